import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ClientOptions, WebSocket, WebSocketServer } from "ws";
import {
  createTestCa,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";
import { openSocket, wire } from "./raw";

// Case I2: a WebSocket (or any other `Upgrade`) handshake to a terminated host is a request like
// any other: decided, the credential injected, the answer's headers masked, audited; a blocked
// host gets a readable 403; after `101` the bytes go both ways to the decided host only, over a
// connection the proxy dialled to its checked address. Real `ws` client and server.

const CANARY = "sk-canary-ws-4c0a9e17b5";
const MASKED = `Bearer ${"*".repeat(CANARY.length)}`;

let ca: TestCa;
let proxy: RunningProxy;
/** Rule host ws.test: a `ws` server on HTTPS that echoes messages. */
let wsUp: Upstream;
/** Allowed host without a rule, free.test: accepts any Upgrade and echoes raw bytes. */
let freeUp: Upstream;
/** Allowed other.test, and blocked evil.test: neither may see a byte of these tests. */
let other: Upstream;
let evil: Upstream;
const handshakes: IncomingMessage["headers"][] = [];
/** Bytes free.test received after its upgrades. */
const freeGot: Buffer[] = [];

beforeAll(async () => {
  ca = await createTestCa();
  wsUp = await startTlsUpstream({ ca, hosts: ["ws.test"] });
  const wss = new WebSocketServer({ noServer: true });
  // The upstream echoes the handshake's credential in a response header (masked on the way back).
  wss.on("headers", (headers, req) => headers.push(`X-Echo-Auth: ${req.headers.authorization ?? ""}`));
  wss.on("connection", (ws) => ws.on("message", (data, binary) => ws.send(data, { binary })));
  wsUp.server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    handshakes.push(req.headers);
    if (req.url === "/deny") {
      // A refusal carrying the credential in its body (the client reads it; masked).
      const body = `you sent ${req.headers.authorization}`;
      return void socket.end(
        `HTTP/1.1 401 Unauthorized\r\nContent-Type: text/plain\r\nContent-Length: ${body.length}\r\nConnection: close\r\n\r\n${body}`,
      );
    }
    wss.handleUpgrade(req, socket, head, (ws) => wss.emit("connection", ws, req));
  });
  freeUp = await startTlsUpstream({ ca, hosts: ["free.test"], address: "127.0.0.3" });
  freeUp.server.on("upgrade", (req: IncomingMessage, socket: Duplex) => {
    handshakes.push(req.headers);
    socket.write(
      `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${req.headers.upgrade}\r\n\r\n`,
    );
    socket.on("data", (d: Buffer) => {
      freeGot.push(d);
      socket.write(Buffer.concat([Buffer.from("free.test got: "), d]));
    });
  });
  other = await startTlsUpstream({ ca, hosts: ["other.test"], address: "127.0.0.4" });
  evil = await startTlsUpstream({ ca, hosts: ["evil.test"], address: "127.0.0.5" });
  proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "free.test", action: "allow" },
        { pattern: "other.test", action: "allow" },
        { pattern: "evil.test", action: "block" },
      ],
      rules: [{ host: "ws.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { API_KEY: CANARY },
    routes: { "ws.test": wsUp, "free.test": freeUp, "other.test": other, "evil.test": evil },
    upstreamCa: ca,
  });
});

afterAll(async () => {
  expect(JSON.stringify(proxy.logs)).not.toContain(CANARY);
  expect(JSON.stringify(proxy.audit)).not.toContain(CANARY);
  expect(JSON.stringify(other.seen)).not.toContain(CANARY);
  expect(other.counts.connections).toBe(0);
  expect(evil.counts.connections).toBe(0);
  await proxy.close();
  await Promise.all([wsUp, freeUp, other, evil].map((u) => u.close()));
});

/** A `ws` client to `host` through the proxy's transparent TLS listener, trusting the run CA. */
function wsClient(host: string, path = "/", headers: Record<string, string> = {}): WebSocket {
  // `servername` reaches tls.connect (ws passes its options on); its typings omit it.
  const options: ClientOptions & { servername: string } = {
    headers: { host, ...headers },
    servername: host,
    ca: proxy.caPem,
  };
  return new WebSocket(`wss://127.0.0.1:${proxy.tlsPort}${path}`, options);
}

