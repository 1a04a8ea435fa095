import { X509Certificate } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { connect as netConnect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type ConnectionOptions, type TLSSocket, connect as tlsConnect } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Dialed } from "../../proxy-image/src/proxy/original-dst";
import { loadOriginalDst } from "../../proxy-image/src/proxy/original-dst";
import {
  createTestCa,
  curl,
  type RunningProxy,
  startPlainUpstream,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";

// Case I4, the proxy's half: connections a default-routing sandbox dialled by address arrive on
// the direct listeners with the address they were dialled at. Here the dialled address comes
// from a stand-in for SO_ORIGINAL_DST (a loopback connection is not DNAT'd); the real call, on
// a real nft DNAT in namespaces, is test/local/default-routing.test.ts. The dialled upstream
// has a CA of its own that only the clients trust, so a completed handshake proves no
// termination; the names' test routes point elsewhere, so a dial to the dialled address proves
// no fresh resolve.

const SECRET = "sk-canary-direct-7d2e91b0";
const OWN_CA_NAME = "I4 dialled upstream's own CA";

let upstreamCa: TestCa; // what the proxy trusts upstream (terminated hosts)
let ownCa: TestCa; // the dialled upstream's own CA: only the clients trust it
let ownCaFile: string;
let dialledTls: Upstream; // 127.0.0.2: where the sandbox dialled
let dialledHttp: Upstream;
let elsewhere: Upstream; // 127.0.0.3: where the names' routes point (rule host api.test too)
let proxy: RunningProxy;
let dialed: Dialed | null = null;

beforeAll(async () => {
  upstreamCa = await createTestCa();
  ownCa = await createTestCa(OWN_CA_NAME);
  ownCaFile = join(mkdtempSync(join(tmpdir(), "bw-direct-")), "own-ca.pem");
  writeFileSync(ownCaFile, ownCa.certPem);
  dialledTls = await startTlsUpstream({ ca: ownCa, hosts: ["allowed.test", "blocked.test"] });
  dialledHttp = await startPlainUpstream();
  elsewhere = await startTlsUpstream({
    ca: upstreamCa,
    hosts: ["allowed.test", "api.test"],
    address: "127.0.0.3",
  });
  proxy = await startProxy({
    vault: vault({
      hosts: [{ pattern: "blocked.test", action: "block" }],
      rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { API_KEY: SECRET },
    routes: { "allowed.test": elsewhere, "api.test": elsewhere },
    upstreamCa,
    originalDst: () => dialed,
  });
});

afterAll(async () => {
  await proxy?.close();
  await dialledTls?.close();
  await dialledHttp?.close();
  await elsewhere?.close();
});

const dialTls = () => ({ address: "127.0.0.2", port: dialledTls.port });
const connectTo = (host: string, port: number) => ["--connect-to", `${host}:443:127.0.0.1:${port}`];
const issuerOf = (s: TLSSocket) => new X509Certificate(s.getPeerCertificate(true).raw).issuer;

function handshake(port: number, options: ConnectionOptions): Promise<TLSSocket | Error> {
  return new Promise((resolve) => {
    const s = tlsConnect({ host: "127.0.0.1", port, ...options });
    s.once("secureConnect", () => resolve(s));
    s.once("error", (e) => resolve(e));
  });
}

describe("case I4: a TLS connection dialled by address", () => {
  it("case I4: an allowed host is relayed untouched to the address dialled, not to a fresh resolve", async () => {
    dialed = dialTls();
    const from = proxy.logs.length;
    const res = await curl([
      "--cacert",
      ownCaFile,
      ...connectTo("allowed.test", proxy.directTlsPort),
      "https://allowed.test/direct",
    ]);
    expect(res.status).toBe(200);
    expect(dialledTls.seen.at(-1)?.url).toBe("/direct");
    expect(elsewhere.seen.some((s) => s.url === "/direct")).toBe(false);
    expect(proxy.dials.at(-1)).toEqual({ protocol: "splice:", host: null, ...dialTls() });
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "allowed.test", from);
    expect(record).toMatchObject({ listener: "direct-tls", mode: "splice", route: "direct", status: 0 });
    expect(proxy.audit.routes).toContainEqual(["allowed.test", "direct"]);
  });

  it("case I4: the client sees the dialled upstream's own certificate", async () => {
    dialed = dialTls();
    const tls = await handshake(proxy.directTlsPort, { servername: "allowed.test", ca: ownCa.certPem });
    if (tls instanceof Error) throw tls;
    expect(issuerOf(tls)).toContain(OWN_CA_NAME);
    tls.destroy();
  });

  it("case I4: a blocked host is terminated and refused with a readable 403, nothing dialled", async () => {
    dialed = dialTls();
    const dialsBefore = proxy.dials.length;
    const from = proxy.logs.length;
    const res = await curl([
      "--cacert",
      proxy.caFile,
      ...connectTo("blocked.test", proxy.directTlsPort),
      "https://blocked.test/",
    ]);
    expect(res.status).toBe(403);
    expect(res.body).toContain("Blocked by Benchwright: blocked.test");
    expect(proxy.dials.length).toBe(dialsBefore);
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "blocked.test", from);
    expect(record).toMatchObject({
      listener: "direct-tls",
      decision: "block",
      status: 403,
      blockedBy: "proxy",
    });
    expect(proxy.audit.blocked).toContain("blocked.test");
  });

  it("case I4: a blocked host is recorded even when the client's handshake fails (it does not trust the run CA)", async () => {
    dialed = dialTls();
    const dialsBefore = proxy.dials.length;
    const from = proxy.logs.length;
    const blockedBefore = proxy.audit.blocked.length;
    const tls = await handshake(proxy.directTlsPort, { servername: "blocked.test", ca: ownCa.certPem });
    expect(tls).toBeInstanceOf(Error);
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "blocked.test", from);
    expect(record).toMatchObject({ mode: "close", decision: "block", blockedBy: "proxy", route: "refused" });
    expect(proxy.audit.blocked.slice(blockedBefore)).toEqual(["blocked.test"]);
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("case I4: a rule host is terminated and injected as through the hosts file, sent to its own address", async () => {
    dialed = dialTls();
    const res = await curl([
      "--cacert",
      proxy.caFile,
      ...connectTo("api.test", proxy.directTlsPort),
      "https://api.test/key",
    ]);
    expect(res.status).toBe(200);
    expect(elsewhere.seen.at(-1)?.headers.authorization).toBe(`Bearer ${SECRET}`);
    expect(dialledTls.seen.some((s) => s.url === "/key")).toBe(false);
    expect(res.body).not.toContain(SECRET);
  });

  it("case I4: without SNI, an allowed address is relayed, recorded by its address", async () => {
    dialed = dialTls();
    const from = proxy.logs.length;
    const tls = await handshake(proxy.directTlsPort, {
      ca: ownCa.certPem,
      checkServerIdentity: () => undefined,
    });
    if (tls instanceof Error) throw tls;
    expect(issuerOf(tls)).toContain(OWN_CA_NAME);
    tls.destroy();
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "127.0.0.2", from);
    expect(record).toMatchObject({ mode: "splice", route: "direct" });
  });

  it("case I4: without SNI, an address the proxy never dials is closed and recorded refused", async () => {
    dialed = { address: "127.0.0.9", port: dialledTls.port };
    const dialsBefore = proxy.dials.length;
    const from = proxy.logs.length;
    const tls = await handshake(proxy.directTlsPort, {
      ca: ownCa.certPem,
      checkServerIdentity: () => undefined,
    });
    expect(tls).toBeInstanceOf(Error);
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "127.0.0.9", from);
    expect(record).toMatchObject({ mode: "close", decision: "refuse", route: "refused" });
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("case I4: an allowed host dialled at a private address is terminated and refused 403, not dialled", async () => {
    dialed = { address: "127.0.0.9", port: dialledTls.port };
    const dialsBefore = proxy.dials.length;
    const res = await curl([
      "--cacert",
      proxy.caFile,
      ...connectTo("allowed.test", proxy.directTlsPort),
      "https://allowed.test/",
    ]);
    expect(res.status).toBe(403);
    expect(res.body).toContain("private or reserved address");
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("case I4: with no original destination the connection is closed, nothing decided or dialled", async () => {
    dialed = null;
    const dialsBefore = proxy.dials.length;
    const from = proxy.logs.length;
    const tls = await handshake(proxy.directTlsPort, { servername: "allowed.test", ca: ownCa.certPem });
    expect(tls).toBeInstanceOf(Error);
    await proxy.waitForLog((l) => l.event === "no_original_destination", from);
    expect(proxy.dials.length).toBe(dialsBefore);
  });
});

describe("case I4: plain HTTP dialled by address", () => {
  it("case I4: an allowed Host is forwarded to the address dialled, and recorded as reached direct", async () => {
    dialed = { address: "127.0.0.2", port: dialledHttp.port };
    const from = proxy.logs.length;
    const res = await curl([`http://127.0.0.1:${proxy.directHttpPort}/plain`, "-H", "Host: allowed.test"]);
    expect(res.status).toBe(200);
    expect(dialledHttp.seen.at(-1)).toMatchObject({ url: "/plain", headers: { host: "allowed.test" } });
    const record = await proxy.waitForLog((l) => l.event === "decision" && l.host === "allowed.test", from);
    expect(record).toMatchObject({ listener: "direct-http", route: "direct", status: 200 });
  });

  it("case I4: a blocked Host is refused 403 and recorded, nothing dialled; so is the next request", async () => {
    dialed = { address: "127.0.0.2", port: dialledHttp.port };
    const dialsBefore = proxy.dials.length;
    const res = await curl([`http://127.0.0.1:${proxy.directHttpPort}/`, "-H", "Host: blocked.test"]);
    expect(res.status).toBe(403);
    expect(res.body).toContain("Blocked by Benchwright: blocked.test");
    expect(proxy.dials.length).toBe(dialsBefore);
    expect(proxy.audit.blocked.at(-1)).toBe("blocked.test");
  });

  it("case I4: an entry blocking the dialled address holds whatever Host is sent", async () => {
    const ipBlocked = await startProxy({
      vault: vault({ hosts: [{ pattern: "127.0.0.2", action: "block" }] }),
      originalDst: () => ({ address: "127.0.0.2", port: dialledHttp.port }),
    });
    try {
      const res = await curl([`http://127.0.0.1:${ipBlocked.directHttpPort}/`, "-H", "Host: allowed.test"]);
      expect(res.status).toBe(403);
      expect(ipBlocked.audit.blocked).toEqual(["127.0.0.2"]);
      expect(ipBlocked.dials).toEqual([]);
    } finally {
      await ipBlocked.close();
    }
  });
});

describe("case I4: HTTP/2 streams and Upgrade handshakes dialled by address", () => {
  it("case I4: an entry blocking the dialled address holds for each h2 stream and each Upgrade", async () => {
    let at: Dialed = { address: "127.0.0.2", port: dialledTls.port };
    const ipBlocked = await startProxy({
      vault: vault({ hosts: [{ pattern: "127.0.0.2", action: "block" }] }),
      originalDst: () => at,
    });
    try {
      const h2 = await curl([
        "--cacert",
        ipBlocked.caFile,
        "--http2",
        "-D",
        "-",
        ...connectTo("allowed.test", ipBlocked.directTlsPort),
        "https://allowed.test/",
      ]);
      expect(h2.status).toBe(403);
      expect(h2.body).toMatch(/^HTTP\/2 403/);
      at = { address: "127.0.0.2", port: dialledHttp.port };
      const ws = await curl([
        `http://127.0.0.1:${ipBlocked.directHttpPort}/ws`,
        "-H",
        "Host: allowed.test",
        "-H",
        "Connection: Upgrade",
        "-H",
        "Upgrade: websocket",
      ]);
      expect(ws.status).toBe(403);
      expect(ipBlocked.audit.blocked.filter((h) => h === "127.0.0.2").length).toBeGreaterThanOrEqual(2);
      expect(ipBlocked.dials).toEqual([]);
    } finally {
      await ipBlocked.close();
    }
  });
});

describe("original-dst.ts on a socket nobody DNAT'd", () => {
  it("gives null: there is no other destination than where it arrived", async () => {
    const originalDst = await loadOriginalDst();
    expect(originalDst).not.toBeNull();
    const { createServer } = await import("node:net");
    const server = createServer();
    const accepted = new Promise<Socket>((resolve) => server.once("connection", resolve));
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    const port = (server.address() as { port: number }).port;
    const client = netConnect(port, "127.0.0.1");
    const socket = await accepted;
    expect(originalDst?.(socket)).toBeNull();
    client.destroy();
    socket.destroy();
    server.close();
  });
});
