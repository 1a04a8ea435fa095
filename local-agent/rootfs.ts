import { randomBytes } from "node:crypto";
import {
  chmodSync,
  existsSync,
  lchownSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import type { LogRecord } from "@benchwright/shared/contract/log";
import { storageFlags } from "./buildah";
import { run } from "./command";

// The sandboxes' root filesystem: the work image (proxy-image/work.Dockerfile, built by `npm run
// images`), exported once per image id into ROOTFS_DIR/<image-id> with every file's owner
// shifted by ROOTFS_UID_BASE (uid k on the image's disk is host uid base+k here). A work
// sandbox's user namespace maps its inner 0 to base, so its setup stage is root of the image's
// files (apt and pip work through the sandbox's overlay) while no host uid that owns anything
// else does. The export is read-only to every sandbox: each writes to an overlay of its own.

export const WORK_IMAGE = "localhost/benchwright-work";
export const ROOTFS_DIR = "/var/lib/benchwright/rootfs";
/** Host uid (and gid) of the image's uid 0; the image's uid k is base+k. */
export const ROOTFS_UID_BASE = 1_000_000_000;
/** How many of the image's uids are shifted into a sandbox's user namespace (0..65535). */
export const ROOTFS_UID_COUNT = 65_536;

export type Rootfs =
  | { ok: true; dir: string; imageId: string; exported: boolean }
  | { ok: false; problem: string };

const firstLine = (text: string) => text.trim().split("\n")[0] ?? "";

async function buildah(args: string[]) {
  return run(["buildah", ...(await storageFlags()), ...args], { timeoutMs: 600_000 });
}

/**
 * The export of `image`, made first if this machine has none for its current id (atomically: a
 * temporary directory renamed into place, so a half-made export is never used). Exports of other
 * ids that no sandbox uses any more are removed.
 */
export async function ensureRootfs(
  options: { image?: string; root?: string; log?: (event: LogRecord) => void } = {},
): Promise<Rootfs> {
  const image = options.image ?? WORK_IMAGE;
  const root = options.root ?? ROOTFS_DIR;
  const inspect = await buildah(["inspect", "--type", "image", "--format", "{{.FromImageID}}", image]);
  if (inspect.code === null) {
    return { ok: false, problem: "buildah is not installed, so the work image's files cannot be exported" };
  }
  if (inspect.code !== 0) {
    return { ok: false, problem: `the work image (${image}) is not built: run npm run images` };
  }
  const imageId = inspect.stdout.trim().replace(/^sha256:/, "");
  if (!/^[0-9a-f]{64}$/.test(imageId)) {
    return { ok: false, problem: `buildah gave no image id for ${image}: ${firstLine(inspect.stdout)}` };
  }
  mkdirSync(root, { recursive: true, mode: 0o700 });
  // Root only: no host uid but root may reach the export (its files belong to base+k).
  chmodSync(root, 0o700);
  const dir = join(root, imageId);
  let exported = false;
  if (!existsSync(dir)) {
    const started = Date.now();
    const problem = await exportImage(image, root, dir);
    if (problem) return { ok: false, problem };
    exported = true;
    options.log?.({ event: "rootfs_exported", imageId, ms: Date.now() - started });
  }
  writeFileSync(join(root, `.use-${imageId}-${process.pid}`), "");
  removeOthers(root, imageId);
  return { ok: true, dir, imageId, exported };
}

async function exportImage(image: string, root: string, dir: string): Promise<string | null> {
  const name = `bw-rootfs-${process.pid}-${randomBytes(4).toString("hex")}`;
  const tmp = join(root, `.tmp-${process.pid}-${randomBytes(4).toString("hex")}`);
  const from = await buildah(["from", "--pull=never", "--name", name, image]);
  if (from.code !== 0) return `could not open the work image (${image}): ${firstLine(from.stderr)}`;
  try {
    const mount = await buildah(["mount", name]);
    if (mount.code !== 0) return `could not mount the work image: ${firstLine(mount.stderr)}`;
    const source = mount.stdout.trim();
    const copy = await run(["cp", "-a", "--", `${source}/.`, tmp], { timeoutMs: 600_000 });
    if (copy.code !== 0) return `could not copy the work image's files: ${firstLine(copy.stderr)}`;
    shiftOwners(source, tmp);
    try {
      renameSync(tmp, dir);
    } catch (error) {
      // Another agent exported the same image meanwhile: theirs is as good.
      if (!existsSync(dir)) throw error;
    }
    return null;
  } catch (error) {
    return `could not export the work image: ${error instanceof Error ? error.message : String(error)}`;
  } finally {
    rmSync(tmp, { recursive: true, force: true });
    await buildah(["umount", name]);
    await buildah(["rm", name]);
  }
}

/**
 * Every entry of `copy` owned by base+k where its original in `source` is owned by k. Taken from
 * the source, so a hard-linked file is shifted once however many names it has. The kernel clears
 * setuid and setgid bits and file capabilities on a change of owner: no such bit survives into
 * the export (a sandbox mounts it nosuid anyway).
 */
function shiftOwners(source: string, copy: string): void {
  const walk = (rel: string) => {
    const from = join(source, rel);
    const st = lstatSync(from);
    lchownSync(join(copy, rel), ROOTFS_UID_BASE + st.uid, ROOTFS_UID_BASE + st.gid);
    if (st.isDirectory()) for (const entry of readdirSync(from)) walk(join(rel, entry));
  };
  walk(".");
}

/**
 * Exports of other image ids no live agent uses, and a crashed export's temporary directory. An
 * agent marks the export it uses (`.use-<id>-<pid>`): a sandbox's mounts do not name it (the
 * overlay's options are relative), and an overlay's lower layer must not change under it.
 */
function removeOthers(root: string, keep: string): void {
  const alive = (pid: string) => existsSync(`/proc/${pid}`);
  const entries = readdirSync(root);
  const users = new Map<string, string[]>();
  for (const entry of entries) {
    const use = /^\.use-([0-9a-f]{64})-(\d+)$/.exec(entry);
    if (!use) continue;
    if (!alive(use[2] as string)) rmSync(join(root, entry), { force: true });
    else users.set(use[1] as string, [...(users.get(use[1] as string) ?? []), use[2] as string]);
  }
  for (const entry of entries) {
    if (entry === keep || entry.startsWith(".use-")) continue;
    const tmpOf = /^\.tmp-(\d+)-/.exec(entry)?.[1];
    if (tmpOf !== undefined && alive(tmpOf)) continue; // still being made
    if (users.has(entry)) continue;
    rmSync(join(root, entry), { recursive: true, force: true });
  }
}
