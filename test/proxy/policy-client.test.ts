import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import {
  PolicyEnvelope,
  ProxyReady,
  policyEtag,
  policyPath,
  readBearer,
} from "@benchwright/shared/contract/proxy-wire";
import { compilePolicy, type VaultSnapshot } from "@benchwright/shared/policy/compile";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createRunCa } from "../../proxy-image/src/proxy/ca";
import type { PolicySource } from "../../proxy-image/src/proxy/handler";
import { type LogFn, PolicyClient, type PolicyState } from "../../proxy-image/src/proxy/policy-client";

// The policy channel against a real HTTP server on 127.0.0.1 that plays the control plane's side
// of the contract: bearer token, ETag = "<version>", 304 on If-None-Match. Case E4: anything but a
// valid document means deny everything; a transport failure keeps what is in force.

const RUN = "run_policy_test";
const TOKEN = "proxy-token-0123456789abcdef";
// Unique per test run: must show up in no log line, whatever happens (secret-leak canary).
const CANARY = `sk-canary-${crypto.randomUUID()}`;
const CANARY2 = `tok-canary-${crypto.randomUUID()}`;

interface Served {
  status: number;
  body: string;
  etag: string | null;
}

interface SeenRequest {
  ifNoneMatch: string | undefined;
  status: number;
}

