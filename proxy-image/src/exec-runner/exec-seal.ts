import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { RunnerSeal } from "@benchwright/shared/contract/exec-runner";

// The end of the setup stage, for the exec runner (exec-runner.ts): setup-stage commands run in a
// cgroup of their own, and `seal` kills everything in it, then (with --sweep) every other process
// that started after the first setup command and is not the seal call's own ancestry.
//
// Why a cgroup: a daemon that double-forks (fork, setsid, fork) leaves its session and process
// group and is re-parented to PID 1, so no tree walk finds it; a child is always born in its
// parent's cgroup, and only a writer of cgroup.procs (root) moves it out. Why also the sweep:
// root can move itself out, and a service that setup starts through PID 1 (`systemctl start`,
// a package's postinst) is born in systemd's cgroup, not ours. Neither stops a root that hides
// deliberately (a mount over /proc/<pid>, code injected into an older process, a kernel module):
// in a VM whose setup stage is root, what holds the boundary is outside it (docs/e2b.md).
//
//   <base>/<uid>/.baseline   the processes alive when the first setup command started (pid and
//                            start time: a recycled pid is not the process it was)
//   <base>/<uid>/.sealing    written first: from then on a setup start is refused
//   <base>/<uid>/.sealed     the kills are done; a later seal kills nothing (idempotent)
//   <base>/<uid>/<execId>/setup   marks a setup exec (its session is killed at seal too)

const KILL_WAIT_MS = 5_000;
const SWEEP_ROUNDS = 20;
/** /proc/<pid>/stat flag of a kernel thread (PF_KTHREAD). */
const PF_KTHREAD = 0x00200000;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

export interface ProcEntry {
  pid: number;
  ppid: number;
  session: number;
  flags: number;
  /** Clock ticks after boot: with the pid, names one process for good. */
  start: number;
}

/** One process's /proc/<pid>/stat, parsed; null once it is gone. */
export function procEntry(pid: number): ProcEntry | null {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "utf8");
  } catch {
    return null;
  }
  // "pid (comm) state ppid pgrp session tty tpgid flags ... starttime(22)": comm may hold anything.
  const f = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  return {
    pid,
    ppid: Number(f[1]),
    session: Number(f[3]),
    flags: Number(f[6]),
    start: Number(f[19]),
  };
}

export function processTable(): ProcEntry[] {
  let names: string[] = [];
  try {
    names = readdirSync("/proc");
  } catch {}
  const out: ProcEntry[] = [];
  for (const n of names) {
    if (!/^[0-9]+$/.test(n)) continue;
    const e = procEntry(Number(n));
    if (e) out.push(e);
  }
  return out;
}

const key = (e: { pid: number; start: number }) => `${e.pid}:${e.start}`;

/** Where cgroup v2 is mounted (/sys/fs/cgroup on a current system), or null. */
export function cgroup2Mount(): string | null {
  let mounts = "";
  try {
    mounts = readFileSync("/proc/self/mounts", "utf8");
  } catch {
    return null;
  }
  const points = mounts
    .split("\n")
    .map((l) => l.split(" "))
    .filter((f) => f[2] === "cgroup2" && f[1] !== undefined && !f[1].includes("\\"))
    .map((f) => f[1] as string);
  return points.includes("/sys/fs/cgroup") ? "/sys/fs/cgroup" : (points[0] ?? null);
}

/** The setup cgroup's path: BW_EXEC_SETUP_CGROUP, else bw-setup under the cgroup v2 mount. */
export function setupCgroupPath(env: NodeJS.ProcessEnv = process.env): string | null {
  if (env.BW_EXEC_SETUP_CGROUP) return env.BW_EXEC_SETUP_CGROUP;
  const mount = cgroup2Mount();
  return mount === null ? null : join(mount, "bw-setup");
}

/** Moves process `pid` into the cgroup at `path` (made if need be); false if that cannot be. */
export function joinCgroup(path: string, pid: number): boolean {
  try {
    mkdirSync(path);
  } catch (e) {
    if ((e as { code?: string }).code !== "EEXIST") return false;
  }
  try {
    writeFileSync(join(path, "cgroup.procs"), String(pid));
    return true;
  } catch {
    return false;
  }
}

function cgroupMembers(path: string): number[] {
  try {
    return readFileSync(join(path, "cgroup.procs"), "utf8")
      .split("\n")
      .filter(Boolean)
      .map(Number)
      .filter((n) => Number.isInteger(n) && n > 0);
  } catch {
    return [];
  }
}

function signal(pid: number, sig: NodeJS.Signals): boolean {
  try {
    process.kill(pid, sig);
    return true;
  } catch {
    return false;
  }
}

