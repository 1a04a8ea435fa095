import { type ChildProcess, spawn } from "node:child_process";
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  readFileSync,
  readlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";
import { BASE_ENV } from "./command";

// A sandbox's processes (docs/local-backend.md, "What a sandbox is").
//
// The init is started as
//   ip netns exec NS unshare --mount --pid --ipc --fork --mount-proc --propagation private sh -c INIT
// INIT runs as host root in the new mount, PID and IPC namespaces (owned by the host's user
// namespace): it makes every mount, then enters a user namespace of its own in which inner uid 0
// is host uid U (the setup stage) and inner uid 1 is U+1 (the execute stage), and forbids
// further user namespaces in it. Mounts made before a user namespace is entered
// are locked for it, so the setup stage, though root in its user namespace, can neither unmount
// the tmpfs over /tmp (to reach the host's) nor /proc (to see the host's processes), nor mount
// anything: it owns neither the mount nor the PID namespace. Its PID-1 process is the init's
// child (the unshare parent stays in the host's PID namespace); commands enter it with nsenter.

export const SANDBOX_HOME = "/home/sandbox";
/** Where the proxy image's programs (proxy.cjs, wiring.cjs) appear, read-only, in every sandbox. */
export const IMAGE_MOUNT = "/run/bw-image";
/**
 * Where the agent's own node binary appears, read-only, in every sandbox: the image's programs run
 * on it. It is the Node the project pins (npm's `node` package, under the checkout), which the
 * sandbox cannot otherwise see: the checkout is hidden and /tmp is a tmpfs of the sandbox's own.
 */
export const NODE_MOUNT = "/run/bw-node";
export const CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt";

const INIT = `set -e
dir=$1 uid=$2 image=$3 node=$4
shift 4
mount --make-rprivate /
# Open the sandbox's files and the image directory first: the tmpfs mounts may cover them.
exec 4<"$dir/hosts" 5<"$dir/resolv.conf" 7<"$image" 8<"$node"
ca=0
if [ -f "$dir/ca-certificates.crt" ]; then exec 6<"$dir/ca-certificates.crt"; ca=1; fi
for d in /tmp /var/tmp /dev/shm; do
  if [ -d "$d" ]; then mount -t tmpfs -o mode=1777,nosuid,nodev bw-tmp "$d"; fi
done
mount -t tmpfs -o "mode=755,uid=$uid,gid=$uid,nosuid,nodev" bw-run /run
mkdir -m 755 ${IMAGE_MOUNT}
mount --no-canonicalize --bind /proc/self/fd/7 ${IMAGE_MOUNT}
mount -o remount,bind,ro,nosuid,nodev ${IMAGE_MOUNT}
: > ${NODE_MOUNT}
mount --no-canonicalize --bind /proc/self/fd/8 ${NODE_MOUNT}
mount -o remount,bind,ro,nosuid,nodev ${NODE_MOUNT}
mount -t tmpfs -o mode=755,nosuid,nodev bw-home /home
mkdir -m 1777 ${SANDBOX_HOME}
# Host directories a sandbox must not read (the checkout with its .data and any .dev.vars, the
# agent's state): each covered by an empty read-only tmpfs.
for hide in "$@"; do
  if [ -d "$hide" ]; then mount -t tmpfs -o ro,mode=555,nosuid,nodev,noexec bw-hidden "$hide"; fi
done
bind() {
  target=$2
  if [ -L "$target" ]; then target=$(readlink -m "$target"); fi
  case "$target" in
    /run/*|/tmp/*) mkdir -p "$(dirname "$target")"; [ -e "$target" ] || : > "$target" ;;
  esac
  if [ -f "$target" ]; then mount --no-canonicalize --bind "/proc/self/fd/$1" "$target"; fi
}
bind 4 /etc/hosts
bind 5 /etc/resolv.conf
if [ "$ca" = 1 ]; then bind 6 ${CA_BUNDLE}; fi
exec 4<&- 5<&- 6<&- 7<&- 8<&-
cd /
# unshare's --map-users asks newuidmap/newgidmap (setuid helpers that check /etc/subuid) to
# write the maps. We are root and may map any host uids, so a root-only helper writes them.
mkdir -m 700 /run/bw-bin
cat > /run/bw-bin/newuidmap <<'SHIM'
#!/bin/sh
case "$0" in *newuidmap) file=uid_map ;; *) file=gid_map ;; esac
pid=$1; shift; map=
while [ $# -ge 3 ]; do map="$map$1 $2 $3
"; shift 3; done
printf '%s' "$map" > "/proc/$pid/$file"
SHIM
cp /run/bw-bin/newuidmap /run/bw-bin/newgidmap
chmod 700 /run/bw-bin/newuidmap /run/bw-bin/newgidmap
# The user namespace maps inner 0 (setup stage) to U and inner 1 (execute stage) to U+1, and no
# one in it may make another (max_user_namespaces 0): so no process of the sandbox can get a
# mount namespace of its own in which to shadow /etc/hosts or the CA bundle.
exec setpriv --clear-groups env PATH="/run/bw-bin:$PATH" \\
  unshare --user --map-users="$uid,0,2" --map-groups="$uid,0,2" --setuid 0 --setgid 0 \\
  sh -c 'echo 0 > /proc/sys/user/max_user_namespaces && echo ready && while :; do sleep 86400 & wait; done'
`;

