import { createHash, randomBytes } from "node:crypto";
import {
  chmodSync,
  createReadStream,
  existsSync,
  mkdirSync,
  readdirSync,
  renameSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import type { LayerList } from "@benchwright/shared/contract/local-agent";
import { AgentError } from "./errors";

// The setup layers this agent keeps (docs/local-backend.md, "Setup layers"), one directory each:
//   <dir>/<hex>/layer.tar   the canonical layer, whose sha256 is the digest
//   <dir>/<hex>/root/       the same layer in overlay form (owners base+k): a sandbox's lower layer
//   <dir>/<hex>/.complete   written last: a directory without it is never used
// Each is made in `.tmp-<pid>-…` and renamed into place; a crashed agent's are removed at start.
// The directory is root's alone (0700): the layers' files belong to the image's shifted uids.

export const LAYERS_DIR = "/var/lib/benchwright/setup-layers";

const hexOf = (digest: string) => digest.replace(/^sha256:/, "");

export class LayerStore {
  /** Digests verified by this process, by the file they were read from (ino, size, mtime). */
  private readonly verified = new Map<string, string>();

  constructor(readonly dir: string) {}

  /** Makes the directory and removes what an agent that is gone left half made. */
  prepare(): string[] {
    mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    chmodSync(this.dir, 0o700);
    const removed: string[] = [];
    for (const entry of readdirSync(this.dir)) {
      const pid = /^\.tmp-(\d+)-/.exec(entry)?.[1];
      if (pid === undefined || existsSync(`/proc/${pid}`)) continue;
      rmSync(join(this.dir, entry), { recursive: true, force: true });
      removed.push(`layer ${entry}`);
    }
    return removed;
  }

  /** A new directory to make a layer in (keep() moves it into place, discard() removes it). */
  scratch(): string {
    const tmp = this.tmpName();
    mkdirSync(tmp, { mode: 0o700 });
    return tmp;
  }

  private tmpName(): string {
    return join(this.dir, `.tmp-${process.pid}-${randomBytes(6).toString("hex")}`);
  }

  /**
   * Moves a layer made in `tmp` (layer.tar and root/) into place under its digest, marked
   * complete. A complete layer of the same digest already there is kept (same bytes), `tmp` removed.
   */
  keep(tmp: string, digest: string): void {
    const final = join(this.dir, hexOf(digest));
    if (existsSync(join(final, ".complete"))) {
      rmSync(tmp, { recursive: true, force: true });
      return;
    }
    rmSync(final, { recursive: true, force: true });
    // Written before the rename, so the directory is complete the moment it has its name.
    writeFileSync(join(tmp, ".complete"), "");
    renameSync(tmp, final);
  }

  discard(tmp: string): void {
    rmSync(tmp, { recursive: true, force: true });
  }

  list(inUse: (digest: string) => number): LayerList {
    const layers: LayerList["layers"] = [];
    for (const entry of readdirSync(this.dir)) {
      if (!/^[0-9a-f]{64}$/.test(entry)) continue;
      try {
        const complete = statSync(join(this.dir, entry, ".complete"));
        const tar = statSync(join(this.dir, entry, "layer.tar"));
        const digest = `sha256:${entry}`;
        layers.push({
          digest,
          bytes: tar.size,
          createdAt: complete.mtime.toISOString(),
          inUse: inUse(digest),
        });
      } catch {}
    }
    return { layers };
  }

  /**
   * The layer's root (overlay form) once its bytes are checked against the digest: complete, and
   * layer.tar hashing to it (read whole the first time, remembered for this process while the
   * file stays the same). A layer that does not match is removed; none is ever used around it.
   */
  async verify(digest: string): Promise<string> {
    const dir = join(this.dir, hexOf(digest));
    const tar = join(dir, "layer.tar");
    if (!existsSync(join(dir, ".complete")) || !existsSync(tar) || !existsSync(join(dir, "root"))) {
      throw new AgentError("setup_image_missing", `this agent keeps no complete setup layer ${digest}`);
    }
    const st = statSync(tar);
    const key = `${st.ino}:${st.size}:${st.mtimeMs}`;
    if (this.verified.get(digest) !== key) {
      const hash = createHash("sha256");
      for await (const chunk of createReadStream(tar)) hash.update(chunk as Buffer);
      if (`sha256:${hash.digest("hex")}` !== digest) {
        this.verified.delete(digest);
        this.remove(digest);
        throw new AgentError(
          "setup_image_mismatch",
          `the stored setup layer ${digest} does not hash to its digest: removed, not started`,
        );
      }
      this.verified.set(digest, key);
    }
    return join(dir, "root");
  }

  /** Removes a layer (renamed aside first, so no half-removed one keeps its name). */
  remove(digest: string): void {
    const dir = join(this.dir, hexOf(digest));
    if (!existsSync(dir)) return;
    const aside = this.tmpName();
    renameSync(dir, aside);
    this.verified.delete(digest);
    rmSync(aside, { recursive: true, force: true });
  }
}
