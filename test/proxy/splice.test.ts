import { X509Certificate } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { createSecureServer, type Http2SecureServer, connect as h2Connect } from "node:http2";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ConnectionOptions, type TLSSocket, connect as tlsConnect } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  curl,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";
import { connectTunnel, exchange, tlsOver, wire } from "./raw";

// Case I3: under catch-all routing (here: a block default), a TLS connection whose SNI names an
// allowed host that no rule matches is relayed without termination. The spliced upstream has a
// CA of its own that the proxy does not know and the clients trust directly, so a client that
// completes its handshake with it proves the proxy did not terminate.

const SECRET = "sk-canary-splice-3f9a1c2e";
const SPLICE_CA_NAME = "I3 spliced upstream's own CA";

let upstreamCa: TestCa; // the proxy's upstream trust (terminated hosts)
let spliceCa: TestCa; // the spliced upstream's own CA: only the clients trust it
let spliceCaFile: string;
let spliced: {
  server: Http2SecureServer;
  port: number;
  seen: Array<{ version: string; alpn: string | false; host: string }>;
};
let api: Upstream;
let proxy: RunningProxy;
let plainProxy: RunningProxy; // default routing: nothing is spliced

beforeAll(async () => {
  upstreamCa = await createTestCa();
  spliceCa = await createTestCa(SPLICE_CA_NAME);
  spliceCaFile = join(mkdtempSync(join(tmpdir(), "bw-splice-")), "splice-ca.pem");
  writeFileSync(spliceCaFile, spliceCa.certPem);

  // h2 and HTTP/1.1 on one TLS port, as real APIs serve: what ALPN the client got shows here.
  const leaf = await spliceCa.issue(["splice.test"]);
  const seen: typeof spliced.seen = [];
  const server = createSecureServer(
    { cert: leaf.certPem, key: leaf.keyPem, allowHTTP1: true },
    (req, res) => {
      const tls = req.socket as TLSSocket;
      seen.push({
        version: req.httpVersion,
        alpn: tls.alpnProtocol ?? false,
        host: req.headers[":authority"] ?? req.headers.host ?? "",
      });
      const body = JSON.stringify({
        version: req.httpVersion,
        authorization: req.headers.authorization ?? null,
      });
      res.writeHead(200, { "content-type": "application/json" });
      res.end(body);
    },
  );
  await new Promise<void>((r) => server.listen(0, "127.0.0.2", r));
  spliced = { server, port: (server.address() as AddressInfo).port, seen };

  api = await startTlsUpstream({ ca: upstreamCa, hosts: ["api.test"], address: "127.0.0.3" });
  const routes = {
    "splice.test": { address: "127.0.0.2", port: spliced.port },
    "api.test": api,
    // Outside the suite's allowed loopback range: a private address, never dialled.
    "private.test": { address: "127.0.0.9", port: spliced.port },
  };
  proxy = await startProxy({
    vault: vault({
      default: "block",
      hosts: [
        { pattern: "splice.test", action: "allow" },
        { pattern: "api.test", action: "allow" },
        { pattern: "private.test", action: "allow" },
        { pattern: "nodns.test", action: "allow" },
      ],
      rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { API_KEY: SECRET },
    routes,
    upstreamCa,
  });
  plainProxy = await startProxy({
    vault: vault({ hosts: [{ pattern: "evil.test", action: "block" }] }),
    routes,
    upstreamCa,
  });
});

afterAll(async () => {
  await proxy?.close();
  await plainProxy?.close();
  await api?.close();
  spliced?.server.close();
});

/** A TLS handshake through the proxy's transparent listener; resolves with the socket or the error. */
function handshake(port: number, options: ConnectionOptions): Promise<TLSSocket | Error> {
  return new Promise((resolve) => {
    const s = tlsConnect({ host: "127.0.0.1", port, ...options });
    s.once("secureConnect", () => resolve(s));
    s.once("error", (e) => resolve(e));
  });
}

const issuerOf = (s: TLSSocket) => new X509Certificate(s.getPeerCertificate(true).raw).issuer;

/** One h2 GET over an already negotiated TLS socket. */
function h2Get(
  socket: TLSSocket,
  authority: string,
  path: string,
): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const session = h2Connect(`https://${authority}`, { createConnection: () => socket });
    session.on("error", reject);
    const req = session.request({ ":path": path, ":method": "GET" });
    let status = 0;
    let body = "";
    req.on("response", (h) => {
      status = Number(h[":status"]);
    });
    req.setEncoding("utf8");
    req.on("data", (c: string) => {
      body += c;
    });
    req.on("end", () => {
      session.close();
      resolve({ status, body });
    });
    req.on("error", reject);
    req.end();
  });
}

const spliceDials = (p: RunningProxy) => p.dials.filter((d) => d.protocol === "splice:");

