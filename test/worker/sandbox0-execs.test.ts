import { describe, expect, it } from "vitest";
import { objectName } from "../../src/broker/kubernetes/manifests";
import type { RecordedRequest } from "../contract/kubernetes-contract";
import { expectBackendError } from "./backend-fixtures";
import {
  api,
  contractOptions,
  k8s,
  line,
  newNs,
  proxyAndWorkIn,
  recorded,
  run,
  waitExit,
} from "./sandbox0-fixtures";

// A sandbox0 work pod's execs under the REAL exec runner (the contract server runs it on this
// machine): output, offsets, exit codes, stdin, env, idempotent ids, the v4 fallback, and kill
// and freeze of a command's session. Apart from the pod manifests (sandbox0-pods.test.ts): these
// run real processes and take longer.

describe("sandbox0 work, task and orchestrator pods", () => {
  it("exec round trip under the runner: output, offsets, exit codes, stdin, env, idempotent ids, v4 fallback", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, id } = await proxyAndWorkIn(ns);

    let mark = (await recorded(ns)).length;
    const first = await b.exec(id, {
      id: "e1",
      argv: ["sh", "-c", "printf 'out-\\316\\261'; printf err >&2; exit 3"],
      stage: "execute",
      timeoutMs: 10_000,
    });
    expect(first).toMatchObject({ execId: "e1", sandboxId: id });
    const start = (await recorded(ns))[mark] as RecordedRequest;
    expect(line(start)).toBe(`GET ${api(ns, "pods", objectName(id))}/exec 101`);
    expect(start.query).toMatchObject({
      command: ["/bw/tools/bin/bw-exec", "start", "e1"],
      container: ["work"],
      stdin: ["true"],
      stdout: ["true"],
      stderr: ["true"],
    });
    expect(start.exec).toMatchObject({ protocol: "v5.channel.k8s.io", closedStdin: true, exitCode: 0 });
    expect(JSON.parse(start.exec?.stdin ?? "")).toEqual({
      argv: ["sh", "-c", "printf 'out-\\316\\261'; printf err >&2; exit 3"],
      env: {},
      timeoutMs: 10_000,
    });

    const done = await waitExit(b, id, "e1");
    expect(done).toEqual({
      execId: "e1",
      sandboxId: id,
      state: "exited",
      exitCode: 3,
      signal: null,
      stdout: "out-α",
      stderr: "err",
      stdoutEnd: 6,
      stderrEnd: 3,
    });
    expect(await b.poll(id, "e1", { stdoutFrom: 4, stderrFrom: 3 })).toMatchObject({
      stdout: "α",
      stderr: "",
      stdoutEnd: 6,
      stderrEnd: 3,
    });
    const pollReq = (await recorded(ns)).at(-1);
    expect(pollReq?.query.command).toEqual(["/bw/tools/bin/bw-exec", "poll", "e1", "4", "3", "0"]);

    expect(
      (await run(b, id, { id: "e2", argv: ["cat"], stdin: "hello\nworld", stage: "execute" })).stdout,
    ).toBe("hello\nworld");
    expect(
      (
        await run(b, id, {
          id: "e3",
          argv: ["sh", "-c", 'printf %s "$FOO"'],
          env: { FOO: "bar" },
          stage: "setup",
        })
      ).stdout,
    ).toBe("bar");
    expect(await run(b, id, { id: "e0", argv: ["true"], stage: "execute" })).toMatchObject({ exitCode: 0 });

    // Replayed with the same id: the command ran once.
    await run(b, id, { id: "once", argv: ["sh", "-c", "echo ran >> once.txt"], stage: "execute" });
    await run(b, id, { id: "once", argv: ["sh", "-c", "echo ran >> once.txt"], stage: "execute" });
    expect((await run(b, id, { id: "count", argv: ["cat", "once.txt"], stage: "execute" })).stdout).toBe(
      "ran\n",
    );

    // An exec id the sandbox never saw: not_found (the runner's refusal, exit 3 in the Status).
    await expectBackendError(b.poll(id, "never", {}), "not_found");
    expect((await recorded(ns)).filter((r) => r.exec).at(-1)?.exec?.exitCode).toBe(3);

    // A cluster that speaks only v4 (no way to close stdin): the runner reads one line.
    await contractOptions({ namespace: ns, execProtocols: ["v4.channel.k8s.io"] });
    mark = (await recorded(ns)).length;
    expect((await run(b, id, { id: "v4", argv: ["cat"], stdin: "v4 stdin", stage: "execute" })).stdout).toBe(
      "v4 stdin",
    );
    expect((await recorded(ns))[mark]?.exec).toMatchObject({
      protocol: "v4.channel.k8s.io",
      closedStdin: false,
    });
  });

  it("kill and freeze: the command's session is killed, stopped and continued; each is idempotent", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, id } = await proxyAndWorkIn(ns, "catch-all");

    await b.exec(id, { id: "sleeper", argv: ["sleep", "30"], stage: "execute" });
    const killed = await b.kill(id, "sleeper");
    expect(killed).toMatchObject({ state: "exited", exitCode: null, signal: "SIGKILL" });
    expect(await b.kill(id, "sleeper")).toEqual(killed);
    await expectBackendError(b.kill(id, "nothing"), "not_found");

    await b.exec(id, {
      id: "loop",
      argv: ["sh", "-c", "while :; do sleep 0.05; done"],
      stage: "execute",
    });
    const states = async () => {
      const res = await fetch(`${k8s.url}/_contract/process-states?namespace=${ns}&pod=${objectName(id)}`);
      return (await res.json()) as Record<string, string | null>;
    };
    /** The state letter of an exec's command, once it is (or is not) stopped: a signal lands
     * at the process's next scheduling, so a few looks may be needed. */
    const settle = async (execId: string, stopped: boolean) => {
      let state: string | null | undefined;
      for (let i = 0; i < 100; i++) {
        state = (await states())[execId];
        if ((state === "T") === stopped) break;
      }
      return state;
    };
    // Running: R or S, or D for a moment (a loaded machine's disk wait while it forks `sleep`).
    expect(await settle("loop", false)).toMatch(/^[RSD]$/);
    await b.freeze(id, true);
    await b.freeze(id, true);
    expect(await settle("loop", true)).toBe("T");
    expect((await recorded(ns)).filter((r) => r.exec?.command[1] === "freeze")).toHaveLength(2);
    // A command started while the sandbox is frozen stops with it, and goes on when it thaws.
    await b.exec(id, { id: "late", argv: ["sh", "-c", "echo late"], stage: "execute" });
    expect(await settle("late", true)).toBe("T");
    await b.freeze(id, false);
    await b.freeze(id, false);
    expect(await settle("loop", false)).toMatch(/^[RSD]$/);
    expect(await waitExit(b, id, "late")).toMatchObject({ exitCode: 0, stdout: "late\n" });
    expect(await b.kill(id, "loop")).toMatchObject({ state: "exited", signal: "SIGKILL" });
  });
});
