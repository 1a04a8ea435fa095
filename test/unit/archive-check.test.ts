import { spawnSync } from "node:child_process";
import {
  chmodSync,
  linkSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { checkBundle, maxTarBytes } from "@benchwright/shared/archive/bundle";
import { ArchiveError, tarGzEntries } from "@benchwright/shared/archive/entries";
import { BUNDLE_DEFAULTS } from "@benchwright/shared/contract/bundle";
import { packTar } from "modern-tar";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  BAD_BUNDLES,
  countedStreamOf,
  countingInflation,
  gnuTar,
  packGz,
  rootEntriesBomb,
  streamOf,
  zeroBomb,
} from "./archive-fixtures";

// The bundle check of shared/archive (the Worker's upload check; bw-unpack runs the same walk), on
// archives GNU tar made from real files and on crafted ones: every BundleCode, PAX and GNU long
// names read as modern-tar reads them, and decompression bombs stopped at their bound without
// the rest of the archive being read.

let scratch: string;
let outside: string;

beforeAll(() => {
  scratch = mkdtempSync(join(tmpdir(), "bw-archive-check-"));
  outside = join(scratch, "outside");
  mkdirSync(outside);
});
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

/** A tree like a real benchmark's: code, a venv-style symlink farm, a hardlink, long names. */
function benchmarkTree(): string {
  const dir = join(scratch, `bench-${Math.random().toString(36).slice(2)}`);
  mkdirSync(join(dir, "lib", "pkg"), { recursive: true });
  mkdirSync(join(dir, "bin"));
  writeFileSync(join(dir, "task_impl.py"), "print('hello')\n");
  writeFileSync(join(dir, "setup.sh"), "#!/bin/sh\npip install x\n");
  chmodSync(join(dir, "setup.sh"), 0o755);
  writeFileSync(join(dir, "lib", "pkg", "tool.py"), "# tool\n".repeat(100));
  symlinkSync("../lib/pkg/tool.py", join(dir, "bin", "tool"));
  symlinkSync("lib", join(dir, "lib64"));
  linkSync(join(dir, "task_impl.py"), join(dir, "task_copy.py"));
  const deep = join(dir, "data", "d".repeat(90), "e".repeat(90));
  mkdirSync(deep, { recursive: true });
  writeFileSync(join(deep, `${"f".repeat(200)}.json`), "{}\n");
  return dir;
}

/** What unpacking `dir` makes: every object below it, and the bytes of its distinct regular files. */
function census(dir: string): { files: number; bytes: number } {
  let files = 0;
  let bytes = 0;
  const inodes = new Set<number>();
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const path = join(d, name);
      const st = lstatSync(path);
      files++;
      if (st.isDirectory()) walk(path);
      else if (st.isFile() && !inodes.has(st.ino)) {
        inodes.add(st.ino);
        bytes += st.size;
      }
    }
  };
  walk(dir);
  return { files, bytes };
}

describe("a bundle that passes", () => {
  for (const format of ["gnu", "posix", "ustar"] as const) {
    it(`GNU tar --format=${format} of a benchmark folder: counted as unpacking makes it`, async () => {
      const dir = benchmarkTree();
      const args = [`--format=${format}`, "-C", dir, "."];
      if (format === "ustar") {
        // ustar cannot hold a 200-byte name: GNU tar refuses it, so this format gets a shorter one.
        rmSync(join(dir, "data"), { recursive: true });
      }
      const result = await checkBundle(streamOf(gnuTar(scratch, args)), BUNDLE_DEFAULTS);
      expect(result).toEqual({ ok: true, ...census(dir) });
    });
  }

  it("an archive without directory entries: the directories its paths imply are counted", async () => {
    const bytes = await packGz([{ header: { name: "a/b/c.txt", size: 2 }, body: "hi" }]);
    expect(await checkBundle(streamOf(bytes), BUNDLE_DEFAULTS)).toEqual({ ok: true, files: 3, bytes: 2 });
  });

  it("a symlink climbing no higher than its own directory, and a hardlink to a file before it", async () => {
    const bytes = await packGz([
      { header: { name: "x/y/f", size: 1 }, body: "1" },
      { header: { name: "x/y/up", type: "symlink", linkname: "../../x/y/f", size: 0 } },
      { header: { name: "x/same", type: "link", linkname: "./x/y/f", size: 0 } },
    ]);
    expect(await checkBundle(streamOf(bytes), BUNDLE_DEFAULTS)).toEqual({ ok: true, files: 5, bytes: 1 });
  });

  it("a bundle exactly at both bounds passes; one byte or one file more does not", async () => {
    const two = await packGz([
      { header: { name: "a", size: 3 }, body: "abc" },
      { header: { name: "b", size: 2 }, body: "de" },
    ]);
    expect(await checkBundle(streamOf(two), { maxUnpackedBytes: 5, maxFiles: 2 })).toMatchObject({
      ok: true,
    });
    expect(await checkBundle(streamOf(two), { maxUnpackedBytes: 4, maxFiles: 2 })).toMatchObject({
      code: "bundle_too_large",
    });
    expect(await checkBundle(streamOf(two), { maxUnpackedBytes: 5, maxFiles: 1 })).toMatchObject({
      code: "bundle_too_many_files",
    });
  });
});

