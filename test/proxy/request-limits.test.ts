import { X509Certificate } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import type { IncomingMessage } from "node:http";
import { connect as h2Connect } from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import { type ConnectionOptions, type TLSSocket, connect as tlsConnect } from "node:tls";
import { PolicyDocument } from "@benchwright/shared/contract/policy";
import { deriveFields } from "@benchwright/shared/contract/policy-routing";
import { type AuditBatch, newAuditKey, verifyAuditBatch } from "@benchwright/shared/contract/proxy-wire";
import { buildPolicyIndex, compilePolicy } from "@benchwright/shared/policy/compile";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ClientOptions, WebSocket, WebSocketServer } from "ws";
import { AuditReporter } from "../../proxy-image/src/proxy/audit";
import { auditRows, type DecisionRecord } from "../../proxy-image/src/proxy/handler/record";
import {
  createTestCa,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";
import { exchange, wire } from "./raw";

// Cases N3 and N4 with the real proxy, real TLS, real clients (curl, node's h2 client, ws) and
// real loopback upstreams: a host entry's and a rule's method and path limits hold on every way
// in, outside them is a readable 403 naming the limit, recorded without the path; a path's
// spelling cannot step outside a prefix; a limited host is always terminated.

const SECRET = "sk-canary-limits-5b7e2d91";
/** A path segment that must never appear in a record, an audit row or a refusal body. */
const HIDDEN = "private-path-7c1f";

let ca: TestCa;
let proxy: RunningProxy;
/** api.test: allowed, GET and HEAD only, under /repos and /user. */
let api: Upstream;
/** rules.test: its rule injects a credential, for POST only, under /v1/. */
let rules: Upstream;
/** free.test: allowed without a limit (spliced, the control for "never spliced"). */
let free: Upstream;
/** x.wild.test: under *.wild.test, allowed with a methods limit (brings catch-all routing). */
let wild: Upstream;
const VAULT = vault({
  hosts: [
    { pattern: "api.test", action: "allow" },
    { pattern: "free.test", action: "allow" },
    { pattern: "*.wild.test", action: "allow" },
  ],
  rules: [{ host: "rules.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
});
/** Upgrade handshakes that reached api.test. */
const upgrades: string[] = [];

beforeAll(async () => {
  ca = await createTestCa();
  api = await startTlsUpstream({ ca, hosts: ["api.test"], address: "127.0.0.2" });
  rules = await startTlsUpstream({ ca, hosts: ["rules.test"], address: "127.0.0.3" });
  free = await startTlsUpstream({ ca, hosts: ["free.test"], address: "127.0.0.4" });
  wild = await startTlsUpstream({ ca, hosts: ["x.wild.test"], address: "127.0.0.5" });
  const wss = new WebSocketServer({ noServer: true });
  wss.on("connection", (ws) => ws.on("message", (data) => ws.send(data)));
  api.server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    upgrades.push(req.url ?? "");
    wss.handleUpgrade(req, socket, head, (ws) => wss.emit("connection", ws, req));
  });
  proxy = await startProxy({
    vault: VAULT,
    secrets: { API_KEY: SECRET },
    routes: { "api.test": api, "rules.test": rules, "free.test": free, "x.wild.test": wild },
    upstreamCa: ca,
  });
  // The limits, on the compiled document (as the control plane will compile them from the vault).
  const base = compilePolicy(VAULT);
  const hosts = base.hosts.map((h) =>
    h.pattern === "api.test"
      ? { ...h, methods: ["GET", "HEAD"], paths: ["/repos", "/user"] }
      : h.pattern === "*.wild.test"
        ? { ...h, methods: ["GET"] }
        : h,
  );
  const limitedRules = base.rules.map((r) => ({ ...r, methods: ["POST"], paths: ["/v1/"] }));
  const derived = deriveFields({ default: base.default, hosts, rules: limitedRules }, base.egress);
  const policy = PolicyDocument.parse({ ...base, hosts, rules: limitedRules, ...derived });
  // case N3: a wildcard limit brings catch-all routing, where unlimited hosts are spliced.
  expect(policy.routing).toEqual({ mode: "catch-all", reasons: ["wildcard_limit"] });
  proxy.policy.set({ kind: "ready", policy, secrets: { API_KEY: SECRET }, index: buildPolicyIndex(policy) });
});

afterAll(async () => {
  // Never the path, never the secret, in any record or audit row.
  for (const text of [JSON.stringify(proxy.logs), JSON.stringify(proxy.audit)]) {
    expect(text).not.toContain(HIDDEN);
    expect(text).not.toContain(SECRET);
  }
  await proxy.close();
  await Promise.all([api, rules, free, wild].map((u) => u.close()));
});

const decisionFor = (host: string, from: number) =>
  proxy.waitForLog((r) => r.event === "decision" && r.host === host, from) as Promise<DecisionRecord>;

/** curl to https://<host><path> through the proxy's TLS listener; the path goes as written. */
const get = (url: string, extra: string[] = []) => curlTls(proxy, url, ["--path-as-is", ...extra]);

describe("case N3: a host entry's method and path limits", () => {
  it("case N3: GET inside the limits goes through; POST is refused with a 403 naming the limit", async () => {
    // case N3
    const ok = await get("https://api.test/repos/a?q=1");
    expect(ok.status).toBe(200);
    expect(api.seen.at(-1)).toMatchObject({ method: "GET", url: "/repos/a?q=1" });

    const seen = api.counts.requests;
    const from = proxy.logs.length;
    const refused = await get(`https://api.test/repos/${HIDDEN}`, ["-X", "POST", "-d", "x=1"]);
    expect(refused.status).toBe(403);
    expect(refused.body).toContain("GET, HEAD only on api.test");
    expect(refused.body).toContain("this request was POST");
    expect(refused.body).not.toContain(HIDDEN);
    expect(api.counts.requests).toBe(seen);
    expect(await decisionFor("api.test", from)).toMatchObject({
      decision: "refuse",
      status: 403,
      method: "POST",
      limit: "method",
      mode: "terminate",
    });
    expect(proxy.audit.limitRefusals).toContainEqual(["api.test", "POST", "method"]);
  });

  it("case N3: a path outside the limits is refused, naming the host; the path is not echoed", async () => {
    // case N3
    const seen = api.counts.requests;
    const from = proxy.logs.length;
    const refused = await get(`https://api.test/${HIDDEN}/x`);
    expect(refused.status).toBe(403);
    expect(refused.body).toContain("path outside the limits of api.test");
    expect(refused.body).not.toContain(HIDDEN);
    expect(api.counts.requests).toBe(seen);
    expect(await decisionFor("api.test", from)).toMatchObject({ limit: "path", status: 403 });
    expect(proxy.audit.limitRefusals).toContainEqual(["api.test", "GET", "path"]);
    // A prefix ends on a segment boundary.
    expect((await get("https://api.test/reposx")).status).toBe(403);
    expect((await get("https://api.test/user")).status).toBe(200);
  });

  it("case N3: a rule's limits hold too, with its credential injected only inside them", async () => {
    // case N3
    const ok = await get("https://rules.test/v1/things", ["-X", "POST", "-d", "x=1"]);
    expect(ok.status).toBe(200);
    expect(rules.seen.at(-1)?.headers.authorization).toBe(`Bearer ${SECRET}`);

    const seen = rules.counts.requests;
    const method = await get("https://rules.test/v1/things", ["-X", "DELETE"]);
    expect(method.status).toBe(403);
    expect(method.body).toContain("POST only on rules.test, by the rule 1 (rules.test)");
    const path = await get(`https://rules.test/v2/${HIDDEN}`, ["-X", "POST", "-d", "x=1"]);
    expect(path.status).toBe(403);
    expect(path.body).toContain("path outside the limits of rules.test");
    expect(rules.counts.requests).toBe(seen);
    expect(proxy.audit.limitRefusals).toContainEqual(["rules.test", "DELETE", "method"]);
    expect(proxy.audit.limitRefusals).toContainEqual(["rules.test", "POST", "path"]);
  });

  it("case N3: a limited host is never spliced: the client sees the run CA's leaf", async () => {
    // case N3
    const issuer = async (servername: string) => {
      const socket = await new Promise<TLSSocket>((resolve, reject) => {
        const options: ConnectionOptions = {
          host: "127.0.0.1",
          port: proxy.tlsPort,
          servername,
          ca: [proxy.caPem, ca.certPem],
        };
        const s = tlsConnect(options);
        s.once("secureConnect", () => resolve(s));
        s.once("error", reject);
      });
      const name = new X509Certificate(socket.getPeerCertificate(true).raw).issuer;
      socket.destroy();
      return name;
    };
    const runCa = new X509Certificate(proxy.caPem).subject;
    const testCa = new X509Certificate(ca.certPem).subject;
    expect(runCa).not.toBe(testCa);
    // The control: an allowed host without a limit is spliced (the upstream's own certificate).
    expect(await issuer("free.test")).toBe(testCa);
    expect(await issuer("api.test")).toBe(runCa);
    expect(await issuer("x.wild.test")).toBe(runCa);
    // And held to its limit when terminated.
    expect((await get("https://x.wild.test/a")).status).toBe(200);
    const post = await get("https://x.wild.test/a", ["-X", "POST", "-d", "x"]);
    expect(post.status).toBe(403);
    expect(post.body).toContain("GET only on x.wild.test, by the host entry *.wild.test");
  });
});

describe("case N4: a path's spelling cannot step outside a prefix", () => {
  it("case N4: %2e%2e, %2E%2E, ..;, // and case are compared normalised and refused", async () => {
    // case N4
    const seen = api.counts.requests;
    for (const path of [
      `/repos/%2e%2e/${HIDDEN}`,
      `/repos/%2E%2E/${HIDDEN}`,
      `/repos/.%2e/${HIDDEN}`,
      `/repos/..;/${HIDDEN}`,
      `/repos;x=1/../${HIDDEN}`,
      `//repos/../${HIDDEN}`,
      `/Repos/${HIDDEN}`,
      `/REPOS`,
    ]) {
      const res = await get(`https://api.test${path}`);
      expect(res.status, path).toBe(403);
      expect(res.body, path).toContain("path outside the limits of api.test");
    }
    expect(api.counts.requests).toBe(seen);
  });

  it("case N4: encoded slashes and backslashes cannot be normalised safely: refused", async () => {
    // case N4
    const seen = api.counts.requests;
    for (const path of [`/repos%2F..%2F${HIDDEN}`, `/repos%2f..%2f${HIDDEN}`, `/repos/%5C..%5C${HIDDEN}`]) {
      const res = await get(`https://api.test${path}`);
      expect(res.status, path).toBe(403);
      expect(res.body, path).toContain("cannot be compared with the path limits of api.test");
      expect(res.body, path).not.toContain(HIDDEN);
    }
    // A raw backslash, which curl would not send as it is.
    const raw = await exchange(
      { port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } },
      [wire(`GET /repos\\..\\${HIDDEN} HTTP/1.1`, ["Host: api.test"])],
      { expect: 1 },
    );
    expect(raw.responses[0]?.status).toBe(403);
    expect(raw.responses[0]?.body.toString()).toContain("it has a backslash");
    expect(api.counts.requests).toBe(seen);
    expect(proxy.audit.limitRefusals).toContainEqual(["api.test", "GET", "unnormalisable_path"]);
  });

  it("case N4: a spelling that normalises inside is let through, and forwarded as it was sent", async () => {
    // case N4
    const res = await get("https://api.test//repos//%61;v=1/./b");
    expect(res.status).toBe(200);
    expect(api.seen.at(-1)?.url).toBe("//repos//%61;v=1/./b");
  });
});

