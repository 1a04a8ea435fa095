import type { ExecInfo, ExecRequest } from "@benchwright/shared/contract/local-agent";
import { describe, expect, it } from "vitest";
import type { ComputeBackend } from "../../src/broker/backend";
import { randomId } from "../../src/crypto/api-keys";
import type { RecordedE2bRequest } from "../contract/e2b-contract";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import { body, commandOf, e2bDeployment, SLOW, starts, workOf } from "./e2b-fixtures";

// The e2b backend's execs, inside workerd, with the real `e2b` SDK against the E2B CONTRACT
// SERVER (test/contract/e2b-server.ts), where they run the REAL exec runner as real processes:
// users per stage, stdin, exit codes and output offsets, idempotent starts, kill. Apart from the
// sandboxes' creation (e2b-create.test.ts): here a sandbox is given, and what runs in it is asserted.
// Each test makes runs of its own, so the requests it asserts are exactly its own.

const { backend, requests, mark } = e2bDeployment("https://execs.contract.test", { unowned: true });

async function waitExit(b: ComputeBackend, sandboxId: string, execId: string, from = 0): Promise<ExecInfo> {
  for (let i = 0; i < 20; i++) {
    const info = await b.poll(sandboxId, execId, { waitMs: 2_000, stdoutFrom: from });
    if (info.state === "exited") return info;
  }
  throw new Error(`exec ${execId} did not exit`);
}

describe("e2b backend: execs", SLOW, () => {
  it("round trip: stages map to users, stdin arrives whole, exit code and output offsets come back", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const { id, info } = await workOf(b, runId, proxyId, "default");
    const since = await mark();
    const stdin = JSON.stringify({ mode: "default", hostsFile: ["api.openai.com"] });
    const started = await b.exec(id, {
      id: "wiring",
      argv: ["sh", "-c", "cat; printf '\\nerr' >&2; exit 7"],
      env: {},
      stage: "setup",
      stdin,
      timeoutMs: 60_000,
    });
    expect(started).toMatchObject({ execId: "wiring", sandboxId: id });
    const done = await waitExit(b, id, "wiring");
    expect(done).toMatchObject({ state: "exited", exitCode: 7, stdout: stdin, stderr: "\nerr" });
    expect(done.stdoutEnd).toBe(new TextEncoder().encode(stdin).length);
    const rs = await requests(since);
    const [start] = starts(rs, info.address);
    expect(commandOf(start as RecordedE2bRequest)).toBe(
      `bw-exec start wiring 60000 ${stdin.length} --setup -- sh -c 'cat; printf '"'"'\\nerr'"'"' >&2; exit 7'`,
    );
    expect(start?.user).toBe("root");
    expect(body(start).stdin).toBe(true);
    const input = rs.filter((r) => r.path === "/process.Process/SendInput");
    expect(input).toHaveLength(1);
    expect(atob(body(input[0]).input.stdin)).toBe(stdin);

    // An execute-stage command: as `user`, paged by offsets while it runs. It waits for a file the
    // test makes once it has seen "one" running, not for a time: on a busy machine a sleep can end
    // before the first poll.
    const cmd: ExecRequest = {
      id: "cmd-0",
      argv: ["sh", "-c", "printf one; until [ -e go ]; do sleep 0.05; done; printf two"],
      env: { NODE_EXTRA_CA_CERTS: "/run/benchwright/run-ca.pem" },
      stage: "execute",
      timeoutMs: 600_000,
    };
    const mark2 = await mark();
    await b.exec(id, cmd);
    const execStart = starts(await requests(mark2), info.address)[0] as RecordedE2bRequest;
    expect(execStart.user).toBe("user");
    expect(body(execStart).process.envs).toEqual(cmd.env);
    let first = await b.poll(id, "cmd-0", { waitMs: 800 });
    for (let i = 0; i < 20 && first.stdoutEnd < 3; i++) first = await b.poll(id, "cmd-0", { waitMs: 800 });
    expect(first).toMatchObject({ state: "running", stdout: "one", stdoutEnd: 3 });
    const gate = { ...cmd, id: "go", argv: ["touch", "go"] };
    await b.exec(id, gate);
    expect(await waitExit(b, id, "go")).toMatchObject({ exitCode: 0 });
    const rest = await waitExit(b, id, "cmd-0", first.stdoutEnd);
    expect(rest).toMatchObject({ exitCode: 0, stdout: "two", stdoutEnd: 6 });
    const polls = starts(await requests(mark2), info.address).filter((r) =>
      commandOf(r).startsWith("bw-exec poll"),
    );
    // An execute command is the execute user's: it is polled as that user, not as root.
    expect(polls.length).toBeGreaterThan(0);
    expect(polls.every((r) => r.user === "user")).toBe(true);
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("exec is idempotent by its id: a replayed start returns the first and runs nothing", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const { id } = await workOf(b, runId, proxyId, "default");
    const count: ExecRequest = {
      id: "cmd-0",
      argv: ["sh", "-c", "echo run >> marks; wc -l < marks"],
      env: {},
      stage: "execute",
      timeoutMs: 60_000,
    };
    await b.exec(id, count);
    expect((await waitExit(b, id, "cmd-0")).stdout.trim()).toBe("1");
    const replay = await b.exec(id, count);
    expect(replay).toMatchObject({ execId: "cmd-0", state: "exited", exitCode: 0 });
    await b.exec(id, { ...count, id: "cmd-1" });
    // Had the replay run, this would count 3.
    expect((await waitExit(b, id, "cmd-1")).stdout.trim()).toBe("2");
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("kill ends a running exec with SIGKILL; an exec or sandbox it does not know is not_found", async () => {
    const b = backend();
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const killed = await b.kill(proxyId, "proxy-1");
    expect(killed).toMatchObject({ execId: "proxy-1", state: "exited", signal: "SIGKILL" });
    await expectBackendError(b.kill(proxyId, "proxy-2"), "not_found");
    await expectBackendError(b.poll(proxyId, "nope", {}), "not_found");
    await expectBackendError(
      b.exec(randomId("sbx_"), { argv: ["true"], env: {}, stage: "setup" }),
      "not_found",
    );
    await b.destroy(proxyId);
  });
});