describe("case H1 and case H2: every refused bundle, with its code", () => {
  for (const bad of BAD_BUNDLES) {
    it(`${bad.attack ? `case ${bad.attack}` : "invalid"}: ${bad.name} → ${bad.code}`, async () => {
      const bytes = await bad.make(scratch, outside);
      const result = await checkBundle(streamOf(bytes), bad.limits ?? BUNDLE_DEFAULTS);
      expect(result).toMatchObject({ ok: false, code: bad.code });
      expect((result as { message: string }).message.length).toBeGreaterThan(0);
    });
  }
});

describe("case H1: the path checked is the real one", () => {
  it("a PAX path longer than any header field is read whole, and named in the message", async () => {
    const name = `${"p".repeat(150)}/${"p".repeat(150)}/../../evil`;
    const bytes = await packGz([{ header: { name, size: 1 }, body: "x" }]);
    // modern-tar writes it as a PAX record (GNU tar does the same for --format=posix).
    expect(new TextDecoder().decode(await packTar([{ header: { name, size: 0 } }]))).toContain(
      `path=${name}`,
    );
    const result = await checkBundle(streamOf(bytes), BUNDLE_DEFAULTS);
    expect(result).toMatchObject({ ok: false, code: "bundle_path_traversal" });
    expect((result as { message: string }).message).toContain("ppp");
  });

  it("GNU tar's own long-name records (././@LongLink) are honoured", async () => {
    const dir = join(scratch, "gnu-long");
    mkdirSync(dir);
    writeFileSync(join(dir, "a"), "a\n");
    const long = "q".repeat(150);
    const bytes = gnuTar(dir, ["--format=gnu", "-P", "--transform", `s,^a$,${long}/../x,`, "a"]);
    expect(Buffer.from(bytes).length).toBeGreaterThan(0);
    // The ustar name field alone (its first 100 bytes) would have passed.
    const names: string[] = [];
    for await (const entry of tarGzEntries(streamOf(bytes), { maxTarBytes: 1 << 20 })) {
      names.push(entry.header.name);
    }
    expect(names).toEqual([`${long}/../x`]);
    expect(await checkBundle(streamOf(bytes), BUNDLE_DEFAULTS)).toMatchObject({
      code: "bundle_path_traversal",
    });
  });
});

describe("case H2: a bomb costs at most its bound", () => {
  it("1 GiB of zeros is refused at its header: its body is never inflated", async () => {
    const bomb = await zeroBomb();
    expect(bomb.length).toBeLessThan(2 * 1024 * 1024);
    const { result, inflated } = await countingInflation(() => checkBundle(streamOf(bomb), BUNDLE_DEFAULTS));
    expect(result).toMatchObject({ ok: false, code: "bundle_too_large" });
    expect((result as { message: string }).message).toContain("zeros.bin");
    // A piece or two of the gunzip's output, out of 1 GiB.
    expect(inflated).toBeLessThan(1024 * 1024);
  });

  it("countless empty entries are refused at the count bound, the rest never inflated", async () => {
    const bomb = await rootEntriesBomb(200_000);
    const limits = { maxUnpackedBytes: 1 << 20, maxFiles: 1000 };
    const { result, inflated } = await countingInflation(() => checkBundle(streamOf(bomb), limits));
    expect(result).toMatchObject({ ok: false, code: "bundle_too_many_files" });
    // 1001 headers of 512 bytes, and what the decoder buffers ahead (1 MiB), of 100 MiB of tar.
    expect(inflated).toBeLessThan(4 * 1024 * 1024);
  });

  it("the tar read is bounded too: metadata and padding count, not only entry sizes", () => {
    const limits = { maxUnpackedBytes: 1 << 20, maxFiles: 10 };
    expect(maxTarBytes(limits)).toBe((1 << 20) + 11 * 3 * 1024 + 16 * 1024 * 1024);
    expect(maxTarBytes(BUNDLE_DEFAULTS)).toBeLessThan(BUNDLE_DEFAULTS.maxUnpackedBytes * 1.2);
  });
});

