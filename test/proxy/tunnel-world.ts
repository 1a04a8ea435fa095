import { randomBytes } from "node:crypto";
import { EventEmitter } from "node:events";
import { createServer as createHttpServer, type Server as HttpServer, type ServerResponse } from "node:http";
import { createServer as createHttpsServer, type Server as HttpsServer } from "node:https";
import { type AddressInfo, connect as netConnect, type Socket } from "node:net";
import { createSecureContext, rootCertificates } from "node:tls";
import { type EgressAgent, type EgressAgentOptions, startEgressAgent } from "@benchwright/egress-agent";
import type { AgentPolicy } from "@benchwright/shared/contract/tunnel";
import { afterAll, afterEach, beforeAll, expect } from "vitest";
// The undici the proxy bundles (proxy-image/package.json), not the root's.
import { Pool } from "../../proxy-image/node_modules/undici";
import { TunnelClient, TunnelError, tunnelConnect } from "../../proxy-image/src/proxy/tunnel-client";
import { createTestCa, selfSignedCert } from "./harness";
import { startTestRelay, type TestRelay } from "./tunnel-relay";

// The egress tunnel end to end on loopback: the proxy's TunnelClient and an undici Pool over it,
// the real egress agent (in-process, and once as the built CLI), a test double of our relay
// (tunnel-relay.ts), and real TLS upstreams with certificates from the suite's own CA. Names
// resolve through the agent's injected lookup; its injected dial maps ports 443/80 to the
// upstreams' ephemeral ports (the checked address is dialled unchanged).

export const RUN_ID = "run_tunnel_test";
export const PROXY_TOKEN = randomBytes(32).toString("base64url");
export const AGENT_TOKEN = `bwe_${randomBytes(32).toString("base64url")}`;
export const BIG = 32 * 1024 * 1024;

export const ADDRESSES: Record<string, string[]> = {
  "api.test": ["127.0.0.1"],
  "big.test": ["127.0.0.1"],
  "plain.test": ["127.0.0.1"],
  "selfsigned.test": ["127.0.0.1"],
  "blocked.test": ["127.0.0.1"],
  "mine.test": ["127.0.0.1"],
  "a.private.test": ["127.0.0.1"],
  "down.test": ["127.0.0.2"], // nothing listens there
  "rebind.test": ["127.0.0.1", "10.0.0.1"],
  "metadata.test": ["169.254.169.254"],
  // Case I5: names whose answers are IP literals a block entry names, in some spelling.
  "ipblocked.test": ["127.0.0.3"],
  "ipblocked6.test": ["64:ff9b::7f00:3"],
  "userblocked.test": ["127.0.0.4"],
};
export const lookup: EgressAgentOptions["lookup"] = async (host) => {
  const answers = ADDRESSES[host];
  if (!answers) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: "ENOTFOUND" });
  return answers.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }));
};

export function policy(version: number, hosts: AgentPolicy["hosts"] = []): AgentPolicy {
  return { runId: RUN_ID, version, default: "allow", egress: "local", hosts };
}
export const BASE_POLICY = policy(1, [{ pattern: "blocked.test", action: "block" }]);

// ---- upstreams ----

export let tlsServer: HttpsServer;
export let plainServer: HttpServer;
export let tlsPort = 0;
export let plainPort = 0;
export let caPem = "";
export const barrier: ServerResponse[] = [];
export const hanging = new Set<ServerResponse>();
/** Per /big response: bytes the upstream wrote and how often write() said to wait. */
export const bigWriter = { written: 0, waits: 0 };

export const dial = (address: string, port: number): Socket =>
  netConnect({ host: address, port: port === 443 ? tlsPort : port === 80 ? plainPort : port });

// ---- the parts of one test ----

export const agentLines: string[] = [];
export const cleanups: Array<() => Promise<unknown> | unknown> = [];

export type LogRecord = Record<string, unknown>;

export function recorder() {
  const records: LogRecord[] = [];
  const events = new EventEmitter();
  return {
    records,
    push(record: LogRecord) {
      records.push(record);
      events.emit("record", record);
    },
    /** Resolves once `event` has been logged n times. */
    nth(event: string, n: number): Promise<void> {
      let seen = 0;
      return this.waitFor((r) => r.event === event && ++seen === n).then(() => {});
    },
    /** The first record (already logged or still to come) that matches. */
    waitFor(match: (r: LogRecord) => boolean): Promise<LogRecord> {
      const hit = records.find(match);
      if (hit) return Promise.resolve(hit);
      return new Promise((resolve) => {
        const on = (r: LogRecord) => {
          if (!match(r)) return;
          events.off("record", on);
          resolve(r);
        };
        events.on("record", on);
      });
    },
  };
}

export async function newRelay(initial: AgentPolicy | null = BASE_POLICY): Promise<TestRelay> {
  const relay = await startTestRelay({ runId: RUN_ID, proxyToken: PROXY_TOKEN, agentToken: AGENT_TOKEN });
  relay.setPolicy(initial);
  cleanups.push(() => relay.close());
  return relay;
}