describe("case N3: every way in is held to the limits", () => {
  it("case N3: an h2 stream outside the limits is refused while another on the connection succeeds", async () => {
    // case N3
    const socket = await new Promise<TLSSocket>((resolve, reject) => {
      const s = tlsConnect({
        host: "127.0.0.1",
        port: proxy.tlsPort,
        servername: "api.test",
        ca: proxy.caPem,
        ALPNProtocols: ["h2"],
      });
      s.once("secureConnect", () => resolve(s));
      s.once("error", reject);
    });
    expect(socket.alpnProtocol).toBe("h2");
    const session = h2Connect("https://api.test", { createConnection: () => socket });
    const stream = (method: string, path: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const req = session.request({ ":method": method, ":path": path });
        let status = 0;
        let body = "";
        req.on("response", (h) => {
          status = Number(h[":status"]);
        });
        req.setEncoding("utf8");
        req.on("data", (c: string) => {
          body += c;
        });
        req.on("end", () => resolve({ status, body }));
        req.on("error", reject);
        req.end();
      });
    const seen = api.counts.requests;
    const [refused, ok, path] = await Promise.all([
      stream("DELETE", "/repos/a"),
      stream("GET", "/repos/a"),
      stream("GET", `/${HIDDEN}`),
    ]);
    expect(refused.status).toBe(403);
    expect(refused.body).toContain("GET, HEAD only on api.test");
    expect(path.status).toBe(403);
    expect(ok.status).toBe(200);
    // A lowercase method is not GET (methods compare exactly, as sent).
    const lower = await stream("get", "/repos/a");
    expect(lower.status).toBe(403);
    expect(session.destroyed).toBe(false);
    expect(api.counts.requests).toBe(seen + 1);
    session.close();
    expect(proxy.audit.limitRefusals).toContainEqual(["api.test", "DELETE", "method"]);
  });

  it("case N3: a WebSocket handshake outside the limits is refused; inside, it upgrades", async () => {
    // case N3
    const client = (path: string) => {
      const options: ClientOptions & { servername: string } = {
        headers: { host: "api.test" },
        servername: "api.test",
        ca: proxy.caPem,
      };
      return new WebSocket(`wss://127.0.0.1:${proxy.tlsPort}${path}`, options);
    };
    const from = proxy.logs.length;
    const refused = await new Promise<{ status: number; body: string }>((resolve, reject) => {
      const ws = client(`/${HIDDEN}/socket`);
      ws.once("unexpected-response", (_req, res) => {
        const chunks: Buffer[] = [];
        res.on("data", (c: Buffer) => chunks.push(c));
        res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
      });
      ws.once("open", () => reject(new Error("upgraded")));
      ws.once("error", () => {});
    });
    expect(refused.status).toBe(403);
    expect(refused.body).toContain("path outside the limits of api.test");
    expect(upgrades).toEqual([]);
    expect(await decisionFor("api.test", from)).toMatchObject({ limit: "path", status: 403, method: "GET" });

    const echoed = await new Promise<string>((resolve, reject) => {
      const ws = client("/repos/socket");
      ws.once("open", () => ws.send("hello"));
      ws.once("message", (data) => {
        ws.close();
        resolve(String(data));
      });
      ws.once("error", reject);
    });
    expect(echoed).toBe("hello");
    expect(upgrades).toEqual(["/repos/socket"]);
  });
});

