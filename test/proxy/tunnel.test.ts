import { spawn } from "node:child_process";
import { randomBytes, X509Certificate } from "node:crypto";
import { EventEmitter, once } from "node:events";
import { createServer as createHttpServer, type Server as HttpServer, type ServerResponse } from "node:http";
import { createServer as createHttpsServer, type Server as HttpsServer } from "node:https";
import { type AddressInfo, connect as netConnect, type Socket } from "node:net";
import { setTimeout as sleep } from "node:timers/promises";
import { createSecureContext, rootCertificates, connect as tlsConnect } from "node:tls";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
// The undici the proxy bundles (proxy-image/package.json), not the root's.
import { Pool } from "../../proxy-image/node_modules/undici";
import {
  type EgressAgent,
  type EgressAgentOptions,
  startEgressAgent,
} from "../../proxy-image/src/egress-agent/egress-agent";
import { TunnelClient, TunnelError, tunnelConnect } from "../../proxy-image/src/proxy/tunnel-client";
import type { AgentPolicy } from "../../src/contract/tunnel";
import { createTestCa, selfSignedCert, startProxy, vault } from "./harness";
import { startTestRelay, type TestRelay } from "./tunnel-relay";

// The egress tunnel end to end on loopback: the proxy's TunnelClient and an undici Pool over it,
// the real egress agent (in-process, and once as the built CLI), a test double of our relay
// (tunnel-relay.ts), and real TLS upstreams with certificates from the suite's own CA. Names
// resolve through the agent's injected lookup; its injected dial maps ports 443/80 to the
// upstreams' ephemeral ports (the checked address is dialled unchanged).

const RUN_ID = "run_tunnel_test";
const PROXY_TOKEN = randomBytes(32).toString("base64url");
const AGENT_TOKEN = `bwe_${randomBytes(32).toString("base64url")}`;
const BIG = 32 * 1024 * 1024;

const ADDRESSES: Record<string, string[]> = {
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
const lookup: EgressAgentOptions["lookup"] = async (host) => {
  const answers = ADDRESSES[host];
  if (!answers) throw Object.assign(new Error(`getaddrinfo ENOTFOUND ${host}`), { code: "ENOTFOUND" });
  return answers.map((address) => ({ address, family: address.includes(":") ? 6 : 4 }));
};

function policy(version: number, hosts: AgentPolicy["hosts"] = []): AgentPolicy {
  return { runId: RUN_ID, version, default: "allow", egress: "local", hosts };
}
const BASE_POLICY = policy(1, [{ pattern: "blocked.test", action: "block" }]);

// ---- upstreams ----

let tlsServer: HttpsServer;
let plainServer: HttpServer;
let tlsPort = 0;
let plainPort = 0;
let caPem = "";
const barrier: ServerResponse[] = [];
const hanging = new Set<ServerResponse>();
/** Per /big response: bytes the upstream wrote and how often write() said to wait. */
const bigWriter = { written: 0, waits: 0 };

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
  expect(agentLines.length).toBeGreaterThan(20);
  expect(all).not.toContain(AGENT_TOKEN);
  expect(all).not.toContain(PROXY_TOKEN);
});

const dial = (address: string, port: number): Socket =>
  netConnect({ host: address, port: port === 443 ? tlsPort : port === 80 ? plainPort : port });

// ---- the parts of one test ----

const agentLines: string[] = [];
const cleanups: Array<() => Promise<unknown> | unknown> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup();
});

type LogRecord = Record<string, unknown>;

