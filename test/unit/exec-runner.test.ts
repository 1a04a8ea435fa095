import { spawn, spawnSync } from "node:child_process";
import {
  chmodSync,
  chownSync,
  copyFileSync,
  existsSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { RUNNER_EXIT, RunnerStatus } from "@benchwright/shared/contract/exec-runner";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { recordedExecs } from "../../proxy-image/src/exec-runner/exec-runner";

// bw-exec, the exec runner of sandbox0 work pods and E2B sandboxes (proxy-image/dist/
// exec-runner.cjs, built by the unit project's global setup), run for real: real processes, real
// sessions and signals, real files, in temporary state directories. Each call is one process, as
// each is one Kubernetes exec in a pod or one envd command in a sandbox; the commands it starts
// outlive it. The spec arrives as a RunnerStart line (Kubernetes) or in the arguments (envd).

const RUNNER = resolve(import.meta.dirname, "../../proxy-image/dist/exec-runner.cjs");
const UID = String(process.getuid?.() ?? 0);
let dir: string;
/** The state directory of the RunnerStart-line tests (the runner makes it, as in a pod). */
let execDir: string;
/** The state directory of the argument-start tests, laid out by hand as the E2B templates do. */
let base: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "bw-runner-"));
  execDir = join(dir, "exec");
  base = join(dir, "state");
  mkdirSync(base, { mode: 0o755 });
});
afterAll(() => {
  // Whatever a failed test left running goes with its session, found by the runner's records.
  for (const exec of [...recordedExecs(execDir), ...recordedExecs(base)]) {
    for (const pid of [exec.pid, exec.supervisor]) {
      if (pid === null) continue;
      for (const [target, signal] of [
        [-pid, "SIGCONT"],
        [-pid, "SIGKILL"],
        [pid, "SIGKILL"],
      ] as const) {
        try {
          process.kill(target, signal);
        } catch {}
      }
    }
  }
  rmSync(dir, { recursive: true, force: true });
});

/**
 * The runner as another uid sees it: a copy in the test's own directory. The checkout may sit
 * below a directory that uid cannot enter (a mktemp -d clone is 0700), as a pod's tools never do.
 */
function runnerFor(): string {
  const copy = join(dir, "exec-runner.cjs");
  copyFileSync(RUNNER, copy);
  chmodSync(copy, 0o644);
  chmodSync(dir, 0o755);
  return copy;
}

/**
 * The node another uid runs: the suite's own (npm's `node` package, under the checkout, so as
 * unreachable as the runner) linked, or else copied, into the test's directory.
 */
function nodeFor(): string {
  const node = join(dir, "node");
  if (!existsSync(node)) {
    try {
      linkSync(process.execPath, node);
    } catch {
      copyFileSync(process.execPath, node);
    }
    chmodSync(node, 0o755);
  }
  return node;
}

function cli(
  args: string[],
  o: { stdin?: string; env?: Record<string, string>; uid?: number; state?: string } = {},
): { code: number | null; reply: unknown; stderr: string } {
  const other = o.uid !== undefined;
  const res = spawnSync(other ? nodeFor() : process.execPath, [other ? runnerFor() : RUNNER, ...args], {
    cwd: dir,
    input: o.stdin ?? "",
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", BW_EXEC_DIR: o.state ?? execDir, ...o.env },
    ...(o.uid === undefined ? {} : { uid: o.uid, gid: o.uid }),
    encoding: "utf8",
    timeout: 30_000,
  });
  const last = res.stdout.trimEnd().split("\n").at(-1) ?? "";
  let reply: unknown = null;
  try {
    reply = JSON.parse(last);
  } catch {}
  return { code: res.status, reply, stderr: res.stderr };
}

/** The state letter of a process (R, S, T, Z...), null when it is gone. */
function stateOf(pid: number): string | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ")[0] ?? null;
  } catch {
    return null;
  }
}

/** The whole status of an exec that ended with `exitCode`, its whole output read from 0. */
const exited = (execId: string, exitCode: number, stdout: string, stderr: string): RunnerStatus => ({
  execId,
  state: "exited",
  exitCode,
  signal: null,
  stdout,
  stderr,
  stdoutEnd: Buffer.byteLength(stdout),
  stderrEnd: Buffer.byteLength(stderr),
});

