import { randomUUID } from "node:crypto";
import {
  closeSync,
  constants,
  fchmodSync,
  fchownSync,
  fstatSync,
  ftruncateSync,
  lstatSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  renameSync,
  rmSync,
  writeSync,
} from "node:fs";
import { join } from "node:path";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { filesFirst, renderHostsFile, withCertificate } from "@benchwright/shared/policy/hosts-file";

// A sandbox's wiring files, written from the host side: the bind sources in its root-only
// directory (sandbox.ts), never a path resolved inside the sandbox. The setup stage is root of the
// sandbox and may have changed any of them (their content, their mode, their ACL), so each is
// opened without following a link, checked to be the regular file it was, and rewritten in
// place (the bind mount holds its inode); once sealed they belong to the host's root, 0644:
// readable in the sandbox, writable by no one there (the host's root is not mapped in it).

/** The image's own files the seal builds the wiring's from (read once, from the export). */
export interface ImageFiles {
  /** The image's CA bundle. */
  bundle: string;
  /** The image's /etc/nsswitch.conf ("" if it has none). */
  nsswitch: string;
}

export function readImageFiles(rootfs: string, bundlePath: string): ImageFiles {
  let nsswitch = "";
  try {
    nsswitch = readFileSync(join(rootfs, "etc", "nsswitch.conf"), "utf8");
  } catch {}
  return { bundle: readFileSync(join(rootfs, bundlePath), "utf8"), nsswitch };
}

/** The hosts file a sandbox starts with; the wiring's block is added below it. */
export const BASE_HOSTS = "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n";
const RUN_CA_FILE = "run-ca.pem";
const MAX_HOSTS_BYTES = 1024 * 1024;

export interface WiredFiles {
  /** The sandbox's root-only directory. */
  dir: string;
  /** Host uid of the sandbox's setup stage (the files' owner until sealed). */
  setupUid: number;
  sealed: boolean;
}

function openRegular(path: string, flags: number) {
  const fd = openSync(path, flags | constants.O_NOFOLLOW | constants.O_NOCTTY);
  if (!fstatSync(fd).isFile()) {
    closeSync(fd);
    throw new Error(`${path} is not a regular file`);
  }
  return fd;
}

/** Rewrites `name` in the sandbox's directory in place, owned by `owner`, 0644. */
function rewrite(files: WiredFiles, name: string, content: string): void {
  const fd = openRegular(join(files.dir, name), constants.O_WRONLY);
  try {
    const owner = files.sealed ? 0 : files.setupUid;
    // Owner and mode first: nothing of the sandbox may write while the content changes. A mode
    // of 0644 also masks any ACL entry the setup stage added to read-only.
    fchownSync(fd, owner, owner);
    fchmodSync(fd, 0o644);
    ftruncateSync(fd, 0);
    const data = Buffer.from(content);
    for (let at = 0; at < data.length; ) at += writeSync(fd, data, at, data.length - at, at);
  } finally {
    closeSync(fd);
  }
}

function readUpTo(path: string, max: number): string {
  const fd = openRegular(path, constants.O_RDONLY);
  try {
    const buffer = Buffer.alloc(max);
    let size = 0;
    for (let n = 1; n > 0 && size < max; size += n) n = readSync(fd, buffer, size, max - size, size);
    return buffer.subarray(0, size).toString("utf8");
  } finally {
    closeSync(fd);
  }
}

/**
 * Everything seal installs: the hosts file (the redirect of `routing` to `proxyAddress`), the
 * resolver, the CA bundle (the image's, with the run CA) and the run CA's own file in `ca/`; with
 * `caCertPem` null, the image's hosts and bundle and no run CA.
 */
