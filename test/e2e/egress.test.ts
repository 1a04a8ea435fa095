import { type ChildProcess, execFileSync, spawn } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, expect, it } from "vitest";
import { type HostListener, startRelay } from "../../local-agent/relay";
import { type DemoUpstream, startDemoUpstream } from "../../scripts/lib/demo-upstream";
import { randomId } from "../../src/crypto/api-keys";
import { until } from "../until";
import {
  type Api,
  CLIENT_HELPERS,
  describeE2e,
  type E2eOptions,
  lastJson,
  newUser,
  nodeScript,
  SKIP_REASON,
  stdoutOf,
  waitForEnd,
} from "./harness";

// Egress through the user's own machine and the declared model's lane, on the local backend.
// "The user's machine" is a network namespace this suite made (10.240.88.0/30) where the real
// egress agent runs; on its LAN (10.240.89.0/30) lives an upstream that the run's proxy cannot
// reach itself (no name for it, and a private address its policy refuses). The agent dials the control plane
// (through a relay on the namespace's link, as a user's machine dials the public URL), the
// proxy dials it too, and the relay Durable Object in `wrangler dev` joins the two.

if (SKIP_REASON) console.warn(`egress end-to-end runs skipped: ${SKIP_REASON} (CI runs them as root)`);

// The user's LAN (an upstream in a namespace of its own) and the user's machine (the agent's
// namespace): separate, because the agent rightly refuses to dial its own machine's addresses.
const LAN_NS = "bwt-e2lan";
const LAN_INDEX = 89;
const USER_NS = "bwt-e2usr";
const USER_INDEX = 88;
const USER_HOST_SIDE = `${USER_NS}h`;
const USER_ADDRESS = `10.240.${USER_INDEX}.2`;

const ip = (...args: string[]) => execFileSync("ip", args, { stdio: ["ignore", "ignore", "pipe"] });

function removeUserMachine(): void {
  for (const args of [
    ["link", "del", USER_HOST_SIDE],
    ["netns", "del", USER_NS],
  ]) {
    try {
      ip(...args);
    } catch {}
  }
  rmSync(`/etc/netns/${USER_NS}`, { recursive: true, force: true });
}

/** A namespace with a link to the host (its way to the control plane and to its LAN). */
function makeUserMachine(hosts: string): void {
  removeUserMachine();
  ip("netns", "add", USER_NS);
  ip("link", "add", USER_HOST_SIDE, "type", "veth", "peer", "name", `${USER_HOST_SIDE}x`);
  ip("link", "set", `${USER_HOST_SIDE}x`, "netns", USER_NS);
  ip("-n", USER_NS, "link", "set", `${USER_HOST_SIDE}x`, "name", "eth0");
  ip("addr", "add", `10.240.${USER_INDEX}.1/30`, "dev", USER_HOST_SIDE);
  ip("link", "set", USER_HOST_SIDE, "up");
  ip("-n", USER_NS, "addr", "add", `${USER_ADDRESS}/30`, "dev", "eth0");
  ip("-n", USER_NS, "link", "set", "eth0", "up");
  ip("-n", USER_NS, "link", "set", "lo", "up");
  ip("-n", USER_NS, "route", "add", "default", "via", `10.240.${USER_INDEX}.1`);
  // The user's machine resolves names its own way (`ip netns exec` mounts this over /etc/hosts).
  mkdirSync(`/etc/netns/${USER_NS}`, { recursive: true });
  writeFileSync(`/etc/netns/${USER_NS}/hosts`, hosts);
}
const LAN_HOSTS = ["lan.demo.test", "lan2.demo.test", "loop.demo.test"];

interface Agent {
  child: ChildProcess;
  lines: string[];
  exited: Promise<number | null>;
}

let lan: DemoUpstream;

async function start(): Promise<E2eOptions> {
  // Started first: its own test CA, which the proxy must trust for TLS inside the tunnel. It
  // expects the same canary as the suite's upstream (the run's vault holds it).
  const canary = `canary-${randomId("e2g_")}`;
  lan = await startDemoUpstream({
    name: LAN_NS,
    index: LAN_INDEX,
    hosts: LAN_HOSTS,
    expectedKey: canary,
  });
  // lan.demo.test is on the user's LAN; loop.demo.test points at the user's own loopback,
  // which the agent must refuse to dial.
  makeUserMachine(
    `127.0.0.1 localhost\n${lan.address} lan.demo.test\n${lan.address} lan2.demo.test\n127.0.0.1 loop.demo.test\n`,
  );
  return { name: "bwt-e2g", index: 90, extraCaPem: lan.caPem, canary };
}

