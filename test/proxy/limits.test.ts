import type { Server } from "node:net";
import { connect as tlsConnect } from "node:tls";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  type RunningProxy,
  startPlainUpstream,
  startProxy,
  startTlsUpstream,
  type Upstream,
  vault,
} from "./harness";
import { connectTunnel, exchange, openSocket, tlsOver, wire } from "./raw";

// Case F2 (light and bounded): header, handshake and idle deadlines close connections that
// stall, half-closed and abandoned connections are released, and the connection cap holds.
// Small limits, so every wait here is a deadline the proxy must meet (no fixed sleeps).

const LIMITS = {
  headersTimeoutMs: 300,
  requestTimeoutMs: 2_000,
  keepAliveTimeoutMs: 300,
  handshakeTimeoutMs: 300,
};
/**
 * Upper bound for "closed by the proxy in time": the deadline, its checking period, Node's
 * 1 s keep-alive grace, and room for a loaded two-core CI machine.
 */
const DEADLINE_MS = 3_000;

let proxy: RunningProxy;
/** Same policy, default-sized deadlines: for the many-connections tests, where only release counts. */
let roomy: RunningProxy;
let plainUp: Upstream;
let tlsUp: Upstream;

beforeAll(async () => {
  const ca = await createTestCa();
  plainUp = await startPlainUpstream({ address: "127.0.0.3" });
  tlsUp = await startTlsUpstream({ ca, hosts: ["api.test"], address: "127.0.0.2" });
  proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "plain.test", action: "allow" },
        { pattern: "api.test", action: "allow" },
      ],
    }),
    routes: { "plain.test": plainUp, "api.test": tlsUp },
    upstreamCa: ca,
    limits: LIMITS,
  });
  roomy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "plain.test", action: "allow" },
        { pattern: "api.test", action: "allow" },
      ],
    }),
    routes: { "plain.test": plainUp, "api.test": tlsUp },
    upstreamCa: ca,
  });
});

afterAll(async () => {
  await proxy.close();
  await roomy.close();
  await Promise.all([plainUp.close(), tlsUp.close()]);
});

const connections = (server: Server) =>
  new Promise<number>((resolve, reject) => server.getConnections((e, n) => (e ? reject(e) : resolve(n))));

/** Resolves when `socket` closes, with how long it took; rejects after `ms`. */
function closedWithin(socket: NodeJS.EventEmitter & { destroyed: boolean }, ms: number): Promise<number> {
  const started = Date.now();
  if (socket.destroyed) return Promise.resolve(0);
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`still open after ${ms} ms`)), ms);
    socket.once("close", () => {
      clearTimeout(timer);
      resolve(Date.now() - started);
    });
    socket.on("error", () => {});
  });
}

/** Polls a count until it reaches `want` (the proxy closes its side asynchronously). */
async function settlesTo(read: () => Promise<number>, want: number, ms = DEADLINE_MS): Promise<number> {
  const until = Date.now() + ms;
  let n = await read();
  while (n !== want && Date.now() < until) {
    await new Promise((r) => setImmediate(r));
    n = await read();
  }
  return n;
}

/** Sends the start of a request, then one header byte every 50 ms for as long as it stays open. */
function slowloris(socket: NodeJS.WritableStream & { destroyed: boolean }, host: string): void {
  socket.write(`GET /slow HTTP/1.1\r\nHost: ${host}\r\nX-Slow: `);
  const drip = setInterval(() => {
    if (socket.destroyed) return clearInterval(drip);
    socket.write("a");
  }, 50);
  drip.unref();
}

describe("case F2: deadlines", () => {
  it("slowloris on the plain listener is closed by the header deadline", async () => {
    const socket = await openSocket({ port: proxy.httpPort });
    slowloris(socket, "plain.test");
    const took = await closedWithin(socket, DEADLINE_MS);
    expect(took).toBeGreaterThanOrEqual(LIMITS.headersTimeoutMs - 50);
    expect(plainUp.counts.requests).toBe(0);
  });

  it("slowloris over transparent TLS is closed by the header deadline", async () => {
    const socket = await openSocket({
      port: proxy.tlsPort,
      tls: { servername: "api.test", ca: proxy.caPem },
    });
    slowloris(socket, "api.test");
    await closedWithin(socket, DEADLINE_MS);
    expect(tlsUp.counts.requests).toBe(0);
  });

  it("slowloris inside a CONNECT tunnel is closed by the header deadline", async () => {
    const t = await connectTunnel(proxy.explicitPort, "api.test:443");
    expect(t.status).toBe(200);
    const inner = await tlsOver(t.socket, { servername: "api.test", ca: proxy.caPem });
    slowloris(inner, "api.test");
    await closedWithin(inner, DEADLINE_MS);
  });

  it("a connection that never sends a byte is closed (plain) or never finishes its handshake (TLS)", async () => {
    const plain = await openSocket({ port: proxy.httpPort });
    const raw = await openSocket({ port: proxy.tlsPort });
    await Promise.all([closedWithin(plain, DEADLINE_MS), closedWithin(raw, DEADLINE_MS)]);
  });

  it("an idle keep-alive connection is closed after the keep-alive deadline", async () => {
    const socket = await openSocket({
      port: proxy.tlsPort,
      tls: { servername: "api.test", ca: proxy.caPem },
    });
    const r = await exchange(socket, [wire("GET /ka HTTP/1.1", ["Host: api.test"])], {
      expect: 1,
      keepOpen: true,
    });
    expect(r.responses[0]?.status).toBe(200);
    const took = await closedWithin(socket, DEADLINE_MS);
    expect(took).toBeGreaterThanOrEqual(LIMITS.keepAliveTimeoutMs - 50);
  });
});

