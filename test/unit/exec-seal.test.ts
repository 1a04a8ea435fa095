import { spawnSync } from "node:child_process";
import {
  chmodSync,
  copyFileSync,
  existsSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmdirSync,
  rmSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { RUNNER_EXIT, type RunnerSeal, type RunnerStatus } from "@benchwright/shared/contract/exec-runner";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { recordedExecs } from "../../proxy-image/src/exec-runner/exec-runner";
import { cgroup2Mount, procEntry } from "../../proxy-image/src/exec-runner/exec-seal";

// The end of the setup stage in the exec runner (proxy-image/src/exec-runner/exec-seal.ts, as bw-exec seal),
// for real: real processes, a real cgroup v2 (this machine mounts one; the test makes a cgroup of
// its own under it and points the runner at it with BW_EXEC_SETUP_CGROUP, so nothing else on the
// machine is touched), real sessions and signals. The sweep is run as a dry run only: for real it
// would take every process started on this machine since the first setup command, which is what
// it is for in a microVM and nothing a test on a shared machine may do.

const RUNNER = resolve(import.meta.dirname, "../../proxy-image/dist/exec-runner.cjs");
const ROOT = process.getuid?.() === 0;
const CGROUP2 = cgroup2Mount();
let dir: string;
const cgroups: string[] = [];

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "bw-seal-"));
  chmodSync(dir, 0o755);
});
afterAll(() => {
  for (const exec of recordedExecs(dir)) {
    for (const pid of [exec.pid, exec.supervisor]) {
      if (pid === null) continue;
      for (const target of [-pid, pid]) {
        try {
          process.kill(target, "SIGKILL");
        } catch {}
      }
    }
  }
  for (const pid of daemons) {
    try {
      process.kill(pid, "SIGKILL");
    } catch {}
  }
  for (const cg of cgroups) {
    try {
      rmdirSync(cg);
    } catch {}
  }
  rmSync(dir, { recursive: true, force: true });
});

const daemons: number[] = [];
const uniq = () => `t_${Math.random().toString(36).slice(2, 10)}`;

function runner(
  state: string,
  args: string[],
  o: { env?: Record<string, string>; uid?: number } = {},
): { code: number | null; reply: unknown; stderr: string } {
  const other = o.uid !== undefined;
  const res = spawnSync(
    other ? copyOf(process.execPath, "node", 0o755) : process.execPath,
    [other ? copyOf(RUNNER, "exec-runner.cjs", 0o644) : RUNNER, ...args],
    {
      cwd: dir,
      env: { PATH: process.env.PATH ?? "/usr/bin:/bin", BW_EXEC_DIR: state, ...o.env },
      ...(other ? { uid: o.uid, gid: o.uid } : {}),
      encoding: "utf8",
      timeout: 30_000,
    },
  );
  let reply: unknown = null;
  try {
    reply = JSON.parse(res.stdout.trimEnd().split("\n").at(-1) ?? "");
  } catch {}
  return { code: res.status, reply, stderr: res.stderr };
}

/** A file another uid can run: the checkout may be below a directory it cannot enter. */
function copyOf(path: string, name: string, mode: number): string {
  const copy = join(dir, name);
  if (!existsSync(copy)) {
    try {
      if (name === "node") linkSync(path, copy);
      else copyFileSync(path, copy);
    } catch {
      copyFileSync(path, copy);
    }
    chmodSync(copy, mode);
  }
  return copy;
}

function untilExited(state: string, id: string, o: { uid?: number } = {}): RunnerStatus {
  for (let i = 0; i < 60; i++) {
    const s = runner(state, ["poll", id, "0", "0", "1000"], o).reply as RunnerStatus;
    if (s.state === "exited") return s;
  }
  throw new Error(`${id} did not exit`);
}

/** Processes and threads of `uid` now: RLIMIT_NPROC counts both (node's supervisor has several). */
function uidTasks(uid: number): { tasks: number; sleeps: number } {
  let tasks = 0;
  let sleeps = 0;
  for (const e of readdirSync("/proc")) {
    if (!/^[0-9]+$/.test(e)) continue;
    try {
      const status = readFileSync(`/proc/${e}/status`, "utf8");
      if (!new RegExp(`^Uid:\\s+${uid}\\s`, "m").test(status)) continue;
      tasks += Number(/^Threads:\s+(\d+)/m.exec(status)?.[1] ?? 1);
      if (/^Name:\s+sleep$/m.test(status)) sleeps++;
    } catch {}
  }
  return { tasks, sleeps };
}

