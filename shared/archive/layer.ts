import { createTarDecoder, createTarPacker, type TarHeader } from "modern-tar";
import { LAYER_EXCLUDED } from "../contract/setup-image";

// A setup image's layer (issue 34): what a sealed setup stage changed, read by GNU tar from the
// host side (`tar -c --format=pax --numeric-owner --xattrs --xattrs-include='trusted.overlay.*'`,
// no -h), made into a canonical, uncompressed OCI layer tar, and that layer back into the form an
// overlay lower layer takes (overlayForm). Pure Web Streams and modern-tar: the local agent and,
// later, sandbox0's capture read through the same rules. The rules (docs/local-backend.md):
//
// - dropped: every LAYER_EXCLUDED path (one run's own files and the kernel's: case P4), devices,
//   fifos, the root directory's own entry, and a hardlink whose target was not kept;
// - overlay whiteouts (character device 0:0) become `.wh.<name>`, an opaque directory
//   (trusted.overlay.opaque=y) gets `.wh..wh..opq`; every other xattr is dropped (no
//   security.capability); a metacopy or redirect xattr (a file whose bytes or name are elsewhere)
//   is refused;
// - owners: the builder's execute uid is 1, the image's uid base+k is k; any other owner, and an
//   entry of the execute uid outside home/ (a later sandbox's execute uid differs, and its lower
//   layers cannot be id-mapped here), is refused; setuid and setgid bits are cleared;
// - a regular file holding the run CA's base64 body is refused (defense in depth for case P4);
// - a name with a `..` component, one seen twice, or one under a symlink the layer holds is
//   refused: a runtime applying the layer resolves such a name through the symlink, outside the
//   tree it came from (sandbox0's capture reads a tar a pod wrote; a tree walk never makes one).
//
// A refusal is a LayerRefusal with the agent's code; an archive that is not GNU tar's pax is an
// Error. Names are written without `./`, directories with a trailing `/`.

export type LayerCode = "setup_image_unsupported" | "setup_image_holds_run_files";

export class LayerRefusal extends Error {
  constructor(
    readonly code: LayerCode,
    message: string,
  ) {
    super(message);
    this.name = "LayerRefusal";
  }
}

/** Whether `path` (relative to the sandbox's root, no `./`, no trailing `/`) is never kept. */
export function layerExcluded(path: string): boolean {
  return LAYER_EXCLUDED.some((e) =>
    e.endsWith("/") ? path === e.slice(0, -1) || path.startsWith(e) : path === e,
  );
}

export interface CaptureRules {
  /**
   * Host uid (and gid) of the builder's execute stage: uid 1 in the layer. Null where the execute
   * uid is an image uid like any other (sandbox0: 10001 in every pod, kept as it is).
   */
  executeUid: number | null;
  /** Host uid of the image's uid 0: base+k is k in the layer. */
  uidBase: number;
  /** How many image uids are mapped (base .. base+count-1). */
  uidCount: number;
  /** The run CA (PEM) no kept file may hold; null: the run had none. */
  runCaPem: string | null;
}

/** One tree as GNU tar read it (`-C <dir> .`), placed at `at` in the layer ("" is the root). */
export interface TreeTar {
  at: string;
  tar: ReadableStream<Uint8Array>;
}

const WHITEOUT = ".wh.";
const OPAQUE = ".wh..wh..opq";
const XATTR = "SCHILY.xattr.";
const REFUSED_XATTRS = ["trusted.overlay.metacopy", "trusted.overlay.redirect"];

/**
 * The canonical layer of `trees`, in order (an entry of the root tree under another tree's `at`
 * is that tree's, and dropped). `files()` counts the entries written once the stream has ended.
 */
