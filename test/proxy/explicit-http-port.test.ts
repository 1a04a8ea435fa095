import { createServer as createHttpServer, type IncomingMessage, type Server } from "node:http";
import {
  type AddressInfo,
  createServer as createNetServer,
  type Server as NetServer,
  type Socket,
} from "node:net";
import type { Duplex } from "node:stream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { curl, type RunningProxy, startPlainUpstream, startProxy, type Upstream, vault } from "./harness";
import { exchange, wire } from "./raw";

// Case I6: the explicit proxy port forwards plain-http absolute-form requests to port 80 only.
// The harness's test route sends plain.test to a real plain-HTTP upstream whatever port the URL
// names, so a request let through to another port would reach it: each refusal asserts it did not.

let upstream: Upstream;
let proxy: RunningProxy;

beforeAll(async () => {
  upstream = await startPlainUpstream({ address: "127.0.0.2" });
  proxy = await startProxy({ vault: vault({ default: "allow" }), routes: { "plain.test": upstream } });
});

afterAll(async () => {
  await proxy.close();
  await upstream.close();
});

/** The decision record of the I6 refusal of `host:port` on the explicit port. */
const refusedOnExplicit = (host: string, port: number) => ({
  listener: "explicit",
  host,
  port,
  decision: "refuse",
  reason: `plain http to port ${port}`,
  status: 403,
});
const lastDecision = (p: { logs: { event?: unknown }[] }) => p.logs.findLast((r) => r.event === "decision");

const viaExplicit = (url: string) => curl(["--proxy", `http://127.0.0.1:${proxy.explicitPort}`, url]);

describe("case I6: plain http through the explicit proxy port", () => {
  it("forwards an absolute-form request to port 80, named or not", async () => {
    for (const url of ["http://plain.test/a", "http://plain.test:80/b"]) {
      const res = await viaExplicit(url);
      expect(res.status, url).toBe(200);
    }
    expect(upstream.seen.map((s) => s.url)).toEqual(["/a", "/b"]);
  });

  it.each([8080, 443, 22, 25, 6379])(
    "case I6: refuses port %i with a readable 403, recorded",
    async (port) => {
      const before = upstream.counts.connections;
      const routes = proxy.audit.routes.length;
      const res = await viaExplicit(`http://plain.test:${port}/x`);
      expect(res.status).toBe(403);
      expect(res.body).toContain(`http://plain.test:${port}/ is not reachable from this run`);
      expect(res.body).toContain("port 80 only");
      expect(upstream.counts.connections).toBe(before);
      expect(proxy.dials.filter((d) => d.port === port)).toEqual([]);
      expect(proxy.audit.routes.slice(routes)).toEqual([["plain.test", "refused"]]);
      expect(lastDecision(proxy)).toMatchObject(refusedOnExplicit("plain.test", port));
    },
  );
});

// Case L4: an `Upgrade` handshake on the explicit proxy port is a request to a port like any
// other: absolute-form to a port other than 80 is refused exactly as I6 refuses it, and nothing
// dials that port. allowed.test resolves (the test resolver) to 127.0.0.2; the harness turns a
// dial of port 80 into the web listener's port and a dial of 6379 into the "redis" listener's,
// so a handshake let through to 6379 would reach a real listener there, and the control shows
// that a dial of port 80 really does reach its listener.
describe("case L4: Upgrade on the explicit proxy port", () => {
  let web: Server;
  let redis: NetServer;
  const reached = { web: 0, redis: 0 };
  // Upgraded sockets are the test's to close (a server's close leaves them open).
  const open = new Set<Socket>();
  let l4: RunningProxy;

  const listen = (server: Server | NetServer) =>
    new Promise<number>((resolve) =>
      server.listen(0, "127.0.0.2", () => resolve((server.address() as AddressInfo).port)),
    );

  beforeAll(async () => {
    // Answers any Upgrade with 101 and echoes what follows.
    web = createHttpServer();
    web.on("connection", (socket: Socket) => {
      reached.web++;
      open.add(socket);
    });
    web.on("upgrade", (req: IncomingMessage, socket: Duplex) => {
      socket.write(
        `HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: ${req.headers.upgrade}\r\n\r\n`,
      );
      socket.on("data", (d: Buffer) => socket.write(Buffer.concat([Buffer.from("echo: "), d])));
    });
    // Anything that connects here is the hole: count it, say nothing.
    redis = createNetServer((socket) => {
      reached.redis++;
      socket.destroy();
    });
    const [webPort, redisPort] = await Promise.all([listen(web), listen(redis)]);
    l4 = await startProxy({
      vault: vault({ hosts: [{ pattern: "allowed.test", action: "allow" }] }),
      dialPorts: { 80: webPort, 6379: redisPort },
      upstream: {
        lookup: async (host) => {
          if (host !== "allowed.test") throw new Error(`no answer for ${host}`);
          return ["127.0.0.2"];
        },
      },
    });
  });

  afterAll(async () => {
    await l4.close();
    for (const socket of open) socket.destroy();
    await Promise.all([web, redis].map((s) => new Promise<void>((resolve) => s.close(() => resolve()))));
  });

  const handshake = (url: string, authority: string, protocol = "websocket") =>
    wire(`GET ${url} HTTP/1.1`, [
      `Host: ${authority}`,
      "Connection: Upgrade",
      `Upgrade: ${protocol}`,
      "Sec-WebSocket-Version: 13",
      "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    ]);

  it("control: an Upgrade to port 80 is dialled to the web listener and relayed", async () => {
    const before = reached.web;
    const r = await exchange(
      { port: l4.explicitPort },
      [handshake("http://allowed.test/ws", "allowed.test"), "ping"],
      {
        idleMs: 300,
        gapMs: 100,
      },
    );
    expect(r.responses[0]?.status).toBe(101);
    expect(r.bytes.toString("latin1")).toContain("echo: ping");
    expect(reached.web).toBe(before + 1);
    expect(l4.dials.at(-1)).toMatchObject({ protocol: "upgrade http:", address: "127.0.0.2", port: 80 });
  });

  // h2c is not an upgrade the proxy makes (it goes as a plain request): the same refusal.
  it.each([
    [6379, "websocket"],
    [8080, "websocket"],
    [6379, "h2c"],
  ])(
    "case L4: an Upgrade to port %i (%s): the I6 refusal, recorded, and nothing dials the port",
    async (port, protocol) => {
      const dials = l4.dials.length;
      const routes = l4.audit.routes.length;
      const r = await exchange({ port: l4.explicitPort }, [
        handshake(`http://allowed.test:${port}/`, `allowed.test:${port}`, protocol),
      ]);
      expect(r.responses[0]?.status).toBe(403);
      expect(r.responses[0]?.body.toString()).toContain(
        `http://allowed.test:${port}/ is not reachable from this run`,
      );
      expect(r.bytes.toString("latin1")).not.toContain("101 Switching");
      expect(reached.redis).toBe(0);
      expect(l4.dials.slice(dials)).toEqual([]);
      expect(l4.audit.routes.slice(routes)).toEqual([["allowed.test", "refused"]]);
      expect(lastDecision(l4)).toMatchObject(refusedOnExplicit("allowed.test", port));
    },
  );
});