function recorder() {
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

async function newRelay(initial: AgentPolicy | null = BASE_POLICY): Promise<TestRelay> {
  const relay = await startTestRelay({ runId: RUN_ID, proxyToken: PROXY_TOKEN, agentToken: AGENT_TOKEN });
  relay.setPolicy(initial);
  cleanups.push(() => relay.close());
  return relay;
}

function newAgent(relay: TestRelay, extra: Partial<EgressAgentOptions> = {}) {
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

function newClient(relay: TestRelay, proxyToken = PROXY_TOKEN, openTimeoutMs?: number) {
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

function pool(client: TunnelClient, origin: string, connections = 4): Pool {
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
async function tunnel(agentOptions: Partial<EgressAgentOptions> = {}) {
  const relay = await newRelay();
  const agent = newAgent(relay, agentOptions);
  await agent.policyRead();
  const proxy = newClient(relay);
  await proxy.until(true);
  return { relay, agent, proxy };
}

async function refusalOf(promise: Promise<unknown>): Promise<TunnelError> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(TunnelError);
  return error as TunnelError;
}

// ---- tests ----

describe("egress tunnel: traffic", () => {
  it("carries https with TLS verified end to end, and a self-signed upstream fails", async () => {
    const { agent, proxy } = await tunnel();
    const res = await pool(proxy.client, "https://api.test").request({ path: "/hello", method: "GET" });
    expect(res.statusCode).toBe(200);
    expect(await res.body.text()).toBe("hello from api.test");
    expect(agent.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });

    const bad = await pool(proxy.client, "https://selfsigned.test")
      .request({ path: "/", method: "GET" })
      .then(
        () => null,
        (e: NodeJS.ErrnoException) => e,
      );
    expect(bad).not.toBeNull();
    expect(bad?.code).toMatch(/SELF_SIGNED|UNABLE_TO_VERIFY/);
    expect(bad).not.toBeInstanceOf(TunnelError);
  });

  it("carries plain http", async () => {
    const { proxy } = await tunnel();
    const res = await pool(proxy.client, "http://plain.test").request({ path: "/", method: "GET" });
    expect(res.statusCode).toBe(200);
    expect(await res.body.text()).toBe("plain hello from plain.test");
  });

  it("multiplexes concurrent connections as streams of one session", async () => {
    const { relay, agent, proxy } = await tunnel();
    const p = pool(proxy.client, "https://api.test", 5);
    const answers = await Promise.all(
      Array.from({ length: 5 }, () =>
        p.request({ path: "/barrier?n=5", method: "GET" }).then((r) => r.body.text()),
      ),
    );
    expect(answers).toEqual(Array(5).fill("together"));
    expect(agent.log.records.filter((r) => r.event === "allowed")).toHaveLength(5);
    expect(agent.log.records.filter((r) => r.event === "paired")).toHaveLength(1);
    expect(relay.accepted).toEqual({ proxy: 1, agent: 1 });
  });

  it("applies back-pressure: a reader that stops holds the upstream back instead of buffering", async () => {
    const { proxy } = await tunnel();
    const res = await pool(proxy.client, "https://big.test").request({ path: "/big", method: "GET" });
    const body = res.body[Symbol.asyncIterator]();
    let read = ((await body.next()).value as Buffer).length;
    // The reader stops. The upstream must come to a standstill well short of the whole body:
    // write() said wait and no 'drain' came while it was watched (at most 5 s, then it fails).
    let last = -1;
    let still = 0;
    for (let i = 0; i < 100 && still < 3; i++) {
      still = bigWriter.written === last ? still + 1 : 0;
      last = bigWriter.written;
      await sleep(50);
    }
    const stalledAt = bigWriter.written;
    expect(still).toBe(3);
    expect(bigWriter.waits).toBeGreaterThan(0);
    // What is in flight is the HTTP/2 windows (1 MiB per stream) plus socket buffers on the way.
    expect(stalledAt).toBeLessThan(BIG / 2);
    for (let next = await body.next(); !next.done; next = await body.next())
      read += (next.value as Buffer).length;
    expect(read).toBe(BIG);
  }, 30_000);
});

describe("egress tunnel: refusals", () => {
  it("refuses each kind with the kind the agent named, and logs one line per decision", async () => {
    const { agent, proxy } = await tunnel({ block: ["mine.test", "*.private.test"] });
    const kindOf = async (host: string, port = 443) => (await refusalOf(proxy.client.open(host, port))).kind;
    expect(await kindOf("blocked.test")).toBe("blocked");
    expect(await kindOf("mine.test")).toBe("blocked");
    expect(await kindOf("a.private.test")).toBe("blocked");
    expect(await kindOf("rebind.test")).toBe("address");
    expect(await kindOf("metadata.test")).toBe("address");
    expect(await kindOf("169.254.169.254")).toBe("address");
    expect(await kindOf("nxdomain.test")).toBe("dns");
    expect(await kindOf("api.test", 22)).toBe("bad_target");
    expect(await kindOf("down.test")).toBe("unreachable");

    const refused = agent.log.records.filter((r) => r.event === "refused");
    expect(refused.map((r) => [r.host, r.port, r.why])).toEqual([
      ["blocked.test", 443, "blocked"],
      ["mine.test", 443, "blocked"],
      ["a.private.test", 443, "blocked"],
      ["rebind.test", 443, "address"],
      ["metadata.test", 443, "address"],
      ["169.254.169.254", 443, "address"],
      ["nxdomain.test", 443, "dns"],
      ["api.test", 22, "bad_target"],
      ["down.test", 443, "unreachable"],
    ]);
    expect(refused.find((r) => r.host === "rebind.test")?.detail).toBe("10.0.0.1 is private");

    // Through undici, the refusal reaches the caller of pool.request() as the TunnelError.
    const error = await refusalOf(
      pool(proxy.client, "https://blocked.test").request({ path: "/", method: "GET" }),
    );
    expect(error.kind).toBe("blocked");
    expect(error.message).not.toContain(PROXY_TOKEN);
  });

  it("case I5: refuses a name resolving to an IP literal the policy or --block names, in any spelling", async () => {
    const relay = await newRelay(policy(1, [{ pattern: "[64:ff9b::7f00:3]", action: "block" }]));
    const agent = newAgent(relay, { block: ["[2002:7f00:4::]"] });
    await agent.policyRead();
    const proxy = newClient(relay);
    await proxy.until(true);
    const kindOf = async (host: string) => (await refusalOf(proxy.client.open(host, 443))).kind;
    expect(await kindOf("ipblocked.test")).toBe("blocked");
    expect(await kindOf("ipblocked6.test")).toBe("blocked");
    expect(await kindOf("userblocked.test")).toBe("blocked");
    expect(await kindOf("[::ffff:127.0.0.3]")).toBe("blocked");
    const refused = agent.log.records.filter((r) => r.event === "refused");
    expect(refused.map((r) => [r.host, r.why, r.detail])).toEqual([
      ["ipblocked.test", "blocked", "the run's policy (127.0.0.3)"],
      ["ipblocked6.test", "blocked", "the run's policy (64:ff9b::7f00:3)"],
      ["userblocked.test", "blocked", "--block (127.0.0.4)"],
      ["127.0.0.3", "blocked", "the run's policy"],
    ]);
    // The control: a name whose address no entry names goes through.
    const stream = await proxy.client.open("api.test", 443);
    stream.destroy();
    expect(agent.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });
  });

  it("gives up on an agent that does not answer (unreachable) and cancels the stream", async () => {
    const relay = await newRelay();
    const agent = newAgent(relay, { lookup: () => new Promise(() => {}), dnsTimeoutMs: 60_000 });
    await agent.policyRead();
    const proxy = newClient(relay, PROXY_TOKEN, 300);
    await proxy.until(true);
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("unreachable");
    expect(proxy.client.up).toBe(true); // one stream gave up; the tunnel itself is fine
  });

  it("refuses loopback unless --allow-cidr names it", async () => {
    const { proxy } = await tunnel({ allowCidrs: [] });
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("address");
  });

  it("refuses everything until the first policy has been read", async () => {
    const relay = await newRelay(null);
    const agent = newAgent(relay);
    const proxy = newClient(relay);
    await proxy.until(true);
    await agent.log.waitFor((r) => r.event === "policy_error"); // 503: the control plane has none yet
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("blocked");
    expect(agent.log.records).toContainEqual(
      expect.objectContaining({ event: "refused", host: "api.test", detail: "no policy read yet" }),
    );
    relay.setPolicy(policy(7));
    expect((await agent.policyRead()).version).toBe(7);
    const stream = await proxy.client.open("api.test", 443);
    stream.destroy();
  });
});

describe("egress tunnel: lifecycle", () => {
  it("goes down when the agent leaves (in-flight streams fail, open says down) and comes back", async () => {
    const { relay, agent, proxy } = await tunnel();
    const p = pool(proxy.client, "https://api.test");
    const res = await p.request({ path: "/hang", method: "GET" });
    const body = res.body.text();
    await agent.log.waitFor((r) => r.event === "allowed");

    await agent.agent.stop();
    await proxy.until(false);
    await expect(body).rejects.toThrow();
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("down");
    expect((await refusalOf(p.request({ path: "/hello", method: "GET" }))).kind).toBe("down");

    // A new agent pairs; the proxy reconnected on its own and works again.
    const second = newAgent(relay);
    await second.policyRead();
    await proxy.until(true);
    const again = await p.request({ path: "/hello", method: "GET" });
    expect(await again.body.text()).toBe("hello from api.test");
    expect(relay.accepted.proxy).toBeGreaterThanOrEqual(2);
  });

  it("hands over to a newer agent: the old one exits, the proxy pairs with the new one", async () => {
    const { relay, agent, proxy } = await tunnel();
    const second = newAgent(relay);
    expect(await agent.agent.done).toBe(1);
    expect(agent.log.records).toContainEqual({
      event: "stopped",
      code: 1,
      why: "another egress agent connected with this token",
    });
    await proxy.log.nth("tunnel_up", 2);
    const res = await pool(proxy.client, "https://api.test").request({ path: "/hello", method: "GET" });
    expect(await res.body.text()).toBe("hello from api.test");
    expect(second.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });
  });

  it("keeps retrying a refused upgrade on the proxy's side, and stays down", async () => {
    const relay = await newRelay();
    newAgent(relay);
    const proxy = newClient(relay, randomBytes(32).toString("base64url"));
    await proxy.log.nth("tunnel_refused", 2);
    expect(proxy.log.records.find((r) => r.event === "tunnel_refused")).toEqual({
      event: "tunnel_refused",
      status: 401,
    });
    expect(proxy.client.up).toBe(false);
  });

  it("stops both ends for good when the run ends", async () => {
    const { relay, agent, proxy } = await tunnel();
    relay.endRun();
    expect(await agent.agent.done).toBe(0);
    await proxy.log.waitFor((r) => r.event === "tunnel_stopped");
    expect(proxy.client.up).toBe(false);
    expect((await refusalOf(proxy.client.open("api.test", 443))).kind).toBe("down");
    expect(agent.log.records).toContainEqual({ event: "stopped", code: 0, why: "the run ended" });
    expect(relay.accepted).toEqual({ proxy: 1, agent: 1 });
  });

  it("exits 1 when the token is revoked, or refused at the upgrade", async () => {
    const { relay, agent, proxy } = await tunnel();
    relay.revokeAgent();
    expect(await agent.agent.done).toBe(1);
    await proxy.until(false);

    const other = await newRelay();
    const stranger = newAgent(other, { token: `bwe_${randomBytes(32).toString("base64url")}` });
    expect(await stranger.agent.done).toBe(1);
    expect(stranger.log.records).toContainEqual(
      expect.objectContaining({ why: "the token was revoked or the run is over" }),
    );
  });
});

