import { createExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import {
  AgentPolicy,
  CLOSE_PEER_GONE,
  CLOSE_REPLACED,
  CLOSE_RUN_ENDED,
  CLOSE_TOKEN_REVOKED,
  EGRESS_AGENT_PATH,
  EGRESS_AGENT_POLICY_PATH,
  PAIRED,
  tunnelPath,
} from "@benchwright/shared/contract/tunnel";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { runEvents, runs } from "../../src/db/schema";
import worker from "../../src/index";
import { relayStub } from "../../src/tunnel/relay";
import { until } from "../until";
import { BASE, call, expectProblem, newTenant, withDb } from "./harness";
import { newRun, setRunStatus } from "./run-fixtures";

// The egress tunnel's control-plane side, in workerd: the agent's token, its copy of the host
// policy, and the relay joining a run's proxy and the user's agent (shared/contract/tunnel.ts).
// Both ends are real WebSockets through the Worker's own fetch, as the proxy and agent dial it.

interface Peer {
  ws: WebSocket;
  texts: string[];
  bytes: Uint8Array[];
  closed: Promise<{ code: number; reason: string }>;
  /** Resolves once a text message equal to `text` arrived. */
  text(text: string): Promise<void>;
  nextBytes(): Promise<Uint8Array>;
}

async function dial(path: string, token: string): Promise<Peer | { status: number; text: string }> {
  const res = await worker.fetch(
    new Request(`${BASE}${path}`, { headers: { upgrade: "websocket", authorization: `Bearer ${token}` } }),
    env,
    createExecutionContext(),
  );
  const ws = res.webSocket;
  if (!ws) return { status: res.status, text: await res.text() };
  // Bytes as ArrayBuffers (the standard default is Blob), as the proxy and the agent read them.
  (ws as WebSocket & { binaryType: string }).binaryType = "arraybuffer";
  ws.accept();
  const texts: string[] = [];
  const bytes: Uint8Array[] = [];
  const waiters: Array<() => void> = [];
  ws.addEventListener("message", (event) => {
    if (typeof event.data === "string") texts.push(event.data);
    else bytes.push(new Uint8Array(event.data as ArrayBuffer));
    for (const w of waiters.splice(0)) w();
  });
  const closed = new Promise<{ code: number; reason: string }>((resolve) =>
    ws.addEventListener("close", (event) => resolve({ code: event.code, reason: event.reason })),
  );
  const until = async (ok: () => boolean) => {
    while (!ok()) await new Promise<void>((resolve) => waiters.push(resolve));
  };
  return {
    ws,
    texts,
    bytes,
    closed,
    text: (text) => until(() => texts.includes(text)),
    nextBytes: async () => {
      const seen = bytes.length;
      await until(() => bytes.length > seen);
      return bytes[seen] as Uint8Array;
    },
  };
}

function isPeer(x: Peer | { status: number }): x is Peer {
  return "ws" in x;
}

async function mustDial(path: string, token: string): Promise<Peer> {
  const peer = await dial(path, token);
  if (!isPeer(peer)) throw new Error(`no WebSocket: ${peer.status} ${peer.text}`);
  return peer;
}

async function runWithToken(spec: Record<string, unknown> = { commands: ["true"], egress: "local" }) {
  const tenant = await newTenant();
  const run = await newRun(tenant, { spec, status: "running" });
  const minted = await tenant.api("POST", `/v1/runs/${run.id}/egress-agent-token`);
  expect(minted.status).toBe(201);
  return { tenant, run, token: minted.json.token as string, command: minted.json.command as string };
}

describe("egress agent tokens", () => {
  it("case K5: mints a bwe_ token shown once, stores only its hash; the command takes it from the environment", async () => {
    const { run, token, command } = await runWithToken();
    expect(token).toMatch(/^bwe_[A-Za-z0-9_-]{43}$/);
    // The token is the command's environment, never one of its arguments (process lists).
    expect(command).toBe(`BENCHWRIGHT_EGRESS_TOKEN=${token} npx --no benchwright egress-agent --url ${BASE}`);
    expect(command.split(" ").slice(1).join(" ")).not.toContain(token);
    expect(command).not.toContain("--token");
    const [row] = await withDb((db) =>
      db.select({ hash: runs.egressTokenHash }).from(runs).where(eq(runs.id, run.id)),
    );
    expect(row?.hash).toMatch(/^[0-9a-f]{64}$/);
    expect(row?.hash).not.toContain(token);
  });

  it("another tenant's run is 404; an ended run is 409 run_ended", async () => {
    const { run } = await runWithToken();
    const other = await newTenant();
    expectProblem(await other.api("POST", `/v1/runs/${run.id}/egress-agent-token`), 404, "not_found");
    await setRunStatus(run.id, "finished");
    expectProblem(await run.tenant.api("POST", `/v1/runs/${run.id}/egress-agent-token`), 409, "run_ended");
  });

  it("the launch answer carries the agent's token when the run egresses locally, and only then", async () => {
    const tenant = await newTenant();
    const local = await tenant.api("POST", "/v1/runs", {
      commands: ["true"],
      egress: "local",
    });
    expect(local.status, local.text).toBe(202);
    expect(local.json.egressAgent.token).toMatch(/^bwe_/);
    expect(local.json.egressAgent.command).toContain(
      `BENCHWRIGHT_EGRESS_TOKEN=${local.json.egressAgent.token} `,
    );
    expect(local.json.egressAgent.command).not.toContain("--token");
    const direct = await tenant.api("POST", "/v1/runs", { commands: ["true"] });
    expect(direct.status).toBe(202);
    expect(direct.json.egressAgent).toBeUndefined();
    // A vault that routes a host through the tunnel makes a direct run wait for an agent too.
    expect(
      (
        await tenant.api("POST", "/v1/vault/hosts", {
          pattern: "lan.example",
          action: "allow",
          via: "tunnel",
        })
      ).status,
    ).toBe(200);
    const tunnelHost = await tenant.api("POST", "/v1/runs", { commands: ["true"] });
    expect(tunnelHost.json.egressAgent.token).toMatch(/^bwe_/);
    for (const id of [local.json.id, direct.json.id, tunnelHost.json.id]) {
      await tenant.api("POST", `/v1/runs/${id}/cancel`);
    }
  });
});

describe("the agent's copy of the host policy", () => {
  it("has the default, the host entries and their routes; no rule, secret or model", async () => {
    const canary = `canary-${crypto.randomUUID()}`;
    const { tenant, token } = await runWithToken();
    await tenant.api("POST", "/v1/vault/secrets", { name: "KEY", value: canary });
    await tenant.api("POST", "/v1/vault/rules", {
      host: "api.example",
      secret: "KEY",
      inject: { scheme: "bearer" },
    });
    await tenant.api("POST", "/v1/vault/hosts", { pattern: "*.evil.example", action: "block" });
    // A limited host: the agent gets the host, not the limits (the proxy holds requests to them).
    const limited = await tenant.api("POST", "/v1/vault/hosts", {
      pattern: "data.example",
      action: "allow",
      methods: ["GET"],
      paths: ["/public/"],
    });
    expect(limited.status, limited.text).toBeLessThan(300);
    const res = await call(token, "GET", EGRESS_AGENT_POLICY_PATH);
    expect(res.status, res.text).toBe(200);
    const policy = AgentPolicy.parse(res.json);
    expect(policy.egress).toBe("local");
    expect(policy.hosts).toContainEqual({ pattern: "*.evil.example", action: "block" });
    expect(policy.hosts).toContainEqual({ pattern: "data.example", action: "allow" });
    expect(res.text).not.toContain(canary);
    expect(res.text).not.toContain("KEY");
    expect(res.headers.get("cache-control")).toBe("no-store");
  });

  it("refuses a missing, malformed, replaced or ended run's token with 401", async () => {
    const { run, token } = await runWithToken();
    expectProblem(await call(null, "GET", EGRESS_AGENT_POLICY_PATH), 401, "unauthorized");
    expectProblem(await call("bwe_short", "GET", EGRESS_AGENT_POLICY_PATH), 401, "unauthorized");
    expectProblem(await call(run.proxyToken, "GET", EGRESS_AGENT_POLICY_PATH), 401, "unauthorized");
    const again = await run.tenant.api("POST", `/v1/runs/${run.id}/egress-agent-token`);
    expectProblem(await call(token, "GET", EGRESS_AGENT_POLICY_PATH), 401, "unauthorized");
    expect((await call(again.json.token, "GET", EGRESS_AGENT_POLICY_PATH)).status).toBe(200);
    await setRunStatus(run.id, "finished");
    expectProblem(await call(again.json.token, "GET", EGRESS_AGENT_POLICY_PATH), 401, "unauthorized");
  });

  it("an egress token opens nothing else: not the API, not the proxy's internal API", async () => {
    const { run, token } = await runWithToken();
    expectProblem(await call(token, "GET", "/v1/runs"), 401, "unauthorized");
    expectProblem(await call(token, "GET", `/internal/runs/${run.id}/policy`), 401, "unauthorized");
  });
});

describe("the relay", () => {
  it("pairs the proxy and the agent, carries bytes both ways unchanged, and notes when the agent leaves", async () => {
    const { run, token } = await runWithToken();
    const proxy = await mustDial(tunnelPath(run.id), run.proxyToken);
    expect(await relayStub(env, run.id).status()).toEqual({ proxy: true, agent: false, paired: false });
    const agent = await mustDial(EGRESS_AGENT_PATH, token);
    await proxy.text(PAIRED);
    await agent.text(PAIRED);
    expect(await relayStub(env, run.id).status()).toEqual({ proxy: true, agent: true, paired: true });

    const up = new Uint8Array([0, 1, 2, 250, 255, 13, 10]);
    proxy.ws.send(up);
    expect([...(await agent.nextBytes())]).toEqual([...up]);
    const big = crypto.getRandomValues(new Uint8Array(60_000));
    agent.ws.send(big);
    expect(await proxy.nextBytes()).toEqual(big);
    // Text from an end is not the relay's to carry.
    agent.ws.send("not bytes");
    proxy.ws.send(new Uint8Array([7]));
    expect([...(await agent.nextBytes())]).toEqual([7]);
    expect(proxy.texts).toEqual([PAIRED]);

    agent.ws.close(1000, "user stopped it");
    expect((await proxy.closed).code).toBe(CLOSE_PEER_GONE);
    // The relay closes the proxy first, then writes the note.
    const notes = await until("the tunnel_down note", async () => {
      const [row] = await withDb((db) =>
        db.select({ notes: runs.notes }).from(runs).where(eq(runs.id, run.id)),
      );
      const list = row?.notes as Array<{ code: string }>;
      return list.some((n) => n.code === "tunnel_down") && list;
    });
    expect(notes).toContainEqual(expect.objectContaining({ code: "tunnel_down", level: "warning" }));
    const trace = await withDb((db) =>
      db.select({ key: runEvents.key }).from(runEvents).where(eq(runEvents.runId, run.id)),
    );
    expect(trace.filter((e) => e.key.startsWith("tunnel:up:"))).toHaveLength(1);
    expect(trace.filter((e) => e.key.startsWith("tunnel:down:"))).toHaveLength(1);
  });

  it("pairs again after the agent comes back; a second agent replaces the first", async () => {
    const { run, token } = await runWithToken();
    const agent1 = await mustDial(EGRESS_AGENT_PATH, token);
    const proxy1 = await mustDial(tunnelPath(run.id), run.proxyToken);
    await agent1.text(PAIRED);
    const agent2 = await mustDial(EGRESS_AGENT_PATH, token);
    expect((await agent1.closed).code).toBe(CLOSE_REPLACED);
    // The proxy's HTTP/2 session was with the first agent: it must start again.
    expect((await proxy1.closed).code).toBe(CLOSE_PEER_GONE);
    const proxy2 = await mustDial(tunnelPath(run.id), run.proxyToken);
    await proxy2.text(PAIRED);
    await agent2.text(PAIRED);
    proxy2.ws.send(new Uint8Array([42]));
    expect([...(await agent2.nextBytes())]).toEqual([42]);
  });

  it("a new token disconnects the old token's agent; the run's end closes both for good", async () => {
    const { run, token } = await runWithToken();
    const agent = await mustDial(EGRESS_AGENT_PATH, token);
    const proxy = await mustDial(tunnelPath(run.id), run.proxyToken);
    await proxy.text(PAIRED);
    await run.tenant.api("POST", `/v1/runs/${run.id}/egress-agent-token`);
    expect((await agent.closed).code).toBe(CLOSE_TOKEN_REVOKED);
    expect((await proxy.closed).code).toBe(CLOSE_PEER_GONE);
    const fresh = await run.tenant.api("POST", `/v1/runs/${run.id}/egress-agent-token`);
    const agent2 = await mustDial(EGRESS_AGENT_PATH, fresh.json.token);
    const proxy2 = await mustDial(tunnelPath(run.id), run.proxyToken);
    await agent2.text(PAIRED);
    await relayStub(env, run.id).endRun();
    expect((await agent2.closed).code).toBe(CLOSE_RUN_ENDED);
    expect((await proxy2.closed).code).toBe(CLOSE_RUN_ENDED);
  });

  it("admits only the run's own credentials, and only as WebSockets", async () => {
    const { run, token } = await runWithToken();
    const other = await runWithToken();
    // The agent's token is not the proxy's, nor the other way round, nor another run's.
    expect((await dial(tunnelPath(run.id), token)) as { status: number }).toMatchObject({ status: 401 });
    expect((await dial(EGRESS_AGENT_PATH, run.proxyToken)) as { status: number }).toMatchObject({
      status: 401,
    });
    expect((await dial(tunnelPath(run.id), other.run.proxyToken)) as { status: number }).toMatchObject({
      status: 404,
    });
    expectProblem(await call(token, "GET", EGRESS_AGENT_PATH), 400, "invalid_request");
    await setRunStatus(run.id, "finished");
    expect((await dial(EGRESS_AGENT_PATH, token)) as { status: number }).toMatchObject({ status: 401 });
    expect((await dial(tunnelPath(run.id), run.proxyToken)) as { status: number }).toMatchObject({
      status: 401,
    });
  });
});