describe("tarGzEntries: the decoder others reuse", () => {
  it("yields each entry's header and body in order; a body left unread is skipped", async () => {
    const bytes = await packGz([
      { header: { name: "files/a.txt", size: 5 }, body: "hello" },
      { header: { name: "files/skipped.bin", size: 4 }, body: "skip" },
      { header: { name: "manifest.json", size: 2 }, body: "{}" },
    ]);
    const seen: [string, string | null][] = [];
    for await (const entry of tarGzEntries(streamOf(bytes), { maxTarBytes: 1 << 20 })) {
      const read = entry.header.name.includes("skipped") ? null : await new Response(entry.body).text();
      seen.push([entry.header.name, read]);
    }
    expect(seen).toEqual([
      ["files/a.txt", "hello"],
      ["files/skipped.bin", null],
      ["manifest.json", "{}"],
    ]);
  });

  it("stopping early cancels the source, even one still open", async () => {
    const bytes = await packGz(
      Array.from({ length: 2000 }, (_, i) => ({
        header: { name: `f${i}`, size: 3 },
        body: `${i % 999}`.padStart(3),
      })),
    );
    const source = countedStreamOf(bytes, { chunk: 512, open: true });
    for await (const entry of tarGzEntries(source.stream, { maxTarBytes: 1 << 30 })) {
      if (entry.header.name === "f3") break;
    }
    expect(source.cancelled()).toBe(true);
  });

  it("a failure inside a body reaches the reader of the body as an ArchiveError", async () => {
    // Random bytes do not compress: the first 4 KiB of gzip hold the header and part of the body.
    const random = crypto.getRandomValues(new Uint8Array(60_000));
    const cut = (await packGz([{ header: { name: "big", size: random.length }, body: random }])).subarray(
      0,
      4096,
    );
    let error: unknown = null;
    try {
      for await (const entry of tarGzEntries(streamOf(cut), { maxTarBytes: 1 << 20 })) {
        await new Response(entry.body).arrayBuffer();
      }
    } catch (e) {
      error = e;
    }
    expect(error).toBeInstanceOf(ArchiveError);
    expect((error as ArchiveError).code).toBe("invalid");
  });

  it("more tar than maxTarBytes is an ArchiveError `too_large`", async () => {
    const bytes = await packGz([{ header: { name: "a", size: 200_000 }, body: "a".repeat(200_000) }]);
    const read = async () => {
      for await (const entry of tarGzEntries(streamOf(bytes), { maxTarBytes: 100_000 })) {
        await new Response(entry.body).arrayBuffer();
      }
    };
    await expect(read()).rejects.toMatchObject({ name: "ArchiveError", code: "too_large" });
  });

  it("GNU tar's archive of real files reads back byte for byte", async () => {
    const dir = join(scratch, "readback");
    mkdirSync(dir);
    writeFileSync(join(dir, "one.txt"), "one\n");
    writeFileSync(join(dir, "two.bin"), Buffer.alloc(70_000, 7));
    const bytes = gnuTar(dir, ["one.txt", "two.bin"]);
    const got: Record<string, number> = {};
    for await (const entry of tarGzEntries(streamOf(bytes), { maxTarBytes: 1 << 20 })) {
      got[entry.header.name] = (await new Response(entry.body).arrayBuffer()).byteLength;
    }
    expect(got).toEqual({ "one.txt": 4, "two.bin": 70_000 });
    expect(spawnSync("tar", ["-tzf", "-"], { input: bytes }).stdout.toString()).toBe("one.txt\ntwo.bin\n");
  });
});