const BLOCK = { start, after: removeUserMachine };

describeE2e("egress through the user's machine, and the model lane", BLOCK, (e) => {
  let relay: HostListener;
  const agents: Agent[] = [];

  beforeAll(async () => {
    const api = new URL(e.stack.apiUrl);
    relay = await startRelay({
      host: `10.240.${USER_INDEX}.1`,
      allowFrom: USER_ADDRESS,
      target: { host: api.hostname, port: Number(api.port) },
    });
  });

  afterAll(async () => {
    for (const a of agents) a.child.kill("SIGKILL");
    await relay?.close();
    await lan?.stop();
  });

  /** The user's agent, run in the user's namespace as the user guide says (plain http: test only). */
  function startAgent(token: string, extra: string[] = []): Agent {
    const child = spawn(
      "ip",
      [
        "netns",
        "exec",
        USER_NS,
        process.execPath,
        join(import.meta.dirname, "..", "..", "proxy-image", "dist", "egress-agent.cjs"),
        "--url",
        `http://10.240.${USER_INDEX}.1:${relay.port}`,
        "--allow-cidr",
        lan.cidr,
        "--insecure-http",
        ...extra,
      ],
      // The token by environment, as the agent's usage recommends (not in the process list).
      { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, BENCHWRIGHT_EGRESS_TOKEN: token } },
    );
    const lines: string[] = [];
    for (const stream of [child.stdout, child.stderr]) {
      stream?.on("data", (d: Buffer) => lines.push(...d.toString().split("\n").filter(Boolean)));
    }
    const exited = new Promise<number | null>((resolve) => child.once("exit", (code) => resolve(code)));
    const agent = { child, lines, exited };
    agents.push(agent);
    return agent;
  }

  async function vault(api: Api, entries: Array<{ pattern: string; action: string; via?: string }>) {
    const ok = (res: { status: number; text: string }, what: string) => {
      if (res.status >= 300) throw new Error(`${what}: ${res.status} ${res.text}`);
    };
    ok(await api.call("POST", "/v1/vault/secrets", { name: "DEMO_KEY", value: e.canary }), "secret");
    ok(
      await api.call("POST", "/v1/vault/rules", {
        host: "lan.demo.test",
        secret: "DEMO_KEY",
        inject: { scheme: "bearer" },
      }),
      "rule",
    );
    for (const entry of entries) ok(await api.call("POST", "/v1/vault/hosts", entry), entry.pattern);
  }

  it("a local-egress run waits for the agent, reaches the LAN through it with the key, and both ends refuse what they must", async () => {
    const api = await newUser(e.stack.apiUrl);
    await vault(api, [
      { pattern: "api.demo.test", action: "allow", via: "direct" },
      { pattern: "lan2.demo.test", action: "allow", via: "direct" },
      { pattern: "blocked.demo.test", action: "block" },
    ]);
    const script = `${CLIENT_HELPERS}
(async () => {
  console.log(JSON.stringify({
    lan: await get("https://lan.demo.test/v1/whoami"),
    api: await get("https://api.demo.test/v1/whoami"),
    lanDirect: await get("https://lan2.demo.test/"),
    loop: await get("https://loop.demo.test/"),
    blocked: await get("https://blocked.demo.test/"),
  }));
})();`;
    const launched = await api.call("POST", "/v1/runs", {
      commands: [nodeScript(script)],
      egress: "local",
    });
    expect(launched.status, launched.text).toBe(202);
    const { token, command } = launched.json.egressAgent;
    expect(command).toContain("npx --no benchwright egress-agent");
    // Nothing runs before the agent is there: the run says it waits for it.
    await until(
      "the run to wait for its agent",
      async () => {
        const run = await api.call("GET", `/v1/runs/${launched.json.id}`);
        return run.json.notes.some((n: { code: string }) => n.code === "egress_agent_awaited");
      },
      60_000,
    );
    expect(stdoutOf((await api.call("GET", `/v1/runs/${launched.json.id}`)).json)).toBe("");
    const agent = startAgent(token);
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      routing: "catch-all",
    });
    const out = lastJson(run);
    // Through the tunnel, with the key injected by the proxy inside TLS end to end.
    expect(out.lan, agent.lines.join("\n")).toMatchObject({
      status: 200,
      body: { host: "lan.demo.test", keyMatches: true },
    });
    // A host the vault sends direct goes direct (and gets no key: its rule is the LAN's).
    expect(out.api).toMatchObject({ status: 200, body: { keyPresent: false } });
    // The proxy cannot reach the LAN itself: routed direct, the LAN host gets nowhere.
    expect(out.lanDirect.status).not.toBe(200);
    // The agent refuses its own loopback; the proxy refuses the blocked host before the tunnel.
    expect(out.loop.status).toBe(403);
    expect(out.blocked.status).toBe(403);
    expect(lan.seen.filter((s) => s.host === "lan2.demo.test")).toEqual([]);
    expect(lan.seen.filter((s) => s.host === "lan.demo.test")).toHaveLength(1);

    const routes = (await api.call("GET", `/v1/runs/${run.id}/egress-routes`)).json.egressRoutes;
    const route = (host: string) =>
      routes.filter((r: { host: string }) => r.host === host).map((r: { route: string }) => r.route);
    expect(route("lan.demo.test")).toEqual(["tunnel"]);
    expect(route("api.demo.test")).toEqual(["direct"]);
    expect(route("loop.demo.test")).toEqual(["refused"]);
    expect(route("blocked.demo.test")).toEqual(["refused"]);
    const blocked = (await api.call("GET", `/v1/runs/${run.id}/blocked-hosts`)).json.blockedHosts;
    expect(blocked).toContainEqual(
      expect.objectContaining({ host: "loop.demo.test", source: "local_agent" }),
    );
    expect(blocked).toContainEqual(expect.objectContaining({ host: "blocked.demo.test", source: "proxy" }));

    // The run's end tells the agent: it exits 0, having logged decisions and never the key.
    expect(await agent.exited).toBe(0);
    const log = agent.lines.join("\n");
    expect(log).toContain('"lan.demo.test"');
    expect(log).not.toContain(e.canary);
    expect(log).not.toContain(token);
    expect(JSON.stringify(run)).not.toContain(e.canary);
  });

  it("the agent killed mid-run: tunnelled egress is refused (never direct) and the run says the tunnel went down", async () => {
    const api = await newUser(e.stack.apiUrl);
    await vault(api, []);
    const script = `${CLIENT_HELPERS}
(async () => {
  const first = await get("https://lan.demo.test/one");
  console.log(JSON.stringify({ marker: "first", first }));
  // A request in flight when the agent dies fails as it can (502); the next ones must be refused.
  let after = null;
  const failedInFlight = [];
  for (let i = 0; i < 240 && after === null; i++) {
    await new Promise((r) => setTimeout(r, 250));
    const r = await get("https://lan.demo.test/again");
    if (r.status === 503) after = r;
    else if (r.status !== 200) failedInFlight.push(r.status ?? r.error);
  }
  console.log(JSON.stringify({ first, after, failedInFlight }));
})();`;
    const launched = await api.call("POST", "/v1/runs", {
      commands: [nodeScript(script)],
      egress: "local",
    });
    expect(launched.status, launched.text).toBe(202);
    const agent = startAgent(launched.json.egressAgent.token);
    await until(
      "the first request through the tunnel",
      async () => {
        const run = await api.call("GET", `/v1/runs/${launched.json.id}`);
        return stdoutOf(run.json).includes('"marker":"first"');
      },
      90_000,
    );
    agent.child.kill("SIGKILL");
    const run = await waitForEnd(api, launched.json.id);
    const out = lastJson(run);
    expect(out.first.status).toBe(200);
    expect(out.after, JSON.stringify(out)).toMatchObject({ status: 503 });
    expect(out.failedInFlight.length).toBeLessThanOrEqual(1);
    expect(run.notes).toContainEqual(expect.objectContaining({ code: "tunnel_down", level: "warning" }));
    const routes = (await api.call("GET", `/v1/runs/${run.id}/egress-routes`)).json.egressRoutes;
    expect(routes).toContainEqual(expect.objectContaining({ host: "lan.demo.test", route: "tunnel" }));
    expect(routes).toContainEqual(expect.objectContaining({ host: "lan.demo.test", route: "refused" }));
    expect(routes.some((r: { route: string }) => r.route === "direct")).toBe(false);
  });

  it("the declared model's lane: a fake base URL and placeholder in the sandbox, the vault key from the proxy, tokens counted", async () => {
    const api = await newUser(e.stack.apiUrl);
    expect((await api.call("POST", "/v1/vault/secrets", { name: "MODEL_KEY", value: e.canary })).status).toBe(
      201,
    );
    const model = await api.call("POST", "/v1/vault/models", {
      name: "eval-model",
      provider: "openai-compatible",
      baseUrl: "https://api.demo.test/v1",
      secret: "MODEL_KEY",
      upstreamModel: "demo-1",
    });
    expect(model.status, model.text).toBeLessThan(300);
    const script = `
(async () => {
  const base = process.env.OPENAI_BASE_URL;
  const key = process.env.OPENAI_API_KEY;
  const post = async (path, body) => {
    const r = await fetch(base + path, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer " + key },
      body: JSON.stringify(body),
    });
    return { status: r.status, text: await r.text() };
  };
  const messages = [{ role: "user", content: "prompt-marker-7f3a" }];
  const chat = await post("/chat/completions", { model: "eval-model", messages });
  const stream = await post("/chat/completions", { model: "eval-model", messages, stream: true });
  const responses = await post("/responses", { model: "eval-model", input: "prompt-marker-7f3a", stream: true });
  const other = await post("/chat/completions", { model: "some-other-model", messages });
  console.log(JSON.stringify({
    base, key,
    chat: { status: chat.status, body: JSON.parse(chat.text) },
    stream: { status: stream.status, done: stream.text.includes("[DONE]"), hello: stream.text.includes("Hello"), usage: stream.text.includes('"usage":{') },
    responses: { status: responses.status, completed: responses.text.includes("response.completed") },
    other: other.status,
  }));
})();`;
    const launched = await api.call("POST", "/v1/runs", {
      model: "eval-model",
      commands: [nodeScript(script)],
    });
    expect(launched.status, launched.text).toBe(202);
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      reason: "completed",
    });
    const out = lastJson(run);
    expect(out.base).toBe("http://model.benchwright.invalid/v1");
    expect(out.key).toBe("bw-model-lane-placeholder");
    expect(out.chat.status, JSON.stringify(out)).toBe(200);
    expect(out.chat.body.model).toBe("demo-1");
    expect(out.stream).toEqual({ status: 200, done: true, hello: true, usage: false });
    expect(out.responses).toEqual({ status: 200, completed: true });
    expect(out.other).toBe(400);
    // The provider got the vault key, from the proxy; the sandbox never had it.
    const calls = e.upstream.seen.filter((s) => s.endpoint !== undefined && s.model === "demo-1");
    expect(calls.length).toBe(3);
    expect(calls.every((c) => c.keyMatches === true)).toBe(true);
    expect(JSON.stringify(run)).not.toContain(e.canary);
    // Which model and provider it reached, and the tokens per call: no prompt, no output.
    const recorded = await until(
      "the model calls' audit rows",
      async () => {
        const res = await api.call("GET", `/v1/runs/${run.id}/model-calls`);
        // Three calls sent upstream, and the one the lane refused (another model's name).
        return res.json?.calls?.length === 4 && res.json;
      },
      30_000,
    );
    expect(recorded.totals).toMatchObject({
      calls: 4,
      inputTokens: 12 + 12 + 9,
      outputTokens: 5 + 5 + 4,
      refused: 1,
    });
    const sent = recorded.calls.filter((c: { refused: string | null }) => c.refused === null);
    expect(sent).toHaveLength(3);
    expect(
      sent.every(
        (c: { provider: string; model: string }) =>
          c.provider === "openai-compatible" && c.model === "eval-model",
      ),
    ).toBe(true);
    expect(JSON.stringify(recorded)).not.toContain("prompt-marker-7f3a");
    expect(JSON.stringify(recorded)).not.toContain("Hello");
  });
});
