import { type SpawnSyncReturns, spawnSync } from "node:child_process";
import { chmodSync, chownSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { buildE2bPrograms } from "../contract/e2b-server";

// bw-exec, the E2B templates' exec runner, as the broker uses it: the real program (built from
// proxy-image/src), real processes, real files. Each call is its own short-lived process, as each
// envd command is in a sandbox; the commands it starts outlive it.

let dir: string;
let execCjs: string;
let base: string;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), "bw-exec-test-"));
  execCjs = (await buildE2bPrograms(join(dir, "programs"))).exec;
  base = join(dir, "state");
  mkdirSync(base, { mode: 0o755 });
});
afterAll(() => {
  // Whatever a test left running dies with its process group, found by the runner's own records.
  for (const owner of readdirSync(base)) {
    for (const exec of readdirSync(join(base, owner))) {
      for (const file of ["pid", "supervisor"]) {
        const pid = Number.parseInt(
          readFileSync(join(base, owner, exec, file), { encoding: "utf8", flag: "a+" }),
          10,
        );
        if (!(pid > 0)) continue;
        for (const target of [-pid, pid]) {
          try {
            process.kill(target, "SIGKILL");
          } catch {}
        }
      }
    }
  }
  rmSync(dir, { recursive: true, force: true });
});

interface Status {
  created?: boolean;
  state: "running" | "exited";
  exitCode: number | null;
  signal: string | null;
  stdout: string;
  stderr: string;
  stdoutEnd: number;
  stderrEnd: number;
}

function cli(args: string[], o: { stdin?: string; env?: Record<string, string>; uid?: number } = {}) {
  const r: SpawnSyncReturns<string> = spawnSync(process.execPath, [execCjs, ...args], {
    input: o.stdin ?? "",
    encoding: "utf8",
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", BW_EXEC_DIR: base, ...o.env },
    ...(o.uid === undefined ? {} : { uid: o.uid, gid: o.uid }),
    timeout: 20_000,
  });
  const line = r.stdout.trim().split("\n").at(-1) ?? "";
  return { code: r.status, status: (line ? JSON.parse(line) : null) as Status | null, stderr: r.stderr };
}

const start = (
  id: string,
  argv: string[],
  o: { timeout?: number; stdin?: string; env?: Record<string, string> } = {},
) =>
  cli(
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
  cli(["poll", id, String(out), String(err), String(wait)]);

/** Polls until the exec has exited (the runner's wait, no sleeps here). */
function untilExited(id: string, out = 0, err = 0): Status {
  for (let i = 0; i < 100; i++) {
    const s = poll(id, out, err, 1_000).status as Status;
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

describe("bw-exec", () => {
  it("runs a command past the runner's own exit and reports its output and exit code", () => {
    const id = uniq();
    const started = start(id, ["sh", "-c", "sleep 0.3; printf out; printf err >&2; exit 3"]);
    expect(started.code).toBe(0);
    expect(started.status).toMatchObject({ created: true, state: "running", exitCode: null });
    const s = untilExited(id);
    expect(s).toEqual({
      state: "exited",
      exitCode: 3,
      signal: null,
      stdout: "out",
      stderr: "err",
      stdoutEnd: 3,
      stderrEnd: 3,
    });
  });

  it("pages output by byte offsets, holding back a character still being written", () => {
    const id = uniq();
    // é is two bytes (c3 a9): the first arrives, then the second a moment later.
    start(id, ["sh", "-c", "printf 'ab\\303'; sleep 0.6; printf '\\251cd'"]);
    const first = poll(id, 0, 0, 500).status as Status;
    expect(first.state).toBe("running");
    expect(first).toMatchObject({ stdout: "ab", stdoutEnd: 2 });
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
    const pid = Number(readFileSync(join(base, String(process.getuid?.() ?? 0), id, "pid"), "utf8"));
    expect(liveInGroup(pid)).toEqual([]);
  });

  it("kill stops a running command and its children; an unknown exec is exit 3", () => {
    const id = uniq();
    start(id, ["sh", "-c", "sleep 30 & sleep 30"]);
    const killed = cli(["kill", id]);
    expect(killed.code).toBe(0);
    expect(killed.status).toMatchObject({ state: "exited", signal: "SIGKILL" });
    const pid = Number(readFileSync(join(base, String(process.getuid?.() ?? 0), id, "pid"), "utf8"));
    expect(liveInGroup(pid)).toEqual([]);
    const unknown = cli(["kill", "no-such-exec"]);
    expect(unknown.code).toBe(3);
    expect(unknown.stderr).toContain("no exec no-such-exec");
    expect(poll("no-such-exec").code).toBe(3);
  });

  it("a program that does not exist ends 127 with the reason on stderr", () => {
    const id = uniq();
    start(id, ["bw-no-such-program"]);
    expect(untilExited(id)).toMatchObject({
      exitCode: 127,
      stderr: expect.stringContaining("bw-no-such-program"),
    });
  });

  it("refuses bad calls with exit 2", () => {
    expect(cli(["start", "bad id", "-", "0", "--", "true"]).code).toBe(2);
    expect(cli(["start", uniq(), "-", "0", "true"]).code).toBe(2);
    expect(cli(["poll", uniq(), "x", "0", "0"]).code).toBe(2);
    expect(cli(["start", uniq(), "-", "10", "--", "cat"], { stdin: "short" }).code).toBe(2);
  });

  it.runIf(process.getuid?.() === 0)(
    "root finds another uid's exec; that uid cannot see root's, nor use a directory not its own",
    () => {
      // The runner as the execute user (uid 1000) and as root, sharing one base laid out as the
      // work template lays it out (e2b-work.Dockerfile): sticky and open, root's own dir made.
      chmodSync(dir, 0o755);
      chmodSync(base, 0o1777);
      const theirs = uniq();
      const r = cli(["start", theirs, "-", "0", "--", "sh", "-c", "id -u"], { uid: 1000 });
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: "" });
      expect(untilExited(theirs).stdout.trim()).toBe("1000");
      const mine = uniq();
      start(mine, ["true"]);
      expect(cli(["poll", mine, "0", "0", "0"], { uid: 1000 }).code).toBe(3);
      // A uid directory open to others is refused, whoever asks.
      chmodSync(join(base, "1000"), 0o755);
      expect(cli(["start", uniq(), "-", "0", "--", "true"], { uid: 1000 }).code).toBe(4);
      expect(cli(["poll", theirs, "0", "0", "0"]).code).toBe(4);
      chmodSync(join(base, "1000"), 0o700);
      // A directory named for root but owned by someone else is refused too.
      const planted = join(dir, "planted");
      mkdirSync(join(planted, "0", theirs), { recursive: true, mode: 0o700 });
      chmodSync(join(planted, "0"), 0o700);
      chownSync(join(planted, "0"), 1000, 1000);
      expect(cli(["poll", theirs, "0", "0", "0"], { env: { BW_EXEC_DIR: planted } }).code).toBe(4);
    },
  );
});
