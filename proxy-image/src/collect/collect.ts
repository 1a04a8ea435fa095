import { createHash } from "node:crypto";
import { constants, type Stats } from "node:fs";
import { type FileHandle, lstat, open, readdir } from "node:fs/promises";
import { join } from "node:path";
import type { CollectManifest, CutReason } from "@benchwright/shared/contract/bundle";
import { createTarPacker, type TarPackController } from "modern-tar";

// bw-collect: the files a run's commands left under $BW_OUT, as the execute stage's uid, into a
// .tar.gz of `files/<path>` entries and a last `manifest.json` (CollectManifest). Whatever the
// commands made there is theirs to shape, so nothing is trusted: the walk lstat's and never
// follows a symlink (one is listed as cut, its target never read: it could name /etc/passwd or
// /proc/self/environ), a file is opened O_NOFOLLOW|O_NONBLOCK (a FIFO swapped in never blocks it)
// and must still be the regular file the walk saw, and exactly the size the walk saw is read.
//
// The walk is depth first, each directory's names in byte order, so the same tree always gives
// the same archive. It goes on past the bounds, listing what it cuts, up to a bound of its own.

export interface CollectLimits {
  maxBytes: number;
  maxFiles: number;
}

/** Bytes read from a file at a time. */
const READ_BYTES = 64 * 1024;
const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Walks `dir` and writes the archive to `out`; resolves to the manifest once `out` has it all. */
export async function collect(
  dir: string,
  limits: CollectLimits,
  out: WritableStream<Uint8Array>,
): Promise<CollectManifest> {
  const { readable, controller } = createTarPacker();
  const written = readable.pipeThrough(new CompressionStream("gzip")).pipeTo(out);
  let manifest: CollectManifest;
  try {
    manifest = await new Walk(dir, limits, controller).run();
    const json = new TextEncoder().encode(`${JSON.stringify(manifest)}\n`);
    await writeEntry(controller, "manifest.json", json);
    controller.finalize();
  } catch (e) {
    controller.error(e);
    await written.catch(() => {});
    throw e;
  }
  await written;
  return manifest;
}

/** A path still to visit; `utf8` false: its name is not UTF-8 (`rel` shows it lossily). */
interface Pending {
  rel: string;
  utf8: boolean;
}

class Walk {
  private readonly files: CollectManifest["files"] = [];
  private readonly cut: CollectManifest["cut"] = [];
  private bytes = 0;
  private visited = 0;
  private readonly maxVisits: number;
  /** The walk stopped at its own bound (visits, or the cut list full). */
  private incomplete = false;

  constructor(
    private readonly dir: string,
    private readonly limits: CollectLimits,
    private readonly tar: TarPackController,
  ) {
    this.maxVisits = Math.max(10 * limits.maxFiles, 10_000);
  }

