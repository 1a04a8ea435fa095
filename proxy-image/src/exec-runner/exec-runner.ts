import { spawn } from "node:child_process";
import {
  closeSync,
  existsSync,
  fstatSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  renameSync,
  rmSync,
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import type {
  RunnerError,
  RunnerFreeze,
  RunnerSeal,
  RunnerStatus,
} from "@benchwright/shared/contract/exec-runner";
import { RunnerExecId } from "@benchwright/shared/contract/exec-runner";
import { EXEC_OUTPUT_LIMIT, outputPage } from "@benchwright/shared/contract/local-agent";
import { isSealing, joinCgroup, recordBaseline, seal as sealSetup } from "./exec-seal";

// `bw-exec`, the exec runner of the sandbox0 work pods and the E2B templates (contract:
// shared/contract/exec-runner.ts; command: main.ts). Each command runs detached from the
// call that started it, under a supervisor process, in a session of its own; its output and exit
// status go to files, so any later short call can read them whatever happened to the broker.
//
//   <base>/<uid>/<execId>/spec.json      argv, cwd, timeoutMs (env is the supervisor's own)
//   <base>/<uid>/<execId>/stdin          the command's stdin, removed once it has it open
//   <base>/<uid>/<execId>/stdout, stderr the command's output, written by the command itself
//   <base>/<uid>/<execId>/supervisor, pid  the supervisor's pid; the command's (= its session id)
//   <base>/<uid>/<execId>/exit           {"exitCode","signal"}, written once by rename
//   <base>/<uid>/.frozen                 this uid's sandbox is frozen: new commands stop at once
//   <base>/<uid>/<execId>/setup          a setup-stage command (exec-seal.ts: the setup cgroup,
//                                        the baseline, seal)
//
// `start` is idempotent by exec id (mkdir is the lock). One private directory per uid: root
// (E2B's poll and kill) finds an exec of any uid, so each uid's directory must be a directory
// that uid owns and nobody else can enter, or a sandbox user could plant a record root would act
// on. Linux only (sessions are found through /proc).

const MAX_WAIT_MS = 30_000;
const START_WAIT_MS = 10_000;
const KILL_WAIT_MS = 5_000;

/** The sandbox's own programs, run by node from beside this file when they are there (a pod). */
const PROGRAMS: Record<string, string> = { "bw-wiring": "wiring.cjs" };

export class Refusal extends Error {
  constructor(
    readonly code: RunnerError["error"],
    detail: string,
  ) {
    super(detail);
  }
}

/** What start needs besides the command: where state goes, and how to run the supervisor. */
export interface RunnerHost {
  base: string;
  /** This program's path and the node that runs it (a pod's node is a wrapper: BW_NODE). */
  self: string;
  node: string;
  /** The setup cgroup (exec-seal.ts), null where the host has no cgroup v2. */
  setupCgroup: string | null;
}

export interface StartSpec {
  argv: string[];
  cwd?: string;
  timeoutMs: number | null;
  /** A setup-stage command: in the setup cgroup, killed at seal; refused once sealed. */
  setup?: boolean;
  /** RLIMIT_NPROC of the command and all it starts (prlimit). */
  pids?: number;
  /** Set by start: the cgroup a setup command's supervisor joins. */
  cgroup?: string | null;
}

const uid = () => process.getuid?.() ?? 0;
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(test: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (test()) return true;
    if (Date.now() >= deadline) return false;
    await sleep(20);
  }
}

function checkId(execId: string): string {
  if (!RunnerExecId.safeParse(execId).success)
    throw new Refusal("bad_request", "an exec id is 1-64 of A-Z a-z 0-9 _ -");
  return execId;
}

/** Written aside and renamed: a reader never sees half a file. */
function writeAtomic(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { mode: 0o600 });
  renameSync(tmp, path);
}

function readNumber(path: string): number | null {
  try {
    const n = Number.parseInt(readFileSync(path, "utf8"), 10);
    return Number.isInteger(n) && n > 0 ? n : null;
  } catch {
    return null;
  }
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === "EPERM";
  }
}

// ---- directories ----

/** A uid's directory, checked: a directory (not a link), owned by that uid, closed to others. */
function checkOwned(dir: string, owner: number): string {
  const st = lstatSync(dir);
  if (!st.isDirectory() || st.uid !== owner || (st.mode & 0o077) !== 0) {
    throw new Refusal("unsafe", `${dir} is not a private directory of uid ${owner}`);
  }
  return dir;
}

/** This uid's directory under `base`, made on first use (and `base`, in a pod's empty volume). */
function ownDir(base: string): string {
  mkdirSync(base, { recursive: true, mode: 0o700 });
  const dir = join(base, String(uid()));
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if ((e as { code?: string }).code !== "EEXIST") throw e;
  }
  return checkOwned(dir, uid());
}