export function captureLayer(
  trees: readonly TreeTar[],
  rules: CaptureRules,
): { layer: ReadableStream<Uint8Array>; files: () => number } {
  const { readable, controller } = createTarPacker();
  let files = 0;
  const kept = new Set<string>();
  const seen = new Set<string>();
  const links = new Set<string>();
  const caNeedle = rules.runCaPem === null ? null : caBody(rules.runCaPem);
  const owner = (id: number, path: string): number => {
    if (id === rules.executeUid) {
      if (path !== "home" && !path.startsWith("home/")) {
        throw new LayerRefusal(
          "setup_image_unsupported",
          `/${path} belongs to the execute stage's uid outside /home (a later sandbox's execute uid differs)`,
        );
      }
      return 1;
    }
    if (id >= rules.uidBase && id < rules.uidBase + rules.uidCount) return id - rules.uidBase;
    throw new LayerRefusal("setup_image_unsupported", `/${path} has an owner no sandbox maps (${id})`);
  };
  const add = async (header: TarHeader, body?: ReadableStream<Uint8Array>, scan?: Scanner) => {
    files++;
    const writer = controller.add(header).getWriter();
    if (body) {
      const reader = body.getReader();
      for (;;) {
        const next = await reader.read();
        if (next.done) break;
        if (scan?.(next.value)) {
          await reader.cancel();
          throw new LayerRefusal("setup_image_holds_run_files", `/${header.name} holds the run's CA`);
        }
        await writer.write(next.value);
      }
    }
    await writer.close();
  };

  const pump = async () => {
    const others = trees.map((t) => t.at).filter((at) => at !== "");
    for (const tree of trees) {
      const types = entryTypes();
      const entries = tree.tar.pipeThrough(types.tap).pipeThrough(createTarDecoder({ strict: true }));
      for await (const { header, body } of entries as unknown as AsyncIterable<{
        header: TarHeader;
        body: ReadableStream<Uint8Array>;
      }>) {
        const tapped = types.next();
        const rel = relative(header.name);
        const path = tree.at === "" ? rel : rel === "" ? tree.at : `${tree.at}/${rel}`;
        const type = header.type ?? "file";
        const isDevice = type === "character-device" || type === "block-device";
        if (isDevice !== (tapped !== undefined && (tapped.flag === "3" || tapped.flag === "4"))) {
          throw new Error(`the archive's entry ${JSON.stringify(header.name)} could not be read`);
        }
        const skip = async () => {
          await body.cancel();
        };
        if (
          path === "" ||
          (tree.at === "" && others.some((at) => path === at || path.startsWith(`${at}/`)))
        ) {
          await skip();
          continue;
        }
        const parts = path.split("/");
        if (
          parts.includes("..") ||
          seen.has(path) ||
          parts.some((_, i) => i > 0 && links.has(parts.slice(0, i).join("/")))
        ) {
          throw new LayerRefusal(
            "setup_image_unsupported",
            `/${path}: a name outside the tree (a .. component, a symlink on its way, or seen twice)`,
          );
        }
        seen.add(path);
        const name = parts.at(-1) as string;
        if (name.startsWith(WHITEOUT)) {
          throw new LayerRefusal("setup_image_unsupported", `/${path}: a name layers reserve for whiteouts`);
        }
        const xattrs = Object.entries(header.pax ?? {}).filter(([k]) => k.startsWith(XATTR));
        for (const [key] of xattrs) {
          if (REFUSED_XATTRS.includes(key.slice(XATTR.length))) {
            throw new LayerRefusal(
              "setup_image_unsupported",
              `/${path} is an overlay ${key.slice(XATTR.length + 16)}`,
            );
          }
        }
        if (layerExcluded(path)) {
          await skip();
          continue;
        }
        const at = path.split("/").slice(0, -1).join("/");
        const mtime = header.mtime;
        if (isDevice) {
          await skip();
          // An overlay whiteout: the path is deleted in the layer. Any other device is dropped.
          if (type === "character-device" && tapped?.major === 0 && tapped.minor === 0) {
            await add({
              name: join(at, `${WHITEOUT}${name}`),
              type: "file",
              size: 0,
              mode: 0o600,
              uid: 0,
              gid: 0,
              mtime,
            });
          }
          continue;
        }
        if (type !== "file" && type !== "directory" && type !== "symlink" && type !== "link") {
          await skip(); // fifos
          continue;
        }
        const uid = owner(header.uid ?? 0, path);
        const gid = owner(header.gid ?? 0, path);
        const mode = (header.mode ?? 0o644) & 0o1777;
        const base = { uid, gid, mode, mtime, uname: "", gname: "" };
        if (type === "directory") {
          await skip();
          await add({ ...base, name: `${path}/`, type: "directory", size: 0 });
          const opaque = xattrs.find(([k]) => k === `${XATTR}trusted.overlay.opaque`)?.[1];
          if (opaque === "y")
            await add({ ...base, name: join(path, OPAQUE), type: "file", size: 0, mode: 0o600 });
          else if (opaque !== undefined) {
            throw new LayerRefusal(
              "setup_image_unsupported",
              `/${path} is an overlay directory of a kind layers do not keep`,
            );
          }
        } else if (type === "symlink") {
          await skip();
          links.add(path);
          await add({ ...base, name: path, type: "symlink", size: 0, linkname: header.linkname ?? "" });
        } else if (type === "link") {
          await skip();
          const target = relative(header.linkname ?? "");
          const full = tree.at === "" ? target : `${tree.at}/${target}`;
          if (kept.has(full)) await add({ ...base, name: path, type: "link", size: 0, linkname: full });
        } else {
          kept.add(path);
          await add(
            { ...base, name: path, type: "file", size: header.size },
            body,
            caNeedle ? scanner(caNeedle) : undefined,
          );
        }
      }
    }
  };
  pump().then(
    () => controller.finalize(),
    (error: unknown) => controller.error(error),
  );
  return { layer: readable, files: () => files };
}

