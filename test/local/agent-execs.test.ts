import { type ExecRequest, type SandboxInfo, SandboxList } from "@benchwright/shared/contract/local-agent";
import { DEFAULT_VIEW_PORT, ProxyView } from "@benchwright/shared/contract/proxy-view";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { OUTPUT_LIMIT } from "../../local-agent/exec";
import { type AgentSuite, startAgentSuite, stateOf, whyNot } from "./agent-suite";
import { type AgentClient, host, secret, until } from "./harness";

// The execs' API on real sandboxes: the environment an exec gets (and the log never has),
// freezing a work sandbox and pausing a proxy sandbox (bw-proxy-view answered once resumed),
// timeouts and kills, output pages, stdin, cwd and an exec started once by its id. Apart from
// what the sandboxes' processes may do (agent-isolation.test.ts).

/** What a stand-in for the proxy serves on 127.0.0.1:<port>/view (generatedAt: when it answers). */
const STAND_IN_VIEW: ProxyView = {
  runId: "run1",
  startedAt: new Date().toISOString(),
  generatedAt: new Date().toISOString(),
  policyVersion: 3,
  policyState: "ready",
  counts: { requests: 0, allow: 0, block: 0, refuse: 0, error: 0, injected: 0 },
  recent: [],
  audit: {
    rowsRecorded: 0,
    rowsSent: 0,
    rowsRejected: 0,
    rowsRefused: 0,
    batchesSent: 0,
    batchesRejected: 0,
    pendingBatches: 0,
    accepting: true,
  },
};
// argv: [marker, view JSON, port]. The marker names it in `ps`.
const VIEW_STAND_IN = `
const view = JSON.parse(process.argv[2]);
require("http")
  .createServer((req, res) => res.end(JSON.stringify({ ...view, generatedAt: new Date().toISOString() })))
  .listen(Number(process.argv[3]), "127.0.0.1", () => console.log("ready"));`;