/** The uid directories this caller may act in: root's first, then (as root) every other uid's. */
function ownerDirs(base: string): { owner: number; dir: string }[] {
  const me = uid();
  const owners =
    me === 0 && existsSync(base)
      ? [
          0,
          ...readdirSync(base)
            .filter((n) => /^[0-9]+$/.test(n) && n !== "0")
            .map(Number),
        ]
      : [me];
  return owners.map((owner) => ({ owner, dir: join(base, String(owner)) }));
}

/** The directory of exec `execId`, its uid's directory checked; null when there is none. */
function findExec(base: string, execId: string): string | null {
  checkId(execId);
  for (const { owner, dir } of ownerDirs(base)) {
    if (!existsSync(join(dir, execId))) continue;
    checkOwned(dir, owner);
    return join(dir, execId);
  }
  return null;
}

function mustFind(base: string, execId: string): string {
  const dir = findExec(base, execId);
  if (dir === null) throw new Refusal("not_found", `no exec ${execId}`);
  return dir;
}

export interface RecordedExec {
  execId: string;
  dir: string;
  /** The command's pid (its session and group id) and its supervisor's, once known. */
  pid: number | null;
  supervisor: number | null;
  exited: boolean;
}

/** Every exec recorded under `base`, any uid's, unchecked: for whoever cleans up after tests. */
export function recordedExecs(base: string): RecordedExec[] {
  const out: RecordedExec[] = [];
  for (const owner of existsSync(base) ? readdirSync(base) : []) {
    if (!/^[0-9]+$/.test(owner)) continue;
    for (const execId of readdirSync(join(base, owner))) {
      if (!RunnerExecId.safeParse(execId).success) continue;
      const dir = join(base, owner, execId);
      out.push({
        execId,
        dir,
        pid: readNumber(join(dir, "pid")),
        supervisor: readNumber(join(dir, "supervisor")),
        exited: existsSync(join(dir, "exit")),
      });
    }
  }
  return out;
}

// ---- sessions ----

/** Pids of the processes in session `sid` (the command and everything it started, unless it
 * made a session of its own). */
function sessionMembers(sid: number): number[] {
  const out: number[] = [];
  let entries: string[] = [];
  try {
    entries = readdirSync("/proc");
  } catch {
    return out;
  }
  for (const entry of entries) {
    if (!/^[0-9]+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      // "pid (comm) state ppid pgrp session ...": comm may hold spaces and parentheses.
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(fields[3]) === sid) out.push(Number(entry));
    } catch {}
  }
  return out;
}

/** `signal` to the command's session and its process group; how many processes it reached. */
function signalSession(sid: number, signal: NodeJS.Signals): number {
  let signalled = 0;
  // Twice: a process forked while the first round ran is caught by the second.
  for (let round = 0; round < 2; round++) {
    for (const pid of sessionMembers(sid)) {
      try {
        process.kill(pid, signal);
        if (round === 0) signalled++;
      } catch {}
    }
  }
  // The group too: where /proc shows no session (or a member left it but not its group).
  try {
    process.kill(-sid, signal);
  } catch {}
  return signalled;
}

// ---- status ----

function readExit(dir: string): { exitCode: number | null; signal: string | null } | null {
  try {
    return JSON.parse(readFileSync(join(dir, "exit"), "utf8"));
  } catch {
    return null;
  }
}

/** The exit, or a lost one: a supervisor that died without recording an end leaves nobody to wait. */
function exitOf(dir: string): { exitCode: number | null; signal: string | null } | null {
  const exit = readExit(dir);
  if (exit !== null) return exit;
  const supervisor = readNumber(join(dir, "supervisor"));
  if (supervisor !== null && !alive(supervisor) && readExit(dir) === null) {
    return { exitCode: null, signal: null };
  }
  return exit;
}

/** Text of a stream file from byte offset `from` (or from the oldest of its last 1 MiB). */
function readStream(path: string, from: number, final: boolean): { text: string; end: number } {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch {
    return { text: "", end: 0 };
  }
  try {
    const size = fstatSync(fd).size;
    const begin = Math.min(Math.max(from, size - EXEC_OUTPUT_LIMIT, 0), size);
    const data = Buffer.alloc(size - begin);
    let got = 0;
    while (got < data.length) {
      const n = readSync(fd, data, got, data.length - got, begin + got);
      if (n === 0) break;
      got += n;
    }
    return outputPage(data.subarray(0, got), begin, from, final);
  } finally {
    closeSync(fd);
  }
}