/** Waits (up to 2 s) for a killed process to be gone: SIGKILL is delivered, not instant. */
function gone(pid: number): boolean {
  const deadline = Date.now() + 2_000;
  while (alive(pid) && Date.now() < deadline) spawnSync("sleep", ["0.05"]);
  return !alive(pid);
}

/** A live (not zombie) process. */
function alive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const state = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0];
    return state !== "Z" && state !== "X";
  } catch {
    return false;
  }
}

/**
 * A setup command that leaves a double-forked daemon: a subshell that makes a session of its
 * own (setsid) and forks again, the parent gone at once, so the daemon is re-parented and in
 * neither the command's session nor its process group. Its pid is written to `pidFile`.
 */
const doubleFork = (pidFile: string) => [
  "sh",
  "-c",
  `setsid sh -c 'sh -c "echo \\$\\$ > ${pidFile}; exec sleep 300" & exit 0' ; sleep 0.3; echo started`,
];

function daemonPid(pidFile: string): number {
  const pid = Number(readFileSync(pidFile, "utf8").trim());
  daemons.push(pid);
  return pid;
}

describe.runIf(ROOT && CGROUP2 !== null)("bw-exec seal, with a cgroup v2 (real)", { timeout: 60_000 }, () => {
  it("kills a double-forked setup daemon through the setup cgroup; a process from before survives; G3", () => {
    // case G3
    const state = join(dir, uniq());
    mkdirSync(state, { mode: 0o755 });
    const cgroup = join(CGROUP2 as string, `bw-test-${uniq()}`);
    cgroups.push(cgroup);
    const env = { BW_EXEC_SETUP_CGROUP: cgroup };
    // The tunnel's place: started before setup, not a setup command.
    const before = uniq();
    expect(runner(state, ["start", before, "-", "0", "--", "sleep", "300"], { env }).code).toBe(0);
    const beforePid = Number(readFileSync(join(state, "0", before, "pid"), "utf8"));

    const setup = uniq();
    const pidFile = join(dir, `${setup}.pid`);
    const started = runner(state, ["start", setup, "-", "0", "--setup", "--", ...doubleFork(pidFile)], {
      env,
    });
    expect(started.code).toBe(0);
    expect(untilExited(state, setup)).toMatchObject({ exitCode: 0, stdout: "started\n" });
    const daemon = daemonPid(pidFile);
    expect(alive(daemon)).toBe(true);
    // Out of the command's session and group, in the setup cgroup.
    const session = procEntry(daemon)?.session;
    expect(session).not.toBe(Number(readFileSync(join(state, "0", setup, "pid"), "utf8")));
    expect(readFileSync(join(cgroup, "cgroup.procs"), "utf8").split("\n")).toContain(String(daemon));

    const dry = runner(state, ["seal", "--dry-run"], { env }).reply as RunnerSeal;
    expect(dry.candidates).toContain(daemon);
    expect(dry.candidates).not.toContain(beforePid);
    expect(alive(daemon)).toBe(true);

    const sealed = runner(state, ["seal"], { env });
    expect(sealed.code).toBe(0);
    expect(sealed.reply).toMatchObject({ cgroup: true, already: false, swept: 0 });
    expect((sealed.reply as RunnerSeal).killed).toBeGreaterThanOrEqual(1);
    expect(gone(daemon)).toBe(true);
    expect(alive(beforePid)).toBe(true);
    expect(existsSync(cgroup)).toBe(false);

    // Sealed: a setup start is refused, an execute one is not; a second seal kills nothing.
    const late = runner(state, ["start", uniq(), "-", "0", "--setup", "--", "true"], { env });
    expect(late.code).toBe(RUNNER_EXIT.sealed);
    expect(late.reply).toMatchObject({ error: "sealed" });
    const plain = uniq();
    expect(runner(state, ["start", plain, "-", "0", "--", "true"], { env }).code).toBe(0);
    expect(runner(state, ["seal"], { env }).reply).toEqual({
      killed: 0,
      cgroup: false,
      sessions: 0,
      swept: 0,
      already: true,
    });
    expect(alive(beforePid)).toBe(true);
  });

  it("every process of a burst in sessions of their own is killed with the setup cgroup", () => {
    const state = join(dir, uniq());
    mkdirSync(state, { mode: 0o755 });
    const cgroup = join(CGROUP2 as string, `bw-test-${uniq()}`);
    cgroups.push(cgroup);
    const env = { BW_EXEC_SETUP_CGROUP: cgroup };
    // Five daemons, each in a session of its own, each with three more in sessions of theirs.
    const burst = uniq();
    const script =
      "for i in 1 2 3 4 5; do setsid sh -c 'for j in 1 2 3; do setsid sleep 300 & done; exec sleep 300' & done; sleep 0.5";
    expect(runner(state, ["start", burst, "-", "0", "--setup", "--", "sh", "-c", script], { env }).code).toBe(
      0,
    );
    untilExited(state, burst);
    const members = readFileSync(join(cgroup, "cgroup.procs"), "utf8")
      .split("\n")
      .filter(Boolean)
      .map(Number);
    expect(members.length).toBeGreaterThanOrEqual(20);
    daemons.push(...members);
    const sealed = runner(state, ["seal"], { env }).reply as RunnerSeal;
    expect(sealed.killed).toBeGreaterThanOrEqual(20);
    for (const pid of members) expect(gone(pid)).toBe(true);
  });
});

