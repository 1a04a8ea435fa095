import type { TarHeader } from "modern-tar";
import type { BundleCode, UnpackResult } from "../contract/bundle";
import { ArchiveError, tarGzEntries } from "./entries";
import { entrySegments, hardlinkSegments, symlinkEscape } from "./paths";
import { BundleTree } from "./tree";

// The bundle check: every entry of a bundle's .tar.gz judged before anything of it is used. The
// Worker runs it on upload (checkBundle); bw-unpack runs the same walk (readBundle) and writes
// each entry only once it passed, so what the Worker accepted is what bw-unpack accepts.
//
// What passes: regular files, directories, symlinks whose target stays in the tree (paths.ts),
// and hardlinks to a regular file of the bundle listed before them. No entry below a symlink or
// a file, no path made twice (tree.ts). The bounds: the sum of the regular files' sizes, checked
// at each header before its body is read (a bomb's huge entry is refused without inflating it);
// the count of what is made (entries, and the directories their paths imply); and the bytes of
// tar read, metadata and padding included (entries.ts).
//
// modern-tar reads a type flag it does not know (GNU sparse, vendor types) as a regular file; so
// it is checked, counted and written as one: a plain file of the bytes the archive holds.

export interface BundleLimits {
  maxUnpackedBytes: number;
  maxFiles: number;
}

/** An entry that passed: what the extractor makes. */
export type BundleEntry =
  | { kind: "dir"; path: string; segments: string[] }
  | { kind: "file"; path: string; segments: string[]; size: number; mode: number; mtime: Date | null }
  | { kind: "symlink"; path: string; segments: string[]; target: string }
  /** `target`: the regular file's path from the root, `/`-separated. */
  | { kind: "hardlink"; path: string; segments: string[]; target: string };

export type Refusal = { ok: false; code: BundleCode; message: string };

/** Where an accepted regular file's bytes go (bw-unpack: the file it created). */
export interface FileSink {
  write(chunk: Uint8Array): Promise<void> | void;
  close(): Promise<void> | void;
  /** The archive failed while the file was being written. */
  abort?(reason: unknown): Promise<void> | void;
}

/** Called with each entry that passed, in order; a regular file's bytes go to the sink it returns. */
export type BundleVisitor = (entry: BundleEntry) => Promise<FileSink | undefined> | FileSink | undefined;

/**
 * Bytes of decompressed tar a bundle within `limits` may take: its files' bytes, and per entry a
 * header, its padding and a PAX or GNU long-name record or two (3 KiB is generous: GNU tar's
 * posix format adds one 1 KiB PAX record to every entry), plus room for the records GNU tar pads
 * the archive to and for the odd larger metadata.
 */
export function maxTarBytes(limits: BundleLimits): number {
  return limits.maxUnpackedBytes + (limits.maxFiles + 1) * 3 * 1024 + 16 * 1024 * 1024;
}

/** Checks a whole bundle without writing anything (the Worker's upload check). */
export function checkBundle(stream: ReadableStream<Uint8Array>, limits: BundleLimits): Promise<UnpackResult> {
  return readBundle(stream, limits, () => undefined);
}

/**
 * Walks a bundle, refusing at the first entry that does not pass; each that does goes to
 * `visit` first. A refusal cancels the stream (nothing after the refused entry is read). An error
 * thrown by `visit` or a sink is not the bundle's: it propagates as it is.
 */
export async function readBundle(
  stream: ReadableStream<Uint8Array>,
  limits: BundleLimits,
  visit: BundleVisitor,
): Promise<UnpackResult> {
  const checker = new BundleChecker(limits);
  try {
    for await (const { header, body } of tarGzEntries(stream, { maxTarBytes: maxTarBytes(limits) })) {
      const verdict = checker.accept(header);
      if (!verdict.ok) return verdict;
      const sink = await visit(verdict.entry);
      if (sink) await pour(body, sink);
    }
  } catch (e) {
    if (e instanceof ArchiveError) {
      return {
        ok: false,
        code: e.code === "too_large" ? "bundle_too_large" : "bundle_invalid",
        message: e.message,
      };
    }
    throw e;
  }
  return { ok: true, files: checker.files, bytes: checker.bytes };
}