/** Opens, sends each message, collects as many answers, closes. */
function roundTrip(
  ws: WebSocket,
  messages: string[],
): Promise<{ answers: string[]; upgrade: IncomingMessage }> {
  return new Promise((resolve, reject) => {
    const answers: string[] = [];
    let upgrade: IncomingMessage | null = null;
    ws.once("upgrade", (res) => {
      upgrade = res;
    });
    ws.once("open", () => {
      for (const m of messages) ws.send(m);
    });
    ws.on("message", (data) => {
      answers.push(String(data));
      if (answers.length === messages.length) ws.close();
    });
    ws.once("close", () => resolve({ answers, upgrade: upgrade as unknown as IncomingMessage }));
    ws.once("error", reject);
  });
}

/** The status and body of a handshake the proxy (or the upstream, through it) did not upgrade. */
function refusedHandshake(ws: WebSocket): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    ws.once("unexpected-response", (_req, res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: Buffer.concat(chunks).toString() }));
    });
    ws.once("open", () => reject(new Error("upgraded")));
    ws.once("error", () => {});
  });
}

const upgradeRecord = (host: string, from: number) =>
  proxy.waitForLog((r) => r.event === "decision" && r.host === host && r.status !== 0, from);

describe("case I2: an Upgrade handshake is decided, injected and audited like a request", () => {
  it("a WebSocket to a rule host: credential injected in the handshake, echo works, audited", async () => {
    const from = proxy.logs.length;
    const dialsBefore = proxy.dials.length;
    const { answers, upgrade } = await roundTrip(
      wsClient("ws.test", "/chat", { authorization: "Bearer agent" }),
      ["hello", "again"],
    );
    expect(answers).toEqual(["hello", "again"]);
    expect(handshakes.at(-1)?.authorization).toBe(`Bearer ${CANARY}`);
    expect(handshakes.at(-1)?.upgrade).toBe("websocket");
    // The 101's headers come back masked.
    expect(upgrade.headers["x-echo-auth"]).toBe(MASKED);
    const rec = await upgradeRecord("ws.test", from);
    expect(rec).toMatchObject({
      method: "GET",
      status: 101,
      decision: "allow",
      reason: "upgraded, credential injected",
      rule: 0,
      route: "direct",
    });
    expect(rec.bytesIn).toBeGreaterThan(0);
    expect(rec.bytesOut).toBeGreaterThan(0);
    expect(proxy.audit.routes).toContainEqual(["ws.test", "direct"]);
    // One fresh upstream connection, to the checked address of the decided host.
    expect(proxy.dials.slice(dialsBefore)).toEqual([
      { protocol: "upgrade https:", host: "ws.test", address: wsUp.address, port: wsUp.port },
    ]);
  });

  it("over the plain listener too: the rule host's handshake goes upstream over TLS", async () => {
    const before = handshakes.length;
    const ws = new WebSocket(`ws://127.0.0.1:${proxy.httpPort}/plain`, { headers: { host: "ws.test" } });
    const { answers } = await roundTrip(ws, ["plain"]);
    expect(answers).toEqual(["plain"]);
    expect(handshakes.slice(before).map((h) => h.authorization)).toEqual([`Bearer ${CANARY}`]);
  });

  it("an upgrade to a blocked host is refused 403, readable, audited, nothing dialled", async () => {
    const from = proxy.logs.length;
    const dialsBefore = proxy.dials.length;
    const res = await refusedHandshake(wsClient("evil.test"));
    expect(res.status).toBe(403);
    expect(res.body).toContain("Blocked by Benchwright: evil.test");
    const rec = await upgradeRecord("evil.test", from);
    expect(rec).toMatchObject({ method: "GET", status: 403, decision: "block", blockedBy: "proxy" });
    expect(proxy.audit.blocked).toContain("evil.test");
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("an upstream that declines the upgrade is answered as it said, masked", async () => {
    const res = await refusedHandshake(wsClient("ws.test", "/deny"));
    expect(res.status).toBe(401);
    expect(res.body).toBe(`you sent ${MASKED}`);
  });

  it("after the upgrade, bytes go to the decided host only, relayed as they are", async () => {
    const from = proxy.logs.length;
    const dialsBefore = proxy.dials.length;
    const socket = await openSocket({
      port: proxy.tlsPort,
      tls: { servername: "free.test", ca: proxy.caPem },
    });
    const read = reader(socket);
    socket.write(wire("GET /raw HTTP/1.1", ["Host: free.test", "Connection: Upgrade", "Upgrade: x-bytes"]));
    const head = await read.until("\r\n\r\n");
    expect(head).toMatch(/^HTTP\/1\.1 101 /);
    expect(head).toMatch(/^upgrade: x-bytes\r$/im);
    // What looks like a request for another host is, after the upgrade, only bytes for free.test.
    const smuggled = wire("GET /smuggled HTTP/1.1", ["Host: other.test"]);
    socket.write(smuggled);
    expect(await read.until("other.test\r\n\r\n")).toBe(`free.test got: ${smuggled}`);
    socket.end();
    const rec = await upgradeRecord("free.test", from);
    expect(rec).toMatchObject({ status: 101, reason: "upgraded", rule: null, route: "direct" });
    expect(Buffer.concat(freeGot).toString()).toContain(smuggled);
    expect(proxy.dials.slice(dialsBefore)).toEqual([
      { protocol: "upgrade https:", host: "free.test", address: freeUp.address, port: freeUp.port },
    ]);
    expect(proxy.logs.slice(from).some((r) => r.host === "other.test")).toBe(false);
  });

  it("an upgraded connection is closed when the policy changes under it", async () => {
    const ws = wsClient("ws.test", "/long");
    await new Promise<void>((resolve, reject) => {
      ws.once("open", () => resolve());
      ws.once("error", reject);
    });
    const closed = new Promise<void>((resolve) => ws.once("close", () => resolve()));
    ws.on("error", () => {});
    const before = proxy.policy.current();
    proxy.policy.setVault(vault({ version: 2, hosts: [{ pattern: "ws.test", action: "block" }] }), {});
    try {
      await proxy.proxy.policyChanged();
      await closed;
      expect(ws.readyState).toBe(WebSocket.CLOSED);
    } finally {
      proxy.policy.set(before);
      await proxy.proxy.policyChanged();
    }
  });

  it("an Upgrade request with a body is refused 400, nothing dialled", async () => {
    const dialsBefore = proxy.dials.length;
    const socket = await openSocket({
      port: proxy.tlsPort,
      tls: { servername: "free.test", ca: proxy.caPem },
    });
    const read = reader(socket);
    socket.write(
      wire(
        "POST /raw HTTP/1.1",
        ["Host: free.test", "Connection: Upgrade", "Upgrade: x-bytes", "Content-Length: 4"],
        "abcd",
      ),
    );
    expect(await read.until("\r\n\r\n")).toMatch(/^HTTP\/1\.1 400 /);
    socket.destroy();
    expect(proxy.dials.length).toBe(dialsBefore);
  });

  it("Upgrade: h2c is not upgraded: forwarded as a plain request without it", async () => {
    const before = freeUp.seen.length;
    const socket = await openSocket({
      port: proxy.tlsPort,
      tls: { servername: "free.test", ca: proxy.caPem },
    });
    const read = reader(socket);
    socket.write(
      wire("GET /h2c HTTP/1.1", [
        "Host: free.test",
        "Connection: Upgrade, HTTP2-Settings",
        "Upgrade: h2c",
        "HTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA",
      ]),
    );
    expect(await read.until("\r\n\r\n")).toMatch(/^HTTP\/1\.1 200 /);
    socket.destroy();
    const seen = freeUp.seen.slice(before);
    expect(seen.map((s) => s.url)).toEqual(["/h2c"]);
    expect(seen[0]?.headers.upgrade).toBeUndefined();
    expect(seen[0]?.headers["http2-settings"]).toBeUndefined();
  });
});

/** Reads a socket into one string, and waits for a marker to appear in it. */
function reader(socket: Socket) {
  let text = "";
  const waiters: Array<() => void> = [];
  socket.on("data", (d: Buffer) => {
    text += d.toString("latin1");
    for (const w of waiters.splice(0)) w();
  });
  return {
    /** Everything read so far, up to and including `marker`, once it has arrived (then consumed). */
    until(marker: string): Promise<string> {
      return new Promise((resolve) => {
        const check = () => {
          const at = text.indexOf(marker);
          if (at === -1) return void waiters.push(check);
          const out = text.slice(0, at + marker.length);
          text = text.slice(at + marker.length);
          resolve(out);
        };
        check();
      });
    },
  };
}
