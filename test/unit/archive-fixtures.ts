import { spawnSync } from "node:child_process";
import { mkdirSync, symlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { constants, crc32, createDeflateRaw, gzipSync } from "node:zlib";
import type { BundleCode } from "@benchwright/shared/contract/bundle";
import { createTarPacker, packTar, type TarEntry } from "modern-tar";

// The archives the bundle tests feed the check (archive-check.test.ts) and bw-unpack
// (archive-unpack.test.ts): made by GNU tar from real files where GNU tar can make them, and by
// modern-tar's packer (or by hand from its output) where only a crafted header will do.

/** A .tar.gz GNU tar writes of `paths` under `cwd` (`-P` keeps absolute and `..` names). */
export function gnuTar(cwd: string, args: string[]): Uint8Array {
  const run = spawnSync("tar", ["-cz", "-f", "-", ...args], { cwd, maxBuffer: 256 * 1024 * 1024 });
  if (run.status !== 0) throw new Error(`tar ${args.join(" ")}: ${run.stderr.toString()}`);
  return new Uint8Array(run.stdout);
}

/** The entries packed by modern-tar, gzipped. */
export async function packGz(entries: TarEntry[]): Promise<Uint8Array> {
  return gzipSync(await packTar(entries));
}

export function streamOf(bytes: Uint8Array): ReadableStream<Uint8Array> {
  return new Blob([bytes]).stream();
}

/**
 * The stream of `bytes`, whether its reader cancelled it, and how many bytes it handed out.
 * `open`: it never ends after them, like a request body still arriving.
 */
export function countedStreamOf(
  bytes: Uint8Array,
  options: { chunk?: number; open?: boolean } = {},
): { stream: ReadableStream<Uint8Array>; taken(): number; cancelled(): boolean } {
  const chunk = options.chunk ?? 16 * 1024;
  let at = 0;
  let cancelled = false;
  const stream = new ReadableStream<Uint8Array>(
    {
      pull(controller) {
        if (at >= bytes.length) return options.open ? new Promise<void>(() => {}) : controller.close();
        controller.enqueue(bytes.subarray(at, at + chunk));
        at += chunk;
      },
      cancel() {
        cancelled = true;
      },
    },
    { highWaterMark: 0 },
  );
  return { stream, taken: () => Math.min(at, bytes.length), cancelled: () => cancelled };
}

/**
 * Runs `fn` with the global DecompressionStream wrapped to count what it inflates: the real
 * gunzip, watched, so a test can say how much of a bomb was ever decompressed.
 */
export async function countingInflation<T>(fn: () => Promise<T>): Promise<{ result: T; inflated: number }> {
  const Real = globalThis.DecompressionStream;
  let inflated = 0;
  class Counted {
    readonly readable: ReadableStream<Uint8Array>;
    readonly writable: WritableStream<Uint8Array>;
    constructor(format: "gzip" | "deflate" | "deflate-raw") {
      const real = new Real(format);
      this.writable = real.writable as WritableStream<Uint8Array>;
      this.readable = (real.readable as ReadableStream<Uint8Array>).pipeThrough(
        new TransformStream<Uint8Array, Uint8Array>({
          transform(c, controller) {
            inflated += c.length;
            controller.enqueue(c);
          },
        }),
      );
    }
  }
  globalThis.DecompressionStream = Counted as unknown as typeof DecompressionStream;
  try {
    const result = await fn();
    return { result, inflated };
  } finally {
    globalThis.DecompressionStream = Real;
  }
}

const FIXED_TIME = new Date("2026-01-01T00:00:00Z");

/**
 * A decompression bomb: one entry of 1 GiB of zeros, about 1 MiB gzipped, as one gzip member.
 * Deflating 1 GiB takes seconds (more on a busy machine), so it is assembled instead: after a full
 * flush a deflate stream starts afresh, so 1 MiB of zeros deflated after one is the same bytes
 * every time, and the body is that piece 1024 times between the tar header's and the end
 * marker's. Only the CRC walks the whole gigabyte (a fraction of a second). Kept once made.
 */
let zeroBombMade: Promise<Uint8Array> | undefined;
export function zeroBomb(): Promise<Uint8Array> {
  zeroBombMade ??= makeZeroBomb();
  // A copy each: a test may consume or change what it was given.
  return zeroBombMade.then((bytes) => bytes.slice());
}

async function makeZeroBomb(): Promise<Uint8Array> {
  const size = 1 << 30;
  const header = await tarHeader({ name: "zeros.bin", size, mtime: FIXED_TIME });
  const zeros = new Uint8Array(1 << 20);
  const endMarker = new Uint8Array(1024);
  const deflater = new FlushedDeflate();
  const head = await deflater.flushed(header);
  const piece = await deflater.flushed(zeros);
  if (!Buffer.from(piece).equals(await deflater.flushed(zeros))) {
    throw new Error("a full flush did not reset the deflate stream");
  }
  const tail = await deflater.finish(endMarker);
  let crc = crc32(header);
  for (let i = 0; i < size / zeros.length; i++) crc = crc32(zeros, crc);
  crc = crc32(endMarker, crc);
  const trailer = Buffer.alloc(8);
  trailer.writeUInt32LE(crc >>> 0, 0);
  trailer.writeUInt32LE((header.length + size + endMarker.length) % 2 ** 32, 4);
  // The gzip header: magic, deflate, no flags, no mtime, no extra flags, OS "Unix".
  const gzipHeader = Buffer.from([0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 3]);
  return new Uint8Array(
    Buffer.concat([
      gzipHeader,
      head,
      ...Array.from({ length: size / zeros.length }, () => piece),
      tail,
      trailer,
    ]),
  );
}

/** A raw deflate stream written in fully flushed pieces: each piece's output comes back alone. */
class FlushedDeflate {
  private readonly deflate = createDeflateRaw({ level: 9 });
  private out: Buffer[] = [];
  constructor() {
    this.deflate.on("data", (c: Buffer) => void this.out.push(c));
  }
  flushed(bytes: Uint8Array): Promise<Buffer> {
    this.deflate.write(bytes);
    return new Promise((resolve) => this.deflate.flush(constants.Z_FULL_FLUSH, () => resolve(this.take())));
  }
  finish(bytes: Uint8Array): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      this.deflate.once("error", reject);
      // The last output arrives before the readable side's "end", not the writable side's "finish".
      this.deflate.once("end", () => resolve(this.take()));
      this.deflate.end(bytes);
    });
  }
  private take(): Buffer {
    const piece = Buffer.concat(this.out);
    this.out = [];
    return piece;
  }
}

