import { constants, type Stats } from "node:fs";
import { type FileHandle, lstat, open, readdir, readlink } from "node:fs/promises";
import { join } from "node:path";
import { createTarPacker, type TarPackController } from "modern-tar";

// bw-layer: sandbox0's capture of a setup image (issue 34). Run after seal in the pod's `work`
// container as the pod's uid, it writes the working directory (/home/sandbox: the one volume the
// setup stage shares with the execute stage, so all a setup leaves them) to stdout as an
// uncompressed pax tar, read the way GNU tar reads a tree: `./` first, numeric owners, modes as
// they are, symlinks never followed. The broker runs it through the capture rules
// (shared/archive/layer.ts), which trust nothing of it. Left out: `out/` ($BW_OUT, one run's
// results), and sockets, fifos and devices (no layer keeps them). The directory's own entry says
// `trusted.overlay.opaque=y`: in the image, /home/sandbox is exactly this tree, as the volume that
// shadowed the image's own was.
//
// A file is opened O_NOFOLLOW|O_NONBLOCK and must still be what the walk saw. Anything the pod's
// uid cannot read, or a name that is not UTF-8, stops the walk (refused): a layer short of a file
// would start later sandboxes from a setup that never happened. Each directory's names in byte
// order, so one tree always gives one tar.

export interface LayerLimits {
  /** Bytes of file content. */
  maxBytes: number;
  /** Entries of any kind. */
  maxFiles: number;
}

export class LayerStop extends Error {
  constructor(
    readonly why: "refused" | "too_large",
    message: string,
  ) {
    super(message);
    this.name = "LayerStop";
  }
}

/** The subdirectory a layer never keeps ($BW_OUT). */
const OUT = "out";
const READ_BYTES = 64 * 1024;
const utf8 = new TextDecoder("utf-8", { fatal: true });

/** Walks `dir` into a tar on `out`; what it wrote once `out` has it all. */
export async function packLayer(
  dir: string,
  limits: LayerLimits,
  out: WritableStream<Uint8Array>,
): Promise<{ files: number; bytes: number }> {
  const { readable, controller } = createTarPacker();
  const written = readable.pipeTo(out);
  try {
    const counted = await new Walk(dir, limits, controller).run();
    controller.finalize();
    await written;
    return counted;
  } catch (e) {
    controller.error(e);
    await written.catch(() => {});
    throw e;
  }
}

class Walk {
  private files = 0;
  private bytes = 0;

  constructor(
    private readonly dir: string,
    private readonly limits: LayerLimits,
    private readonly tar: TarPackController,
  ) {}

  async run(): Promise<{ files: number; bytes: number }> {
    const top = await lstat(this.dir).catch(() => null);
    if (!top?.isDirectory()) throw new LayerStop("refused", `${this.dir} is not a directory`);
    await this.entry("./", "directory", top, { "SCHILY.xattr.trusted.overlay.opaque": "y" });
    // Depth first, an explicit stack: a deep tree needs no deep recursion.
    const stack = (await this.children("")).filter((rel) => rel !== OUT);
    while (stack.length > 0) {
      const rel = stack.pop() as string;
      const abs = join(this.dir, rel);
      const stat = await lstat(abs).catch(() => null);
      if (!stat) throw new LayerStop("refused", `./${rel} cannot be read`);
      if (stat.isDirectory()) {
        await this.entry(`./${rel}/`, "directory", stat);
        stack.push(...(await this.children(rel)));
      } else if (stat.isSymbolicLink()) {
        const target = await readlink(abs, { encoding: "buffer" });
        await this.entry(`./${rel}`, "symlink", stat, undefined, this.name(target, rel));
      } else if (stat.isFile()) {
        await this.file(rel, abs, stat);
      }
    }
    return { files: this.files, bytes: this.bytes };
  }

  /** A directory's entries, to be popped in byte order. */
  private async children(rel: string): Promise<string[]> {
    let names: Buffer[];
    try {
      names = await readdir(join(this.dir, rel), { encoding: "buffer" });
    } catch {
      throw new LayerStop("refused", `./${rel} cannot be listed by the pod's uid`);
    }
    names.sort(Buffer.compare);
    return names.reverse().map((raw) => {
      const name = this.name(raw, rel);
      return rel === "" ? name : `${rel}/${name}`;
    });
  }

  private name(raw: Buffer, where: string): string {
    try {
      return utf8.decode(raw);
    } catch {
      throw new LayerStop("refused", `./${where} holds a name that is not UTF-8`);
    }
  }

  private count(size: number): void {
    this.files++;
    this.bytes += size;
    if (this.files > this.limits.maxFiles) {
      throw new LayerStop("too_large", `more than ${this.limits.maxFiles} entries`);
    }
    if (this.bytes > this.limits.maxBytes) {
      throw new LayerStop("too_large", `more than ${this.limits.maxBytes} bytes of files`);
    }
  }

  private async entry(
    name: string,
    type: "directory" | "symlink",
    stat: Stats,
    pax?: Record<string, string>,
    linkname?: string,
  ): Promise<void> {
    this.count(0);
    const body = this.tar
      .add({
        name,
        type,
        size: 0,
        mode: stat.mode & 0o7777,
        uid: stat.uid,
        gid: stat.gid,
        mtime: stat.mtime,
        ...(linkname === undefined ? {} : { linkname }),
        ...(pax ? { pax } : {}),
      })
      .getWriter();
    await body.close();
  }

  private async file(rel: string, abs: string, seen: Stats): Promise<void> {
    this.count(seen.size);
    let handle: FileHandle;
    try {
      handle = await open(abs, constants.O_RDONLY | constants.O_NOFOLLOW | constants.O_NONBLOCK);
    } catch {
      throw new LayerStop("refused", `./${rel} cannot be read by the pod's uid`);
    }
    try {
      const now = await handle.stat();
      if (!now.isFile() || now.dev !== seen.dev || now.ino !== seen.ino || now.size !== seen.size) {
        throw new LayerStop("refused", `./${rel} changed while it was read`);
      }
      const body = this.tar
        .add({
          name: `./${rel}`,
          type: "file",
          size: seen.size,
          mode: seen.mode & 0o7777,
          uid: seen.uid,
          gid: seen.gid,
          mtime: seen.mtime,
        })
        .getWriter();
      let left = seen.size;
      while (left > 0) {
        // A fresh buffer each time: the packer queues the chunk itself, it does not copy it.
        const chunk = new Uint8Array(Math.min(READ_BYTES, left));
        const { bytesRead } = await handle.read(chunk, 0, chunk.length, null);
        if (bytesRead === 0) throw new LayerStop("refused", `./${rel} changed while it was read`);
        await body.write(chunk.subarray(0, bytesRead));
        left -= bytesRead;
      }
      await body.close();
    } finally {
      await handle.close();
    }
  }
}