export function newAgent(relay: TestRelay, extra: Partial<EgressAgentOptions> = {}) {
  const log = recorder();
  const agent: EgressAgent = startEgressAgent({
    url: relay.url,
    token: AGENT_TOKEN,
    allowCidrs: ["127.0.0.0/8"],
    policyIntervalMs: 100,
    reconnectMs: { min: 20, max: 200 },
    ownAddresses: [],
    lookup,
    dial,
    log: (record) => {
      agentLines.push(JSON.stringify(record));
      log.push(record);
    },
    ...extra,
  });
  cleanups.push(() => agent.stop());
  return { agent, log, policyRead: () => log.waitFor((r) => r.event === "policy") };
}

export function newClient(relay: TestRelay, proxyToken = PROXY_TOKEN, openTimeoutMs?: number) {
  const log = recorder();
  const client = new TunnelClient({
    controlPlaneUrl: relay.url,
    runId: RUN_ID,
    proxyToken,
    ...(openTimeoutMs ? { openTimeoutMs } : {}),
    reconnectMs: { min: 20, max: 200 },
    log: (record) => log.push(record),
  });
  client.start();
  cleanups.push(() => client.stop());
  const until = (up: boolean) =>
    client.up === up
      ? Promise.resolve()
      : new Promise<void>((resolve) => {
          const off = client.onChange((now) => {
            if (now !== up) return;
            off();
            resolve();
          });
        });
  return { client, log, until };
}

export function pool(client: TunnelClient, origin: string, connections = 4): Pool {
  const p = new Pool(origin, {
    connections,
    connect: tunnelConnect(client, {
      secureContext: createSecureContext({ ca: [...rootCertificates, caPem] }),
      timeoutMs: 5_000,
    }),
  });
  cleanups.push(() => p.destroy());
  return p;
}

/** Everything up: relay, an agent with the base policy read, a paired client. */
export async function tunnel(agentOptions: Partial<EgressAgentOptions> = {}) {
  const relay = await newRelay();
  const agent = newAgent(relay, agentOptions);
  await agent.policyRead();
  const proxy = newClient(relay);
  await proxy.until(true);
  return { relay, agent, proxy };
}

export async function refusalOf(promise: Promise<unknown>): Promise<TunnelError> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(TunnelError);
  return error as TunnelError;
}

// ---- tests ----

/**
 * The upstreams (before all), the per-test cleanups (after each) and the token canary (after
 * all: no agent line carries a token, and the file's agents logged more than `minAgentLines`).
 */
export function useTunnelWorld(minAgentLines = 20): void {
  beforeAll(async () => {
    const ca = await createTestCa();
    caPem = ca.certPem;
    const leaf = await ca.issue(["api.test", "big.test", "down.test", "127.0.0.1"]);
    const selfSigned = await selfSignedCert(["selfsigned.test"]);
    const selfContext = createSecureContext({ cert: selfSigned.certPem, key: selfSigned.keyPem });
    tlsServer = createHttpsServer(
      {
        cert: leaf.certPem,
        key: leaf.keyPem,
        SNICallback: (name, cb) => cb(null, name === "selfsigned.test" ? selfContext : undefined),
      },
      (req, res) => {
        const url = new URL(req.url ?? "/", "https://x");
        if (url.pathname === "/barrier") {
          // Answers nobody until n requests are waiting: only concurrent streams get through.
          barrier.push(res);
          if (barrier.length === Number(url.searchParams.get("n"))) {
            for (const r of barrier.splice(0)) r.end("together");
          }
          return;
        }
        if (url.pathname === "/big") {
          res.writeHead(200, { "content-length": String(BIG) });
          const chunk = Buffer.alloc(64 * 1024, 0x61);
          bigWriter.written = 0;
          bigWriter.waits = 0;
          const pump = () => {
            while (bigWriter.written < BIG) {
              bigWriter.written += chunk.length;
              const more = res.write(chunk);
              if (!more) {
                bigWriter.waits += 1;
                res.once("drain", pump);
                return;
              }
            }
            res.end();
          };
          pump();
          return;
        }
        if (url.pathname === "/hang") {
          hanging.add(res);
          res.writeHead(200, { "content-type": "text/plain" });
          res.write("first part;");
          return;
        }
        res.end(`hello from ${req.headers.host}`);
      },
    );
    plainServer = createHttpServer((req, res) => res.end(`plain hello from ${req.headers.host}`));
    await Promise.all([
      new Promise<void>((resolve) => tlsServer.listen(0, "127.0.0.1", resolve)),
      new Promise<void>((resolve) => plainServer.listen(0, "127.0.0.1", resolve)),
    ]);
    tlsPort = (tlsServer.address() as AddressInfo).port;
    plainPort = (plainServer.address() as AddressInfo).port;
  });

  afterAll(async () => {
    for (const res of hanging) res.destroy();
    tlsServer.closeAllConnections();
    plainServer.closeAllConnections();
    await Promise.all([
      new Promise((resolve) => tlsServer.close(resolve)),
      new Promise((resolve) => plainServer.close(resolve)),
    ]);
    // Canary: no line any agent logged carries a token.
    const all = agentLines.join("\n");
    expect(agentLines.length).toBeGreaterThan(minAgentLines);
    expect(all).not.toContain(AGENT_TOKEN);
    expect(all).not.toContain(PROXY_TOKEN);
  });

  afterEach(async () => {
    for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
  });
}
