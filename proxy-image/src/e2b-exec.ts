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
  unlinkSync,
  writeFileSync,
} from "node:fs";
import { join } from "node:path";

// `bw-exec`: the exec runner of the E2B templates. E2B's process API (envd) streams a process's
// output to whoever is connected and keeps none of it, while the broker polls from a Durable
// Object that may be evicted between two polls. So every command the broker runs in an E2B
// sandbox is started through this runner, which keeps what the broker needs inside the sandbox:
//
//   <base>/<uid>/<execId>/stdout, stderr   the command's output, written by the command itself
//   <base>/<uid>/<execId>/pid, supervisor  the command's pid, and its supervisor's
//   <base>/<uid>/<execId>/exit             {"exitCode","signal"} once it ended
//
// `start` is idempotent by exec id (mkdir is the lock): a broker that restarts and starts the same
// exec again gets the one already there. The command runs under a detached supervisor in its own
// session, so nothing that happens to the envd request that started it (a deadline, a dropped
// stream) touches it. `poll` and `kill` run as root and find an exec of any uid; a uid's
// directory must be its own and closed to others, so a sandbox user cannot plant a record root
// would read. Output is read from byte offsets cut on UTF-8 character boundaries, the last 1 MiB
// of each stream at most, as the local backend's host agent does.

export const EXEC_DIR_DEFAULT = "/var/lib/bw-exec";
export const OUTPUT_LIMIT = 1024 * 1024;
export const MAX_WAIT_MS = 30_000;
/** Exit codes of the CLI besides 0. */
export const EXEC_EXIT = { usage: 2, unknown: 3, unsafe: 4 } as const;

const ID = /^[A-Za-z0-9_-]{1,64}$/;
const START_DEADLINE_MS = 10_000;
const KILL_WAIT_MS = 5_000;

export interface ExecStatus {
  state: "running" | "exited";
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  stdoutEnd: number;
  stderrEnd: number;
}

export class ExecRunnerError extends Error {
  constructor(
    readonly exit: (typeof EXEC_EXIT)[keyof typeof EXEC_EXIT],
    message: string,
  ) {
    super(message);
  }
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const uid = () => process.getuid?.() ?? 0;

function checkId(id: string): string {
  if (!ID.test(id)) throw new ExecRunnerError(EXEC_EXIT.usage, "an exec id is 1-64 of A-Z a-z 0-9 _ -");
  return id;
}

/** A uid's directory, checked: a directory (not a link), owned by that uid, closed to others. */
function checkOwned(dir: string, owner: number): void {
  const st = lstatSync(dir);
  if (!st.isDirectory() || st.uid !== owner || (st.mode & 0o077) !== 0) {
    throw new ExecRunnerError(EXEC_EXIT.unsafe, `${dir} is not a private directory of uid ${owner}`);
  }
}

/** This uid's directory under `base`, made on first use. */
export function ownDir(base: string): string {
  const dir = join(base, String(uid()));
  if (!existsSync(dir)) {
    try {
      mkdirSync(dir, { mode: 0o700 });
    } catch (e) {
      if ((e as { code?: string }).code !== "EEXIST") throw e;
    }
  }
  checkOwned(dir, uid());
  return dir;
}

/** The directory of exec `id`: root looks in every uid's directory (its own first), others in theirs. */
export function findExec(base: string, id: string): string | null {
  checkId(id);
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
  for (const owner of owners) {
    const dir = join(base, String(owner));
    if (!existsSync(join(dir, id))) continue;
    checkOwned(dir, owner);
    return join(dir, id);
  }
  return null;
}

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

function alive(pid: number | null): boolean {
  if (pid === null) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as { code?: string }).code === "EPERM";
  }
}

/** Length of the longest prefix that does not end inside a multi-byte UTF-8 character. */
export function completeUtf8Length(data: Buffer): number {
  for (let back = 1; back <= Math.min(4, data.length); back++) {
    const byte = data[data.length - back] as number;
    if ((byte & 0xc0) === 0x80) continue;
    const need = byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : byte >= 0xc0 ? 2 : 1;
    return need > back ? data.length - back : data.length;
  }
  return data.length;
}

/**
 * Text of a stream file from byte offset `from` (or from the oldest byte kept), and the offset to
 * ask from next. A character still being written waits for the next read unless `final`.
 */