describe("case N3: the audit batch", () => {
  it("case N3: holds a limitRefusals row per host, method and limit, never the path", async () => {
    // case N3
    const spoolDir = await mkdtemp(join(tmpdir(), "bw-limits-audit-"));
    const auditKey = newAuditKey();
    const batches: AuditBatch[] = [];
    // The control plane's side of the channel, in process: the contract's own verification.
    const reporter = new AuditReporter({
      controlPlaneUrl: "http://127.0.0.1:9",
      runId: "run_limits",
      proxyToken: "proxy-token-0123456789abcdef",
      auditKey,
      spoolDir,
      fetch: async (_url, init) => {
        batches.push(
          verifyAuditBatch(auditKey, new Headers(init.headers), String(init.body), { runId: "run_limits" }),
        );
        return new Response("{}", { status: 200 });
      },
    });
    try {
      // The proxy's own records of this file's requests, turned into rows as its gate does.
      for (const r of proxy.logs) if (r.event === "decision") auditRows(reporter, r as DecisionRecord);
      await reporter.flush();
      const rows = batches.flatMap((b) => b.limitRefusals);
      expect(rows).toContainEqual(
        expect.objectContaining({ host: "api.test", method: "POST", limit: "method" }),
      );
      expect(rows).toContainEqual(
        expect.objectContaining({ host: "api.test", method: "GET", limit: "path" }),
      );
      expect(rows).toContainEqual(
        expect.objectContaining({ host: "api.test", method: "GET", limit: "unnormalisable_path" }),
      );
      const apiPath = rows.find((r) => r.host === "api.test" && r.method === "GET" && r.limit === "path");
      expect(apiPath?.count).toBeGreaterThan(5);
      // Exactly the contract's fields: a host, a method, a limit, counts and times.
      for (const row of rows)
        expect(Object.keys(row).sort()).toEqual([
          "count",
          "firstSeen",
          "host",
          "lastSeen",
          "limit",
          "method",
        ]);
      expect(JSON.stringify(batches)).not.toContain(HIDDEN);
      expect(JSON.stringify(batches)).not.toContain("/repos");
    } finally {
      await reporter.stop();
      await rm(spoolDir, { recursive: true, force: true });
    }
  });
});