async function pour(body: ReadableStream<Uint8Array>, sink: FileSink): Promise<void> {
  const reader = body.getReader();
  try {
    while (true) {
      const next = await reader.read();
      if (next.done) break;
      await sink.write(next.value);
    }
  } catch (e) {
    await sink.abort?.(e);
    throw e;
  } finally {
    reader.releaseLock();
  }
  await sink.close();
}

/** The per-entry judgement, in archive order. */
export class BundleChecker {
  private readonly tree = new BundleTree();
  private entries = 0;
  /** Filesystem objects the bundle makes (entries and implied directories; not the root). */
  files = 0;
  /** The regular files' bytes. */
  bytes = 0;

  constructor(private readonly limits: BundleLimits) {}

  accept(header: TarHeader): { ok: true; entry: BundleEntry } | Refusal {
    const name = header.name;
    const refuse = (code: BundleCode, why: string): Refusal => ({
      ok: false,
      code,
      message: `entry ${quote(name)}: ${why}`,
    });
    // Every entry counts, even one that makes nothing (the root again, a directory again): a
    // bomb of countless empty entries stops here.
    if (++this.entries > this.limits.maxFiles) {
      return refuse("bundle_too_many_files", `more than ${this.limits.maxFiles} entries`);
    }
    const type = header.type ?? "file";
    if (type !== "file" && type !== "directory" && type !== "symlink" && type !== "link") {
      return refuse("bundle_special_file", `a ${type}, which a bundle may not hold`);
    }
    const path = entrySegments(name);
    if (!path.ok) return refuse(path.code, path.why);
    const segments = path.segments;
    const joined = segments.join("/");
    if (segments.length === 0) {
      // `./`: GNU tar lists the directory it packed; it is the tree's root, already there.
      if (type === "directory") return { ok: true, entry: { kind: "dir", path: "", segments } };
      return refuse("bundle_invalid", `a ${type} at the bundle's root itself`);
    }

    let entry: BundleEntry;
    if (type === "file") {
      const size = header.size;
      if (!Number.isSafeInteger(size) || size < 0) return refuse("bundle_invalid", "a bad size");
      if (this.bytes + size > this.limits.maxUnpackedBytes) {
        return refuse(
          "bundle_too_large",
          `${size} bytes, past the bound of ${this.limits.maxUnpackedBytes} bytes unpacked (${this.bytes} before it)`,
        );
      }
      const mtime = header.mtime && !Number.isNaN(header.mtime.getTime()) ? header.mtime : null;
      entry = { kind: "file", path: joined, segments, size, mode: header.mode ?? 0o644, mtime };
    } else if (type === "directory") {
      entry = { kind: "dir", path: joined, segments };
    } else if (type === "symlink") {
      const target = header.linkname ?? "";
      const way = symlinkEscape(segments, target);
      if (way) return refuse(way.code, `${way.why} (${quote(target)})`);
      entry = { kind: "symlink", path: joined, segments, target };
    } else {
      const target = hardlinkSegments(header.linkname ?? "");
      if (!target.ok) return refuse(target.code, `${target.why} (${quote(header.linkname ?? "")})`);
      const kind = this.tree.kindAt(target.segments);
      if (kind !== "file" && kind !== "hardlink") {
        return refuse(
          "bundle_link_escape",
          `a hardlink to ${quote(header.linkname ?? "")}, which is not a regular file listed before it`,
        );
      }
      entry = { kind: "hardlink", path: joined, segments, target: target.segments.join("/") };
    }

    const placed = this.tree.place(segments, entry.kind);
    if (!placed.ok) return refuse(placed.code, placed.why);
    this.files += placed.created;
    if (this.files > this.limits.maxFiles) {
      return refuse("bundle_too_many_files", `more than ${this.limits.maxFiles} files and directories`);
    }
    if (entry.kind === "file") this.bytes += entry.size;
    return { ok: true, entry };
  }
}

/** A name for a message: quoted, and cut short (a PAX path may be megabytes). */
function quote(name: string): string {
  return JSON.stringify(name.length > 200 ? `${name.slice(0, 200)}…` : name);
}