export function readStream(path: string, from: number, final: boolean): { text: string; end: number } {
  let fd: number;
  try {
    fd = openSync(path, "r");
  } catch {
    return { text: "", end: 0 };
  }
  try {
    const size = fstatSync(fd).size;
    const oldest = Math.max(0, size - OUTPUT_LIMIT);
    let begin = Math.min(Math.max(from, oldest), size);
    let data = Buffer.alloc(size - begin);
    let got = 0;
    while (got < data.length) {
      const n = readSync(fd, data, got, data.length - got, begin + got);
      if (n === 0) break;
      got += n;
    }
    data = data.subarray(0, got);
    if (from < oldest) {
      // The oldest kept byte may be mid-character: skip continuation bytes.
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

export function status(dir: string, stdoutFrom: number, stderrFrom: number): ExecStatus {
  let exit: { exitCode: number | null; signal: string | null } | null = null;
  try {
    exit = JSON.parse(readFileSync(join(dir, "exit"), "utf8"));
  } catch {}
  if (exit === null && !alive(readNumber(join(dir, "supervisor")))) {
    // The supervisor died without recording an end (killed from outside): the command is lost.
    exit = { exitCode: null, signal: null };
    // A command that outlived its supervisor is still counted as ended: nobody can wait for it.
  }
  const final = exit !== null;
  const out = readStream(join(dir, "stdout"), stdoutFrom, final);
  const err = readStream(join(dir, "stderr"), stderrFrom, final);
  return {
    state: final ? "exited" : "running",
    exitCode: exit?.exitCode ?? null,
    signal: exit?.signal ?? null,
    stdout: out.text,
    stderr: err.text,
    stdoutEnd: out.end,
    stderrEnd: err.end,
  };
}

export interface StartOptions {
  base: string;
  id: string;
  argv: string[];
  /** Killed (the whole process group, SIGKILL) after this long; null: no limit. */
  timeoutMs: number | null;
  stdin: Buffer | null;
  /** This program's own path, to start its supervisor with. */
  self: string;
  env: NodeJS.ProcessEnv;
}

/** Starts exec `id`, or finds it started: `created` says which. */
export async function start(o: StartOptions): Promise<ExecStatus & { created: boolean }> {
  checkId(o.id);
  if (o.argv.length === 0) throw new ExecRunnerError(EXEC_EXIT.usage, "nothing to run");
  const dir = join(ownDir(o.base), o.id);
  try {
    mkdirSync(dir, { mode: 0o700 });
  } catch (e) {
    if ((e as { code?: string }).code !== "EEXIST") throw e;
    return { created: false, ...status(dir, 0, 0) };
  }
  writeFileSync(join(dir, "stdout"), "", { mode: 0o600 });
  writeFileSync(join(dir, "stderr"), "", { mode: 0o600 });
  if (o.stdin !== null) writeFileSync(join(dir, "stdin"), o.stdin, { mode: 0o600 });
  const supervisor = spawn(
    process.execPath,
    [o.self, "supervise", dir, o.timeoutMs === null ? "-" : String(o.timeoutMs), "--", ...o.argv],
    { detached: true, stdio: "ignore", env: o.env },
  );
  supervisor.unref();
  if (supervisor.pid !== undefined) writeAtomic(join(dir, "supervisor"), String(supervisor.pid));
  // Answer once the command runs (or could not start), so a poll right after never misses it.
  const deadline = Date.now() + START_DEADLINE_MS;
  while (!existsSync(join(dir, "pid")) && !existsSync(join(dir, "exit")) && Date.now() < deadline) {
    if (!alive(supervisor.pid ?? null)) break;
    await sleep(10);
  }
  return { created: true, ...status(dir, 0, 0) };
}

/** The supervisor: runs the command in its own process group, records its pid and its end. */
export function supervise(dir: string, timeoutMs: number | null, argv: string[], env: NodeJS.ProcessEnv) {
  const [file, ...args] = argv as [string, ...string[]];
  const stdinPath = join(dir, "stdin");
  const stdin = existsSync(stdinPath) ? openSync(stdinPath, "r") : "ignore";
  const out = openSync(join(dir, "stdout"), "a");
  const err = openSync(join(dir, "stderr"), "a");
  const finish = (exitCode: number | null, signal: string | null) => {
    writeAtomic(join(dir, "exit"), JSON.stringify({ exitCode, signal }));
    process.exit(0);
  };
  const child = spawn(file, args, { stdio: [stdin, out, err], detached: true, env });
  for (const fd of [stdin, out, err]) if (typeof fd === "number") closeSync(fd);
  child.on("spawn", () => {
    writeAtomic(join(dir, "pid"), String(child.pid));
    try {
      unlinkSync(stdinPath);
    } catch {}
  });
  child.on("error", (e) => {
    writeFileSync(join(dir, "stderr"), `could not start ${file}: ${e.message}\n`, { flag: "a" });
    finish(127, null);
  });
  child.on("exit", (code, signal) => finish(code, signal));
  if (timeoutMs !== null) {
    setTimeout(() => killGroup(child.pid ?? null), timeoutMs).unref();
  }
}

function killGroup(pid: number | null): void {
  if (pid === null) return;
  for (const target of [-pid, pid]) {
    try {
      process.kill(target, "SIGKILL");
    } catch {}
  }
}

function mustFind(base: string, id: string): string {
  const dir = findExec(base, id);
  if (dir === null) throw new ExecRunnerError(EXEC_EXIT.unknown, `no exec ${id}`);
  return dir;
}

/** Status from the offsets, after waiting up to `waitMs` for new output or the end. */
export async function poll(
  base: string,
  id: string,
  stdoutFrom: number,
  stderrFrom: number,
  waitMs: number,
): Promise<ExecStatus> {
  const dir = mustFind(base, id);
  const deadline = Date.now() + Math.min(Math.max(0, waitMs), MAX_WAIT_MS);
  for (;;) {
    const s = status(dir, stdoutFrom, stderrFrom);
    const news = s.stdoutEnd > stdoutFrom || s.stderrEnd > stderrFrom;
    if (s.state === "exited" || news || Date.now() >= deadline) return s;
    await sleep(50);
  }
}

/** SIGKILL to the command's process group; the status once its end is recorded. */
export async function kill(base: string, id: string): Promise<ExecStatus> {
  const dir = mustFind(base, id);
  if (!existsSync(join(dir, "exit"))) killGroup(readNumber(join(dir, "pid")));
  const deadline = Date.now() + KILL_WAIT_MS;
  for (;;) {
    const s = status(dir, 0, 0);
    if (s.state === "exited" || Date.now() >= deadline) return s;
    await sleep(20);
  }
}