/** Records which processes exist before the setup stage's first command (once per uid dir). */
export function recordBaseline(uidDir: string): void {
  const file = join(uidDir, ".baseline");
  if (existsSync(file)) return;
  const entries = processTable().map(key);
  try {
    writeFileSync(file, JSON.stringify(entries), { flag: "wx", mode: 0o600 });
  } catch {} // another start wrote it first: that one is the baseline
}

export const isSealing = (uidDir: string) =>
  existsSync(join(uidDir, ".sealing")) || existsSync(join(uidDir, ".sealed"));

/** The pids the sweep would take now: new since the baseline, not ours, not the kernel's. */
export function sweepCandidates(uidDir: string): number[] {
  let baseline: Set<string>;
  try {
    baseline = new Set(JSON.parse(readFileSync(join(uidDir, ".baseline"), "utf8")) as string[]);
  } catch {
    return []; // no setup command ever ran: nothing started since
  }
  const table = processTable();
  const byPid = new Map(table.map((e) => [e.pid, e]));
  const ours = new Set<number>();
  for (let p = byPid.get(process.pid); p && !ours.has(p.pid); p = byPid.get(p.ppid)) ours.add(p.pid);
  return table
    .filter((e) => e.pid !== 1 && e.pid !== 2 && e.ppid !== 2 && (e.flags & PF_KTHREAD) === 0)
    .filter((e) => !ours.has(e.pid) && !baseline.has(key(e)))
    .map((e) => e.pid);
}

/**
 * Kills what the setup stage left: the setup cgroup's members, the sessions of setup execs still
 * running, and with `sweep` everything else started since the baseline. Idempotent: once sealed,
 * nothing more is killed. `dryRun` kills nothing and lists the sweep's candidates.
 */
export async function seal(
  uidDir: string,
  options: {
    cgroup: string | null;
    sweep: boolean;
    dryRun: boolean;
    /** The session of each setup exec that has not exited (the runner's records). */
    setupSessions: number[];
    signalSession: (sid: number, sig: NodeJS.Signals) => number;
  },
): Promise<RunnerSeal> {
  if (options.dryRun) {
    const members = options.cgroup === null ? [] : cgroupMembers(options.cgroup);
    return {
      killed: 0,
      cgroup: options.cgroup !== null && existsSync(options.cgroup),
      sessions: 0,
      swept: 0,
      already: existsSync(join(uidDir, ".sealed")),
      candidates: [...new Set([...members, ...sweepCandidates(uidDir)])],
    };
  }
  if (existsSync(join(uidDir, ".sealed"))) {
    return { killed: 0, cgroup: false, sessions: 0, swept: 0, already: true };
  }
  writeFileSync(join(uidDir, ".sealing"), "");
  const killed = new Set<string>();
  const kill = (pid: number) => {
    const e = procEntry(pid);
    if (e && signal(pid, "SIGKILL")) killed.add(key(e));
  };

  // 1. The cgroup: the kernel kills every member at once (cgroup.kill, Linux 5.14), else member
  // by member until it is empty (a process forked meanwhile is a member too, and goes next round).
  let cgroup = false;
  if (options.cgroup !== null && existsSync(options.cgroup)) {
    cgroup = true;
    const before = cgroupMembers(options.cgroup);
    for (const pid of before) {
      const e = procEntry(pid);
      if (e) killed.add(key(e));
    }
    try {
      writeFileSync(join(options.cgroup, "cgroup.kill"), "1");
    } catch {}
    const deadline = Date.now() + KILL_WAIT_MS;
    for (;;) {
      const members = cgroupMembers(options.cgroup);
      if (members.length === 0 || Date.now() >= deadline) break;
      for (const pid of members) kill(pid);
      await sleep(20);
    }
    try {
      rmdirSync(options.cgroup);
    } catch {}
  }

  // 2. The setup execs' sessions (where there was no cgroup to put them in).
  let sessions = 0;
  for (const sid of options.setupSessions) {
    const e = procEntry(sid);
    sessions += options.signalSession(sid, "SIGKILL");
    if (e) killed.add(key(e));
  }

  // 3. The sweep: stop every candidate (so none forks on), round after round, then kill them all.
  let swept = 0;
  if (options.sweep) {
    const stopped = new Map<string, number>();
    for (let round = 0; round < SWEEP_ROUNDS; round++) {
      const fresh = sweepCandidates(uidDir)
        .map(procEntry)
        .filter((e): e is ProcEntry => e !== null && !stopped.has(key(e)));
      if (fresh.length === 0) break;
      for (const e of fresh) if (signal(e.pid, "SIGSTOP")) stopped.set(key(e), e.pid);
    }
    for (const [k, pid] of stopped) {
      if (signal(pid, "SIGKILL")) {
        if (!killed.has(k)) swept++;
        killed.add(k);
      }
    }
  }

  writeFileSync(join(uidDir, ".sealed"), "");
  return { killed: killed.size, cgroup, sessions, swept, already: false };
}
