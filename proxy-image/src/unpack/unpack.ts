import { constants, linkSync, lstatSync, mkdirSync, symlinkSync } from "node:fs";
import { open } from "node:fs/promises";
import { join, resolve } from "node:path";
import {
  type BundleEntry,
  type BundleLimits,
  type FileSink,
  readBundle,
} from "@benchwright/shared/archive/bundle";
import type { UnpackResult } from "@benchwright/shared/contract/bundle";

// bw-unpack: a bundle's .tar.gz into a sandbox's working directory, as the execute stage's uid.
// Every entry passes the Worker's own check (shared/archive) before it is written, and the writing
// does not rely on the check alone: files are created O_CREAT|O_EXCL|O_NOFOLLOW (never through a
// symlink, never over anything), every directory on a path is made or found and then lstat'ed to
// be a real directory (so neither a symlink an entry made nor one already in <dir> is ever
// followed), symlinks and hardlinks are made only where nothing is, a hardlink only to a regular
// file this run created (same inode), modes are 0o755 or 0o644 (no setuid, setgid or sticky bit),
// and ownership is left to the uid that runs it.
//
// A refused bundle stops at the refused entry; what was written before it stays, all of it inside
// <dir> (the caller discards the sandbox's run or the directory).

/** An unpack that failed for a reason not the bundle's: the directory, the disk, an argument. */
export class UnpackFailure extends Error {
  override name = "UnpackFailure";
}

export async function unpack(
  dir: string,
  input: ReadableStream<Uint8Array>,
  limits: BundleLimits,
): Promise<UnpackResult> {
  const writer = new TreeWriter(prepareRoot(dir));
  return readBundle(input, limits, (entry) => writer.make(entry));
}

/** <dir>, made if missing; it must be a real directory, not a symlink to one. */
function prepareRoot(dir: string): string {
  const root = resolve(dir);
  mkdirSync(root, { recursive: true, mode: 0o755 });
  if (!lstatSync(root).isDirectory()) throw new UnpackFailure(`${root} is not a directory`);
  return root;
}

class TreeWriter {
  /** Paths from the root proven to be real directories ("" is the root). */
  private readonly dirs = new Set<string>([""]);
  /** The regular files this run created, by path from the root: a hardlink may only join these. */
  private readonly files = new Map<string, { dev: number; ino: number }>();

  constructor(private readonly root: string) {}

  async make(entry: BundleEntry): Promise<FileSink | undefined> {
    switch (entry.kind) {
      case "dir":
        this.directory(entry.segments);
        return undefined;
      case "file":
        return this.file(entry.path, entry.segments, entry.mode, entry.mtime);
      case "symlink":
        this.directory(entry.segments.slice(0, -1));
        symlinkSync(entry.target, this.abs(entry.path));
        return undefined;
      case "hardlink": {
        this.directory(entry.segments.slice(0, -1));
        const made = this.files.get(entry.target);
        const now = lstatSync(this.abs(entry.target));
        if (!made || !now.isFile() || now.dev !== made.dev || now.ino !== made.ino) {
          throw new UnpackFailure(`${entry.target} is no longer the file this bundle made`);
        }
        linkSync(this.abs(entry.target), this.abs(entry.path));
        this.files.set(entry.path, made);
        return undefined;
      }
    }
  }

  private async file(path: string, segments: string[], mode: number, mtime: Date | null): Promise<FileSink> {
    this.directory(segments.slice(0, -1));
    const { O_WRONLY, O_CREAT, O_EXCL, O_NOFOLLOW } = constants;
    // Executable for anyone if executable for someone in the archive; nothing else is kept.
    const safeMode = mode & 0o111 ? 0o755 : 0o644;
    const handle = await open(this.abs(path), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW, safeMode);
    try {
      await handle.chmod(safeMode); // open's mode is narrowed by the umask
      const stat = await handle.stat();
      this.files.set(path, { dev: stat.dev, ino: stat.ino });
    } catch (e) {
      await handle.close();
      throw e;
    }
    return {
      async write(chunk) {
        for (let at = 0; at < chunk.length; ) {
          const { bytesWritten } = await handle.write(chunk, at, chunk.length - at);
          at += bytesWritten;
        }
      },
      async close() {
        try {
          if (mtime) await handle.utimes(mtime, mtime);
        } finally {
          await handle.close();
        }
      },
      abort: () => handle.close(),
    };
  }

  /** Each directory of `segments` from the root down: made, or found to be a real one already. */
  private directory(segments: readonly string[]): void {
    let path = "";
    for (const segment of segments) {
      path = path === "" ? segment : `${path}/${segment}`;
      if (this.dirs.has(path)) continue;
      const abs = this.abs(path);
      try {
        mkdirSync(abs, { mode: 0o755 });
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "EEXIST") throw e;
      }
      // lstat, not stat: a symlink here (to a directory or not) is in the way, never followed.
      if (!lstatSync(abs).isDirectory()) throw new UnpackFailure(`${path} is in the way: not a directory`);
      this.dirs.add(path);
    }
  }

  private abs(path: string): string {
    return join(this.root, path);
  }
}