describe.skipIf(whyNot !== null)("local agent: sandboxes in namespaces", () => {
  let suite: AgentSuite;
  let api: AgentClient;
  let logs: string[];
  let agentSecret: string;
  let proxy: SandboxInfo;
  const canary = `canary-${secret()}`;

  beforeAll(async () => {
    suite = await startAgentSuite();
    ({ api, logs, agentSecret, proxy } = suite);
  }, 300_000);

  afterAll(() => suite?.close(), 30_000);

  it("passes exactly the requested environment, never the agent's", async () => {
    process.env.BW_AGENT_ENV_PROBE = agentSecret;
    try {
      const r = await api.run("wk1", {
        argv: ["env"],
        stage: "execute",
        env: { CANARY: canary, QUOTE: "it's $HOME" },
      });
      const vars = Object.fromEntries(
        r.stdout
          .trim()
          .split("\n")
          .map((l) => [l.split("=")[0], l.slice(l.indexOf("=") + 1)]),
      );
      expect(vars.CANARY).toBe(canary);
      expect(vars.QUOTE).toBe("it's $HOME");
      expect(vars.HOME).toBe("/home/sandbox");
      expect(Object.keys(vars).sort()).toEqual(["CANARY", "HOME", "PATH", "PWD", "QUOTE"]);
      expect(r.stdout).not.toContain(agentSecret);
    } finally {
      delete process.env.BW_AGENT_ENV_PROBE;
    }
    const loader = await api.run("wk1", {
      argv: ["sh", "-c", "echo $LD_PRELOAD"],
      stage: "setup",
      env: { LD_PRELOAD: "/nonexistent/evil.so" },
    });
    expect(loader.stdout).toBe("/nonexistent/evil.so\n"); // reached the program, not nsenter
  });

  it("freezes a work sandbox's processes and thaws them (halting a run)", async () => {
    const started = await api.start("wk1", { argv: ["sh", "-c", "sleep 1; echo woke"], stage: "execute" });
    expect((await api.call("POST", "/v1/sandboxes/wk1/freeze", { frozen: true })).status).toBe(204);
    const frozen = await api.poll("wk1", started.execId, "?waitMs=2000");
    expect(frozen.state).toBe("running"); // stopped: its one-second sleep cannot end
    expect((await api.call("POST", "/v1/sandboxes/wk1/freeze", { frozen: false })).status).toBe(204);
    const done = await api.poll("wk1", started.execId, "?waitMs=10000");
    expect(done).toMatchObject({ state: "exited", exitCode: 0 });
    expect(done.stdout).toContain("woke");
  });

  it("pauses a proxy sandbox and resumes it; bw-proxy-view prints the view, answered only once resumed", async () => {
    const marker = `bw-view-stand-in-${secret().slice(0, 8)}`;
    const standIn = await api.serve("px1", VIEW_STAND_IN, "setup", [
      marker,
      JSON.stringify(STAND_IN_VIEW),
      String(DEFAULT_VIEW_PORT),
    ]);
    const view = (env: Record<string, string> = {}): ExecRequest => ({
      argv: ["bw-proxy-view"],
      stage: "setup",
      env,
    });
    // Running: the view on the default port. The caller's environment does not reach the program
    // but for BW_VIEW_PORT (a NODE_OPTIONS that reached node would make it fail to start).
    const now = await api.run("px1", view({ NODE_OPTIONS: "--require /nonexistent/evil.js" }));
    expect(now).toMatchObject({ exitCode: 0, stderr: "" });
    expect(now.stdout.split("\n")).toHaveLength(2); // one line, then the newline
    expect({ ...ProxyView.parse(JSON.parse(now.stdout)), generatedAt: "x" }).toEqual({
      ...STAND_IN_VIEW,
      generatedAt: "x",
    });
    const elsewhere = await api.run("px1", view({ BW_VIEW_PORT: "9" }));
    expect(elsewhere).toMatchObject({ exitCode: 1, stdout: "" });
    expect(elsewhere.stderr).toMatch(
      /^bw-proxy-view: cannot read the proxy's view at http:\/\/127\.0\.0\.1:9\/view: /,
    );

    const listed = async () =>
      SandboxList.parse((await api.call("GET", "/v1/sandboxes?runId=run1")).body).sandboxes.find(
        (s) => s.id === "px1",
      )?.frozen;
    expect(await listed()).toBe(false);
    expect((await api.call("POST", "/v1/sandboxes/px1/freeze", { frozen: true })).status).toBe(204);
    expect(await listed()).toBe(true);
    await until("the stand-in to be stopped", async () => (await stateOf(api, "px1", marker)) === "T");
    // Paused: a read reaches the stopped stand-in's socket and waits there, unanswered.
    const pending = await api.start("px1", view());
    const k = /^10\.231\.(\d+)\.2$/.exec(proxy.address)?.[1];
    await until("the request to wait in the stand-in's socket", async () => {
      const ss = await host([
        "ip",
        "netns",
        "exec",
        `bw${k}p`,
        "ss",
        "-tniH",
        `( sport = :${DEFAULT_VIEW_PORT} )`,
      ]);
      return /bytes_received:[1-9]/.test(ss.stdout);
    });
    expect((await api.poll("px1", pending.execId)).state).toBe("running");
    const resumedAt = Date.now();
    expect((await api.call("POST", "/v1/sandboxes/px1/freeze", { frozen: false })).status).toBe(204);
    expect(await listed()).toBe(false);
    const done = await api.poll("px1", pending.execId, "?waitMs=20000");
    expect(done).toMatchObject({ state: "exited", exitCode: 0, stderr: "" });
    expect(Date.parse(ProxyView.parse(JSON.parse(done.stdout)).generatedAt)).toBeGreaterThanOrEqual(
      resumedAt,
    );
    expect(await stateOf(api, "px1", marker)).not.toBe("T");
    await api.call("POST", `/v1/sandboxes/px1/exec/${standIn.execId}/kill`);
  }, 30_000);

  it("runs bw-proxy-view in a proxy sandbox only", async () => {
    for (const id of ["wk1", "tk1"]) {
      const res = await api.call("POST", `/v1/sandboxes/${id}/exec`, {
        argv: ["bw-proxy-view"],
        stage: "setup",
      });
      expect([res.status, res.body.code, res.body.detail], id).toEqual([
        400,
        "invalid_request",
        "bw-proxy-view runs in a proxy sandbox only",
      ]);
    }
  });

  it("kills an exec at its timeout, and on request", async () => {
    const started = Date.now();
    const timed = await api.run("wk1", {
      argv: ["sh", "-c", "sleep 30 & sleep 30"],
      stage: "execute",
      timeoutMs: 300,
    });
    expect(Date.now() - started).toBeLessThan(5_000);
    expect(timed).toMatchObject({ state: "exited", exitCode: null, signal: "SIGKILL" });
    expect((await api.sh("wk1", "ps -eo args | grep -c '^sleep 30'")).stdout.trim()).toBe("0");
    const long = await api.start("wk1", { argv: ["sleep", "30"], stage: "execute" });
    const killed = await api.call("POST", `/v1/sandboxes/wk1/exec/${long.execId}/kill`);
    expect(killed.status).toBe(200);
    expect(killed.body).toMatchObject({ state: "exited", signal: "SIGKILL" });
  });

  it("pages output by byte offsets and keeps the last 1 MiB", async () => {
    const r = await api.run("wk1", { argv: ["sh", "-c", "printf abcdef; printf err >&2"], stage: "execute" });
    expect(r).toMatchObject({ stdout: "abcdef", stdoutEnd: 6, stderr: "err", stderrEnd: 3, exitCode: 0 });
    expect(await api.poll("wk1", r.execId, "?stdoutFrom=4&stderrFrom=3")).toMatchObject({
      stdout: "ef",
      stdoutEnd: 6,
      stderr: "",
      stderrEnd: 3,
    });
    const big = await api.run("wk1", {
      argv: ["sh", "-c", "head -c 1200000 /dev/zero | tr '\\0' a; echo"],
      stage: "execute",
    });
    expect(big.stdoutEnd).toBe(1_200_001);
    expect(big.stdout.length).toBe(OUTPUT_LIMIT);
  });

  it("takes stdin, a cwd, and starts an exec with a given id once", async () => {
    const r = await api.run("wk1", {
      argv: ["sh", "-c", "pwd; cat"],
      stage: "execute",
      stdin: "hello",
      cwd: "/tmp",
    });
    expect(r.stdout).toBe("/tmp\nhello");
    const request = {
      id: "once-1",
      argv: ["sh", "-c", "echo x >> /tmp/once; cat /tmp/once | wc -l"],
      stage: "execute" as const,
    };
    const first = await api.run("wk1", request);
    const second = await api.call("POST", "/v1/sandboxes/wk1/exec", request);
    expect(second.status).toBe(200);
    expect(second.body.execId).toBe("once-1");
    expect(first.stdout.trim()).toBe("1");
    expect((await api.sh("wk1", "wc -l < /tmp/once")).stdout.trim()).toBe("1");
  });

  it("never logs an exec's environment; one line per lifecycle event", async () => {
    expect(logs.join("\n")).not.toContain(canary);
    expect(logs.filter((l) => l.includes('"sandbox_created"'))).toHaveLength(3);
  });
});