describe("exec runner, started with a RunnerStart line (Kubernetes exec)", { timeout: 60_000 }, () => {
  const runner = (args: string[], stdin?: string) => cli(args, stdin === undefined ? {} : { stdin });

  let n = 0;
  const newId = () => `e${++n}_${process.pid}`;

  function start(id: string, spec: Record<string, unknown>) {
    return runner(["start", id], `${JSON.stringify({ env: {}, timeoutMs: 10_000, ...spec })}\n`);
  }

  /** Polls for up to 30 s, the runner waiting up to 5 s each time (less once there is output). */
  function waitExit(id: string, from: [number, number] = [0, 0]): RunnerStatus {
    for (const deadline = Date.now() + 30_000; Date.now() < deadline; ) {
      const { reply } = runner(["poll", id, String(from[0]), String(from[1]), "5000"]);
      const status = RunnerStatus.parse(reply);
      if (status.state === "exited") return status;
    }
    throw new Error(`exec ${id} did not exit`);
  }

  /** Looks again until the process is (or is not) stopped: a signal lands at its next scheduling. */
  function settle(pid: number, stopped: boolean): string | null {
    let state = stateOf(pid);
    for (let i = 0; i < 10_000 && (state === "T") !== stopped; i++) state = stateOf(pid);
    return state;
  }

  const pidOf = (id: string) => Number(readFileSync(join(execDir, UID, id, "pid"), "utf8"));

  it("runs a command detached: output by byte offsets, exit code, stdin, env, cwd", () => {
    const id = newId();
    const started = start(id, {
      argv: ["sh", "-c", 'printf "%s-%s" "$GREETING" "$(cat)"; pwd; printf "e\\316\\261" >&2; exit 7'],
      env: { GREETING: "hello" },
      stdin: "from stdin",
      cwd: "/",
    });
    expect(started.code).toBe(RUNNER_EXIT.ok);
    expect(RunnerStatus.parse(started.reply).execId).toBe(id);
    expect(waitExit(id)).toEqual(exited(id, 7, "hello-from stdin/\n", "eα"));
    expect(waitExit(id, [6, 1])).toMatchObject({
      stdout: "from stdin/\n",
      stderr: "α",
      stdoutEnd: 18,
      stderrEnd: 3,
    });
    expect(waitExit(id, [18, 3])).toMatchObject({ stdout: "", stderr: "" });
  });

  it("is idempotent by exec id: a replayed start answers for the first and runs nothing", () => {
    const id = newId();
    const command = { argv: ["sh", "-c", "echo ran >> once.txt"] };
    start(id, command);
    waitExit(id);
    const again = start(id, { argv: ["sh", "-c", "echo other >> once.txt"] });
    expect(RunnerStatus.parse(again.reply)).toMatchObject({ execId: id, state: "exited", exitCode: 0 });
    expect(readFileSync(join(dir, "once.txt"), "utf8")).toBe("ran\n");
  });

  it("refuses what is not its contract with stable exit codes", () => {
    expect(runner(["poll", "no-such-exec", "0", "0"])).toMatchObject({
      code: RUNNER_EXIT.notFound,
      reply: { error: "not_found", detail: "no exec no-such-exec" },
    });
    expect(runner(["kill", "no-such-exec"]).code).toBe(RUNNER_EXIT.notFound);
    expect(runner(["poll", "../escape", "0", "0"])).toMatchObject({
      code: RUNNER_EXIT.badRequest,
      reply: { error: "bad_request" },
    });
    expect(runner(["poll", "x", "-1", "0"]).code).toBe(RUNNER_EXIT.badRequest);
    expect(runner(["frobnicate"]).reply).toEqual({
      error: "bad_request",
      detail: "unknown operation frobnicate",
    });
    // A bad spec leaves nothing behind: the same id can start properly afterwards.
    const id = newId();
    expect(runner(["start", id], "not json\n")).toMatchObject({ code: RUNNER_EXIT.badRequest });
    expect(existsSync(join(execDir, UID, id))).toBe(false);
    start(id, { argv: ["true"] });
    expect(waitExit(id).exitCode).toBe(0);
  });

  it("a command that cannot start has exited with no code and says why", () => {
    const id = newId();
    start(id, { argv: ["/nonexistent/program"] });
    const done = waitExit(id);
    expect(done).toMatchObject({ state: "exited", exitCode: null, signal: null });
    expect(done.stderr).toContain("could not start: spawn /nonexistent/program ENOENT");
  });

  it("keeps the last 1 MiB of output, with absolute offsets, cut on character boundaries", () => {
    const id = newId();
    // 600 000 two-byte characters: 1.2 MB, so the window starts mid-character.
    start(id, { argv: [process.execPath, "-e", 'process.stdout.write("α".repeat(600000))'] });
    const done = waitExit(id);
    expect(done.stdoutEnd).toBe(1_200_000);
    const kept = Buffer.byteLength(done.stdout);
    expect(kept).toBeLessThanOrEqual(1024 * 1024);
    expect(kept).toBeGreaterThan(1024 * 1024 - 4);
    expect(done.stdout).toBe("α".repeat(kept / 2));
  });

  it("kill: SIGKILL to the command's whole session (its background children too); idempotent", () => {
    const id = newId();
    start(id, { argv: ["sh", "-c", "sleep 30 & echo $! > bg.pid; wait"] });
    for (let i = 0; i < 10_000 && !existsSync(join(dir, "bg.pid")); i++) spawnSync("true");
    const bg = Number(readFileSync(join(dir, "bg.pid"), "utf8"));
    expect(stateOf(bg)).toMatch(/^[RS]$/);
    const killed = runner(["kill", id]);
    expect(killed.reply).toMatchObject({ execId: id, state: "exited", exitCode: null, signal: "SIGKILL" });
    let after = stateOf(bg);
    for (let i = 0; i < 10_000 && after !== null && after !== "Z"; i++) after = stateOf(bg);
    expect([null, "Z"]).toContain(after); // gone (or dead, awaiting its reaper)
    expect(runner(["kill", id]).reply).toEqual(killed.reply);
  });

  it("a timeout kills the command's session", () => {
    const id = newId();
    start(id, { argv: ["sleep", "30"], timeoutMs: 200 });
    expect(waitExit(id)).toMatchObject({ state: "exited", exitCode: null, signal: "SIGKILL" });
  });

  it("freeze stops every running command's session, and a command started meanwhile; thaw continues them", () => {
    const id = newId();
    start(id, { argv: ["sh", "-c", "while :; do sleep 0.05; done"] });
    const pid = pidOf(id);
    expect(settle(pid, false)).toMatch(/^[RS]$/);
    expect(runner(["freeze"]).reply).toEqual({ frozen: true, signalled: expect.any(Number) });
    expect(settle(pid, true)).toBe("T");
    expect(runner(["freeze"]).code).toBe(RUNNER_EXIT.ok);

    const late = newId();
    start(late, { argv: ["sh", "-c", "echo late"] });
    expect(settle(pidOf(late), true)).toBe("T");
    expect(RunnerStatus.parse(runner(["poll", late, "0", "0"]).reply).state).toBe("running");

    expect(runner(["thaw"]).reply).toEqual({ frozen: false, signalled: expect.any(Number) });
    expect(runner(["thaw"]).code).toBe(RUNNER_EXIT.ok);
    expect(settle(pid, false)).toMatch(/^[RS]$/);
    expect(waitExit(late)).toMatchObject({ exitCode: 0, stdout: "late\n" });
    expect(runner(["kill", id]).reply).toMatchObject({ signal: "SIGKILL" });
  });

  it("bw-wiring runs the wiring program beside the runner", () => {
    const id = newId();
    start(id, { argv: ["bw-wiring"], stdin: "{}" });
    const done = waitExit(id);
    expect(done.exitCode).toBe(2); // WIRING_EXIT.badInput: it parsed our (empty) input
    expect(done.stderr).toContain("bad wiring input");
  });

  it("hold stays until SIGTERM, then exits 0", async () => {
    const child = spawn(process.execPath, [RUNNER, "hold"], { stdio: ["ignore", "pipe", "inherit"] });
    // It says so once its SIGTERM handler is in place: the pod's log line, with its event.
    const said = await new Promise<Buffer>((r) => child.stdout.once("data", r));
    expect(JSON.parse(said.toString())).toMatchObject({ level: "info", event: "holding" });
    expect(child.exitCode).toBeNull();
    child.kill("SIGTERM");
    const code = await new Promise((r) => child.once("exit", (c) => r(c)));
    expect(code).toBe(0);
  });
});