describe("case I3: an allowed host without a rule is spliced", () => {
  it("case I3: the client sees the upstream's own certificate and negotiates h2 with it, end to end", async () => {
    const from = proxy.logs.length;
    const dialsBefore = spliceDials(proxy).length;
    const socket = await handshake(proxy.tlsPort, {
      servername: "splice.test",
      ca: spliceCa.certPem, // not the run CA: only the upstream itself can complete this handshake
      ALPNProtocols: ["h2", "http/1.1"],
    });
    if (socket instanceof Error) throw socket;
    expect(issuerOf(socket)).toContain(SPLICE_CA_NAME);
    expect(socket.alpnProtocol).toBe("h2");
    const res = await h2Get(socket, "splice.test", "/through");
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body)).toEqual({ version: "2.0", authorization: null });
    expect(spliced.seen.at(-1)).toEqual({ version: "2.0", alpn: "h2", host: "splice.test:443" });

    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "splice.test", from);
    expect(record).toMatchObject({
      mode: "splice",
      listener: "tls",
      decision: "allow",
      reason: "spliced",
      route: "direct",
      rule: null,
    });
    expect((record as { bytesIn: number }).bytesIn).toBeGreaterThan(0);
    expect((record as { bytesOut: number }).bytesOut).toBeGreaterThan(0);
    expect(proxy.audit.routes).toContainEqual(["splice.test", "direct"]);
    // The SNI is the host the relay dialled: the checked address of splice.test, nothing else.
    expect(spliceDials(proxy).slice(dialsBefore)).toEqual([
      { protocol: "splice:", host: null, address: "127.0.0.2", port: spliced.port },
    ]);
  });

  it("case I3: curl over HTTP/1.1, trusting only the upstream's CA, gets the upstream's answer", async () => {
    const res = await curl([
      "--http1.1",
      "--cacert",
      spliceCaFile,
      "--connect-to",
      `splice.test:443:127.0.0.1:${proxy.tlsPort}`,
      "https://splice.test/curl",
    ]);
    expect(res.status).toBe(200);
    expect(JSON.parse(res.body)).toEqual({ version: "1.1", authorization: null });
  });

  it("case I3: through a CONNECT tunnel whose target is the SNI's host, spliced too", async () => {
    const from = proxy.logs.length;
    const t = await connectTunnel(proxy.explicitPort, "splice.test:443");
    expect(t.status).toBe(200);
    const tls = await tlsOver(t.socket, { servername: "splice.test", ca: spliceCa.certPem });
    expect(issuerOf(tls)).toContain(SPLICE_CA_NAME);
    const r = await exchange(tls, [wire("GET /tunnel HTTP/1.1", ["Host: splice.test", "Connection: close"])]);
    expect(r.responses[0]?.status).toBe(200);
    // (Records are written when a connection closes: an earlier test's may land after `from`.)
    const record = await proxy.waitForLog((l) => l.mode === "splice" && l.listener === "explicit", from);
    expect(record).toMatchObject({ host: "splice.test", method: "TLS", route: "direct" });
  });

  it("case I3: a spliced connection is closed when the policy changes under it", async () => {
    const socket = await handshake(proxy.tlsPort, { servername: "splice.test", ca: spliceCa.certPem });
    if (socket instanceof Error) throw socket;
    const closed = new Promise<void>((r) => socket.once("close", () => r()));
    socket.on("error", () => {});
    const before = proxy.policy.current();
    proxy.policy.setVault(
      vault({ version: 2, default: "block", hosts: [{ pattern: "splice.test", action: "block" }] }),
      {},
    );
    try {
      await proxy.proxy.policyChanged();
      await closed;
      expect(socket.destroyed).toBe(true);
    } finally {
      proxy.policy.set(before);
      await proxy.proxy.policyChanged();
    }
  });

  it("case I3: a spliced connection silent both ways past the idle limit is closed", async () => {
    const idle = await startProxy({
      vault: vault({ default: "block", hosts: [{ pattern: "splice.test", action: "allow" }] }),
      routes: { "splice.test": { address: "127.0.0.2", port: spliced.port } },
      limits: { spliceIdleTimeoutMs: 300 },
    });
    try {
      const socket = await handshake(idle.tlsPort, { servername: "splice.test", ca: spliceCa.certPem });
      if (socket instanceof Error) throw socket;
      socket.on("error", () => {});
      await new Promise<void>((r) => socket.once("close", () => r()));
      const record = await idle.waitForLog((l) => l.mode === "splice");
      expect(record).toMatchObject({ host: "splice.test", reason: "spliced, ended: idle timeout" });
    } finally {
      await idle.close();
    }
  });

  it("case I3: under default routing the same host is terminated (nothing is spliced)", async () => {
    const result = await handshake(plainProxy.tlsPort, { servername: "splice.test", ca: spliceCa.certPem });
    expect(result).toBeInstanceOf(Error); // the run CA's certificate, which this client does not trust
    expect(spliceDials(plainProxy)).toEqual([]);
  });
});