/**
 * The layer in overlay form, for GNU tar to extract as an overlay lower layer (`tar -x
 * --numeric-owner -p --xattrs --xattrs-include=trusted.overlay.opaque`): `.wh.<name>` becomes a
 * character device 0:0, `.wh..wh..opq` the opaque xattr of its directory (the directory listed
 * again, which tar applies to the one it made), uid and gid k become uidBase+k.
 */
export function overlayForm(layer: ReadableStream<Uint8Array>, uidBase: number): ReadableStream<Uint8Array> {
  const { readable, controller } = createTarPacker();
  const dirs = new Map<string, TarHeader>();
  const pump = async () => {
    const entries = layer.pipeThrough(createTarDecoder({ strict: true }));
    for await (const { header, body } of entries as unknown as AsyncIterable<{
      header: TarHeader;
      body: ReadableStream<Uint8Array>;
    }>) {
      const path = relative(header.name);
      const name = path.split("/").at(-1) as string;
      const at = path.split("/").slice(0, -1).join("/");
      let out: TarHeader;
      if (name === OPAQUE) {
        const dir = dirs.get(at) ?? {
          name: `${at}/`,
          type: "directory",
          size: 0,
          mode: 0o755,
          uid: uidBase,
          gid: uidBase,
        };
        out = { ...dir, pax: { [`${XATTR}trusted.overlay.opaque`]: "y" } };
      } else if (name.startsWith(WHITEOUT)) {
        out = {
          name: join(at, name.slice(WHITEOUT.length)),
          type: "character-device",
          size: 0,
          mode: 0,
          uid: 0,
          gid: 0,
          mtime: header.mtime,
        };
      } else {
        out = {
          name: header.type === "directory" ? `${path}/` : path,
          type: header.type ?? "file",
          size: header.size,
          mode: header.mode,
          mtime: header.mtime,
          uid: uidBase + (header.uid ?? 0),
          gid: uidBase + (header.gid ?? 0),
          ...(header.linkname ? { linkname: header.linkname } : {}),
        };
        if (out.type === "directory") dirs.set(path, out);
      }
      const writer = controller.add(out).getWriter();
      if (out.type === "file" && out.size > 0) {
        const reader = body.getReader();
        for (let next = await reader.read(); !next.done; next = await reader.read())
          await writer.write(next.value);
      } else {
        await body.cancel();
      }
      await writer.close();
    }
  };
  pump().then(
    () => controller.finalize(),
    (error: unknown) => controller.error(error),
  );
  return readable;
}

/** An entry's name as a path from the tree's root: no `./`, no leading or trailing `/`. */
function relative(name: string): string {
  return name
    .split("/")
    .filter((s) => s !== "" && s !== ".")
    .join("/");
}

const join = (dir: string, name: string) => (dir === "" ? name : `${dir}/${name}`);

/** The run CA's base64 body, whitespace left out. */
function caBody(pem: string): Uint8Array {
  const body = pem
    .replace(/-----(BEGIN|END) [^-]+-----/g, "")
    .replace(/\s+/g, "")
    .slice(0, 64);
  return new TextEncoder().encode(body);
}

