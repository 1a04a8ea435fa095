import {
  type ClientHttp2Session,
  createSecureServer,
  type Http2SecureServer,
  connect as h2connect,
  type IncomingHttpHeaders,
} from "node:http2";
import type { AddressInfo, Socket } from "node:net";
import { type TLSSocket, connect as tlsConnect } from "node:tls";
import { WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  curl,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  tlsArgs,
  type Upstream,
  vault,
} from "./harness";
import { connectTunnel } from "./raw";

// Case I1: HTTP/2 on a terminated host. The proxy offers h2 in ALPN; every stream on a connection
// is decided on its own, its `:authority` must be the SNI's host (else 421, the other streams go
// on), and the credential is injected and masked per stream. Upstream, h2 is used when the origin
// offers it, with trailers both ways.

const CANARY = "sk-canary-h2-7d1e5a90c3";
const MASKED = `Bearer ${"*".repeat(CANARY.length)}`;

function expectNoSecret(text: string, where = "response"): void {
  expect(text, `${where} leaks the canary`).not.toContain(CANARY);
}

let ca: TestCa;
let proxy: RunningProxy;
/** HTTP/1.1 upstream of the rule host api.test (echoes the request as JSON). */
let api: Upstream;
/** An allowed host without a rule: must see nothing a stream for api.test sent. */
let other: Upstream;
/** HTTP/2-only upstream of the rule host h2up.test: echoes, and puts the credential in a trailer. */
let h2up: Http2SecureServer;
const h2seen: IncomingHttpHeaders[] = [];

function listen(server: Http2SecureServer, address: string): Promise<number> {
  return new Promise((resolve) =>
    server.listen(0, address, () => resolve((server.address() as AddressInfo).port)),
  );
}

beforeAll(async () => {
  ca = await createTestCa();
  api = await startTlsUpstream({ ca, hosts: ["api.test"] });
  other = await startTlsUpstream({ ca, hosts: ["other.test"], address: "127.0.0.3" });
  const leaf = await ca.issue(["h2up.test"]);
  // h2 only (no allowHTTP1): an upstream the proxy can reach only by speaking h2.
  h2up = createSecureServer({ cert: leaf.certPem, key: leaf.keyPem });
  h2up.on("stream", (stream, headers) => {
    h2seen.push(headers);
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => {
      const auth = String(headers.authorization ?? "");
      stream.respond({ ":status": 200, "content-type": "application/json" }, { waitForTrailers: true });
      stream.once("wantTrailers", () => stream.sendTrailers({ "x-echo-auth": auth, "x-done": "yes" }));
      stream.end(JSON.stringify({ auth, body: Buffer.concat(chunks).toString() }));
    });
  });
  const h2port = await listen(h2up, "127.0.0.4");
  proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "other.test", action: "allow" },
        { pattern: "evil.test", action: "block" },
      ],
      rules: [
        { host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } },
        { host: "h2up.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } },
      ],
    }),
    secrets: { API_KEY: CANARY },
    routes: { "api.test": api, "other.test": other, "h2up.test": { address: "127.0.0.4", port: h2port } },
    upstreamCa: ca,
  });
});

afterAll(async () => {
  // Across every stream of this file: no secret in the decision log or the audit rows.
  expectNoSecret(JSON.stringify(proxy.logs), "decision log");
  expectNoSecret(JSON.stringify(proxy.audit), "audit rows");
  expectNoSecret(JSON.stringify(other.seen), "other.test upstream");
  await proxy.close();
  await Promise.all([api.close(), other.close(), new Promise((r) => h2up.close(r))]);
});

/**
 * An HTTP/2 session to the proxy's TLS listener for `sni`, trusting the run CA; or inside a
 * CONNECT tunnel of the explicit port when `tunnel` is given.
 */
function session(sni: string, tunnel?: Socket): Promise<ClientHttp2Session> {
  return new Promise((resolve, reject) => {
    const s = h2connect(`https://${sni}`, {
      createConnection: () =>
        tlsConnect({
          ...(tunnel ? { socket: tunnel } : { host: "127.0.0.1", port: proxy.tlsPort }),
          servername: sni,
          ca: proxy.caPem,
          ALPNProtocols: ["h2"],
        }),
    });
    s.once("connect", () => resolve(s));
    s.once("error", reject);
  });
}

interface StreamResult {
  status: number;
  headers: IncomingHttpHeaders;
  trailers: IncomingHttpHeaders;
  body: string;
}