describe("exec runner, started with the command in its arguments (E2B envd)", { timeout: 60_000 }, () => {
  const call = (args: string[], o: { stdin?: string; env?: Record<string, string>; uid?: number } = {}) => {
    const r = cli(args, { ...o, state: base });
    return { code: r.code, status: r.reply as RunnerStatus | null, stderr: r.stderr };
  };

  const start = (
    id: string,
    argv: string[],
    o: { timeout?: number; stdin?: string; env?: Record<string, string> } = {},
  ) =>
    call(
      [
        "start",
        id,
        o.timeout === undefined ? "-" : String(o.timeout),
        String(Buffer.byteLength(o.stdin ?? "")),
        "--",
        ...argv,
      ],
      { ...(o.stdin === undefined ? {} : { stdin: o.stdin }), ...(o.env ? { env: o.env } : {}) },
    );

  const poll = (id: string, out = 0, err = 0, wait = 0) =>
    call(["poll", id, String(out), String(err), String(wait)]);

  /** Polls until the exec has exited (the runner's wait, no sleeps here). */
  function untilExited(id: string, out = 0, err = 0): RunnerStatus {
    for (let i = 0; i < 100; i++) {
      const s = poll(id, out, err, 1_000).status as RunnerStatus;
      if (s.state === "exited") return s;
    }
    throw new Error(`${id} did not exit`);
  }

  /** Live (not zombie) processes of a process group, from /proc. */
  function liveInGroup(pgid: number): number[] {
    const out: number[] = [];
    for (const entry of readdirSync("/proc")) {
      if (!/^[0-9]+$/.test(entry)) continue;
      let stat: string;
      try {
        stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      } catch {
        continue;
      }
      // pid (comm) state ppid pgrp ...: comm may hold spaces, so split after its closing paren.
      const [state, , pgrp] = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      if (Number(pgrp) === pgid && state !== "Z" && state !== "X") out.push(Number(entry));
    }
    return out;
  }

  const uniq = () => `t_${Math.random().toString(36).slice(2, 10)}`;

  it("runs a command past the runner's own exit and reports its output and exit code", () => {
    const id = uniq();
    const started = start(id, ["sh", "-c", "sleep 0.3; printf out; printf err >&2; exit 3"]);
    expect(started.code).toBe(0);
    expect(started.status).toMatchObject({ created: true, state: "running", exitCode: null });
    expect(untilExited(id)).toEqual(exited(id, 3, "out", "err"));
  });

  it("pages output by byte offsets, holding back a character still being written", () => {
    const id = uniq();
    // é is two bytes (c3 a9): the first arrives, the second only once the test says so.
    const go = join(dir, `${id}.go`);
    start(id, ["sh", "-c", `printf 'ab\\303'; while [ ! -e ${go} ]; do sleep 0.05; done; printf '\\251cd'`]);
    let first = poll(id, 0, 0, 500).status as RunnerStatus;
    for (let i = 0; i < 100 && first.stdoutEnd < 2; i++) first = poll(id, 0, 0, 500).status as RunnerStatus;
    expect(first.state).toBe("running");
    expect(first).toMatchObject({ stdout: "ab", stdoutEnd: 2 });
    writeFileSync(go, "");
    const rest = untilExited(id, first.stdoutEnd);
    expect(rest).toMatchObject({ stdout: "écd", stdoutEnd: 6, exitCode: 0 });
    // Asking again from the end gives nothing new; from 0, everything.
    expect(poll(id, 6, 0).status).toMatchObject({ stdout: "", stdoutEnd: 6 });
    expect(poll(id, 0, 0).status).toMatchObject({ stdout: "abécd", stdoutEnd: 6 });
  });

  it("is idempotent by exec id: a second start returns the first and runs nothing", () => {
    const id = uniq();
    const marks = join(dir, `${id}.marks`);
    const argv = ["sh", "-c", `echo ran >> ${marks}`];
    expect(start(id, argv).status?.created).toBe(true);
    untilExited(id);
    const again = start(id, argv);
    expect(again.status).toMatchObject({ created: false, state: "exited", exitCode: 0 });
    expect(readFileSync(marks, "utf8")).toBe("ran\n");
  });

  it("gives the command exactly the stdin it was sent, and its env without the runner's own", () => {
    const id = uniq();
    const s = start(id, ["sh", "-c", 'cat; printf "|%s|" "$FOO"; printenv BW_EXEC_DIR || printf unset'], {
      stdin: '{"json":"on stdin"}',
      env: { FOO: "bar" },
    });
    expect(s.code).toBe(0);
    expect(untilExited(id).stdout).toBe('{"json":"on stdin"}|bar|unset');
  });

  it("kills the whole process group after its timeout", () => {
    const id = uniq();
    start(id, ["sh", "-c", "sleep 30 & sleep 30"], { timeout: 300 });
    const s = untilExited(id);
    expect(s).toMatchObject({ exitCode: null, signal: "SIGKILL" });
    // Nothing of its process group is left: the background sleep went with it.
    const pid = Number(readFileSync(join(base, UID, id, "pid"), "utf8"));
    expect(liveInGroup(pid)).toEqual([]);
  });

  it("kill stops a running command and its children; an unknown exec is exit 3", () => {
    const id = uniq();
    start(id, ["sh", "-c", "sleep 30 & sleep 30"]);
    const killed = call(["kill", id]);
    expect(killed.code).toBe(0);
    expect(killed.status).toMatchObject({ state: "exited", signal: "SIGKILL" });
    const pid = Number(readFileSync(join(base, UID, id, "pid"), "utf8"));
    expect(liveInGroup(pid)).toEqual([]);
    const unknown = call(["kill", "no-such-exec"]);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toContain("no exec no-such-exec");
    expect(poll("no-such-exec").code).toBe(3);
  });

  it("a program that does not exist has exited with no code, the reason on stderr", () => {
    const id = uniq();
    start(id, ["bw-no-such-program"]);
    expect(untilExited(id)).toMatchObject({
      exitCode: null,
      stderr: expect.stringContaining("bw-no-such-program"),
    });
  });

  it("refuses bad calls with exit 2", () => {
    expect(call(["start", "bad id", "-", "0", "--", "true"]).code).toBe(2);
    expect(call(["start", uniq(), "-", "0", "true"]).code).toBe(2);
    expect(call(["poll", uniq(), "x", "0", "0"]).code).toBe(2);
    expect(call(["start", uniq(), "-", "10", "--", "cat"], { stdin: "short" }).code).toBe(2);
  });

  it.runIf(process.getuid?.() === 0)(
    "root finds another uid's exec; that uid cannot see root's, nor use a directory not its own",
    () => {
      // The runner as the execute user (uid 1000) and as root, sharing one base laid out as the
      // work template lays it out (e2b-work.Dockerfile): sticky and open, root's own dir made.
      chmodSync(dir, 0o755);
      chmodSync(base, 0o1777);
      const theirs = uniq();
      const r = call(["start", theirs, "-", "0", "--", "sh", "-c", "id -u"], { uid: 1000 });
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: "" });
      expect(untilExited(theirs).stdout.trim()).toBe("1000");
      const mine = uniq();
      start(mine, ["true"]);
      expect(call(["poll", mine, "0", "0", "0"], { uid: 1000 }).code).toBe(3);
      // A uid directory open to others is refused, whoever asks.
      chmodSync(join(base, "1000"), 0o755);
      expect(call(["start", uniq(), "-", "0", "--", "true"], { uid: 1000 }).code).toBe(4);
      expect(call(["poll", theirs, "0", "0", "0"]).code).toBe(4);
      chmodSync(join(base, "1000"), 0o700);
      // A directory named for root but owned by someone else is refused too.
      const planted = join(dir, "planted");
      mkdirSync(join(planted, "0", theirs), { recursive: true, mode: 0o700 });
      chmodSync(join(planted, "0"), 0o700);
      chownSync(join(planted, "0"), 1000, 1000);
      expect(call(["poll", theirs, "0", "0", "0"], { env: { BW_EXEC_DIR: planted } }).code).toBe(4);
    },
  );
});
