import { spawnSync } from "node:child_process";
import { randomBytes } from "node:crypto";
import { createServer as createHttpsServer, type Server as HttpsServer } from "node:https";
import {
  type AddressInfo,
  connect,
  createServer,
  type LookupFunction,
  type Server,
  type Socket,
} from "node:net";
import { resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WebSocket, WebSocketServer } from "ws";
import {
  BRIDGE_TOKEN_HEADER,
  EDGE_TOKEN_HEADER,
  encodeFrame,
  FrameReader,
  forward,
  portOf,
  serve,
} from "../../proxy-image/src/e2b-bridge/bridge";
import {
  createTestCa,
  curl,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";

// bw-bridge between a work sandbox and its run's proxy sandbox on E2B, for real: the real proxy
// (credential injection, block list) behind `serve`, the work sandbox's clients (curl) in front of
// `forward`, and between them an HTTPS stand-in for E2B's edge, which admits a WebSocket upgrade
// only with the sandbox's traffic token and then passes bytes through (what E2B's public URL of a
// sandbox with public traffic off does). The framing is also checked against the `ws` package.

const CANARY = "sk-canary-bridge-5e4d3c2b1a";
const TOKEN = randomBytes(32).toString("hex");
const EDGE_TOKEN = randomBytes(16).toString("hex");
const EDGE_HOST = "8090-sbxproxy.e2b.test";
/** The edge's name, resolved to the stand-in on loopback (no DNS in tests). */
const toLoopback: LookupFunction = (_host, options, callback) => {
  if ((options as { all?: boolean }).all) callback(null, [{ address: "127.0.0.1", family: 4 }]);
  else callback(null, "127.0.0.1", 4);
};

/** The edge stand-in: TLS with a certificate for the sandbox host, token check, then a byte pipe. */
async function startEdge(ca: TestCa, bridgePort: number) {
  const { certPem, keyPem } = await ca.issue([EDGE_HOST]);
  const seen: Array<{ path: string; token: boolean }> = [];
  const server: HttpsServer = createHttpsServer({ cert: certPem, key: keyPem }, (_req, res) => {
    res.writeHead(404).end();
  });
  server.on("upgrade", (req, socket, head) => {
    const ok = req.headers[EDGE_TOKEN_HEADER] === EDGE_TOKEN;
    seen.push({ path: req.url ?? "", token: ok });
    if (!ok) {
      socket.end("HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n");
      return;
    }
    const up = connect(bridgePort, "127.0.0.1", () => {
      // The edge consumes its own token; everything else goes on as it came.
      const lines = [`${req.method} ${req.url} HTTP/1.1`];
      for (let i = 0; i < req.rawHeaders.length; i += 2) {
        if ((req.rawHeaders[i] as string).toLowerCase() === EDGE_TOKEN_HEADER) continue;
        lines.push(`${req.rawHeaders[i]}: ${req.rawHeaders[i + 1]}`);
      }
      up.write(`${lines.join("\r\n")}\r\n\r\n`);
      up.write(head);
      socket.pipe(up).pipe(socket);
    });
    up.on("error", () => socket.destroy());
    socket.on("error", () => up.destroy());
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  return { server, port: (server.address() as AddressInfo).port, seen };
}

describe("bw-bridge: a work sandbox's connections to its run's proxy, through E2B's edge", () => {
  let ca: TestCa;
  let api: Upstream;
  let proxy: RunningProxy;
  let bridge: Server;
  let edge: Awaited<ReturnType<typeof startEdge>>;
  let local: { tls: Server; http: Server };
  const logs: Array<Record<string, unknown>> = [];
  const sockets = new Map<Server, Set<Socket>>();
  const track = (s: Server) => {
    const set = new Set<Socket>();
    sockets.set(s, set);
    s.on("connection", (c: Socket) => set.add(c));
    // An upgraded HTTP connection is the same socket: it is tracked from its connection event.
    return s;
  };

  beforeAll(async () => {
    ca = await createTestCa();
    api = await startTlsUpstream({ ca, hosts: ["api.test"] });
    proxy = await startProxy({
      vault: vault({
        hosts: [{ pattern: "evil.test", action: "block" }],
        rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
      }),
      secrets: { API_KEY: CANARY },
      routes: { "api.test": api },
      upstreamCa: ca,
    });
    bridge = await serve({
      host: "127.0.0.1",
      port: 0,
      token: TOKEN,
      targets: { tls: proxy.tlsPort, http: proxy.httpPort },
      log: (r) => void logs.push(r),
    });
    track(bridge);
    edge = await startEdge(ca, portOf(bridge));
    track(edge.server as unknown as Server);
    local = await forward({
      url: `https://${EDGE_HOST}:${edge.port}`,
      token: TOKEN,
      edgeToken: EDGE_TOKEN,
      host: "127.0.0.1",
      ports: { tls: 0, http: 0 },
      ca: ca.certPem,
      lookup: toLoopback,
    });
    track(local.tls);
    track(local.http);
  });
  afterAll(async () => {
    // Spliced connections end on their own within seconds; the suite does not wait for them.
    for (const s of [local.tls, local.http, bridge, edge.server]) {
      const closed = new Promise<void>((r) => s.close(() => r()));
      for (const socket of sockets.get(s) ?? []) socket.destroy();
      await closed;
    }
    await proxy.close();
    await api.close();
  });

  // The work sandbox's view: the hosts file sends api.test to 127.0.0.1, where `forward` listens.
  const via = (port: number, host: string, scheme: "https" | "http") => [
    "--connect-to",
    `${host}:${scheme === "https" ? 443 : 80}:127.0.0.1:${port}`,
  ];

  it("carries the client's own TLS to the proxy, which injects the credential upstream", async () => {
    const res = await curl([
      "--cacert",
      proxy.caFile,
      ...via(portOf(local.tls), "api.test", "https"),
      "https://api.test/v1/models",
    ]);
    expect(res.stderr).toBe("");
    expect(res.status).toBe(200);
    expect(api.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
    expect(res.body).not.toContain(CANARY);
    expect(edge.seen.at(-1)).toEqual({ path: "/tls", token: true });
  });

  it("the proxy's block list applies through the bridge, on the HTTP path too", async () => {
    const tls = await curl([
      "--cacert",
      proxy.caFile,
      ...via(portOf(local.tls), "evil.test", "https"),
      "https://evil.test/",
    ]);
    expect(tls.status).toBe(403);
    const plain = await curl([...via(portOf(local.http), "evil.test", "http"), "http://evil.test/"]);
    expect(plain.status).toBe(403);
    expect(edge.seen.at(-1)).toEqual({ path: "/http", token: true });
    expect(proxy.audit.blocked).toContain("evil.test");
  });

  it("without the bridge token nothing reaches the proxy; without the traffic token nothing passes the edge", async () => {
    const before = api.counts.connections;
    const wrongBridge = await forward({
      url: `https://${EDGE_HOST}:${edge.port}`,
      token: "x".repeat(64),
      edgeToken: EDGE_TOKEN,
      host: "127.0.0.1",
      ports: { tls: 0, http: 0 },
      ca: ca.certPem,
      lookup: toLoopback,
    });
    const noEdge = await forward({
      url: `https://${EDGE_HOST}:${edge.port}`,
      token: TOKEN,
      host: "127.0.0.1",
      ports: { tls: 0, http: 0 },
      ca: ca.certPem,
      lookup: toLoopback,
    });
    try {
      for (const f of [wrongBridge, noEdge]) {
        const res = await curl([
          "--cacert",
          proxy.caFile,
          ...via(portOf(f.tls), "api.test", "https"),
          "https://api.test/",
        ]);
        expect(res.code).not.toBe(0);
        expect(res.status).toBe(0);
      }
      expect(logs).toContainEqual({ event: "bridge_refused", reason: "token" });
      expect(edge.seen.at(-1)).toEqual({ path: "/tls", token: false });
      expect(api.counts.connections).toBe(before);
    } finally {
      for (const s of [wrongBridge.tls, wrongBridge.http, noEdge.tls, noEdge.http]) s.close();
    }
  });
});

describe("bw-bridge framing (RFC 6455), against the ws package", () => {
  let echo: Server;
  beforeAll(async () => {
    echo = createServer((s) => s.pipe(s));
    await new Promise<void>((r) => echo.listen(0, "127.0.0.1", r));
  });
  afterAll(() => new Promise<void>((r) => echo.close(() => r())));

  it("serve: a ws client's binary messages reach the target and come back, 1 MiB included", async () => {
    const server = await serve({
      host: "127.0.0.1",
      port: 0,
      token: TOKEN,
      targets: { tls: portOf(echo), http: portOf(echo) },
    });
    try {
      const ws = new WebSocket(`ws://127.0.0.1:${portOf(server)}/tls`, {
        headers: { [BRIDGE_TOKEN_HEADER]: TOKEN },
      });
      await new Promise((r, j) => ws.once("open", r).once("error", j));
      const big = randomBytes(1024 * 1024);
      const got: Buffer[] = [];
      const done = new Promise<void>((r) =>
        ws.on("message", (m: Buffer) => {
          got.push(m);
          if (Buffer.concat(got).length >= big.length + 5) r();
        }),
      );
      ws.send(Buffer.from("hello"));
      ws.send(big);
      await done;
      expect(Buffer.concat(got).equals(Buffer.concat([Buffer.from("hello"), big]))).toBe(true);
      ws.close();
      const refused = new WebSocket(`ws://127.0.0.1:${portOf(server)}/tls`, {
        headers: { [BRIDGE_TOKEN_HEADER]: "no" },
      });
      const status = await new Promise<number>((r) =>
        refused.once("unexpected-response", (_q, res) => r(res.statusCode ?? 0)),
      );
      expect(status).toBe(403);
    } finally {
      server.closeAllConnections?.();
      server.close();
    }
  });

  it("forward: its masked frames are read by a ws server, which sees both tokens", async () => {
    const headers: Record<string, string | string[] | undefined>[] = [];
    const wss = new WebSocketServer({ port: 0, host: "127.0.0.1" });
    await new Promise((r) => wss.once("listening", r));
    wss.on("connection", (ws, req) => {
      headers.push(req.headers);
      ws.on("message", (m: Buffer) => ws.send(Buffer.from(m.toString().toUpperCase())));
    });
    const f = await forward({
      url: `http://127.0.0.1:${(wss.address() as AddressInfo).port}`,
      token: TOKEN,
      edgeToken: EDGE_TOKEN,
      host: "127.0.0.1",
      ports: { tls: 0, http: 0 },
    });
    try {
      const client = connect(portOf(f.http), "127.0.0.1");
      const reply = await new Promise<string>((r) => {
        client.once("data", (d) => r(d.toString()));
        client.write("ping through");
      });
      expect(reply).toBe("PING THROUGH");
      expect(headers[0]?.[BRIDGE_TOKEN_HEADER]).toBe(TOKEN);
      expect(headers[0]?.[EDGE_TOKEN_HEADER]).toBe(EDGE_TOKEN);
      client.destroy();
    } finally {
      f.tls.close();
      f.http.close();
      for (const c of wss.clients) c.terminate();
      wss.close();
    }
  });

  it("a server refuses unmasked frames and reserved bits; a client refuses masked ones", () => {
    expect(() => new FrameReader(true).push(encodeFrame(0x2, Buffer.from("x"), false))).toThrow(/unmasked/);
    expect(() => new FrameReader(false).push(encodeFrame(0x2, Buffer.from("x"), true))).toThrow(/masked/);
    const rsv = encodeFrame(0x2, Buffer.from("x"), true);
    rsv[0] = (rsv[0] as number) | 0x40;
    expect(() => new FrameReader(true).push(rsv)).toThrow(/reserved/);
    // Split anywhere, frames come out whole; 126- and 127-length encodings included.
    for (const size of [5, 300, 70_000]) {
      const payload = randomBytes(size);
      const wire = encodeFrame(0x2, payload, true);
      const reader = new FrameReader(true);
      const frames = [...reader.push(wire.subarray(0, 3)), ...reader.push(wire.subarray(3))];
      expect(frames).toHaveLength(1);
      expect(frames[0]?.payload.equals(payload)).toBe(true);
    }
  });
});

describe("bw-bridge as a command", () => {
  const BRIDGE = resolve(import.meta.dirname, "../../proxy-image/dist/e2b-bridge.cjs");

  it("refuses to start with one JSON log line (its event and detail, never the token) and exit 2", () => {
    const short = "short-token-canary";
    const r = spawnSync(process.execPath, [BRIDGE, "serve"], {
      env: { PATH: process.env.PATH, BW_BRIDGE_TOKEN: short },
      encoding: "utf8",
    });
    expect(r.status).toBe(2);
    const lines = r.stderr.trim().split("\n");
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0] as string)).toMatchObject({
      level: "error",
      event: "bridge_start_failed",
      detail: "BW_BRIDGE_TOKEN is too short",
    });
    expect(r.stderr + r.stdout).not.toContain(short);
  });
});