export function installSealed(
  files: WiredFiles,
  wiring: {
    routing: RoutingMode;
    proxyAddress: string;
    hostsFile: readonly string[];
    caCertPem: string | null;
    resolvConf: string;
    imageBundle: string;
  },
): void {
  const sealed = { ...files, sealed: true };
  const pem = wiring.caCertPem;
  rewrite(
    sealed,
    "hosts",
    pem === null
      ? BASE_HOSTS
      : renderHostsFile(BASE_HOSTS, wiring.routing, wiring.proxyAddress, wiring.hostsFile),
  );
  rewrite(sealed, "resolv.conf", wiring.resolvConf);
  rewrite(
    sealed,
    "ca-certificates.crt",
    pem === null ? wiring.imageBundle : withCertificate(wiring.imageBundle, pem),
  );
  // The CA directory: the host's root's from now on, emptied of whatever the setup stage left
  // (a link there must never be followed by the agent), then the run CA written anew.
  const ca = join(files.dir, "ca");
  if (!lstatSync(ca).isDirectory()) throw new Error(`${ca} is not a directory`);
  const dirFd = openSync(ca, constants.O_RDONLY | constants.O_DIRECTORY | constants.O_NOFOLLOW);
  try {
    fchownSync(dirFd, 0, 0);
    fchmodSync(dirFd, 0o755);
  } finally {
    closeSync(dirFd);
  }
  for (const entry of readdirSync(ca)) rmSync(join(ca, entry), { recursive: true, force: true });
  if (pem !== null) {
    const fd = openSync(
      join(ca, RUN_CA_FILE),
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW,
      0o644,
    );
    try {
      fchownSync(fd, 0, 0);
      fchmodSync(fd, 0o644);
      writeSync(fd, pem.endsWith("\n") ? pem : `${pem}\n`);
    } finally {
      closeSync(fd);
    }
  }
}

/** A vault edit under default routing: the hosts file's redirect block rewritten from outside. */
export function installHosts(files: WiredFiles, proxyAddress: string, hostsFile: readonly string[]): void {
  // Sealed, the file is the agent's own; before, the setup stage's lines above the block are kept.
  const current = files.sealed ? BASE_HOSTS : readUpTo(join(files.dir, "hosts"), MAX_HOSTS_BYTES);
  rewrite(files, "hosts", renderHostsFile(current, "default", proxyAddress, hostsFile));
}

/**
 * The paths the seal owns in the sandbox's tree (relative to its root): each bound from the
 * sandbox's directory (`bound`, the bind source's name there), or written into the tree itself.
 */
export const SEAL_OWNED: ReadonlyArray<{ path: string; bound: string | null }> = [
  { path: "etc/hosts", bound: "hosts" },
  { path: "etc/resolv.conf", bound: "resolv.conf" },
  { path: "etc/ssl/certs/ca-certificates.crt", bound: "ca-certificates.crt" },
  { path: "run/benchwright", bound: "ca" },
  // Not bound: the setup stage's package installs may rename a new one over it (sed -i does).
  { path: "etc/nsswitch.conf", bound: null },
];

const NO_FOLLOW = constants.O_NOFOLLOW | constants.O_NONBLOCK | constants.O_NOCTTY;

/**
 * Opens the directory holding `path` in the sandbox's tree, from `root` (the host path of its root
 * directory: PID 1's, which nothing inside can move), never following a link. Each directory on
 * the way, the root's own included, is given back to the setup stage's uid and made writable by
 * it alone, so that the execute stage cannot rename the file or a directory above it aside. The
 * caller closes the descriptor.
 */
function openParent(root: string, path: string, setupUid: number): number {
  let fd = openSync(root, constants.O_RDONLY | constants.O_DIRECTORY);
  for (const part of [null, ...path.split("/").slice(0, -1)]) {
    if (part !== null) {
      const next = openSync(
        `/proc/self/fd/${fd}/${part}`,
        constants.O_RDONLY | constants.O_DIRECTORY | NO_FOLLOW,
      );
      closeSync(fd);
      fd = next;
    }
    fchownSync(fd, setupUid, setupUid);
    fchmodSync(fd, fstatSync(fd).mode & 0o7755);
  }
  return fd;
}