export interface SandboxFiles {
  hosts: string;
  resolvConf: string;
}

/**
 * The per-sandbox files, bind-mounted over /etc/hosts, /etc/resolv.conf and the CA bundle: in
 * a root-only directory, owned by U (the setup stage writes them), 0644 (the execute stage, U+1,
 * cannot).
 */
function writeSandboxFiles(dir: string, uid: number, files: SandboxFiles): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const put = (name: string, write: (path: string) => void) => {
    const path = join(dir, name);
    write(path);
    chownSync(path, uid, uid);
    chmodSync(path, 0o644);
  };
  put("hosts", (p) => writeFileSync(p, files.hosts));
  put("resolv.conf", (p) => writeFileSync(p, files.resolvConf));
  if (existsSync(CA_BUNDLE)) put("ca-certificates.crt", (p) => copyFileSync(CA_BUNDLE, p));
}

// IPC too: System V IPC and POSIX message queues are per IPC namespace, and the host's (or another
// sandbox's) must not be reachable from a sandbox.
const NAMESPACES = ["user", "mnt", "pid", "net", "ipc"] as const;
type NsIds = Record<(typeof NAMESPACES)[number], string>;

function nsIds(pid: number | "self"): NsIds | null {
  try {
    return Object.fromEntries(NAMESPACES.map((n) => [n, readlinkSync(`/proc/${pid}/ns/${n}`)])) as NsIds;
  } catch {
    return null;
  }
}

export class SandboxProcess {
  private exitedFlag = false;
  readonly exited: Promise<void>;

  private constructor(
    private readonly child: ChildProcess,
    /** Host PID of the sandbox's PID 1. */
    readonly initPid: number,
    /** Setup-stage host uid U; the execute stage runs as U+1. */
    readonly uid: number,
    private readonly ns: NsIds,
  ) {
    this.exited = new Promise<void>((resolve) => {
      if (child.exitCode !== null || child.signalCode !== null) resolve();
      child.once("exit", () => resolve());
    }).then(() => {
      this.exitedFlag = true;
    });
  }