function status(dir: string, execId: string, stdoutFrom: number, stderrFrom: number): RunnerStatus {
  const exit = exitOf(dir);
  const final = exit !== null;
  const out = readStream(join(dir, "stdout"), stdoutFrom, final);
  const err = readStream(join(dir, "stderr"), stderrFrom, final);
  return {
    execId,
    state: final ? "exited" : "running",
    exitCode: exit?.exitCode ?? null,
    signal: exit?.signal ?? null,
    stdout: out.text,
    stderr: err.text,
    stdoutEnd: out.end,
    stderrEnd: err.end,
  };
}

// ---- operations ----

/**
 * Starts exec `execId` as this uid, or finds it started (`created` says which). `env` is the
 * command's whole environment; it goes to the supervisor's, never to a file.
 */
export async function start(
  host: RunnerHost,
  execId: string,
  spec: StartSpec,
  env: NodeJS.ProcessEnv,
  stdin: Uint8Array | null,
): Promise<RunnerStatus> {
  checkId(execId);
  const uidDir = ownDir(host.base);
  const dir = join(uidDir, execId);
  if (spec.setup && !existsSync(dir)) {
    if (isSealing(uidDir)) throw new Refusal("sealed", "the setup stage has ended (sealed)");
    recordBaseline(uidDir);
    spec = { ...spec, cgroup: host.setupCgroup };
  }
  let created = true;
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if ((e as { code?: string }).code !== "EEXIST") throw e;
    created = false; // started before (a replayed call): answer for that one, start nothing
  }
  if (created) {
    writeFileSync(join(dir, "stdout"), "", { mode: 0o600 });
    writeFileSync(join(dir, "stderr"), "", { mode: 0o600 });
    if (stdin !== null) writeFileSync(join(dir, "stdin"), stdin, { mode: 0o600 });
    if (spec.setup) writeFileSync(join(dir, "setup"), "", { mode: 0o600 });
    writeAtomic(join(dir, "spec.json"), JSON.stringify(spec));
    const supervisor = spawn(host.node, [host.self, "supervise", dir, host.node], {
      detached: true,
      stdio: "ignore",
      env,
    });
    supervisor.on("error", () => {});
    supervisor.unref();
    if (supervisor.pid !== undefined) writeAtomic(join(dir, "supervisor"), String(supervisor.pid));
  }
  // Answer once the command runs (or could not start), so a poll right after never misses it.
  const begun = await until(
    () => existsSync(join(dir, "pid")) || exitOf(dir) !== null || !existsSync(join(dir, "supervisor")),
    START_WAIT_MS,
  );
  if (created && exitOf(dir) === null && (!begun || !existsSync(join(dir, "pid")))) {
    // The supervisor never got going: say so once, rather than "running" for ever.
    const supervisor = readNumber(join(dir, "supervisor"));
    if (supervisor !== null) signalSession(supervisor, "SIGKILL");
    writeFileSync(join(dir, "stderr"), "could not start: the supervisor did not start\n", { flag: "a" });
    writeAtomic(join(dir, "exit"), JSON.stringify({ exitCode: null, signal: null }));
  }
  return { ...status(dir, execId, 0, 0), created };
}

/** The detached parent of one command: starts it, enforces its timeout, records its exit. */
export function supervise(dir: string, node: string): void {
  const spec = JSON.parse(readFileSync(join(dir, "spec.json"), "utf8")) as StartSpec;
  const stdinPath = join(dir, "stdin");
  const stdin = existsSync(stdinPath) ? openSync(stdinPath, "r") : "ignore";
  const out = openSync(join(dir, "stdout"), "a");
  const err = openSync(join(dir, "stderr"), "a");
  // A setup command's supervisor joins the setup cgroup before it starts anything: the command
  // and all it forks are born there (if it cannot, seal still has the session and the sweep).
  if (spec.setup && spec.cgroup) joinCgroup(spec.cgroup, process.pid);
  const [name, ...args] = spec.argv as [string, ...string[]];
  const beside = PROGRAMS[name] && join(dirname(process.argv[1] as string), PROGRAMS[name]);
  let [file, argv] = beside && existsSync(beside) ? [node, [beside, ...args]] : [name, args];
  if (spec.pids !== undefined) {
    // An unprivileged uid may lower its own limits, never raise the hard one back.
    [file, argv] = ["prlimit", [`--nproc=${spec.pids}:${spec.pids}`, "--", file, ...argv]];
  }
  const frozenFile = join(dirname(dir), ".frozen");
  if (existsSync(frozenFile)) {
    // The sandbox is frozen: the command stops itself before it runs, and thaw continues it.
    [file, argv] = ["/bin/sh", ["-c", 'kill -STOP $$ && exec "$@"', "bw-frozen", file, ...argv]];
  }
  let done = false;
  const finish = (exitCode: number | null, signal: string | null) => {
    if (done) return;
    done = true;
    writeAtomic(join(dir, "exit"), JSON.stringify({ exitCode, signal }));
    process.exit(0);
  };
  // detached: the command leads a new session, so kill and freeze reach everything it starts.
  const child = spawn(file, argv, { cwd: spec.cwd, stdio: [stdin, out, err], detached: true });
  for (const fd of [stdin, out, err]) if (typeof fd === "number") closeSync(fd);
  child.on("spawn", () => {
    const pid = child.pid as number;
    writeAtomic(join(dir, "pid"), String(pid));
    try {
      unlinkSync(stdinPath);
    } catch {}
    // Frozen since the check above: this command stops with the others.
    if (existsSync(frozenFile)) signalSession(pid, "SIGSTOP");
    if (spec.timeoutMs !== null) setTimeout(() => signalSession(pid, "SIGKILL"), spec.timeoutMs).unref();
  });
  child.on("error", (e) => {
    // As the local agent says it: no exit code, for there was no process.
    writeFileSync(join(dir, "stderr"), `could not start: ${e.message}\n`, { flag: "a" });
    finish(null, null);
  });
  child.on("exit", (code, signal) => finish(code, signal));
}