class FakeControlPlane {
  served: Served | null = null;
  readonly seen: SeenRequest[] = [];
  port = 0;
  private server: Server | null = null;

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  async start(): Promise<void> {
    this.server = createServer((req, res) => this.handle(req, res));
    await new Promise<void>((resolve) => this.server?.listen(this.port, "127.0.0.1", resolve));
    this.port = (this.server.address() as AddressInfo).port;
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = null;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Serves a valid envelope (checked with the contract's own schema). */
  serve(version: number, secrets: Record<string, string>, vault: Partial<VaultSnapshot> = {}): void {
    const policy = compilePolicy(snapshot(version, vault));
    const body = JSON.stringify(PolicyEnvelope.parse({ policy, secrets }));
    this.served = { status: 200, body, etag: policyEtag(version) };
  }

  /** Serves a body as is (malformed on purpose). */
  serveRaw(body: string, etag: string | null = null, status = 200): void {
    this.served = { status, body, etag };
  }

  private handle(req: IncomingMessage, res: ServerResponse): void {
    const reply = (status: number, body = "", headers: Record<string, string> = {}) => {
      this.seen.push({ ifNoneMatch: req.headers["if-none-match"], status });
      res.writeHead(status, headers);
      res.end(body);
    };
    const served = this.served;
    if (req.method !== "GET" || req.url !== policyPath(RUN)) reply(404);
    else if (readBearer(req.headers.authorization) !== TOKEN) reply(401);
    else if (!served) reply(404);
    else if (served.etag !== null && req.headers["if-none-match"] === served.etag) reply(304);
    else {
      const headers: Record<string, string> = { "content-type": "application/json" };
      if (served.etag !== null) headers.etag = served.etag;
      reply(served.status, served.body, headers);
    }
  }
}

function snapshot(version: number, vault: Partial<VaultSnapshot>): VaultSnapshot {
  return {
    version,
    default: "allow",
    hosts: [{ pattern: "evil.example", action: "block" }],
    rules: [
      { host: "api.example.com", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } },
      { host: "*.internal.example", secret: "INTERNAL", inject: { scheme: "raw", name: "x-token" } },
    ],
    ...vault,
  };
}

const SECRETS = { API_KEY: CANARY, INTERNAL: CANARY2 };

async function until(cond: () => boolean, what: string, timeoutMs = 5000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const version = (state: PolicyState) => (state.kind === "ready" ? state.policy.version : null);

describe("PolicyClient (E4: deny everything unless a valid policy is in force)", () => {
  let cp: FakeControlPlane;
  let logs: Array<{ level: string; event: string; fields: unknown }>;
  let changes: PolicyState[];
  let client: PolicyClient;

  const log: LogFn = (level, event, fields) => void logs.push({ level, event, fields });
  const makeClient = (options: Partial<ConstructorParameters<typeof PolicyClient>[0]> = {}) =>
    new PolicyClient({
      controlPlaneUrl: cp.url,
      runId: RUN,
      proxyToken: TOKEN,
      intervalMs: 1000,
      log,
      onChange: (s) => void changes.push(s),
      ...options,
    });

  beforeEach(async () => {
    cp = new FakeControlPlane();
    await cp.start();
    logs = [];
    changes = [];
    client = makeClient();
  });

  afterEach(async () => {
    await client.stop();
    await cp.stop();
    // The canary check runs after every scenario, including the failing ones.
    const text = JSON.stringify(logs);
    expect(text).not.toContain(CANARY);
    expect(text).not.toContain(CANARY2);
  });

  it("fits the proxy's PolicySource", () => {
    const source: PolicySource = client;
    expect(source.current().kind).toBe("none");
  });

  it("starts with no policy: deny everything", async () => {
    expect(client.current()).toEqual({ kind: "none" });
    await client.refreshNow();
    // The control plane has none for this run (404): an answer, and it means deny.
    expect(client.current().kind).toBe("invalid");
  });

  it("never had one and the control plane is unreachable: still none, and the log says so", async () => {
    await cp.stop();
    await client.refreshNow();
    await client.refreshNow();
    expect(client.current()).toEqual({ kind: "none" });
    const unreachable = logs.filter((l) => l.event === "control_plane_unreachable");
    expect(unreachable).toHaveLength(1); // once per outage, not once per poll
  });

  it("loads a valid document: index and secrets in force, secrets behind no prototype", async () => {
    cp.serve(1, SECRETS);
    const state = await client.refreshNow();
    expect(state.kind).toBe("ready");
    if (state.kind !== "ready") return;
    expect(state.policy.version).toBe(1);
    expect(state.index.decideHost("EVIL.example.").action).toBe("block");
    expect(state.index.matchRule("a.internal.example")?.rule.secret).toBe("INTERNAL");
    expect(state.secrets.API_KEY).toBe(CANARY);
    expect(state.secrets.constructor).toBeUndefined();
    expect(Object.isFrozen(state.secrets)).toBe(true);
    expect(Object.isFrozen(state.policy.rules[0])).toBe(true);
    expect(changes).toEqual([state]);
    expect(logs.some((l) => l.event === "policy_in_force")).toBe(true);
  });

  it("sends If-None-Match and keeps the same state on 304", async () => {
    cp.serve(4, SECRETS);
    const first = await client.refreshNow();
    await client.refreshNow();
    await client.refreshNow();
    expect(client.current()).toBe(first);
    expect(changes).toHaveLength(1);
    expect(cp.seen.map((s) => [s.ifNoneMatch, s.status])).toEqual([
      [undefined, 200],
      ['"4"', 304],
      ['"4"', 304],
    ]);
  });

  it("swaps in a new version within the poll interval", async () => {
    client = makeClient({ intervalMs: 50 });
    cp.serve(1, SECRETS);
    expect(version(await client.start())).toBe(1);
    cp.serve(2, SECRETS, { default: "block" });
    await until(() => version(client.current()) === 2, "version 2");
    const state = client.current();
    expect(state.kind === "ready" && state.index.decideHost("anything.example").action).toBe("block");
    // Never a moment without a valid policy on the way.
    expect(changes.map((s) => s.kind)).toEqual(["ready", "ready"]);
  });

  it("polls at least every 2 s (the interval is bounded)", () => {
    expect(() => makeClient({ intervalMs: 2001 })).toThrow(RangeError);
    expect(() => makeClient({ intervalMs: 0 })).toThrow(RangeError);
    expect(() => makeClient({ intervalMs: 2000 })).not.toThrow();
  });

  it.each<[string, (cp: FakeControlPlane) => void]>([
    [
      "an unknown field in the document",
      (c) => {
        const policy = { ...compilePolicy(snapshot(2, {})), extra: true };
        c.serveRaw(JSON.stringify({ policy, secrets: SECRETS }), '"2"');
      },
    ],
    [
      "an unknown host action",
      (c) => {
        const policy = compilePolicy(snapshot(2, {}));
        const bad = { ...policy, hosts: [{ pattern: "evil.example", action: "log" }] };
        c.serveRaw(JSON.stringify({ policy: bad, secrets: SECRETS }), '"2"');
      },
    ],
    [
      "a secret missing for a rule",
      (c) => {
        const policy = compilePolicy(snapshot(2, {}));
        c.serveRaw(JSON.stringify({ policy, secrets: { API_KEY: CANARY } }), '"2"');
      },
    ],
    [
      "a secret value with a line break",
      (c) => {
        const policy = compilePolicy(snapshot(2, {}));
        c.serveRaw(JSON.stringify({ policy, secrets: { ...SECRETS, API_KEY: `${CANARY}\r\n` } }), '"2"');
      },
    ],
    [
      "a truncated body",
      (c) => {
        const policy = compilePolicy(snapshot(2, {}));
        const body = JSON.stringify({ secrets: SECRETS, policy });
        c.serveRaw(body.slice(0, body.indexOf(CANARY2) + 10), '"2"');
      },
    ],
    ["a body that is not an object", (c) => c.serveRaw("null", '"2"')],
    ["a 404 (no policy for this run)", (c) => c.serveRaw("", null, 404)],
    ["a 401 (the proxy token is refused)", (c) => c.serveRaw("", null, 401)],
  ])("%s replaces a valid policy with deny-all", async (_name, serveBad) => {
    cp.serve(1, SECRETS);
    expect(version(await client.refreshNow())).toBe(1);
    serveBad(cp);
    const state = await client.refreshNow();
    expect(state.kind).toBe("invalid");
    expect(client.current()).toBe(state);
    expect(changes.map((s) => s.kind)).toEqual(["ready", "invalid"]);
    const refused = logs.find((l) => l.level === "error");
    expect(refused?.event).toBe("policy_refused");
    expect(JSON.stringify(refused?.fields)).toContain('"previousVersion":1');
  });

  it("recovers from an invalid document without a version bump (no If-None-Match while invalid)", async () => {
    cp.serve(1, SECRETS);
    await client.refreshNow();
    // Version 2 arrives corrupted, then intact under the same ETag.
    cp.serve(2, SECRETS);
    const good = cp.served as Served;
    cp.serveRaw(good.body.slice(0, 40), good.etag);
    expect((await client.refreshNow()).kind).toBe("invalid");
    cp.served = good;
    expect(version(await client.refreshNow())).toBe(2);
    expect(cp.seen.map((s) => s.ifNoneMatch)).toEqual([undefined, '"1"', undefined]);
  });

  it("a body over the size bound means deny-all", async () => {
    client = makeClient({ maxBodyBytes: 100 });
    cp.serve(1, SECRETS);
    const state = await client.refreshNow();
    expect(state.kind === "invalid" && state.reason).toContain("larger than 100 bytes");
  });

  it("keeps the current policy while the control plane is down or failing, and says so", async () => {
    cp.serve(1, SECRETS);
    const ready = await client.refreshNow();
    cp.serveRaw("upstream exploded", null, 503);
    expect(await client.refreshNow()).toBe(ready);
    await cp.stop();
    expect(await client.refreshNow()).toBe(ready);
    expect(await client.refreshNow()).toBe(ready);
    const warned = logs.filter((l) => l.level === "warn" && l.event === "control_plane_unreachable");
    expect(warned).toHaveLength(1);
    expect(JSON.stringify(warned[0]?.fields)).toContain('"version":1');
    await cp.start();
    cp.serve(1, SECRETS);
    expect(await client.refreshNow()).toBe(ready);
    expect(logs.some((l) => l.event === "control_plane_reachable")).toBe(true);
    expect(changes).toHaveLength(1);
  });

  it("a request timeout counts as unreachable", async () => {
    cp.serve(1, SECRETS);
    const ready = await client.refreshNow();
    const hang = createServer(() => undefined);
    await new Promise<void>((resolve) => hang.listen(0, "127.0.0.1", resolve));
    const slow = makeClient({
      controlPlaneUrl: `http://127.0.0.1:${(hang.address() as AddressInfo).port}`,
      timeoutMs: 100,
    });
    expect(await slow.refreshNow()).toEqual({ kind: "none" });
    expect(ready.kind).toBe("ready");
    await slow.stop();
    hang.closeAllConnections();
    await new Promise<void>((resolve) => hang.close(() => resolve()));
  });

  it("does not follow a redirect with the proxy token", async () => {
    const elsewhere: string[] = [];
    const other = createServer((req, res) => {
      elsewhere.push(String(req.headers.authorization));
      res.end();
    });
    await new Promise<void>((resolve) => other.listen(0, "127.0.0.1", resolve));
    const target = `http://127.0.0.1:${(other.address() as AddressInfo).port}/steal`;
    const redirecting = createServer((_req, res) => {
      res.writeHead(302, { location: target });
      res.end();
    });
    await new Promise<void>((resolve) => redirecting.listen(0, "127.0.0.1", resolve));
    const moved = makeClient({
      controlPlaneUrl: `http://127.0.0.1:${(redirecting.address() as AddressInfo).port}`,
    });
    expect(await moved.refreshNow()).toEqual({ kind: "none" });
    expect(elsewhere).toEqual([]);
    await moved.stop();
    for (const server of [other, redirecting]) {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
  });

  it("stop() ends polling", async () => {
    client = makeClient({ intervalMs: 20 });
    cp.serve(1, SECRETS);
    await client.start();
    await until(() => cp.seen.length >= 3, "a few polls");
    await client.stop();
    const count = cp.seen.length;
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(cp.seen.length).toBe(count);
  });
});

describe("ProxyReady", () => {
  it("accepts what the proxy's own run CA produces", async () => {
    const ca = await createRunCa({ runId: RUN });
    const body = {
      caCertPem: ca.certPem,
      caFingerprint256: ca.fingerprint256,
      policyVersion: null,
      listeners: { tls: 8443, http: 8080, explicit: 3128 },
    };
    expect(ProxyReady.parse(body)).toEqual(body);
  });
});