describe("case F2: connections are released", () => {
  /** n keep-alive connections, each answered once and held open; then closed, all released. */
  async function holdThenRelease(
    n: number,
    target: Parameters<typeof openSocket>[0],
    request: (i: number) => Buffer | string,
    server: Server,
  ): Promise<void> {
    const open = await Promise.all(
      Array.from({ length: n }, async (_, i) => {
        const s = await openSocket(target);
        const r = await exchange(s, [request(i)], { expect: 1, keepOpen: true });
        return { s, status: r.responses[0]?.status };
      }),
    );
    expect(open.filter((o) => o.status !== 200)).toEqual([]);
    expect(await connections(server)).toBe(n);
    for (const { s } of open) s.destroy();
    expect(await settlesTo(() => connections(server), 0)).toBe(0);
  }

  it("100 concurrent keep-alive connections on the plain listener, then all gone", async () => {
    const request = (i: number) => wire(`GET /many-${i} HTTP/1.1`, ["Host: plain.test"]);
    await holdThenRelease(100, { port: roomy.httpPort }, request, roomy.proxy.http);
  });

  it("30 concurrent TLS keep-alive connections, then all gone", async () => {
    const target = { port: roomy.tlsPort, tls: { servername: "api.test", ca: roomy.caPem } };
    const request = () => wire("GET /tls-many HTTP/1.1", ["Host: api.test"]);
    await holdThenRelease(30, target, request, roomy.proxy.tls);
  });

  it("half-closed connections (request sent, then FIN; or FIN at once) are released", async () => {
    const sockets = await Promise.all(Array.from({ length: 40 }, () => openSocket({ port: roomy.httpPort })));
    sockets.forEach((s, i) => {
      if (i % 2 === 0) s.end(wire("GET /half HTTP/1.1", ["Host: plain.test"]));
      else s.end();
    });
    await Promise.all(sockets.map((s) => closedWithin(s, DEADLINE_MS)));
    expect(await settlesTo(() => connections(roomy.proxy.http), 0)).toBe(0);
  });

  it("half-closed TLS connections are released", async () => {
    const target = { port: roomy.tlsPort, tls: { servername: "api.test", ca: roomy.caPem } };
    const sockets = await Promise.all(Array.from({ length: 20 }, () => openSocket(target)));
    for (const s of sockets) s.end();
    await Promise.all(sockets.map((s) => closedWithin(s, DEADLINE_MS)));
    expect(await settlesTo(() => connections(roomy.proxy.tls), 0)).toBe(0);
  });

  it("the proxy still serves after all of the above", async () => {
    const r = await exchange({ port: roomy.httpPort }, [
      wire("GET /after HTTP/1.1", ["Host: plain.test", "Connection: close"]),
    ]);
    expect(r.responses[0]?.status).toBe(200);
  });
});

describe("case F2: the connection cap holds", () => {
  it("connections beyond maxConnections are dropped without being served", async () => {
    const capped = await startProxy({
      vault: vault({ hosts: [{ pattern: "plain.test", action: "allow" }] }),
      routes: { "plain.test": plainUp },
      limits: { ...LIMITS, headersTimeoutMs: 5_000, requestTimeoutMs: 10_000, maxConnections: 5 },
    });
    try {
      for (const [port, server] of [
        [capped.httpPort, capped.proxy.http],
        [capped.tlsPort, capped.proxy.tls],
      ] as const) {
        const held = await Promise.all(Array.from({ length: 5 }, () => openSocket({ port })));
        expect(await settlesTo(() => connections(server), 5)).toBe(5);
        const extra = await openSocket({ port });
        await closedWithin(extra, DEADLINE_MS);
        expect(await connections(server)).toBe(5);
        for (const s of held) s.destroy();
        expect(await settlesTo(() => connections(server), 0)).toBe(0);
      }
      // And a TLS client over the cap sees a failed handshake, not a certificate for anything.
      const held = await Promise.all(Array.from({ length: 5 }, () => openSocket({ port: capped.tlsPort })));
      const err = await new Promise<string>((resolve) => {
        const s = tlsConnect({
          host: "127.0.0.1",
          port: capped.tlsPort,
          servername: "api.test",
          ca: capped.caPem,
        });
        s.once("secureConnect", () => resolve("connected"));
        s.once("error", (e: Error & { code?: string }) => resolve(e.code ?? e.message));
      });
      expect(err).not.toBe("connected");
      for (const s of held) s.destroy();
    } finally {
      await capped.close();
    }
  });
});