/**
 * Status from the offsets, after waiting up to `waitMs` for the end or for output past them (a
 * caller waiting for a line, such as the tunnel's "listening", need not wait out the whole wait).
 */
export async function poll(
  base: string,
  execId: string,
  stdoutFrom: number,
  stderrFrom: number,
  waitMs: number,
): Promise<RunnerStatus> {
  const dir = mustFind(base, execId);
  const deadline = Date.now() + Math.min(waitMs, MAX_WAIT_MS);
  for (;;) {
    const s = status(dir, execId, stdoutFrom, stderrFrom);
    const news = s.stdoutEnd > stdoutFrom || s.stderrEnd > stderrFrom;
    if (s.state === "exited" || news || Date.now() >= deadline) return s;
    await sleep(50);
  }
}

/** SIGKILL to the command's session; the status once its end is recorded. Idempotent. */
export async function kill(base: string, execId: string): Promise<RunnerStatus> {
  const dir = mustFind(base, execId);
  if (exitOf(dir) === null) {
    // A start still under way: its command gets its pid in a moment.
    await until(() => existsSync(join(dir, "pid")) || exitOf(dir) !== null, START_WAIT_MS);
    const pid = readNumber(join(dir, "pid"));
    if (pid !== null && exitOf(dir) === null) signalSession(pid, "SIGKILL");
    await until(() => exitOf(dir) !== null, KILL_WAIT_MS);
  }
  return status(dir, execId, 0, 0);
}

/** SIGSTOP (or SIGCONT) to the session of every running exec this caller may act on. */
export function freeze(base: string, frozen: boolean): RunnerFreeze {
  ownDir(base); // this uid's mark even before its first exec
  let signalled = 0;
  for (const { owner, dir } of ownerDirs(base)) {
    if (!existsSync(dir)) continue;
    checkOwned(dir, owner);
    // The mark first: a command starting meanwhile stops itself (see supervise).
    if (frozen) writeFileSync(join(dir, ".frozen"), "");
    else rmSync(join(dir, ".frozen"), { force: true });
    for (const entry of readdirSync(dir)) {
      if (!RunnerExecId.safeParse(entry).success) continue;
      const exec = join(dir, entry);
      if (existsSync(join(exec, "exit"))) continue;
      const pid = readNumber(join(exec, "pid"));
      if (pid !== null) signalled += signalSession(pid, frozen ? "SIGSTOP" : "SIGCONT");
    }
  }
  return { frozen, signalled };
}

/**
 * Ends the setup stage of this uid's sandbox (exec-seal.ts): kills what it left, refuses setup
 * starts from then on. `sweep`: also every other process started since the first setup command.
 */
export function seal(
  host: Pick<RunnerHost, "base" | "setupCgroup">,
  options: { sweep: boolean; dryRun: boolean },
): Promise<RunnerSeal> {
  const uidDir = ownDir(host.base);
  const setupSessions: number[] = [];
  for (const entry of readdirSync(uidDir)) {
    if (!RunnerExecId.safeParse(entry).success) continue;
    const exec = join(uidDir, entry);
    if (!existsSync(join(exec, "setup")) || existsSync(join(exec, "exit"))) continue;
    const pid = readNumber(join(exec, "pid"));
    if (pid !== null) setupSessions.push(pid);
  }
  return sealSetup(uidDir, { ...options, cgroup: host.setupCgroup, setupSessions, signalSession });
}