describe.runIf(ROOT)("bw-exec seal without a cgroup (real)", { timeout: 60_000 }, () => {
  it("kills a setup command's session still running; the sweep finds a double-forked daemon", () => {
    const state = join(dir, uniq());
    mkdirSync(state, { mode: 0o755 });
    // A cgroup path that cannot be made: the host has none to give.
    const env = { BW_EXEC_SETUP_CGROUP: join(dir, "no-cgroup-here", "bw-setup") };
    const before = uniq();
    runner(state, ["start", before, "-", "0", "--", "sleep", "300"], { env });
    const beforePid = Number(readFileSync(join(state, "0", before, "pid"), "utf8"));
    const running = uniq();
    runner(state, ["start", running, "-", "0", "--setup", "--", "sh", "-c", "sleep 300 & sleep 300"], {
      env,
    });
    const runningPid = Number(readFileSync(join(state, "0", running, "pid"), "utf8"));
    const forked = uniq();
    const pidFile = join(dir, `${forked}.pid`);
    runner(state, ["start", forked, "-", "0", "--setup", "--", ...doubleFork(pidFile)], { env });
    untilExited(state, forked);
    const daemon = daemonPid(pidFile);

    const dry = runner(state, ["seal", "--dry-run"], { env }).reply as RunnerSeal;
    expect(dry.cgroup).toBe(false);
    expect(dry.candidates).toContain(daemon);
    expect(dry.candidates).toContain(runningPid);
    expect(dry.candidates).not.toContain(beforePid);
    expect(dry.candidates).not.toContain(process.pid);

    const sealed = runner(state, ["seal"], { env }).reply as RunnerSeal;
    expect(sealed).toMatchObject({ cgroup: false, swept: 0, already: false });
    expect(sealed.sessions).toBeGreaterThanOrEqual(2);
    expect(gone(runningPid)).toBe(true);
    expect(untilExited(state, running).signal).toBe("SIGKILL");
    // Without a cgroup and without --sweep, a double-forked daemon is out of reach: the E2B
    // backend always seals with --sweep (docs/e2b.md); here it is killed by the test.
    expect(alive(daemon)).toBe(true);
    expect(alive(beforePid)).toBe(true);
  });
});

describe.runIf(ROOT)("bw-exec --pids (real)", { timeout: 60_000 }, () => {
  it("holds the execute uid's processes at RLIMIT_NPROC: a fork bomb cannot grow past it", () => {
    // uid 1000 runs nothing else here, so its process count is the command's alone.
    const state = join(dir, uniq());
    mkdirSync(state);
    chmodSync(state, 0o1777);
    const id = uniq();
    // sh forks until the kernel says no (dash then gives up: "Cannot fork", exit 2).
    const bomb = `for i in ${"x ".repeat(60)}; do sleep 5 & done; wait`;
    const r = runner(state, ["start", id, "20000", "0", "--pids", "30", "--", "sh", "-c", bomb], {
      uid: 1000,
    });
    expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: "" });
    const running = uidTasks(1000);
    const done = untilExited(state, id, { uid: 1000 });
    expect(done.stderr).toMatch(/cannot fork/i);
    expect(done.exitCode).not.toBe(0);
    // It made some, never past the limit: the supervisor's threads, sh and its sleeps together.
    expect(running.tasks).toBeLessThanOrEqual(30);
    expect(running.sleeps).toBeGreaterThan(0);
    expect(running.sleeps).toBeLessThan(30);
  });
});