describe("case I3: what is never spliced", () => {
  it("case I3: a rule host is still terminated: the client sees the run CA and the header is injected", async () => {
    const from = proxy.logs.length;
    const res = await curlTls(proxy, "https://api.test/injected");
    expect(res.status).toBe(200);
    expect(api.seen.at(-1)?.headers.authorization).toBe(`Bearer ${SECRET}`);
    expect(res.body).not.toContain(SECRET);
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "api.test", from);
    expect(record).toMatchObject({ mode: "terminate", rule: 0, reason: "allowed, credential injected" });
    // A client trusting only the upstream's own CA cannot complete the handshake: the proxy's.
    const pinned = await handshake(proxy.tlsPort, { servername: "api.test", ca: upstreamCa.certPem });
    expect(pinned).toBeInstanceOf(Error);
  });

  it("case I3: a blocked SNI is terminated and refused with a readable 403", async () => {
    const dialsBefore = proxy.dials.length;
    const res = await curlTls(proxy, "https://evil.test/");
    expect(res.status).toBe(403);
    expect(res.body).toContain("Blocked by Benchwright: evil.test");
    expect(proxy.audit.blocked).toContain("evil.test");
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("case I3: a blocked SNI whose client refuses the run CA is still recorded, from its ClientHello", async () => {
    const dialsBefore = proxy.dials.length;
    const from = proxy.logs.length;
    const blockedBefore = proxy.audit.blocked.length;
    const tls = await handshake(proxy.tlsPort, { servername: "evil.test", ca: spliceCa.certPem });
    expect(tls).toBeInstanceOf(Error);
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "evil.test", from);
    expect(record).toMatchObject({ mode: "close", decision: "block", route: "refused" });
    expect(String(record.reason)).toContain("handshake failed");
    expect(proxy.audit.blocked.slice(blockedBefore)).toEqual(["evil.test"]);
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("case I3: a ClientHello without SNI is not spliced: terminated, and the handshake fails", async () => {
    // No name, nothing to decide on; the terminator has no certificate for no name, so the
    // handshake fails and nothing is dialled (connecting to an IP, node:tls sends no SNI).
    const from = proxy.logs.length;
    const dialsBefore = proxy.dials.length;
    const result = await handshake(proxy.tlsPort, { ca: spliceCa.certPem });
    expect(result).toBeInstanceOf(Error);
    expect(proxy.dials.length).toBe(dialsBefore);
    await proxy.waitForLog((l) => l.event === "tls_error", from);
  });

  it("case I3: an SNI other than the CONNECT target is not spliced: terminated and refused 421", async () => {
    const dialsBefore = proxy.dials.length;
    const t = await connectTunnel(proxy.explicitPort, "splice.test:443");
    expect(t.status).toBe(200);
    const tls = await tlsOver(t.socket, { servername: "api.test", ca: proxy.caPem });
    expect(issuerOf(tls)).not.toContain(SPLICE_CA_NAME);
    const r = await exchange(tls, [wire("GET / HTTP/1.1", ["Host: api.test", "Connection: close"])]);
    expect(r.responses[0]?.status).toBe(421);
    expect(r.bytes.toString()).not.toContain(SECRET);
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("case I3: an encrypted ClientHello (ECH) is not spliced, whatever its visible SNI", async () => {
    const from = proxy.logs.length;
    const dialsBefore = proxy.dials.length;
    const r = await exchange({ port: proxy.tlsPort }, [echHello("splice.test")], { timeoutMs: 2_000 });
    expect(r.closedByPeer).toBe(true);
    expect(proxy.dials.length).toBe(dialsBefore);
    await proxy.waitForLog((l) => l.event === "tls_error", from);
  });

  it("case I3: an allowed host that resolves to a private address is not dialled: terminated, 403", async () => {
    const dialsBefore = proxy.dials.length;
    const res = await curlTls(proxy, "https://private.test/");
    expect(res.status).toBe(403);
    expect(res.body).toContain("private or reserved address");
    expect(proxy.audit.blocked).toContain("private.test");
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("case I3: an allowed host that does not resolve is not spliced: terminated, 502", async () => {
    const res = await curlTls(proxy, "https://nodns.test/");
    expect(res.status).toBe(502);
    expect(proxy.audit.routes).toContainEqual(["nodns.test", "refused"]);
  });
});

/** A minimal ClientHello naming `sni` and carrying an ECH extension (its payload is noise). */
function echHello(sni: string): Buffer {
  const u16 = (n: number) => Buffer.from([n >> 8, n & 255]);
  const vec2 = (b: Buffer) => Buffer.concat([u16(b.length), b]);
  const name = Buffer.concat([Buffer.from([0]), vec2(Buffer.from(sni))]);
  const extensions = Buffer.concat([u16(0), vec2(vec2(name)), u16(0xfe0d), vec2(Buffer.alloc(16, 1))]);
  const body = Buffer.concat([
    Buffer.from([3, 3]),
    Buffer.alloc(32, 9),
    Buffer.from([0]),
    vec2(Buffer.from([0x13, 0x01])),
    Buffer.from([1, 0]),
    vec2(extensions),
  ]);
  const message = Buffer.concat([Buffer.from([1, 0, body.length >> 8, body.length & 255]), body]);
  return Buffer.concat([Buffer.from([0x16, 3, 1]), u16(message.length), message]);
}
