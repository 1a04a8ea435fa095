import { spawn } from "node:child_process";
import { chmodSync, mkdirSync, readFileSync, readlinkSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { SandboxKind } from "@benchwright/shared/contract/local-agent";
import { BASE_ENV, must, run } from "./command";
import { ROOTFS_UID_BASE, ROOTFS_UID_COUNT } from "./rootfs";

// A sandbox's user namespace (docs/local-backend.md, "What a sandbox is"): made from the host
// side and kept by a bind mount of its nsfs file, so that no process of the sandbox holds it.

// newuidmap/newgidmap as unshare calls them: setuid helpers that check /etc/subuid. We are root
// and may write any map, so a root-only stand-in writes the one in BW_UID_MAP / BW_GID_MAP.
const MAP_SHIM = `#!/bin/sh
case "$0" in *newuidmap) map=$BW_UID_MAP file=uid_map ;; *) map=$BW_GID_MAP file=gid_map ;; esac
printf '%s\\n' "$map" > "/proc/$1/$file"
`;

/** The user namespace's map (`inner host count` lines) for a sandbox of `kind` with uid U. */
export function idMap(kind: SandboxKind, uid: number): string {
  if (kind === "proxy") return `0 ${uid} 2`;
  return [
    `0 ${ROOTFS_UID_BASE} 1`,
    `1 ${uid + 1} 1`,
    `2 ${ROOTFS_UID_BASE + 2} ${ROOTFS_UID_COUNT - 2}`,
  ].join("\n");
}

/**
 * Makes the sandbox's user namespace and keeps it by a bind mount on `dir/userns`; its ns id. A
 * holder process makes it (unshare, the helpers writing its maps), the agent binds its nsfs file,
 * then the holder goes. Every namespace count of it is set to 0 from inside it (UserLimits); its
 * limits are returned, to be held again at seal.
 */
export async function makeUserNamespace(
  dir: string,
  map: string,
  binDir: string,
): Promise<{ id: string; limits: UserLimits }> {
  mkdirSync(binDir, { recursive: true, mode: 0o700 });
  chmodSync(binDir, 0o700);
  for (const name of ["newuidmap", "newgidmap"]) writeFileSync(join(binDir, name), MAP_SHIM, { mode: 0o700 });
  const file = join(dir, "userns");
  const env = { ...BASE_ENV, PATH: `${binDir}:${BASE_ENV.PATH}`, BW_UID_MAP: map, BW_GID_MAP: map };
  // unshare only calls the helpers with --map-users/--map-groups; the shim writes the whole map.
  const holder = spawn(
    "unshare",
    ["--user", "--map-users=0,0,1", "--map-groups=0,0,1", "sleep", "infinity"],
    {
      env,
      stdio: ["ignore", "ignore", "pipe"],
    },
  );
  let stderr = "";
  holder.stderr.on("data", (d: Buffer) => {
    if (stderr.length < 4096) stderr += d.toString();
  });
  const flat = (text: string) => text.replace(/\s+/g, " ").trim();
  try {
    const pid = holder.pid;
    if (pid === undefined) throw new Error("unshare did not start");
    const mine = readlinkSync("/proc/self/ns/user");
    for (let i = 0; ; i++) {
      if (holder.exitCode !== null) throw new Error(`unshare exited: ${stderr.trim()}`);
      let uidMap = "";
      let gidMap = "";
      try {
        uidMap = readFileSync(`/proc/${pid}/uid_map`, "utf8");
        gidMap = readFileSync(`/proc/${pid}/gid_map`, "utf8");
      } catch {}
      if (flat(uidMap) === flat(map) && flat(gidMap) === flat(map)) break;
      if (i > 500) throw new Error(`the sandbox's user namespace has the map ${flat(uidMap)}`);
      await sleep(10);
    }
    if (readlinkSync(`/proc/${pid}/ns/user`) === mine) throw new Error("unshare made no user namespace");
    await must(["mount", "--bind", `/proc/${pid}/ns/user`, file]);
  } catch (error) {
    throw new Error(`could not make the sandbox's user namespace: ${(error as Error).message}`);
  } finally {
    holder.kill("SIGKILL");
  }
  let limits: UserLimits;
  try {
    limits = await forbidNamespaces(file);
  } catch (error) {
    throw new Error(
      `could not forbid namespaces in the sandbox's user namespace: ${(error as Error).message}`,
    );
  }
  return { id: `user:[${statSync(file).ino}]`, limits };
}

/**
 * The limits of the sandbox's user namespace as the agent holds them (`user.max_*` as seen from
 * inside it): each namespace count 0, every other limit as the kernel made it. The setup stage is
 * root of that namespace and may write any of them (the only sysctls it may write: the mount,
 * PID, IPC and network namespaces are the host root's), so seal writes them all again.
 */
export type UserLimits = Record<string, string>;

/** The namespace counts: no process of the sandbox may make a namespace of any kind. */
const NAMESPACE_COUNT = /^max_[a-z]+_namespaces$/;

// Run by the host's sh and cat (nsenter --user enters no mount namespace): writes each
// name=value given, then prints every limit as name=value.
const LIMITS_SCRIPT = `cd /proc/sys/user || exit 1
for kv; do printf '%s\\n' "\${kv#*=}" > "\${kv%%=*}" || exit 1; done
for f in max_*; do printf '%s=%s\\n' "$f" "$(cat "$f")"; done`;

async function writeLimits(file: string, values: UserLimits): Promise<UserLimits> {
  const assignments = Object.entries(values).map(([k, v]) => `${k}=${v}`);
  const out = await must([
    "nsenter",
    `--user=${file}`,
    "--",
    "sh",
    "-c",
    LIMITS_SCRIPT,
    "bw-limits",
    ...assignments,
  ]);
  const read: UserLimits = {};
  for (const line of out.trim().split("\n")) {
    const m = /^(max_[a-z_]+)=(\d+)$/.exec(line);
    if (!m) throw new Error(`unexpected limits line: ${line.slice(0, 80)}`);
    read[m[1] as string] = m[2] as string;
  }
  return read;
}

async function forbidNamespaces(file: string): Promise<UserLimits> {
  const made = await writeLimits(file, {});
  if (made.max_user_namespaces === undefined) throw new Error("no user.max_user_namespaces here");
  const held = Object.fromEntries(
    Object.entries(made).map(([k, v]) => [k, NAMESPACE_COUNT.test(k) ? "0" : v]),
  );
  await holdUserLimits(file, held);
  return held;
}

/**
 * Writes `held` into the user namespace kept by `file` again, from the host side, and reads every
 * limit back; throws naming each that does not read as held.
 */
export async function holdUserLimits(file: string, held: UserLimits): Promise<void> {
  const now = await writeLimits(file, held);
  const wrong = [...new Set([...Object.keys(held), ...Object.keys(now)])].filter((k) => now[k] !== held[k]);
  if (wrong.length > 0) {
    throw new Error(
      wrong.map((k) => `user.${k} reads ${now[k] ?? "nothing"}, not ${held[k] ?? "nothing"}`).join("; "),
    );
  }
}

/** Unmounts the user namespace's file (the namespace goes once nothing is in it). */
export async function releaseUserNamespace(dir: string): Promise<void> {
  await run(["umount", join(dir, "userns")]);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