/** The 512-byte header modern-tar's packer writes for an entry of `header.size` bytes. */
async function tarHeader(header: { name: string; size: number; mtime: Date }): Promise<Uint8Array> {
  const { readable, controller } = createTarPacker();
  const reader = readable.getReader();
  controller.add(header);
  const parts: Uint8Array[] = [];
  for (let n = 0; n < 512; ) {
    const { value, done } = await reader.read();
    if (done) break;
    parts.push(value);
    n += value.length;
  }
  await reader.cancel();
  return new Uint8Array(Buffer.concat(parts).subarray(0, 512));
}

/**
 * Countless entries that make nothing: `./` again and again, `count` identical header blocks
 * (modern-tar's own, repeated) and the end marker; 512 bytes of tar each, a few bytes gzipped.
 */
export async function rootEntriesBomb(count: number): Promise<Uint8Array> {
  const one = await packTar([{ header: { name: "./", type: "directory", size: 0, mtime: FIXED_TIME } }]);
  const tar = new Uint8Array(count * 512 + 1024);
  for (let i = 0; i < count; i++) tar.set(one.subarray(0, 512), i * 512);
  return gzipSync(tar);
}

export interface BadBundle {
  /** The test's name: what is wrong with it. */
  name: string;
  code: BundleCode;
  /** The attack case it belongs to. */
  attack: "H1" | "H2" | null;
  /** The .tar.gz, made from files under `scratch`; `outside` is where an escape would land. */
  make(scratch: string, outside: string): Promise<Uint8Array> | Uint8Array;
  /** The limits to check it with (the contract's defaults when absent). */
  limits?: { maxUnpackedBytes: number; maxFiles: number };
}