  async run(): Promise<CollectManifest> {
    const limits = { maxBytes: this.limits.maxBytes, maxFiles: this.limits.maxFiles };
    let top: Stats;
    try {
      top = await lstat(this.dir);
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "ENOENT")
        return { files: [], cut: [], limits, missing: true };
      throw e;
    }
    // $BW_OUT itself replaced by a symlink or a file: listed as the one thing cut, by the name ".".
    if (top.isSymbolicLink()) this.addCut(".", "symlink", null);
    else if (!top.isDirectory()) this.addCut(".", "special", null);
    else await this.walk();
    const manifest: CollectManifest = { files: this.files, cut: this.cut, limits, missing: false };
    if (this.incomplete) manifest.incomplete = true;
    return manifest;
  }

  private async walk(): Promise<void> {
    // Paths relative to the root, the next to visit last; a directory's children go on in reverse
    // byte order so they come off in order. An explicit stack: a deep tree needs no deep recursion.
    const stack: Pending[] = [];
    await this.push(stack, "");
    while (stack.length > 0 && !this.incomplete) {
      if (++this.visited > this.maxVisits) {
        this.incomplete = true;
        break;
      }
      const { rel, utf8: named } = stack.pop() as Pending;
      // A name that is not UTF-8 cannot be named faithfully in the manifest nor in the archive.
      if (!named) {
        this.addCut(rel, "unreadable", null);
        continue;
      }
      const abs = join(this.dir, rel);
      let stat: Stats;
      try {
        stat = await lstat(abs);
      } catch {
        this.addCut(rel, "unreadable", null);
        continue;
      }
      if (stat.isSymbolicLink()) this.addCut(rel, "symlink", null);
      else if (stat.isDirectory()) await this.push(stack, rel);
      else if (stat.isFile()) await this.file(rel, abs, stat);
      else this.addCut(rel, "special", null);
    }
  }

  /** Puts a directory's children on the stack (or cuts it when it cannot be listed). */
  private async push(stack: Pending[], rel: string): Promise<void> {
    let names: Buffer[];
    try {
      names = await readdir(join(this.dir, rel), { encoding: "buffer" });
    } catch {
      this.addCut(rel === "" ? "." : rel, "unreadable", null);
      return;
    }
    names.sort(Buffer.compare);
    for (let i = names.length - 1; i >= 0; i--) {
      const raw = names[i] as Buffer;
      let name: string;
      let named = true;
      try {
        name = utf8.decode(raw);
      } catch {
        name = raw.toString("utf8");
        named = false;
      }
      stack.push({ rel: rel === "" ? name : `${rel}/${name}`, utf8: named });
    }
  }

  private async file(rel: string, abs: string, seen: Stats): Promise<void> {
    const size = seen.size;
    if (this.files.length >= this.limits.maxFiles) return this.addCut(rel, "too_many", size);
    if (this.bytes + size > this.limits.maxBytes) return this.addCut(rel, "too_large", size);
    let handle: FileHandle;
    try {
      handle = await open(abs, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch (e) {
      // ELOOP: it became a symlink since the walk saw it.
      return this.addCut(rel, (e as NodeJS.ErrnoException).code === "ELOOP" ? "symlink" : "unreadable", size);
    }
    try {
      const now = await handle.stat();
      if (!now.isFile()) return this.addCut(rel, "special", null);
      if (now.dev !== seen.dev || now.ino !== seen.ino || now.size !== size) {
        return this.addCut(rel, "unreadable", size);
      }
      // From here its bytes are in the archive, counted against the bound, whatever follows.
      this.bytes += size;
      const sha256 = await this.copy(handle, rel, size, seen.mtime);
      if (sha256 === null) return this.addCut(rel, "unreadable", size);
      this.files.push({ path: rel, size, sha256 });
    } finally {
      await handle.close();
    }
  }

  /**
   * Exactly `size` bytes of the file into its entry, hashed on the way. Null when the file was
   * not that size after all (it shrank: the entry is padded with zeros; it grew: the entry holds
   * the first `size` bytes), so the manifest cuts it instead of listing bytes it never had.
   */
  private async copy(handle: FileHandle, rel: string, size: number, mtime: Date): Promise<string | null> {
    const hash = createHash("sha256");
    const body = this.tar.add({ name: `files/${rel}`, size, type: "file", mode: 0o644, mtime }).getWriter();
    let left = size;
    let changed = false;
    while (left > 0) {
      // A fresh buffer each time: the packer queues the chunk itself, it does not copy it.
      const chunk = new Uint8Array(Math.min(READ_BYTES, left));
      const { bytesRead } = changed ? { bytesRead: 0 } : await handle.read(chunk, 0, chunk.length, null);
      if (bytesRead === 0) {
        changed = true;
        chunk.fill(0);
        await body.write(chunk);
        left -= chunk.length;
        continue;
      }
      const part = chunk.subarray(0, bytesRead);
      hash.update(part);
      await body.write(part);
      left -= bytesRead;
    }
    await body.close();
    if (!changed) {
      const more = await handle.read(new Uint8Array(1), 0, 1, null);
      if (more.bytesRead > 0) changed = true;
    }
    return changed ? null : hash.digest("hex");
  }

  /** Lists a cut; once maxFiles are listed, the walk stops instead (the manifest stays bounded). */
  private addCut(path: string, reason: CutReason, size: number | null): void {
    if (this.cut.length >= this.limits.maxFiles) this.incomplete = true;
    else this.cut.push({ path, reason, size });
  }
}

async function writeEntry(tar: TarPackController, name: string, bytes: Uint8Array): Promise<void> {
  const body = tar.add({ name, size: bytes.length, type: "file", mode: 0o644 }).getWriter();
  await body.write(bytes);
  await body.close();
}
