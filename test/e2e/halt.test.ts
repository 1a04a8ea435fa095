import { expect, it } from "vitest";
import {
  CLIENT_HELPERS,
  demoVault,
  describeE2e,
  lastJson,
  newUser,
  nodeScript,
  stdoutOf,
  waitForEnd,
} from "./harness";

// Halt for review, on real parts: a running run is halted (its commands' processes stop), the
// user edits host policy, the run resumes, and the proxy, which kept running and polling, already
// enforces the edit. The deadline is the proxy's own policy poll, measured by the sandbox itself.

describeE2e("halting a run for review", { start: { name: "bwt-e2h", index: 94 } }, (e) => {
  it("picks up a host policy edit made while halted, within seconds of resuming", async () => {
    const api = await newUser(e.stack.apiUrl);
    // Catch-all (block default), other.demo.test allowed for now.
    await demoVault(api, e.canary, { default: "block" });
    const allow = await api.call("POST", "/v1/vault/hosts", { pattern: "other.demo.test", action: "allow" });
    expect(allow.status).toBe(200);
    const first = `${CLIENT_HELPERS}
get("https://other.demo.test/first").then((r) => console.log("first:" + r.status));`;
    // The second command retries until refused and reports how long the proxy took.
    const second = `${CLIENT_HELPERS}
(async () => {
  const started = Date.now();
  let r;
  for (;;) {
    r = await get("https://other.demo.test/again");
    if (r.status === 403 || Date.now() - started > 15000) break;
    await new Promise((ok) => setTimeout(ok, 100));
  }
  console.log(JSON.stringify({ status: r.status, waitedMs: Date.now() - started }));
})();`;
    const launched = await api.call("POST", "/v1/runs", {
      commands: [`${nodeScript(first)}\nsleep 3`, nodeScript(second)],
    });
    const id = launched.json.id as string;
    // Wait for the first command's answer (the allowed host reached), then halt.
    const deadline = Date.now() + 60_000;
    for (;;) {
      const run = await api.call("GET", `/v1/runs/${id}`);
      if (stdoutOf(run.json).includes("first:")) break;
      if (Date.now() > deadline) throw new Error(`no first output: ${run.text.slice(0, 2000)}`);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect((await api.call("POST", `/v1/runs/${id}/halt`)).status).toBe(202);
    for (;;) {
      if ((await api.call("GET", `/v1/runs/${id}`)).json.halted === true) break;
      if (Date.now() > deadline) throw new Error("the run did not halt");
      await new Promise((r) => setTimeout(r, 100));
    }
    // The review: block the host, then resume.
    const hosts = await api.call("GET", "/v1/vault/hosts");
    const entry = hosts.json.hosts.find((h: { pattern: string }) => h.pattern === "other.demo.test");
    expect((await api.call("PATCH", `/v1/vault/hosts/${entry.id}`, { action: "block" })).status).toBe(200);
    expect((await api.call("POST", `/v1/runs/${id}/resume`)).status).toBe(202);

    const run = await waitForEnd(api, id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      reason: "completed",
    });
    const out = stdoutOf(run);
    expect(out).toContain("first:200");
    const result = JSON.parse(
      out
        .split("\n")
        .filter((l) => l.startsWith("{"))
        .at(-1) ?? "{}",
    );
    expect(result.status).toBe(403);
    expect(result.waitedMs).toBeLessThan(5_000);
    const notes = run.trace
      .filter((t: { kind: string }) => t.kind === "note")
      .map((t: { detail: { halted?: boolean } }) => t.detail.halted);
    expect(notes).toEqual(expect.arrayContaining([true, false]));
    expect(run.halted).toBe(false);
    // Halting an ended run is refused with a clear code.
    expect((await api.call("POST", `/v1/runs/${id}/halt`)).json.code).toBe("run_ended");
  });

  it("notes, on resume, that a change needing catch-all was not retrofitted; a task made after it gets catch-all", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    // One task at a time: "late" waits for "first", so its sandbox is made after the edit.
    const late = `${CLIENT_HELPERS}
get("https://other.demo.test/late").then((r) => console.log(JSON.stringify(r)));`;
    const launched = await api.call("POST", "/v1/runs", {
      commands: ["sleep 8"],
      tasks: [
        { name: "first", commands: ["sleep 8"] },
        { name: "late", commands: [nodeScript(late)] },
      ],
      maxParallelTasks: 1,
    });
    const id = launched.json.id as string;
    const deadline = Date.now() + 60_000;
    for (;;) {
      if ((await api.call("GET", `/v1/runs/${id}`)).json.status === "running") break;
      if (Date.now() > deadline) throw new Error("the run did not start");
      await new Promise((r) => setTimeout(r, 100));
    }
    await api.call("POST", `/v1/runs/${id}/halt`);
    for (;;) {
      if ((await api.call("GET", `/v1/runs/${id}`)).json.halted === true) break;
      if (Date.now() > deadline) throw new Error("the run did not halt");
      await new Promise((r) => setTimeout(r, 100));
    }
    await api.call("PUT", "/v1/vault/settings", { default: "block" });
    await api.call("POST", `/v1/runs/${id}/resume`);
    const run = await waitForEnd(api, id);
    expect(run.status).toBe("finished");
    expect(run.routing).toBe("default");
    const note = run.notes.find((n: { code: string }) => n.code === "routing_change_not_retrofitted");
    expect(note).toMatchObject({ level: "warning" });
    expect(note.text).toContain("Relaunch");
    expect(note.text).toContain("Task sandboxes made from now on");
    // Sandboxes made before the edit keep default routing; the task made after it has catch-all,
    // and there the block default refuses a host its hosts file never named: at the handshake,
    // since the run CA was made under default routing and vouches only for its names (case N5).
    const routing = (kind: string, taskIndex: number | null) =>
      run.sandboxes.find(
        (s: { kind: string; taskIndex: number | null }) => s.kind === kind && s.taskIndex === taskIndex,
      )?.routing;
    expect([routing("work", null), routing("task", 0), routing("task", 1)]).toEqual([
      "default",
      "default",
      "catch-all",
    ]);
    expect(lastJson(run, "late")).toMatchObject({ error: expect.any(String) });
    expect(e.upstream.seen.filter((s) => s.path === "/late")).toEqual([]);
  });
});
