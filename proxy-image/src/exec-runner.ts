import { spawn } from "node:child_process";
import {
  closeSync,
  existsSync,
  fstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  readSync,
  renameSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { dirname, join } from "node:path";
import {
  POD_PATHS,
  RUNNER_EXIT,
  type RunnerError,
  RunnerExecId,
  type RunnerFreeze,
  RunnerStart,
  type RunnerStatus,
} from "../../src/broker/kubernetes/runner-wire";

// The exec runner of a sandbox0 work pod (contract: src/broker/kubernetes/runner-wire.ts). Each
// command runs detached from the Kubernetes exec that started it, under a supervisor process,
// in a session of its own; its output and exit status go to files under BW_EXEC_DIR/<execId>/,
// so any later short exec can read them, whatever happened to the broker in between.
//
// Files of an exec: spec.json (the RunnerStart), stdin, out, err, pid (the command's pid, which
// is also its session and process group id), exit.json ({exitCode, signal}, written once by
// rename). Linux only (sessions are found through /proc).

const OUTPUT_LIMIT = 1024 * 1024;
const MAX_WAIT_MS = 10_000;
const START_WAIT_MS = 10_000;
const MAX_SPEC_BYTES = 4 * 1024 * 1024;

const execRoot = () => process.env.BW_EXEC_DIR || POD_PATHS.execDir;
/** The node that runs this program (a wrapper in the pod: node there runs from /bw/tools). */
const nodeBin = () => process.env.BW_NODE || process.execPath;
const self = () => process.argv[1] as string;

/** The sandbox's own programs, by the names the coordinator uses; next to this file. */
const PROGRAMS: Record<string, string> = { "bw-wiring": "wiring.cjs" };

class Refusal extends Error {
  constructor(
    readonly code: RunnerError["error"],
    detail: string,
  ) {
    super(detail);
  }
}

function execDir(execId: string): string {
  if (!RunnerExecId.safeParse(execId).success) throw new Refusal("bad_request", "bad exec id");
  return join(execRoot(), execId);
}

function readJson<T>(path: string): T | null {
  try {
    return JSON.parse(readFileSync(path, "utf8")) as T;
  } catch {
    return null;
  }
}

/** Written aside and renamed: a reader never sees half a file. */
function writeAtomic(path: string, text: string): void {
  const tmp = `${path}.tmp-${process.pid}`;
  writeFileSync(tmp, text, { mode: 0o600 });
  renameSync(tmp, path);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function until(test: () => boolean, ms: number): Promise<boolean> {
  const deadline = Date.now() + ms;
  for (;;) {
    if (test()) return true;
    if (Date.now() >= deadline) return false;
    await sleep(20);
  }
}

// ---- output windows (the same paging as the local agent's OutputBuffer) ----

/** Length of the longest prefix that does not end inside a multi-byte UTF-8 character. */
function completeUtf8Length(data: Buffer): number {
  for (let back = 1; back <= Math.min(4, data.length); back++) {
    const byte = data[data.length - back] as number;
    if ((byte & 0xc0) === 0x80) continue;
    const need = byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : byte >= 0xc0 ? 2 : 1;
    return need > back ? data.length - back : data.length;
  }
  return data.length;
}

/**
 * Text of `path` from byte offset `from` (or from the oldest of its last 1 MiB) and the offset
 * to ask from next, cut on UTF-8 boundaries; a character still being written waits unless final.
 */
function readWindow(path: string, from: number, final: boolean): { text: string; end: number } {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch {
    return { text: "", end: 0 };
  }
  try {
    const size = fstatSync(fd).size;
    const start = Math.max(0, size - OUTPUT_LIMIT);
    let begin = Math.min(Math.max(from, start), size);
    let data = Buffer.alloc(size - begin);
    const got = data.length > 0 ? readSync(fd, data, 0, data.length, begin) : 0;
    data = data.subarray(0, got);
    if (from < start) {
      let skip = 0;
      while (skip < data.length && skip < 3 && ((data[skip] as number) & 0xc0) === 0x80) skip++;
      data = data.subarray(skip);
      begin += skip;
    }
    if (!final) data = data.subarray(0, completeUtf8Length(data));
    return { text: data.toString("utf8"), end: begin + data.length };
  } finally {
    closeSync(fd);
  }
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
  return signalled;
}

const pidOf = (dir: string): number | null => readJson<{ pid: number }>(join(dir, "pid"))?.pid ?? null;
const exitOf = (dir: string) =>
  readJson<{ exitCode: number | null; signal: string | null }>(join(dir, "exit.json"));

// ---- operations ----

function status(execId: string, stdoutFrom: number, stderrFrom: number): RunnerStatus {
  const dir = execDir(execId);
  if (!existsSync(dir)) throw new Refusal("not_found", `no exec ${execId}`);
  const exit = exitOf(dir);
  const final = exit !== null;
  const out = readWindow(join(dir, "out"), stdoutFrom, final);
  const err = readWindow(join(dir, "err"), stderrFrom, final);
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

async function start(execId: string, specLine: string): Promise<RunnerStatus> {
  const dir = execDir(execId);
  mkdirSync(execRoot(), { recursive: true, mode: 0o700 });
  let fresh = true;
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if ((e as { code?: string }).code !== "EEXIST") throw e;
    fresh = false; // started before (a replayed call): answer for that one, start nothing
  }
  if (fresh) {
    let spec: RunnerStart;
    try {
      spec = RunnerStart.parse(JSON.parse(specLine));
    } catch {
      rmSync(dir, { recursive: true, force: true });
      throw new Refusal("bad_request", "stdin is not one RunnerStart line");
    }
    writeAtomic(join(dir, "spec.json"), JSON.stringify(spec));
    const supervisor = spawn(nodeBin(), [self(), "supervise", execId], {
      detached: true,
      stdio: "ignore",
      env: process.env,
    });
    supervisor.on("error", () => {});
    supervisor.unref();
  }
  const begun = await until(
    () => existsSync(join(dir, "pid")) || existsSync(join(dir, "exit.json")),
    START_WAIT_MS,
  );
  if (!begun && fresh) {
    // The supervisor never got going: say so once, rather than "running" for ever.
    writeFileSync(join(dir, "err"), "could not start: the supervisor did not start\n", { flag: "a" });
    writeAtomic(join(dir, "exit.json"), JSON.stringify({ exitCode: null, signal: null }));
  }
  return status(execId, 0, 0);
}

/** The detached parent of one command: starts it, enforces its timeout, records its exit. */
function supervise(execId: string): void {
  const dir = execDir(execId);
  const spec = RunnerStart.parse(JSON.parse(readFileSync(join(dir, "spec.json"), "utf8")));
  const outFd = openSync(join(dir, "out"), "a", 0o600);
  const errFd = openSync(join(dir, "err"), "a", 0o600);
  let inFd: number | "ignore" = "ignore";
  if (spec.stdin !== undefined) {
    writeFileSync(join(dir, "stdin"), spec.stdin, { mode: 0o600 });
    inFd = openSync(join(dir, "stdin"), "r");
  }
  const [name, ...args] = spec.argv as [string, ...string[]];
  const program = PROGRAMS[name];
  let [file, argv] = program ? [nodeBin(), [join(dirname(self()), program), ...args]] : [name, args];
  const frozenFile = join(execRoot(), ".frozen");
  if (existsSync(frozenFile)) {
    // The sandbox is frozen: the command stops itself before it runs, and thaw continues it.
    [file, argv] = ["/bin/sh", ["-c", 'kill -STOP $$ && exec "$@"', "bw-frozen", file, ...argv]];
  }
  const env: Record<string, string> = {};
  for (const [k, v] of Object.entries(process.env)) {
    if (v !== undefined && k !== "BW_NODE" && k !== "BW_EXEC_DIR") env[k] = v;
  }
  Object.assign(env, spec.env);
  let done = false;
  const finish = (exitCode: number | null, signal: string | null) => {
    if (done) return;
    done = true;
    writeAtomic(join(dir, "exit.json"), JSON.stringify({ exitCode, signal }));
    process.exit(0);
  };
  // detached: the command leads a new session, so kill and freeze reach everything it starts.
  const child = spawn(file, argv, {
    cwd: spec.cwd,
    env,
    detached: true,
    stdio: [inFd, outFd, errFd],
  });
  child.on("spawn", () => {
    const pid = child.pid as number;
    writeAtomic(join(dir, "pid"), JSON.stringify({ pid }));
    // Frozen since the check above: this command stops with the others.
    if (existsSync(frozenFile)) signalSession(pid, "SIGSTOP");
    if (spec.timeoutMs !== null) {
      setTimeout(() => signalSession(pid, "SIGKILL"), spec.timeoutMs).unref();
    }
  });
  child.on("error", (e) => {
    writeFileSync(errFd, `could not start: ${e.message}\n`);
    finish(null, null);
  });
  child.on("exit", (code, signal) => finish(code, signal));
}

async function poll(execId: string, stdoutFrom: number, stderrFrom: number, waitMs: number) {
  const dir = execDir(execId);
  if (!existsSync(dir)) throw new Refusal("not_found", `no exec ${execId}`);
  if (waitMs > 0) await until(() => existsSync(join(dir, "exit.json")), Math.min(waitMs, MAX_WAIT_MS));
  return status(execId, stdoutFrom, stderrFrom);
}

async function kill(execId: string): Promise<RunnerStatus> {
  const dir = execDir(execId);
  if (!existsSync(dir)) throw new Refusal("not_found", `no exec ${execId}`);
  if (!existsSync(join(dir, "exit.json"))) {
    await until(() => pidOf(dir) !== null || existsSync(join(dir, "exit.json")), START_WAIT_MS);
    const pid = pidOf(dir);
    if (pid !== null) signalSession(pid, "SIGKILL");
    await until(() => existsSync(join(dir, "exit.json")), 5_000);
  }
  return status(execId, 0, 0);
}

/** SIGSTOP (or SIGCONT) to the session of every running exec. */
function freeze(frozen: boolean): RunnerFreeze {
  const root = execRoot();
  mkdirSync(root, { recursive: true, mode: 0o700 });
  // The mark first: a command starting meanwhile stops itself (see supervise).
  if (frozen) writeFileSync(join(root, ".frozen"), "");
  else rmSync(join(root, ".frozen"), { force: true });
  let signalled = 0;
  for (const entry of readdirSync(root)) {
    if (!RunnerExecId.safeParse(entry).success) continue;
    const dir = join(root, entry);
    if (existsSync(join(dir, "exit.json"))) continue;
    const pid = pidOf(dir);
    if (pid !== null) signalled += signalSession(pid, frozen ? "SIGSTOP" : "SIGCONT");
  }
  return { frozen, signalled };
}

async function readLine(max: number): Promise<string> {
  // One line, not the end of stdin: a v4 Kubernetes exec cannot close its stdin.
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    const buf = chunk as Buffer;
    const nl = buf.indexOf(10);
    chunks.push(nl === -1 ? buf : buf.subarray(0, nl));
    size += buf.length;
    if (nl !== -1 || size > max) break;
  }
  process.stdin.destroy();
  return Buffer.concat(chunks).toString("utf8");
}

const int = (s: string | undefined, name: string): number => {
  if (s === undefined || !/^[0-9]{1,15}$/.test(s))
    throw new Refusal("bad_request", `${name} must be an integer`);
  return Number(s);
};

async function main(args: string[]): Promise<unknown> {
  const [op, ...rest] = args;
  switch (op) {
    case "start":
      return start(rest[0] ?? "", await readLine(MAX_SPEC_BYTES));
    case "poll":
      return poll(
        rest[0] ?? "",
        int(rest[1] ?? "0", "stdoutFrom"),
        int(rest[2] ?? "0", "stderrFrom"),
        int(rest[3] ?? "0", "waitMs"),
      );
    case "kill":
      return kill(rest[0] ?? "");
    case "freeze":
    case "thaw":
      return freeze(op === "freeze");
    default:
      throw new Refusal("bad_request", `unknown operation ${op ?? "(none)"}`);
  }
}

const EXIT_OF: Record<RunnerError["error"], number> = {
  not_found: RUNNER_EXIT.notFound,
  bad_request: RUNNER_EXIT.badRequest,
  internal: RUNNER_EXIT.internal,
};

const [op, ...rest] = process.argv.slice(2);
if (op === "supervise") {
  supervise(rest[0] ?? "");
} else if (op === "hold") {
  // The pod's main process: nothing to do but stay, and go when Kubernetes asks.
  process.on("SIGTERM", () => process.exit(0));
  setInterval(() => {}, 1 << 30);
  process.stdout.write("bw-exec: holding the pod open\n");
} else {
  main(process.argv.slice(2)).then(
    (reply) => {
      process.stdout.write(`${JSON.stringify(reply)}\n`);
    },
    (e: unknown) => {
      const refusal = e instanceof Refusal ? e : new Refusal("internal", (e as Error).message ?? "error");
      const reply: RunnerError = { error: refusal.code, detail: refusal.message };
      process.stdout.write(`${JSON.stringify(reply)}\n`);
      process.exitCode = EXIT_OF[refusal.code];
    },
  );
}