describe("egress agent: the command", () => {
  const BIN = "proxy-image/dist/egress-agent.cjs";
  function run(args: string[], env: Record<string, string> = {}, input?: string) {
    const child = spawn(process.execPath, [BIN, ...args], {
      env: { PATH: process.env.PATH ?? "", ...env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    child.stdin.end(input ?? "");
    let stdout = "";
    let stderr = "";
    const lines = new EventEmitter();
    child.stdout.on("data", (d: Buffer) => {
      stdout += d.toString();
      lines.emit("data");
    });
    child.stderr.on("data", (d: Buffer) => {
      stderr += d.toString();
    });
    const exit = once(child, "exit").then(([code]) => code as number);
    cleanups.push(() => child.exitCode === null && child.kill());
    const until = (text: string) =>
      stdout.includes(text)
        ? Promise.resolve()
        : new Promise<void>((resolve) => {
            const on = () => {
              if (!stdout.includes(text)) return;
              lines.off("data", on);
              resolve();
            };
            lines.on("data", on);
          });
    return { exit, until, out: () => stdout, err: () => stderr };
  }

  it("refuses a bad flag with exit 2, naming the flag and never the token", async () => {
    const env = { BENCHWRIGHT_EGRESS_TOKEN: AGENT_TOKEN };
    const cases: Array<[string[], RegExp, Record<string, string>?]> = [
      [
        ["--url", "https://cp.example"],
        /BENCHWRIGHT_EGRESS_TOKEN is not/,
        { BENCHWRIGHT_EGRESS_TOKEN: "bwe_short" },
      ],
      [["--url", "https://cp.example"], /no token: set BENCHWRIGHT_EGRESS_TOKEN/, {}],
      [["--url", "http://cp.example"], /--url/],
      [["--url", "https://cp.example", "--allow-cidr", "10.0.0/8"], /--allow-cidr/],
      [["--url", "https://cp.example", "--block", "*.com"], /--block/],
      [["--url", "https://cp.example", "--policy-interval-ms", "5"], /--policy/],
      [["--url", "https://cp.example", `--tokn=${AGENT_TOKEN}`], /unknown flag --tokn/],
      [["--url", "https://cp.example", AGENT_TOKEN], /unexpected argument/],
    ];
    const children = cases.map(([args, , own]) => run(args, own ?? env));
    for (const [i, [, message]] of cases.entries()) {
      const child = children[i] as ReturnType<typeof run>;
      expect(await child.exit).toBe(2);
      expect(child.err()).toMatch(message);
      expect(child.err() + child.out()).not.toContain(AGENT_TOKEN);
    }
  }, 20_000);

  it("case K5: --token is refused (exit 2) with a message pointing at the environment, never echoing it", async () => {
    for (const args of [
      ["--url", "https://cp.example", "--token", AGENT_TOKEN],
      ["--url", "https://cp.example", `--token=${AGENT_TOKEN}`],
    ]) {
      const child = run(args);
      expect(await child.exit).toBe(2);
      expect(child.err()).toContain("--token is refused");
      expect(child.err()).toContain("BENCHWRIGHT_EGRESS_TOKEN");
      expect(child.err() + child.out()).not.toContain(AGENT_TOKEN);
    }
  }, 20_000);

  it("case K5: --token-stdin reads the token from standard input and runs", async () => {
    const relay = await newRelay();
    const child = run(
      ["--token-stdin", "--allow-cidr", "127.0.0.0/8", "--policy-interval-ms", "200"],
      {
        BENCHWRIGHT_URL: relay.url,
      },
      `${AGENT_TOKEN}\n`,
    );
    await child.until('"event":"policy"');
    relay.endRun();
    expect(await child.exit).toBe(0);
    expect(child.out() + child.err()).not.toContain(AGENT_TOKEN);
    // An empty standard input is a usage error, as a missing variable is.
    const empty = run(["--url", "https://cp.example", "--token-stdin"], {}, "");
    expect(await empty.exit).toBe(2);
    expect(empty.err()).toContain("standard input held no token");
  }, 20_000);

  it("runs from the environment, logs JSON lines without the token, exits 0 when the run ends", async () => {
    const relay = await newRelay();
    const child = run(["--allow-cidr", "127.0.0.0/8", "--policy-interval-ms", "200"], {
      BENCHWRIGHT_URL: relay.url,
      BENCHWRIGHT_EGRESS_TOKEN: AGENT_TOKEN,
    });
    await child.until('"event":"policy"');
    const proxy = newClient(relay);
    await proxy.until(true);
    // No test lookup in the real binary: an IP literal on loopback, allowed by --allow-cidr,
    // with nothing listening on port 80 of 127.0.0.3.
    expect((await refusalOf(proxy.client.open("127.0.0.3", 80))).kind).toBe("unreachable");
    relay.endRun();
    expect(await child.exit).toBe(0);
    const lines = child
      .out()
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l) as LogRecord);
    expect(lines.map((l) => l.event)).toEqual(
      expect.arrayContaining(["connected", "policy", "paired", "refused", "disconnected", "stopped"]),
    );
    // Every line has a level and a timestamp (src/contract/log.ts).
    for (const l of lines as Array<LogRecord & { level?: unknown; ts?: unknown }>) {
      expect(["debug", "info", "warn", "error"]).toContain(l.level);
      expect(Number.isNaN(Date.parse(String(l.ts)))).toBe(false);
    }
    expect(lines.find((l) => l.event === "disconnected")).toMatchObject({ level: "warn" });
    expect(child.err()).toContain("the run ended");
    expect(child.out() + child.err()).not.toContain(AGENT_TOKEN);
  }, 20_000);
});

describe("case I3: a tunnelled host is spliced through the egress tunnel", () => {
  /** The whole proxy (catch-all: egress through the tunnel forces it) over a paired tunnel. */
  async function proxyOverTunnel() {
    const parts = await tunnel();
    const running = await startProxy({
      vault: vault({
        default: "block",
        hosts: [
          { pattern: "api.test", action: "allow", via: "tunnel" },
          // Allowed by the vault, refused by the user's agent (BASE_POLICY blocks it there).
          { pattern: "blocked.test", action: "allow", via: "tunnel" },
        ],
      }),
      upstream: { tunnel: parts.proxy.client },
    });
    cleanups.push(() => running.close());
    return { ...parts, running };
  }

  /** One HTTP/1.1 GET over TLS to the proxy's transparent listener, trusting only `ca`. */
  function getOverTls(port: number, host: string, ca: string) {
    return new Promise<{ issuer: string; text: string }>((resolve, reject) => {
      const s = tlsConnect({ host: "127.0.0.1", port, servername: host, ca, ALPNProtocols: ["http/1.1"] });
      let text = "";
      let issuer = "";
      s.once("secureConnect", () => {
        issuer = new X509Certificate(s.getPeerCertificate(true).raw).issuer;
        s.write(`GET /hello HTTP/1.1\r\nHost: ${host}\r\nConnection: close\r\n\r\n`);
      });
      s.setEncoding("utf8");
      s.on("data", (d: string) => {
        text += d;
      });
      s.once("end", () => resolve({ issuer, text }));
      s.once("error", reject);
    });
  }

  it("case I3: the client's TLS goes to the upstream inside the tunnel, untouched; routed tunnel", async () => {
    const { agent, running } = await proxyOverTunnel();
    // The client trusts only the upstream's CA: a handshake that completes was not terminated.
    const got = await getOverTls(running.tlsPort, "api.test", caPem);
    expect(got.text).toMatch(/^HTTP\/1\.1 200 /);
    expect(got.text).toContain("hello from api.test");
    expect(got.issuer).not.toBe(new X509Certificate(running.caPem).subject);
    const record = await running.waitForLog((r) => r.mode === "splice" && r.host === "api.test");
    expect(record).toMatchObject({ decision: "allow", reason: "spliced", route: "tunnel", method: "TLS" });
    expect(running.audit.routes).toContainEqual(["api.test", "tunnel"]);
    // The agent made the connection, on the user's machine; the proxy dialled nothing itself.
    expect(agent.log.records).toContainEqual({ event: "allowed", host: "api.test", port: 443 });
    expect(running.dials).toEqual([]);
  });

  it("case I3: a host the user's agent refuses is terminated instead and refused readably", async () => {
    const { agent, running } = await proxyOverTunnel();
    const got = await getOverTls(running.tlsPort, "blocked.test", running.caPem);
    // Terminated: the run CA signed what the client saw, and the refusal is an HTTP answer.
    expect(got.issuer).toBe(new X509Certificate(running.caPem).subject);
    expect(got.text).toMatch(/^HTTP\/1\.1 403 /);
    const record = await running.waitForLog((r) => r.host === "blocked.test" && r.mode === "terminate");
    expect(record).toMatchObject({ decision: "block" });
    expect(running.logs.filter((r) => r.mode === "splice" && r.host === "blocked.test")).toEqual([]);
    expect(
      agent.log.records.filter((r) => r.event === "refused" && r.host === "blocked.test").length,
    ).toBeGreaterThan(0);
  });
});
