import { type ChildProcess, spawn } from "node:child_process";
import {
  chmodSync,
  chownSync,
  copyFileSync,
  mkdirSync,
  readFileSync,
  readlinkSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import type { SandboxKind } from "@benchwright/shared/contract/local-agent";
import type { SandboxCgroup } from "./cgroups";
import { BASE_ENV, must, run } from "./command";
import { ROOTFS_UID_BASE } from "./rootfs";
import { holdUserLimits, idMap, makeUserNamespace, releaseUserNamespace, type UserLimits } from "./userns";

// A sandbox's processes (docs/local-backend.md, "What a sandbox is").
//
// Its user namespace is made first, from the host side, and kept by a bind mount of its nsfs
// file in the sandbox's root-only directory (`userns`): no process of the sandbox has to hold
// it. Its maps: work, task and orchestrator sandboxes map inner 0 (the setup stage) to
// ROOTFS_UID_BASE, the owner of the work image's exported files, inner 1 (the execute stage) to
// the sandbox's own U+1, and inner 2..65535 to base+2..; proxy sandboxes map inner 0 to U and 1
// to U+1 (the image's files are "nobody"'s to them). No one in it may make another user
// namespace (max_user_namespaces 0), so no process of the sandbox can get a mount namespace of
// its own in which to shadow /etc/hosts or the CA bundle.
//
// Then the init, started as
//   ip netns exec NS unshare --mount --pid --ipc --fork --propagation private sh -c INIT
// runs as host root in the new mount, PID and IPC namespaces (owned by the host's user namespace,
// so nothing in the sandbox can unmount or mount anything there): it makes the sandbox's root
// filesystem (an overlay over the export, on a tmpfs of its own), every mount in it, pivots into
// it and detaches the host's tree, then stays as PID 1 with no capabilities (a reaper that runs
// nothing more). Commands enter with nsenter.

export const SANDBOX_HOME = "/home/sandbox";
/** Where a work sandbox's commands leave results ($BW_OUT), made for the execute stage. */
export const SANDBOX_OUT = "/home/sandbox/out";
/** Where the proxy image's programs (proxy.cjs, wiring.cjs, ...) appear, read-only, in every sandbox. */
export const IMAGE_MOUNT = "/run/bw-image";
/**
 * Where the agent's own node binary appears, read-only, in every sandbox: the image's programs run
 * on it. It is the Node the project pins (npm's `node` package, under the checkout), which the
 * sandbox cannot otherwise see.
 */
export const NODE_MOUNT = "/run/bw-node";
export const CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt";
/** The run CA's directory in the sandbox (the wiring's caDir), bind-mounted from `ca/`. */
export const CA_DIR = "/run/benchwright";

const INIT = `set -e
dir=$1 lower=$2 image=$3 node=$4 size=$5 rootuid=$6 execuid=$7 kind=$8 capture=$9 layer=\${10} homeuid=\${11}
mount --make-rprivate /
m="$dir/mnt"
# The sandbox's writable layer: a tmpfs of its mount namespace, gone with it; for a setup image's
# builder, the agent's own, mounted there in the host's mount namespace (which keeps it readable
# by the agent, never by the sandbox: this namespace detaches the host's tree below).
[ "$capture" = 1 ] || mount -t tmpfs -o "size=$size,mode=700,nosuid,nodev" bw-layer "$m"
mkdir "$m/lower" "$m/upper" "$m/work" "$m/root"
chown --reference="$lower" "$m/upper"
chmod --reference="$lower" "$m/upper"
# Given relative to $m, so that the overlay's options name no host directory. A setup layer, when
# the sandbox starts from one, lies over the image. No metacopy (an upper file's bytes elsewhere)
# and no redirect (a directory's name elsewhere): what a capture reads is the upper itself.
mount --bind "$lower" "$m/lower"
lowers=lower
if [ -n "$layer" ]; then
  mkdir "$m/layer"
  mount --bind "$layer" "$m/layer"
  lowers=layer:lower
fi
(cd "$m" && mount -t overlay -o "lowerdir=$lowers,upperdir=upper,workdir=work,metacopy=off,redirect_dir=off,nosuid,nodev" bw-root root)
r="$m/root"
# Nothing this script (host root, before the pivot) writes or mounts on may be a link: a layer's
# link there would lead it out of the sandbox's tree.
for p in proc dev sys tmp var var/tmp run home etc etc/ssl etc/ssl/certs; do
  if [ -L "$r/$p" ]; then echo "bw-init: /$p is a link" >&2; exit 1; fi
done
mount -t proc -o nosuid,nodev,noexec bw-proc "$r/proc"
# A minimal /dev: the harmless devices, a pty instance of its own, shm. No /sys.
mount -t tmpfs -o nosuid,noexec,mode=755,size=64k bw-dev "$r/dev"
for n in null zero full random urandom tty; do
  : > "$r/dev/$n"
  mount --bind "/dev/$n" "$r/dev/$n"
  mount -o remount,bind,nosuid,noexec "$r/dev/$n"
done
mkdir -m 755 "$r/dev/pts" "$r/dev/shm"
mount -t devpts -o newinstance,ptmxmode=0666,mode=0620,nosuid,noexec bw-pts "$r/dev/pts"
ln -s pts/ptmx "$r/dev/ptmx"
ln -s /proc/self/fd "$r/dev/fd"
ln -s /proc/self/fd/0 "$r/dev/stdin"
ln -s /proc/self/fd/1 "$r/dev/stdout"
ln -s /proc/self/fd/2 "$r/dev/stderr"
mount -t tmpfs -o mode=1777,nosuid,nodev bw-shm "$r/dev/shm"
mount -t tmpfs -o ro,nosuid,nodev,noexec,mode=555,size=4k bw-sys "$r/sys"
mount -t tmpfs -o mode=1777,nosuid,nodev bw-tmp "$r/tmp"
mount -t tmpfs -o mode=1777,nosuid,nodev bw-tmp "$r/var/tmp"
mount -t tmpfs -o "mode=755,uid=$rootuid,gid=$rootuid,nosuid,nodev" bw-run "$r/run"
if [ "$capture" = 1 ]; then
  # The builder's /home (the bundle, a venv) is part of what a capture keeps: on the layer's tmpfs.
  mkdir -m 755 "$m/home"
  chown "$rootuid:$rootuid" "$m/home"
  mount --bind "$m/home" "$r/home"
  mount -o remount,bind,nosuid,nodev "$r/home"
else
  mount -t tmpfs -o "mode=755,uid=$rootuid,gid=$rootuid,nosuid,nodev" bw-home "$r/home"
fi
if [ -n "$layer" ] && [ -d "$m/layer/home" ] && [ ! -L "$m/layer/home" ]; then
  # The layer's /home, copied (its files belong to the builder's execute uid, kept as base+1),
  # then given to this sandbox's execute uid. Host binaries; nothing of the sandbox runs yet.
  cp -a "$m/layer/home/." "$r/home/"
  find "$r/home" -xdev -uid "$homeuid" -exec chown -h "$execuid" {} +
  find "$r/home" -xdev -gid "$homeuid" -exec chgrp -h "$execuid" {} +
fi
for p in home/sandbox home/sandbox/out; do
  if [ -L "$r/$p" ]; then echo "bw-init: /$p is a link" >&2; exit 1; fi
done
[ -d "$r${SANDBOX_HOME}" ] || mkdir -m 755 "$r${SANDBOX_HOME}"
chown -h "$execuid:$execuid" "$r${SANDBOX_HOME}"
if [ "$kind" != proxy ]; then
  [ -d "$r${SANDBOX_OUT}" ] || mkdir -m 755 "$r${SANDBOX_OUT}"
  chown -h "$execuid:$execuid" "$r${SANDBOX_OUT}"
fi
ro() {
  mount --bind "$1" "$2"
  mount -o remount,bind,ro,nosuid,nodev "$2"
}
mkdir -m 755 "$r${IMAGE_MOUNT}"
ro "$image" "$r${IMAGE_MOUNT}"
: > "$r${NODE_MOUNT}"
ro "$node" "$r${NODE_MOUNT}"
# The sandbox's wiring files, from its root-only directory (seal rewrites them there).
mkdir -m 755 "$r${CA_DIR}"
mount --bind "$dir/ca" "$r${CA_DIR}"
mount -o remount,bind,nosuid,nodev,noexec "$r${CA_DIR}"
place() {
  t="$r$2"
  if [ -L "$t" ] || [ ! -f "$t" ]; then rm -rf "$t"; mkdir -p "$(dirname "$t")"; : > "$t"; fi
  mount --bind "$dir/$1" "$t"
  mount -o remount,bind,nosuid,nodev,noexec "$t"
}
place hosts /etc/hosts
place resolv.conf /etc/resolv.conf
place ca-certificates.crt ${CA_BUNDLE}
# Into the new root; the host's tree is detached from this mount namespace.
cd "$r"
pivot_root . .
umount -l .
cd /
# PID 1 from here on: no capabilities, no new privileges, reaping orphans; it runs nothing more
# (the image's files are still exactly the export's when it starts).
exec setpriv --inh-caps=-all --bounding-set=-all --no-new-privs -- sh -c 'sleep infinity & echo ready; wait'
`;

/**
 * A builder's writable layer, in the agent's own mount namespace at `mnt` (the sandbox's init then
 * uses it instead of a tmpfs of its own): a tmpfs of `bytes`, on a private bind of `mnt` to
 * itself so that the mount propagates into no other mount namespace.
 */
async function mountCaptureLayer(mnt: string, bytes: number): Promise<void> {
  try {
    await must(["mount", "--bind", mnt, mnt]);
    await must(["mount", "--make-private", mnt]);
    await must(["mount", "-t", "tmpfs", "-o", `size=${bytes},mode=700,nosuid,nodev`, "bw-layer", mnt]);
    await must(["mount", "--make-private", mnt]);
  } catch (error) {
    await unmountCaptureLayer(dirname(mnt));
    throw error;
  }
}

/** Every mount the agent made at a sandbox's `mnt` (the layer's tmpfs and the bind below it). */
async function unmountCaptureLayer(dir: string): Promise<void> {
  const point = join(dir, "mnt");
  const mounted = () =>
    readFileSync("/proc/self/mountinfo", "utf8")
      .split("\n")
      .some((line) => line.split(" ")[4] === point);
  for (let i = 0; i < 4 && mounted(); i++) await run(["umount", "-l", point]);
}

/** Joins every cgroup.procs file given before `--`, then execs the rest (on the host side). */
export const CGROUP_JOIN = 'while [ "$1" != -- ]; do echo $$ > "$1"; shift; done; shift; exec "$@"';

export interface SandboxFiles {
  hosts: string;
  resolvConf: string;
}

/**
 * The per-sandbox files, in its root-only directory: bind-mounted over /etc/hosts,
 * /etc/resolv.conf and the CA bundle (a copy of the image's own), and `ca/` at CA_DIR. Owned by
 * the setup stage's uid until seal (the wiring writes them), 0644 (the execute stage cannot).
 */
function writeSandboxFiles(dir: string, rootUid: number, files: SandboxFiles, rootfs: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const own = (path: string, mode: number) => {
    chownSync(path, rootUid, rootUid);
    chmodSync(path, mode);
  };
  const put = (name: string, write: (path: string) => void) => {
    const path = join(dir, name);
    write(path);
    own(path, 0o644);
  };
  put("hosts", (p) => writeFileSync(p, files.hosts));
  put("resolv.conf", (p) => writeFileSync(p, files.resolvConf));
  put("ca-certificates.crt", (p) => copyFileSync(join(rootfs, CA_BUNDLE), p));
  mkdirSync(join(dir, "ca"), { mode: 0o755 });
  own(join(dir, "ca"), 0o755);
  mkdirSync(join(dir, "mnt"), { mode: 0o700 });
  writeFileSync(join(dir, "userns"), "");
}

// IPC too: System V IPC and POSIX message queues are per IPC namespace, and the host's (or another
// sandbox's) must not be reachable from a sandbox. The user namespace is checked through its file.
const NAMESPACES = ["mnt", "pid", "net", "ipc"] as const;
type NsIds = Record<(typeof NAMESPACES)[number], string>;

function nsIds(pid: number | "self"): NsIds | null {
  try {
    return Object.fromEntries(NAMESPACES.map((n) => [n, readlinkSync(`/proc/${pid}/ns/${n}`)])) as NsIds;
  } catch {
    return null;
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export class SandboxProcess {
  private exitedFlag = false;
  readonly exited: Promise<void>;

  private constructor(
    private readonly child: ChildProcess,
    /** Host PID of the sandbox's PID 1. */
    readonly initPid: number,
    /** The sandbox's host uid U; the execute stage runs as U+1. */
    readonly uid: number,
    /** Host uid of the setup stage (inner 0): ROOTFS_UID_BASE, or U in a proxy sandbox. */
    readonly setupUid: number,
    /** The sandbox's root-only directory (its files, its user namespace's file). */
    readonly dir: string,
    private readonly ns: NsIds,
    private readonly userNs: string,
    /** Its user namespace's limits as made (every namespace count 0), held again at seal. */
    private readonly userLimits: UserLimits,
    readonly cgroup: SandboxCgroup,
    /** Made with `capture`: its writable layer is mounted in the agent's namespace too. */
    readonly capturable: boolean,
  ) {
    this.exited = new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      child.once("exit", () => resolve());
    }).then(() => {
      this.exitedFlag = true;
    });
  }

  /** Host path of the user namespace's file (nsenter --user=). */
  private get userNsFile(): string {
    return join(this.dir, "userns");
  }

  static async start(options: {
    kind: SandboxKind;
    netns: string;
    uid: number;
    dir: string;
    files: SandboxFiles;
    /** Host directory with the proxy image's programs, mounted read-only at IMAGE_MOUNT. */
    imageDir: string;
    /** The work image's exported files: the overlay's lower layer. */
    rootfs: string;
    /** Bytes the sandbox's writable layer may hold (its memory limit). */
    layerBytes: number;
    /** Root-only directory for the uid-map helpers. */
    binDir: string;
    cgroup: SandboxCgroup;
    /** A setup image's builder: its writable layer and /home stay readable by the agent. */
    capture?: boolean;
    /** A stored setup layer's root (overlay form) to start from, over the work image. */
    layerRoot?: string | null;
  }): Promise<SandboxProcess> {
    const rootUid = options.kind === "proxy" ? options.uid : ROOTFS_UID_BASE;
    writeSandboxFiles(options.dir, rootUid, options.files, options.rootfs);
    const capture = options.capture === true;
    if (capture) await mountCaptureLayer(join(options.dir, "mnt"), options.layerBytes);
    let made: Awaited<ReturnType<typeof makeUserNamespace>>;
    try {
      made = await makeUserNamespace(options.dir, idMap(options.kind, options.uid), options.binDir);
    } catch (error) {
      if (capture) await unmountCaptureLayer(options.dir);
      throw error;
    }
    const { id: userNs, limits } = made;
    const child = spawn(
      "sh",
      [
        "-c",
        CGROUP_JOIN,
        "bw-cgroup",
        ...options.cgroup.procsFiles("init"),
        "--",
        "ip",
        "netns",
        "exec",
        options.netns,
        "unshare",
        "--mount",
        "--pid",
        "--ipc",
        "--fork",
        "--propagation",
        "private",
        "sh",
        "-c",
        INIT,
        "bw-init",
        options.dir,
        options.rootfs,
        options.imageDir,
        process.execPath,
        String(options.layerBytes),
        String(rootUid),
        String(options.uid + 1),
        options.kind,
        capture ? "1" : "0",
        options.layerRoot ?? "",
        // The builder's execute uid as the layer's root keeps it: the image's uid 1.
        String(ROOTFS_UID_BASE + 1),
      ],
      { env: BASE_ENV, stdio: ["ignore", "pipe", "pipe"], detached: true },
    );
    try {
      await waitReady(child);
      const unsharePid = child.pid as number;
      const children = readFileSync(`/proc/${unsharePid}/task/${unsharePid}/children`, "utf8").trim();
      const initPid = Number(children.split(/\s+/)[0]);
      const ns = nsIds(initPid);
      const mine = nsIds("self");
      const status = readFileSync(`/proc/${initPid}/status`, "utf8");
      const capEff = /^CapEff:\s+([0-9a-f]+)/m.exec(status)?.[1];
      // Never run anything unisolated: every namespace differs from the agent's, PID 1 holds no
      // capability, and the files the sandbox sees are the ones in its directory.
      if (!ns || !mine || NAMESPACES.some((n) => ns[n] === mine[n]) || !/^0+$/.test(capEff ?? "")) {
        throw new Error("the sandbox's init is not in namespaces of its own");
      }
      if (userNs === readlinkSync("/proc/self/ns/user")) {
        throw new Error("the sandbox's user namespace is the agent's");
      }
      for (const [name, target] of [
        ["hosts", "/etc/hosts"],
        ["resolv.conf", "/etc/resolv.conf"],
        ["ca-certificates.crt", CA_BUNDLE],
      ] as const) {
        if (statSync(join(options.dir, name)).ino !== statSync(`/proc/${initPid}/root${target}`).ino) {
          throw new Error(`the sandbox's ${target} is not its own copy`);
        }
      }
      child.stdout?.resume();
      child.stderr?.resume();
      return new SandboxProcess(
        child,
        initPid,
        options.uid,
        rootUid,
        options.dir,
        ns,
        userNs,
        limits,
        options.cgroup,
        capture,
      );
    } catch (error) {
      // The sandbox side first (its host-side parent then reaps it), then the parent.
      try {
        const pid = child.pid as number;
        for (const c of readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").split(/\s+/)) {
          if (c) process.kill(Number(c), "SIGKILL");
        }
      } catch {}
      setTimeout(() => child.kill("SIGKILL"), 1_000).unref();
      await releaseUserNamespace(options.dir);
      if (capture) await unmountCaptureLayer(options.dir);
      throw error;
    }
  }

  /**
   * Writes its user namespace's limits again from the host side (no process of the sandbox runs
   * for it) and reads them back; throws naming any that does not hold.
   */
  holdUserLimits(): Promise<void> {
    return holdUserLimits(this.userNsFile, this.userLimits);
  }

  /** Host path of PID 1's root: the sandbox's root directory, which nothing inside can move. */
  get rootPath(): string {
    return `/proc/${this.initPid}/root`;
  }

  /** Still running, in the namespaces it started in (a PID reused by another process is not). */
  isolated(): boolean {
    if (this.exitedFlag) return false;
    const now = nsIds(this.initPid);
    if (now === null || !NAMESPACES.every((n) => now[n] === this.ns[n])) return false;
    try {
      return `user:[${statSync(this.userNsFile).ino}]` === this.userNs;
    } catch {
      return false;
    }
  }

  /** The sandbox's processes (host PIDs) in its setup and execute leaves, PID 1 not among them. */
  processes(leaf: "setup" | "run" | "" = ""): number[] {
    const rels = leaf === "" ? ["setup", "run"] : [leaf];
    const pidNs = this.ns.pid;
    return rels.flatMap((rel) => this.cgroup.pids(rel)).filter((pid) => this.inSandbox(pid, pidNs));
  }

  /** Whether host PID `pid` runs inside the sandbox (not a host-side nsenter of it). */
  inSandbox(pid: number, pidNs = this.ns.pid): boolean {
    try {
      return readlinkSync(`/proc/${pid}/ns/pid`) === pidNs;
    } catch {
      return false;
    }
  }

  /**
   * SIGTERM to every process of the sandbox but its PID 1, so that a proxy gets to flush its last
   * audit batch before kill() takes the namespace down.
   */
  async terminate(): Promise<void> {
    await this.signalAll("SIGTERM");
  }

  /** SIGSTOP or SIGCONT to every process of the sandbox but its PID 1 (halting a run). */
  async freeze(frozen: boolean): Promise<void> {
    await this.signalAll(frozen ? "SIGSTOP" : "SIGCONT");
  }

  /**
   * SIGKILL to every process of the sandbox but its PID 1. A stopped process dies without being
   * continued, and none of them runs again once this returns.
   */
  async killAll(): Promise<void> {
    await this.signalAll("SIGKILL");
  }

  /**
   * From the host (no program of the sandbox runs for it): every process in the sandbox's exec
   * cgroups, a few rounds, so that one forked meanwhile is reached too.
   */
  private async signalAll(signal: NodeJS.Signals): Promise<void> {
    if (this.exitedFlag) return;
    const done = new Set<number>();
    for (let round = 0; round < 3; round++) {
      for (const pid of this.processes()) {
        if (done.has(pid)) continue;
        done.add(pid);
        try {
          process.kill(pid, signal);
        } catch {}
      }
      await sleep(10);
    }
  }

  /**
   * SIGKILL to PID 1 takes the whole PID namespace with it. The host-side parents (unshare,
   * nsenter) are left to reap their children and exit on their own: killed first, they would
   * leave zombies to the host's init. Then the user namespace's file is released.
   */
  async kill(): Promise<void> {
    if (!this.exitedFlag) {
      try {
        process.kill(this.initPid, "SIGKILL");
      } catch {}
      const timer = setTimeout(() => this.child.kill("SIGKILL"), 5_000);
      await this.exited;
      clearTimeout(timer);
    }
    await releaseUserNamespace(this.dir);
    if (this.capturable) await unmountCaptureLayer(this.dir);
  }

  /**
   * A builder's writable layer as the agent sees it (made with `capture`): the overlay's upper
   * directory and the directory bound at /home. Read only while nothing of the sandbox runs.
   */
  get captureTrees(): { upper: string; home: string } | null {
    if (!this.capturable) return null;
    return { upper: join(this.dir, "mnt", "upper"), home: join(this.dir, "mnt", "home") };
  }

  /**
   * The command line that runs argv in this sandbox, in the cgroup `leaf` (joined on the host
   * side, before anything of the sandbox runs). The requested environment is not in it: it
   * arrives as a shell script on fd 3 (see envScript) and applies only to the final program, so
   * neither setpriv nor nsenter (host root) ever runs with caller-chosen variables such as
   * LD_PRELOAD, and no value shows in the host's process list.
   *
   * setup: nsenter enters the namespaces and becomes inner root (0).
   * execute: privilege is dropped on the host side before anything is entered: no new privileges
   * and no inheritable capabilities (setpriv), then nsenter, which enters the namespaces and
   * becomes inner uid 1 (host U+1) itself, groups cleared, before it runs the first program of
   * the sandbox. No binary of the sandbox's filesystem ever runs as root in this stage.
   */
  execArgv(stage: "setup" | "execute", leaf: string, cwd: string, argv: readonly string[]): string[] {
    const enter = [
      "nsenter",
      `--user=${this.userNsFile}`,
      "-t",
      String(this.initPid),
      "--mount",
      "--pid",
      "--net",
      "--ipc",
    ];
    const command =
      stage === "setup"
        ? [...enter, "--"]
        : [
            "setpriv",
            "--no-new-privs",
            "--inh-caps=-all",
            "--",
            ...enter,
            // Inner uid 1 of the sandbox's user namespace: host uid U+1.
            "--setuid=1",
            "--setgid=1",
            "--",
          ];
    return [
      "sh",
      "-c",
      CGROUP_JOIN,
      "bw-cgroup",
      ...this.cgroup.procsFiles(leaf),
      "--",
      ...command,
      "sh",
      "-c",
      EXEC_WRAPPER,
      "bw-exec",
      cwd,
      ...argv,
    ];
  }
}

/**
 * Runs in the sandbox, as the stage's uid: enters the cwd, takes the caller's environment from
 * fd 3, execs argv. The program sees exactly PATH and HOME (defaults below), PWD (set by `cd`),
 * and the caller's variables, which override the defaults.
 */
const EXEC_WRAPPER = 'cd -- "$1" && unset OLDPWD && eval "$(cat <&3)" && exec 3<&- && shift && exec "$@"';

/** Environment for execs before the caller's variables apply (which override these). */
export const EXEC_BASE_ENV: Record<string, string> = {
  PATH: BASE_ENV.PATH as string,
  HOME: SANDBOX_HOME,
};

/** `export NAME='value'` lines; names are validated by the contract, values single-quoted. */
export function envScript(env: Record<string, string>): string {
  return Object.entries(env)
    .map(([k, v]) => `export ${k}='${v.replaceAll("'", "'\\''")}'\n`)
    .join("");
}

function waitReady(child: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    let out = "";
    let err = "";
    const timer = setTimeout(() => finish(new Error("the sandbox's init did not start within 10 s")), 10_000);
    const finish = (error?: Error) => {
      clearTimeout(timer);
      child.stdout?.off("data", onOut);
      child.off("exit", onExit);
      if (error) reject(error);
      else resolve();
    };
    const onOut = (d: Buffer) => {
      out += d.toString();
      if (out.includes("ready\n")) finish();
    };
    const onExit = () =>
      finish(new Error(`the sandbox's init exited: ${err.trim().split("\n").slice(-2).join("; ")}`));
    child.stdout?.on("data", onOut);
    child.stderr?.on("data", (d: Buffer) => {
      if (err.length < 4096) err += d.toString();
    });
    child.on("exit", onExit);
    child.on("error", (e) => finish(e));
  });
}
