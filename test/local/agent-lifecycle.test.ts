import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { AgentHealth, type SandboxInfo, SandboxList } from "@benchwright/shared/contract/local-agent";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { RunningAgent } from "../../local-agent/server";
import { localBackend } from "../../src/broker/local-backend";
import { type AgentSuite, startAgentSuite, stateOf, UIDS, whyNot } from "./agent-suite";
import { type AgentClient, host, leftovers, type TestControlPlane, until } from "./harness";

// The agent's API and its sandboxes' lifecycle: it refuses calls without the secret and bad
// bodies, describes and lists what it made, destroys sandboxes (paused, halted, twice) leaving
// nothing, and close() removes all it made. Apart from the other agent-*.test.ts files: these
// tests make and destroy sandboxes of their own, and close the agent last.

describe.skipIf(whyNot !== null)("local agent: sandboxes in namespaces", () => {
  let suite: AgentSuite;
  let agent: RunningAgent;
  let api: AgentClient;
  let controlPlane: TestControlPlane;
  let stateDir: string;
  let ipForwardBefore: string;
  let agentSecret: string;
  let proxy: SandboxInfo;
  let work: SandboxInfo; // default routing
  let catchAll: SandboxInfo;

  beforeAll(async () => {
    suite = await startAgentSuite();
    ({ agent, api, controlPlane, stateDir, ipForwardBefore, agentSecret, proxy, work, catchAll } = suite);
  }, 300_000);

  afterAll(() => suite?.close(), 30_000);

  it("refuses a call without the secret or with a wrong one (401 unauthorized)", async () => {
    for (const auth of [null, "wrong-secret-wrong-secret", `${agentSecret}x`]) {
      const res = await api.call("GET", "/v1/health", undefined, auth);
      expect(res.status).toBe(401);
      expect(res.body.code).toBe("unauthorized");
    }
    const res = await api.call("POST", "/v1/sandboxes", { kind: "proxy", id: "nope", runId: "r" }, null);
    expect(res.status).toBe(401);
    expect((await api.call("GET", "/v1/sandboxes?runId=r")).body.sandboxes).toEqual([]);
  });

  it("refuses bad bodies with 400 invalid_request", async () => {
    const bad: unknown[] = [
      "{not json",
      { kind: "proxy", id: "bad id!", runId: "r" },
      { kind: "proxy", id: "ok", runId: "r", extra: 1 },
      { kind: "work", id: "ok", runId: "r", proxySandboxId: "px1" },
      { kind: "vm", id: "ok", runId: "r" },
    ];
    for (const body of bad) {
      const res = await api.call("POST", "/v1/sandboxes", body);
      expect(res.status, JSON.stringify(body)).toBe(400);
      expect(res.body.code).toBe("invalid_request");
    }
    const exec = await api.call("POST", "/v1/sandboxes/wk1/exec", { argv: ["true"], stage: "root" });
    expect([exec.status, exec.body.code]).toEqual([400, "invalid_request"]);
    const unknown = await api.call("POST", "/v1/sandboxes/wk1/exec", { argv: [], stage: "setup" });
    expect([unknown.status, unknown.body.code]).toEqual([400, "invalid_request"]);
    const poll = await api.call("GET", "/v1/sandboxes/wk1/exec/x?waitMs=-1");
    expect([poll.status, poll.body.code]).toEqual([400, "invalid_request"]);
    const missing = await api.call("POST", "/v1/sandboxes/nosuch/exec", { argv: ["true"], stage: "setup" });
    expect([missing.status, missing.body.code]).toEqual([404, "not_found"]);
  });

  it("reports this machine healthy", async () => {
    const res = await api.call("GET", "/v1/health");
    expect(res.status).toBe(200);
    expect(AgentHealth.parse(res.body)).toEqual({
      ok: true,
      problems: [],
      workImageId: expect.stringMatching(/^sha256:[0-9a-f]{64}$/),
    });
  });

  it("describes the sandboxes it made, and answers a repeated create with the same sandbox", async () => {
    expect(proxy).toMatchObject({ kind: "proxy", state: "ready", proxyAddress: null, routing: null });
    expect(proxy.controlPlaneUrl).toMatch(/^http:\/\/10\.231\.\d+\.1:\d+$/);
    expect(work).toMatchObject({ kind: "work", routing: "default", controlPlaneUrl: null });
    expect(work.proxyAddress).toMatch(/^10\.232\.\d+\.1$/);
    expect(catchAll).toMatchObject({ kind: "task", routing: "catch-all" });
    expect(work.probeTarget).toMatch(/^10\.233\.\d+\.1:\d+$/);
    const again = await api.call("POST", "/v1/sandboxes", {
      kind: "work",
      id: "wk1",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "default",
    });
    expect(again.status).toBe(200);
    expect(again.body).toEqual(work);
    const other = await api.call("POST", "/v1/sandboxes", {
      kind: "work",
      id: "wk1",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "catch-all",
    });
    expect([other.status, other.body.code]).toEqual([400, "invalid_request"]);
    const listed = await api.call("GET", "/v1/sandboxes?runId=run1");
    expect(listed.body.sandboxes?.map((s: SandboxInfo) => s.id).sort()).toEqual(["px1", "tk1", "wk1"]);
  });

  it("destroys a paused proxy sandbox promptly, continuing its proxy first so that it flushes", async () => {
    const px2 = await api.create({ kind: "proxy", id: "px2", runId: "run2" });
    // A stand-in for the proxy: on SIGTERM it calls the control plane (the real one sends its
    // last audit batch), then exits.
    await api.serve(
      "px2",
      `process.on("SIGTERM", () => fetch(process.argv[1] + "/flushed").finally(() => process.exit(0)));
       setInterval(() => {}, 1000);
       console.log("ready");`,
      "setup",
      [px2.controlPlaneUrl as string, "bw-flush-stand-in"],
    );
    expect((await api.call("POST", "/v1/sandboxes/px2/freeze", { frozen: true })).status).toBe(204);
    await until(
      "the stand-in to be stopped",
      async () => (await stateOf(api, "px2", "bw-flush-stand-in")) === "T",
    );
    const all = SandboxList.parse((await api.call("GET", "/v1/sandboxes")).body).sandboxes;
    expect(all.find((s) => s.id === "px2")).toMatchObject({ runId: "run2", kind: "proxy", frozen: true });
    const started = Date.now();
    expect((await api.call("DELETE", "/v1/sandboxes/px2")).status).toBe(204);
    expect(controlPlane.paths).toContain("/flushed");
    // Stopped, the stand-in would have taken the SIGTERM only after the 5 s grace: never.
    expect(Date.now() - started).toBeLessThan(5_000);
    const after = SandboxList.parse((await api.call("GET", "/v1/sandboxes")).body).sandboxes;
    expect(after.map((s) => s.id)).not.toContain("px2");
  }, 30_000);

  it("destroys idempotently, and a destroyed work sandbox leaves nothing", async () => {
    const extra = await api.create({
      kind: "work",
      id: "wk2",
      runId: "run1",
      proxySandboxId: "px1",
      routing: "default",
    });
    const netns = (await host(["ip", "netns", "list"])).stdout;
    const name = netns
      .split("\n")
      .map((l) => l.split(" ")[0] ?? "")
      .find((n) => /^bw\d+w\d+$/.test(n) && n.endsWith(`w${2}`));
    expect(name).toBeDefined();
    for (let n = 0; n < 2; n++) expect((await api.call("DELETE", "/v1/sandboxes/wk2")).status).toBe(204);
    expect((await api.call("DELETE", "/v1/sandboxes/never-existed")).status).toBe(204);
    expect((await host(["ip", "netns", "list"])).stdout).not.toContain(`${name} `);
    expect(existsSync(join(stateDir, "sandboxes", "wk2"))).toBe(false);
    const gone = await api.call("POST", "/v1/sandboxes/wk2/exec", { argv: ["true"], stage: "setup" });
    expect([gone.status, gone.body.code]).toEqual([404, "not_found"]);
    expect(extra.address).not.toBe(work.address);
  });

  it("destroys a halted (frozen) work sandbox and its running execs promptly", async () => {
    await api.create({ kind: "work", id: "wk3", runId: "run1", proxySandboxId: "px1", routing: "default" });
    const uid = Number(
      (await api.sh("wk3", "cat /proc/self/uid_map", "setup")).stdout.trim().split(/\s+/)[1],
    );
    await api.start("wk3", { argv: ["sh", "-c", "sleep 60 & sleep 60"], stage: "execute" });
    // Freeze once they run in the sandbox: a process still on its way in is not there to stop.
    await until("the sleeps to run", async () => (await stateOf(api, "wk3", "sleep 60")) === "S");
    expect((await api.call("POST", "/v1/sandboxes/wk3/freeze", { frozen: true })).status).toBe(204);
    await until("the sleeps to be stopped", async () => (await stateOf(api, "wk3", "sleep 60")) === "T");
    const started = Date.now();
    expect((await api.call("DELETE", "/v1/sandboxes/wk3")).status).toBe(204);
    // Its execs' host-side nsenters stopped with their children: left stopped, the sandbox's PID 1
    // could not finish dying and the DELETE would wait out a 5 s fallback.
    expect(Date.now() - started).toBeLessThan(5_000);
    const processes = (await leftovers([uid, uid + 2])).filter((l) => l.startsWith("process"));
    expect(processes).toEqual([]);
    const listed = SandboxList.parse((await api.call("GET", "/v1/sandboxes")).body).sandboxes;
    expect(listed.map((s) => s.id)).not.toContain("wk3");
  }, 30_000);

  it("lists every sandbox it holds, and none it destroyed (GET /v1/sandboxes, the broker's list())", async () => {
    const res = await api.call("GET", "/v1/sandboxes");
    expect(res.status).toBe(200);
    const { sandboxes } = SandboxList.parse(res.body);
    expect(sandboxes.map((s) => [s.id, s.runId, s.kind, s.state, s.frozen]).sort()).toEqual([
      ["px1", "run1", "proxy", "ready", false],
      ["tk1", "run1", "task", "ready", false],
      ["wk1", "run1", "work", "ready", false],
    ]);
    const listed = await localBackend(agent.url, agentSecret).list();
    expect(listed.sort((a, b) => a.id.localeCompare(b.id))).toEqual([
      { id: "px1", runId: "run1", kind: "proxy" },
      { id: "tk1", runId: "run1", kind: "task" },
      { id: "wk1", runId: "run1", kind: "work" },
    ]);
    expect((await api.call("GET", "/v1/sandboxes?runId=run2")).body).toEqual({ sandboxes: [] });
  });

  it("close() removes every namespace, process, table and file it made", async () => {
    await agent.close();
    expect(await leftovers(UIDS)).toEqual([]);
    expect(readFileSync("/proc/sys/net/ipv4/ip_forward", "utf8").trim()).toBe(ipForwardBefore);
    expect(existsSync(join(stateDir, "sandboxes", "px1"))).toBe(false);
  });
});