/** One request on `s`; `body` chunks are written one by one (a streamed request body). */
function request(
  s: ClientHttp2Session,
  headers: Record<string, string>,
  body: string[] = [],
): Promise<StreamResult> {
  return new Promise((resolve, reject) => {
    const stream = s.request(headers, { endStream: body.length === 0 });
    let head: IncomingHttpHeaders = {};
    let trailers: IncomingHttpHeaders = {};
    const chunks: Buffer[] = [];
    stream.on("response", (h) => {
      head = h;
    });
    stream.on("trailers", (t) => {
      trailers = t;
    });
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () =>
      resolve({
        status: Number(head[":status"]),
        headers: head,
        trailers,
        body: Buffer.concat(chunks).toString(),
      }),
    );
    stream.on("error", reject);
    const write = (i: number) => {
      if (i >= body.length) return void (body.length > 0 && stream.end());
      stream.write(body[i], () => setImmediate(() => write(i + 1)));
    };
    write(0);
  });
}

describe("case I1: each HTTP/2 stream is decided, injected and masked on its own", () => {
  it("two streams on one connection: the SNI's :authority injected and masked, another refused 421", async () => {
    const s = await session("api.test");
    expect(s.alpnProtocol).toBe("h2");
    const otherBefore = other.counts.connections;
    const from = proxy.logs.length;
    const [mine, theirs] = await Promise.all([
      request(s, {
        ":method": "GET",
        ":path": "/v1/mine",
        ":authority": "api.test",
        authorization: "Bearer agent",
      }),
      request(s, { ":method": "GET", ":path": "/v1/theirs", ":authority": "other.test" }),
    ]);
    expect(mine.status).toBe(200);
    expect(api.seen.find((r) => r.url === "/v1/mine")?.headers.authorization).toBe(`Bearer ${CANARY}`);
    // The echo of the injected header comes back masked, same length.
    expect(JSON.parse(mine.body).headers.authorization).toBe(MASKED);
    expectNoSecret(mine.body);
    expect(theirs.status).toBe(421);
    expect(theirs.body).toContain(":authority differs");
    expect(other.counts.connections).toBe(otherBefore);
    // The session survives the refused stream: a third stream on it is decided and served.
    const third = await request(s, { ":method": "GET", ":path": "/v1/third", ":authority": "api.test" });
    expect(third.status).toBe(200);
    s.close();
    const records = proxy.logs.slice(from).filter((r) => r.event === "decision");
    expect(records).toHaveLength(3);
    expect(new Set(records.map((r) => r.conn)).size).toBe(1);
    expect(records.find((r) => r.status === 421)).toMatchObject({
      host: null,
      decision: "refuse",
      reason: ":authority differs from the connection's host",
    });
    expect(records.filter((r) => r.status === 200)).toEqual([
      expect.objectContaining({ host: "api.test", rule: 0, reason: "allowed, credential injected" }),
      expect.objectContaining({ host: "api.test", rule: 0, reason: "allowed, credential injected" }),
    ]);
  });

  it("a Host field that disagrees with :authority is refused 400, nothing forwarded", async () => {
    const s = await session("api.test");
    const before = api.counts.requests;
    const res = await request(s, {
      ":method": "GET",
      ":path": "/v1/host",
      ":authority": "api.test",
      host: "other.test",
    });
    s.close();
    expect(res.status).toBe(400);
    expect(api.counts.requests).toBe(before);
  });

  it("a blocked host's streams are refused 403 each, and audited", async () => {
    const s = await session("evil.test");
    const res = await Promise.all(
      [1, 2].map((i) => request(s, { ":method": "GET", ":path": `/${i}`, ":authority": "evil.test" })),
    );
    s.close();
    expect(res.map((r) => r.status)).toEqual([403, 403]);
    expect(res[0]?.body).toContain("Blocked by Benchwright: evil.test");
    expect(proxy.audit.blocked.filter((h) => h === "evil.test")).toHaveLength(2);
  });

  it("a streamed request body reaches the upstream whole; the record counts it", async () => {
    const s = await session("api.test");
    const from = proxy.logs.length;
    const res = await request(
      s,
      { ":method": "POST", ":path": "/v1/upload", ":authority": "api.test", "content-type": "text/plain" },
      ["first,", "second,", "third"],
    );
    s.close();
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body).body).toBe("first,second,third");
    const rec = await proxy.waitForLog((r) => r.event === "decision" && r.method === "POST", from);
    expect(rec).toMatchObject({ host: "api.test", bytesIn: "first,second,third".length, status: 200 });
  });

  it("an h2 upstream is spoken h2, its trailers come back masked, per stream", async () => {
    const s = await session("h2up.test");
    const before = h2seen.length;
    const res = await Promise.all(
      ["a", "b"].map((x) =>
        request(s, { ":method": "POST", ":path": `/rpc/${x}`, ":authority": "h2up.test", te: "trailers" }, [
          x,
        ]),
      ),
    );
    s.close();
    // Each stream reached the h2 origin as a stream of its own, with the credential and TE.
    const seen = h2seen.slice(before);
    expect(seen.map((h) => h[":path"]).sort()).toEqual(["/rpc/a", "/rpc/b"]);
    for (const h of seen) {
      expect(h.authorization).toBe(`Bearer ${CANARY}`);
      expect(h[":authority"]).toBe("h2up.test");
      expect(h.te).toBe("trailers");
    }
    for (const [i, r] of res.entries()) {
      expect(r.status).toBe(200);
      expect(JSON.parse(r.body)).toEqual({ auth: MASKED, body: ["a", "b"][i] });
      expect(r.trailers["x-echo-auth"]).toBe(MASKED);
      expect(r.trailers["x-done"]).toBe("yes");
      expectNoSecret(JSON.stringify(r));
    }
  });

  it("inside a CONNECT tunnel too: the stream for the tunnel's host is served, another is 421", async () => {
    const tunnel = await connectTunnel(proxy.explicitPort, "api.test:443");
    expect(tunnel.status).toBe(200);
    const s = await session("api.test", tunnel.socket);
    const [mine, theirs] = await Promise.all([
      request(s, { ":method": "GET", ":path": "/v1/tunnel", ":authority": "api.test" }),
      request(s, { ":method": "GET", ":path": "/v1/tunnel", ":authority": "other.test" }),
    ]);
    s.close();
    expect([mine.status, theirs.status]).toEqual([200, 421]);
    expect(JSON.parse(mine.body).headers.authorization).toBe(MASKED);
  });

  it("the platform's own host is offered HTTP/1.1 only, whatever the client offers", async () => {
    const socket = await new Promise<TLSSocket>((resolve, reject) => {
      const t = tlsConnect({
        host: "127.0.0.1",
        port: proxy.tlsPort,
        servername: WIRING_PROBE_HOST,
        ca: proxy.caPem,
        ALPNProtocols: ["h2", "http/1.1"],
      });
      t.once("secureConnect", () => resolve(t));
      t.once("error", reject);
    });
    expect(socket.alpnProtocol).toBe("http/1.1");
    socket.destroy();
    const s = await session("api.test");
    expect(s.alpnProtocol).toBe("h2");
    s.close();
  });

  it("curl --http2 negotiates h2 with the proxy; an HTTP/1.1 client still gets HTTP/1.1", async () => {
    const h2 = await curlTls(proxy, "https://api.test/v1/curl", ["--http2", "-D", "-"]);
    expect(h2.code).toBe(0);
    expect(h2.body).toMatch(/^HTTP\/2 200/);
    expect(api.seen.find((r) => r.url === "/v1/curl")?.headers.authorization).toBe(`Bearer ${CANARY}`);
    expectNoSecret(h2.body);
    const h1 = await curl([
      ...tlsArgs(proxy, "h2up.test"),
      "--http1.1",
      "-D",
      "-",
      "https://h2up.test/v1/h1",
    ]);
    expect(h1.body).toMatch(/^HTTP\/1\.1 200/);
    // An HTTP/1.1 client to an h2-only origin: translated, injected, masked.
    expect(h1.body).toContain(JSON.stringify({ auth: MASKED, body: "" }));
    expectNoSecret(h1.body);
  });
});