/**
 * Checks each bound path of SEAL_OWNED, from the sandbox's side, is still the bind source in
 * `dir` (setup could have renamed a directory above it aside and put files of its own there),
 * and seals the directories above it (openParent). Throws naming the first that is not.
 */
export function checkBound(root: string, dir: string, setupUid: number): void {
  for (const { path, bound } of SEAL_OWNED) {
    if (bound === null) continue;
    const parent = openParent(root, path, setupUid);
    try {
      const name = path.split("/").at(-1) as string;
      const fd = openSync(`/proc/self/fd/${parent}/${name}`, constants.O_RDONLY | NO_FOLLOW);
      const seen = fstatSync(fd);
      closeSync(fd);
      const source = lstatSync(join(dir, bound));
      if (seen.dev !== source.dev || seen.ino !== source.ino)
        throw new Error(`/${path} is not the agent's any more`);
    } finally {
      closeSync(parent);
    }
  }
}

/**
 * The sandbox's /etc/nsswitch.conf written from the host side into its own tree, the image's with
 * the hosts file first (filesFirst): written beside the old one and renamed over it, so whatever
 * setup left there (a link to anywhere, a file with other names) is replaced, never written
 * through. It then belongs to the host's root, 0644.
 */
export function installNsswitch(root: string, setupUid: number, image: ImageFiles): void {
  const parent = openParent(root, "etc/nsswitch.conf", setupUid);
  const etc = `/proc/self/fd/${parent}`;
  const tmp = `${etc}/.bw-nsswitch-${randomUUID()}`;
  try {
    const fd = openSync(tmp, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | NO_FOLLOW, 0o644);
    try {
      fchownSync(fd, 0, 0);
      fchmodSync(fd, 0o644);
      const data = Buffer.from(filesFirst(image.nsswitch));
      for (let at = 0; at < data.length; ) at += writeSync(fd, data, at, data.length - at, at);
    } finally {
      closeSync(fd);
    }
    renameSync(tmp, `${etc}/nsswitch.conf`);
  } catch (error) {
    rmSync(tmp, { force: true });
    throw error;
  } finally {
    closeSync(parent);
  }
}

/**
 * A file of the sandbox's own tree read from the host side, from `root` (PID 1's root), never
 * following a link (each directory opened with O_NOFOLLOW, as openParent does, but nothing
 * changed on the way): at most `max` bytes of a regular file. Throws saying what is there instead.
 */
export function readInTree(root: string, path: string, max: number): string {
  let fd = openSync(root, constants.O_RDONLY | constants.O_DIRECTORY);
  try {
    const parts = path.split("/");
    for (const part of parts.slice(0, -1)) {
      const next = openSync(
        `/proc/self/fd/${fd}/${part}`,
        constants.O_RDONLY | constants.O_DIRECTORY | NO_FOLLOW,
      );
      closeSync(fd);
      fd = next;
    }
    const file = openSync(`/proc/self/fd/${fd}/${parts.at(-1)}`, constants.O_RDONLY | NO_FOLLOW);
    try {
      if (!fstatSync(file).isFile()) throw new Error(`/${path} is not a regular file`);
      const buffer = Buffer.alloc(max);
      let size = 0;
      for (let n = 1; n > 0 && size < max; size += n) n = readSync(file, buffer, size, max - size, size);
      return buffer.subarray(0, size).toString("utf8");
    } finally {
      closeSync(file);
    }
  } catch (error) {
    const code = (error as { code?: string }).code;
    // ELOOP: O_NOFOLLOW met a link; ENOTDIR: a directory on the way is not one.
    if (code === "ELOOP") throw new Error(`/${path} or a directory above it is a link`);
    if (code !== undefined) throw new Error(`/${path}: ${code}`);
    throw error;
  } finally {
    closeSync(fd);
  }
}
