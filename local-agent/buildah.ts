import { spawn } from "node:child_process";
import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";

// The image store the local backend's sandboxes come from: the host agent exports the work image
// from it (rootfs.ts), and the image builds (`npm run images`: scripts/lib/images.ts and
// node-base.ts) and their test put images in and read them through here. One storage: overlay
// where this machine lets root mount it (each layer a diff), else vfs (each layer a whole copy:
// the same images, but a build of three takes minutes even from cache, where overlay takes
// seconds); in a root of its own, so the host's other container storage, or its driver, never
// conflicts; outside any clone, so the base image and the layer cache outlive a checkout (CI
// builds in a fresh clone on the same machine). BW_IMAGES_DRIVER=vfs forces vfs. To look inside:
// buildah --root /var/lib/benchwright/containers/overlay --storage-driver overlay images
export const STORE_ROOT = process.env.BW_IMAGES_ROOT || "/var/lib/benchwright/containers";
const SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const storageOf = (driver: string) => [
  "--root",
  `${STORE_ROOT}/${driver}`,
  "--runroot",
  `/run/benchwright/containers/${driver}`,
  "--storage-driver",
  driver,
];

let storage: Promise<string[]> | null = null;
/** The storage flags; the first call finds out whether overlay works here (its driver test-mounts). */
export function storageFlags(): Promise<string[]> {
  storage ??= (async () => {
    if (process.env.BW_IMAGES_DRIVER === "vfs") return storageOf("vfs");
    // Nothing of the caller's environment (the host agent calls this too; its own holds a secret).
    const probe = await run("buildah", [...storageOf("overlay"), "info"], { env: { PATH: SAFE_PATH } });
    return storageOf(probe.code === 0 ? "overlay" : "vfs");
  })();
  return storage;
}

export interface Output {
  code: number;
  stdout: string;
  stderr: string;
}

/** Why images cannot be built or run here, or null when they can (root, buildah). */
export function buildahMissing(): string | null {
  if (process.platform !== "linux") return "image builds need Linux";
  if (process.getuid?.() !== 0) return "image builds need root";
  const path = (process.env.PATH ?? "/usr/bin").split(":");
  if (!path.some((dir) => existsSync(`${dir}/buildah`))) return "buildah is not installed";
  return null;
}

/** Runs a command to its end, keeping its output (and passing its lines to `onLine`). */
export function run(
  file: string,
  args: string[],
  opts: { input?: string; onLine?: (line: string) => void; env?: NodeJS.ProcessEnv } = {},
): Promise<Output> {
  return new Promise((resolve, reject) => {
    const child = spawn(file, args, { stdio: ["pipe", "pipe", "pipe"], env: opts.env ?? process.env });
    const out = { stdout: "", stderr: "" };
    for (const name of ["stdout", "stderr"] as const) {
      let partial = "";
      child[name].setEncoding("utf8").on("data", (chunk: string) => {
        out[name] += chunk;
        if (!opts.onLine) return;
        const lines = (partial + chunk).split("\n");
        partial = lines.pop() ?? "";
        for (const line of lines) opts.onLine(line);
      });
    }
    child.on("error", reject);
    child.on("close", (code) => resolve({ code: code ?? 1, ...out }));
    child.stdin.end(opts.input ?? "");
  });
}

/** Like `run`, but a failure throws, naming `what` with the end of the output; its stdout. */
export async function runOk(file: string, args: string[], what: string): Promise<string> {
  const r = await run(file, args);
  if (r.code !== 0) throw new Error(`${what} failed (exit ${r.code}):\n${tail(r)}`);
  return r.stdout;
}

export const buildah = async (args: string[], opts?: Parameters<typeof run>[2]) =>
  run("buildah", [...(await storageFlags()), ...args], opts);

/** Like `buildah`, but a failure throws with the command and the end of its output. */
export async function buildahOk(args: string[]): Promise<string> {
  return runOk("buildah", [...(await storageFlags()), ...args], `buildah ${args[0]}`);
}

/** The last lines a command printed, for an error message. */
export function tail(r: Output, lines = 30): string {
  return `${r.stdout}\n${r.stderr}`.trim().split("\n").slice(-lines).join("\n");
}

/** An image's labels, or null when the image is not in the store. */
export async function imageLabels(ref: string): Promise<Record<string, string> | null> {
  const r = await buildah(["inspect", "--type", "image", ref]);
  if (r.code !== 0) return null;
  const info = JSON.parse(r.stdout) as { OCIv1?: { config?: { Labels?: Record<string, string> } } };
  return info.OCIv1?.config?.Labels ?? {};
}

/**
 * Runs `fn` holding the machine's image-build lock (flock(1) on a file in STORE_ROOT), so that two
 * builds of the same images (CI's early build in the background and a test's, two clones, `npm
 * start` beside `npm test`) never run at once: the second waits, then finds the first's layers in
 * the cache. The holder is a flock child that keeps the lock while its stdin is open; it ends with
 * this process, so a crashed build never leaves the lock held.
 */
export async function withBuildLock<T>(fn: () => Promise<T>): Promise<T> {
  mkdirSync(STORE_ROOT, { recursive: true });
  const holder = spawn(
    "flock",
    ["--exclusive", join(STORE_ROOT, "build.lock"), "sh", "-c", "echo held; exec cat"],
    {
      stdio: ["pipe", "pipe", "ignore"],
      env: { PATH: SAFE_PATH },
    },
  );
  await new Promise<void>((resolve, reject) => {
    holder.on("error", reject);
    holder.on("exit", (code) =>
      reject(new Error(`flock exited (${code}) before taking the image-build lock`)),
    );
    holder.stdout.setEncoding("utf8").once("data", () => resolve());
  });
  holder.removeAllListeners("exit");
  try {
    return await fn();
  } finally {
    holder.stdin.end();
  }
}