describe("case I1: an HTTP/2 session lives by the same deadlines as an HTTP/1.1 connection", () => {
  it("one that opens no stream, and one idle after its stream, are closed by the proxy", async () => {
    const short = await startProxy({
      vault: vault({}),
      routes: { "other.test": other },
      upstreamCa: ca,
      limits: { headersTimeoutMs: 400, keepAliveTimeoutMs: 400 },
    });
    try {
      const open = (sni: string) =>
        new Promise<ClientHttp2Session>((resolve, reject) => {
          const s = h2connect(`https://${sni}`, {
            createConnection: () =>
              tlsConnect({
                host: "127.0.0.1",
                port: short.tlsPort,
                servername: sni,
                ca: short.caPem,
                ALPNProtocols: ["h2"],
              }),
          });
          s.once("connect", () => resolve(s));
          s.once("error", reject);
        });
      const closed = (s: ClientHttp2Session) =>
        new Promise<void>((resolve) => s.once("close", () => resolve()));
      // Never a stream: closed by the header deadline.
      const silent = await open("other.test");
      await closed(silent);
      // One stream, then silence: closed by the keep-alive deadline.
      const used = await open("other.test");
      const res = await request(used, { ":method": "GET", ":path": "/once", ":authority": "other.test" });
      expect(res.status).toBe(200);
      await closed(used);
      expect(silent.destroyed && used.destroyed).toBe(true);
    } finally {
      await short.close();
    }
  });
});
