import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { RUNNER_EXIT, RunnerStatus } from "../../src/broker/kubernetes/runner-wire";

// The sandbox0 work pod's exec runner (proxy-image/dist/exec-runner.cjs, built by the unit
// project's global setup), run for real: real processes, real sessions and signals, in a
// temporary BW_EXEC_DIR. Each call is one process, as each is one Kubernetes exec in a pod.

const RUNNER = resolve(import.meta.dirname, "../../proxy-image/dist/exec-runner.cjs");
let dir: string;
let execDir: string;

beforeAll(() => {
  dir = mkdtempSync(join(tmpdir(), "bw-runner-"));
  execDir = join(dir, "exec");
});
afterAll(() => {
  // Whatever a failed test left running goes with its session.
  for (const id of existsSync(execDir) ? readdirSync(execDir) : []) {
    try {
      const { pid } = JSON.parse(readFileSync(join(execDir, id, "pid"), "utf8")) as { pid: number };
      process.kill(-pid, "SIGCONT");
      process.kill(-pid, "SIGKILL");
    } catch {}
  }
  rmSync(dir, { recursive: true, force: true });
});

function runner(args: string[], stdin?: string): { code: number | null; reply: unknown; stderr: string } {
  const res = spawnSync(process.execPath, [RUNNER, ...args], {
    cwd: dir,
    input: stdin ?? "",
    env: { PATH: process.env.PATH, BW_EXEC_DIR: execDir },
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

let n = 0;
const newId = () => `e${++n}_${process.pid}`;

function start(id: string, spec: Record<string, unknown>) {
  return runner(["start", id], `${JSON.stringify({ env: {}, timeoutMs: 10_000, ...spec })}\n`);
}

/** Polls, the runner waiting up to 5 s for the exit each time. */
function waitExit(id: string, from: [number, number] = [0, 0]): RunnerStatus {
  for (let i = 0; i < 6; i++) {
    const { reply } = runner(["poll", id, String(from[0]), String(from[1]), "5000"]);
    const status = RunnerStatus.parse(reply);
    if (status.state === "exited") return status;
  }
  throw new Error(`exec ${id} did not exit`);
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

/** Looks again until the process is (or is not) stopped: a signal lands at its next scheduling. */
function settle(pid: number, stopped: boolean): string | null {
  let state = stateOf(pid);
  for (let i = 0; i < 10_000 && (state === "T") !== stopped; i++) state = stateOf(pid);
  return state;
}

const pidOf = (id: string) =>
  (JSON.parse(readFileSync(join(execDir, id, "pid"), "utf8")) as { pid: number }).pid;

describe("exec runner", { timeout: 60_000 }, () => {
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
    const done = waitExit(id);
    expect(done).toEqual({
      execId: id,
      state: "exited",
      exitCode: 7,
      signal: null,
      stdout: "hello-from stdin/\n",
      stderr: "eα",
      stdoutEnd: 18,
      stderrEnd: 3,
    });
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
    expect(existsSync(join(execDir, id))).toBe(false);
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
    // It says so once its SIGTERM handler is in place.
    await new Promise((r) => child.stdout.once("data", r));
    expect(child.exitCode).toBeNull();
    child.kill("SIGTERM");
    const code = await new Promise((r) => child.once("exit", (c) => r(c)));
    expect(code).toBe(0);
  });
});