/** Fed a file's chunks in order; true once they held the needle (whitespace between its bytes ignored). */
type Scanner = (chunk: Uint8Array) => boolean;

function scanner(needle: Uint8Array): Scanner {
  // Knuth-Morris-Pratt over the file's bytes without whitespace: a PEM wrapped at any width matches.
  const fail = new Int32Array(needle.length);
  for (let i = 1, k = 0; i < needle.length; i++) {
    while (k > 0 && needle[i] !== needle[k]) k = fail[k - 1] as number;
    if (needle[i] === needle[k]) k++;
    fail[i] = k;
  }
  let matched = 0;
  return (chunk) => {
    for (const byte of chunk) {
      if (byte === 0x0a || byte === 0x0d || byte === 0x20 || byte === 0x09) continue;
      while (matched > 0 && byte !== needle[matched]) matched = fail[matched - 1] as number;
      if (byte === needle[matched]) matched++;
      if (matched === needle.length) return true;
    }
    return false;
  };
}

/** A real entry's type flag and device numbers, which modern-tar's headers do not carry. */
interface Tapped {
  flag: string;
  major: number;
  minor: number;
}

/**
 * A pass-through that reads the tar's header blocks beside modern-tar's decoder and notes each
 * real entry's type flag and device numbers, in order: the decoder yields the same entries in the
 * same order, and the capture takes one note per entry (next()). Pax size records are followed.
 */
function entryTypes(): { tap: TransformStream<Uint8Array, Uint8Array>; next(): Tapped | undefined } {
  const notes: Tapped[] = [];
  let head: Uint8Array = new Uint8Array(0);
  let skip = 0;
  let pax: { want: number; parts: Uint8Array[]; got: number } | null = null;
  let paxSize: number | null = null;
  const block = (h: Uint8Array) => {
    if (h.every((b) => b === 0)) return; // the end-of-archive blocks and their padding
    const flag = String.fromCharCode(h[156] as number);
    let size = numeric(h.subarray(124, 136));
    if (flag === "x" || flag === "g") {
      if (flag === "x") pax = { want: size, parts: [], got: 0 };
    } else if (flag === "L" || flag === "K") {
      // GNU long names: metadata, no entry of their own.
    } else {
      if (paxSize !== null) size = paxSize;
      paxSize = null;
      notes.push({ flag, major: numeric(h.subarray(329, 337)), minor: numeric(h.subarray(337, 345)) });
      if ("123456".includes(flag)) size = 0; // links, devices, directories, fifos: no body
    }
    skip = size + (-size & 511);
  };
  const tap = new TransformStream<Uint8Array, Uint8Array>({
    transform(chunk, controller) {
      controller.enqueue(chunk);
      let at = 0;
      while (at < chunk.length) {
        if (skip > 0) {
          const n = Math.min(skip, chunk.length - at);
          if (pax && pax.got < pax.want) {
            const part = chunk.subarray(at, at + Math.min(n, pax.want - pax.got));
            pax.parts.push(part.slice());
            pax.got += part.length;
          }
          skip -= n;
          at += n;
          if (skip === 0 && pax) {
            const text = new TextDecoder().decode(concat(pax.parts));
            const size = /(?:^|\n)\d+ size=(\d+)\n/.exec(text)?.[1];
            paxSize = size === undefined ? null : Number(size);
            pax = null;
          }
          continue;
        }
        const n = Math.min(512 - head.length, chunk.length - at);
        head = concat([head, chunk.subarray(at, at + n)]);
        at += n;
        if (head.length === 512) {
          block(head);
          head = new Uint8Array(0);
        }
      }
    },
  });
  return { tap, next: () => notes.shift() };
}

/** A tar numeric field: octal text, or GNU's base-256 (high bit set). */
function numeric(field: Uint8Array): number {
  if (((field[0] as number) & 0x80) !== 0) {
    let n = (field[0] as number) & 0x7f;
    for (const b of field.subarray(1)) n = n * 256 + b;
    return n;
  }
  const text = new TextDecoder()
    .decode(field)
    .replace(/[\0 ].*$/s, "")
    .trim();
  return text === "" ? 0 : Number.parseInt(text, 8);
}

function concat(parts: readonly Uint8Array[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}