  static async start(options: {
    netns: string;
    uid: number;
    dir: string;
    files: SandboxFiles;
    /** Host directory with the proxy image's programs, mounted read-only at IMAGE_MOUNT. */
    imageDir: string;
    /** Host directories hidden from the sandbox (empty read-only tmpfs over each). */
    hide: readonly string[];
  }): Promise<SandboxProcess> {
    writeSandboxFiles(options.dir, options.uid, options.files);
    const child = spawn(
      "ip",
      [
        "netns",
        "exec",
        options.netns,
        "unshare",
        "--mount",
        "--pid",
        "--ipc",
        "--fork",
        "--mount-proc",
        "--propagation",
        "private",
        "sh",
        "-c",
        INIT,
        "bw-init",
        options.dir,
        String(options.uid),
        options.imageDir,
        process.execPath,
        ...options.hide,
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
      const uid = /^Uid:\s+(\d+)/m.exec(status)?.[1];
      // Never run anything unisolated: every namespace differs from the agent's, and PID 1 is U.
      if (!ns || !mine || NAMESPACES.some((n) => ns[n] === mine[n]) || uid !== String(options.uid)) {
        throw new Error("the sandbox's init is not in namespaces of its own");
      }
      child.stdout?.resume();
      child.stderr?.resume();
      return new SandboxProcess(child, initPid, options.uid, ns);
    } catch (error) {
      // The sandbox side first (its host-side parent then reaps it), then the parent.
      try {
        const pid = child.pid as number;
        for (const c of readFileSync(`/proc/${pid}/task/${pid}/children`, "utf8").split(/\s+/)) {
          if (c) process.kill(Number(c), "SIGKILL");
        }
      } catch {}
      setTimeout(() => child.kill("SIGKILL"), 1_000).unref();
      throw error;
    }
  }

  /** Still running, in the namespaces it started in (a PID reused by another process is not). */
  isolated(): boolean {
    if (this.exitedFlag) return false;
    const now = nsIds(this.initPid);
    return now !== null && NAMESPACES.every((n) => now[n] === this.ns[n]);
  }

  /**
   * SIGTERM to every process of the sandbox but its PID 1 (from inside its PID namespace), so
   * that a proxy gets to flush its last audit batch before kill() takes the namespace down.
   */
  async terminate(): Promise<void> {
    await this.signalAll("TERM");
  }

  /** SIGSTOP or SIGCONT to every process of the sandbox but its PID 1 (halting a run). */
  async freeze(frozen: boolean): Promise<void> {
    await this.signalAll(frozen ? "STOP" : "CONT");
  }

  /**
   * SIGKILL to every process of the sandbox but its PID 1. A stopped process dies without being
   * continued, and none of them runs again once this returns.
   */
  async killAll(): Promise<void> {
    await this.signalAll("KILL");
  }

  private async signalAll(signal: "TERM" | "STOP" | "CONT" | "KILL"): Promise<void> {
    if (this.exitedFlag) return;
    await new Promise<void>((resolve) => {
      const c = spawn(
        "nsenter",
        ["-t", String(this.initPid), "--pid", "--mount", "--", "kill", `-${signal}`, "-1"],
        {
          env: BASE_ENV,
          stdio: "ignore",
        },
      );
      c.once("exit", () => resolve());
      c.once("error", () => resolve());
    });
  }

  /**
   * SIGKILL to PID 1 takes the whole PID namespace with it. The host-side parents (unshare,
   * nsenter) are left to reap their children and exit on their own: killed first, they would
   * leave zombies to the host's init.
   */
  async kill(): Promise<void> {
    if (this.exitedFlag) return;
    try {
      process.kill(this.initPid, "SIGKILL");
    } catch {}
    const timer = setTimeout(() => this.child.kill("SIGKILL"), 5_000);
    await this.exited;
    clearTimeout(timer);
  }

  /**
   * The command line that runs argv in this sandbox. The requested environment is not in it: it
   * arrives as a shell script on fd 3 (see envScript) and applies only to the final program, so
   * neither nsenter nor setpriv (host root) ever runs with caller-chosen variables such as
   * LD_PRELOAD, and no value shows in the host's process list.
   */
  execArgv(stage: "setup" | "execute", cwd: string, argv: readonly string[]): string[] {
    const enter =
      stage === "setup"
        ? ["nsenter", "-t", String(this.initPid), "--user", "--mount", "--pid", "--net", "--ipc", "--"]
        : [
            "nsenter",
            "-t",
            String(this.initPid),
            "--user",
            "--mount",
            "--pid",
            "--net",
            "--ipc",
            "--",
            "setpriv",
            // Inner uid 1 of the sandbox's user namespace: host uid U+1.
            "--reuid=1",
            "--regid=1",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
          ];
    return [...enter, "sh", "-c", EXEC_WRAPPER, "bw-exec", cwd, ...argv];
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