const file = (name: string, body = "x", extra: Partial<TarEntry["header"]> = {}): TarEntry => ({
  header: { name, size: new TextEncoder().encode(body).length, mtime: FIXED_TIME, ...extra },
  body,
});
const symlink = (name: string, linkname: string): TarEntry => ({
  header: { name, type: "symlink", linkname, size: 0, mtime: FIXED_TIME },
});
const hardlink = (name: string, linkname: string): TarEntry => ({
  header: { name, type: "link", linkname, size: 0, mtime: FIXED_TIME },
});

/** A scratch tree for GNU tar: `a` (a file) and whatever `more` adds. */
function tree(scratch: string, more: (dir: string) => void = () => {}): string {
  const dir = join(scratch, `src-${Math.random().toString(36).slice(2)}`);
  mkdirSync(dir);
  writeFileSync(join(dir, "a"), "content of a\n");
  more(dir);
  return dir;
}

const LONG = "y".repeat(120);

/** Every way a bundle is refused, each with its BundleCode. */
export const BAD_BUNDLES: BadBundle[] = [
  // case H1: traversal, absolute paths, links out of the tree, special files.
  {
    name: "GNU tar: a member renamed to ../evil",
    code: "bundle_path_traversal",
    attack: "H1",
    make: (s) => gnuTar(tree(s), ["-P", "--transform", "s,^a$,../evil,", "a"]),
  },
  {
    name: "GNU tar: a `..` in the middle (sub/../../evil)",
    code: "bundle_path_traversal",
    attack: "H1",
    make: (s) => gnuTar(tree(s), ["-P", "--transform", "s,^a$,sub/../../evil,", "a"]),
  },
  {
    name: "GNU tar: a GNU long name hiding `..` past the 100 bytes of its ustar name",
    code: "bundle_path_traversal",
    attack: "H1",
    make: (s) => gnuTar(tree(s), ["-P", "--transform", `s,^a$,${LONG}/../../evil,`, "a"]),
  },
  {
    name: "crafted: a PAX path ../evil behind a harmless ustar name",
    code: "bundle_path_traversal",
    attack: "H1",
    make: () => packGz([file("harmless.txt", "x", { pax: { path: "../evil" } })]),
  },
  {
    name: "crafted: a backslash `..` (..\\evil) a Windows tool would climb with",
    code: "bundle_path_traversal",
    attack: "H1",
    make: () => packGz([file("..\\evil")]),
  },
  {
    name: "GNU tar -P: an absolute member name",
    code: "bundle_absolute_path",
    attack: "H1",
    make: (s, outside) => gnuTar(tree(s), ["-P", "--transform", `s,^a$,${outside}/abs,`, "a"]),
  },
  {
    name: "crafted: a Windows drive path (C:\\evil)",
    code: "bundle_absolute_path",
    attack: "H1",
    make: () => packGz([file("C:\\evil")]),
  },
  {
    name: "crafted: a PAX absolute path behind a harmless ustar name",
    code: "bundle_absolute_path",
    attack: "H1",
    make: (_s, outside) => packGz([file("harmless.txt", "x", { pax: { path: `${outside}/abs` } })]),
  },
  {
    name: "GNU tar: a symlink to /etc/passwd",
    code: "bundle_link_escape",
    attack: "H1",
    make: (s) =>
      gnuTar(
        tree(s, (d) => symlinkSync("/etc/passwd", join(d, "passwd"))),
        ["passwd"],
      ),
  },
  {
    name: "GNU tar: a symlink climbing out (sub/up -> ../../outside)",
    code: "bundle_link_escape",
    attack: "H1",
    make: (s) =>
      gnuTar(
        tree(s, (d) => {
          mkdirSync(join(d, "sub"));
          symlinkSync("../../outside", join(d, "sub", "up"));
        }),
        ["sub"],
      ),
  },
  {
    name: "crafted: `..` after a symlink (a -> ., then b -> a/../outside)",
    code: "bundle_link_escape",
    attack: "H1",
    make: () => packGz([symlink("a", "."), symlink("b", "a/../outside")]),
  },
  {
    name: "crafted: an entry below a symlink of the bundle (a -> sub, then a/x)",
    code: "bundle_link_escape",
    attack: "H1",
    make: () => packGz([file("sub/keep"), symlink("a", "sub"), file("a/x")]),
  },
  {
    name: "GNU tar -P: a hardlink to /etc/passwd",
    code: "bundle_link_escape",
    attack: "H1",
    make: (s) =>
      gnuTar(
        tree(s, (d) => spawnSync("ln", [join(d, "a"), join(d, "b")])),
        ["-P", "--transform", "s,^a$,/etc/passwd,RSh", "a", "b"],
      ),
  },
  {
    name: "GNU tar -P: a hardlink climbing out (../outside/a)",
    code: "bundle_link_escape",
    attack: "H1",
    make: (s) =>
      gnuTar(
        tree(s, (d) => spawnSync("ln", [join(d, "a"), join(d, "b")])),
        ["-P", "--transform", "s,^a$,../outside/a,RSh", "a", "b"],
      ),
  },
  {
    name: "GNU tar: a hardlink to a file the bundle does not hold (etc/passwd)",
    code: "bundle_link_escape",
    attack: "H1",
    make: (s) =>
      gnuTar(
        tree(s, (d) => spawnSync("ln", [join(d, "a"), join(d, "b")])),
        ["--transform", "s,^a$,etc/passwd,RSh", "a", "b"],
      ),
  },
  {
    name: "crafted: a hardlink to a symlink of the bundle",
    code: "bundle_link_escape",
    attack: "H1",
    make: () => packGz([symlink("s", "x"), hardlink("h", "s")]),
  },
  {
    name: "GNU tar: a FIFO (mkfifo)",
    code: "bundle_special_file",
    attack: "H1",
    make: (s) =>
      gnuTar(
        tree(s, (d) => spawnSync("mkfifo", [join(d, "pipe")])),
        ["a", "pipe"],
      ),
  },
  {
    name: "crafted: a character device (/dev/null's 1,3)",
    code: "bundle_special_file",
    attack: "H1",
    make: () => packGz([{ header: { name: "null", type: "character-device", size: 0, mode: 0o666 } }]),
  },
  {
    name: "crafted: a block device",
    code: "bundle_special_file",
    attack: "H1",
    make: () => packGz([{ header: { name: "sda", type: "block-device", size: 0 } }]),
  },
  // case H2: decompression bombs, huge or countless entries.
  {
    name: "a gzip bomb: 1 GiB of zeros in one entry, about 1 MiB gzipped",
    code: "bundle_too_large",
    attack: "H2",
    make: () => zeroBomb(),
  },
  {
    name: "files each within the bound, their sum over it",
    code: "bundle_too_large",
    attack: "H2",
    make: () => packGz([file("one", "a".repeat(600)), file("two", "b".repeat(600))]),
    limits: { maxUnpackedBytes: 1000, maxFiles: 100 },
  },
  {
    name: "a tiny tar followed by 64 MiB of zero padding (no entry's size)",
    code: "bundle_too_large",
    attack: "H2",
    make: async () =>
      gzipSync(Buffer.concat([await packTar([file("a")]), new Uint8Array(64 * 1024 * 1024)]), { level: 1 }),
    limits: { maxUnpackedBytes: 1024 * 1024, maxFiles: 10 },
  },
  {
    name: "entries of no size, each with 1 MiB of PAX metadata",
    code: "bundle_too_large",
    attack: "H2",
    make: () =>
      packGz(
        Array.from({ length: 40 }, (_, i) =>
          file(`e${i}`, "", { pax: { comment: "z".repeat(1024 * 1024) } }),
        ),
      ),
    limits: { maxUnpackedBytes: 1024 * 1024, maxFiles: 100 },
  },
  {
    name: "countless empty entries: 20 000 `./` entries",
    code: "bundle_too_many_files",
    attack: "H2",
    make: () => rootEntriesBomb(20_000),
    limits: { maxUnpackedBytes: 1024 * 1024, maxFiles: 1000 },
  },
  {
    name: "countless distinct empty files",
    code: "bundle_too_many_files",
    attack: "H2",
    make: () => packGz(Array.from({ length: 1500 }, (_, i) => file(`f${i}`, ""))),
    limits: { maxUnpackedBytes: 1024 * 1024, maxFiles: 1000 },
  },
  {
    name: "one entry whose path implies more directories than the bound",
    code: "bundle_too_many_files",
    attack: "H2",
    make: () => packGz([file("a/b/c/d/e/f")]),
    limits: { maxUnpackedBytes: 1024 * 1024, maxFiles: 3 },
  },
  // Not a tar.gz, or not one a bundle may be.
  {
    name: "not gzip at all",
    code: "bundle_invalid",
    attack: null,
    make: () => new TextEncoder().encode("#!/bin/sh\necho hello\n"),
  },
  { name: "an empty upload", code: "bundle_invalid", attack: null, make: () => new Uint8Array(0) },
  {
    name: "gzip of something that is not a tar",
    code: "bundle_invalid",
    attack: null,
    make: () => gzipSync("hello ".repeat(200)),
  },
  {
    name: "a gzip stream cut short",
    code: "bundle_invalid",
    attack: null,
    make: async () => {
      const whole = await packGz([file("a", "q".repeat(50_000))]);
      return whole.subarray(0, Math.floor(whole.length / 2));
    },
  },
  {
    name: "a tar cut short inside an entry's body",
    code: "bundle_invalid",
    attack: null,
    make: async () => gzipSync((await packTar([file("a", "q".repeat(10_000))])).subarray(0, 4096)),
  },
  {
    name: "a header with a bad checksum",
    code: "bundle_invalid",
    attack: null,
    make: async () => {
      const tar = await packTar([file("abc")]);
      tar[0] = "x".charCodeAt(0);
      return gzipSync(tar);
    },
  },
  {
    name: "bytes after the end-of-archive marker that are not zeros",
    code: "bundle_invalid",
    attack: null,
    make: async () => gzipSync(Buffer.concat([await packTar([file("a")]), Buffer.from("trailing junk")])),
  },
  {
    name: "a PAX path holding a NUL",
    code: "bundle_invalid",
    attack: null,
    make: () => packGz([file("harmless.txt", "x", { pax: { path: "ok\0../../evil" } })]),
  },
  {
    name: "an entry with an empty PAX path",
    code: "bundle_invalid",
    attack: null,
    make: () => packGz([file("harmless.txt", "x", { pax: { path: "" } })]),
  },
  {
    name: "the same file twice",
    code: "bundle_invalid",
    attack: null,
    make: () => packGz([file("a", "one"), file("a", "two")]),
  },
  {
    name: "an entry below a file",
    code: "bundle_invalid",
    attack: null,
    make: () => packGz([file("a"), file("a/b")]),
  },
  {
    name: "a regular file at the bundle's root itself (.)",
    code: "bundle_invalid",
    attack: null,
    make: () => packGz([file(".")]),
  },
];
