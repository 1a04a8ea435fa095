import { createServer, type IncomingMessage, type Server } from "node:http";
import type { AddressInfo, Socket } from "node:net";
import { readBearer } from "@benchwright/shared/contract/proxy-wire";
import {
  type AgentPolicy,
  CLOSE_PEER_GONE,
  CLOSE_REPLACED,
  CLOSE_RUN_ENDED,
  CLOSE_TOKEN_REVOKED,
  EGRESS_AGENT_PATH,
  EGRESS_AGENT_POLICY_PATH,
  PAIRED,
  tunnelPath,
} from "@benchwright/shared/contract/tunnel";
import { type RawData, type WebSocket, WebSocketServer } from "ws";

// A test double of our own relay (src/tunnel/relay.ts, a Durable Object; the real one and its
// Worker routes are tested in workerd elsewhere), for the proxy's and the agent's ends on Node:
// the same contract (shared/contract/tunnel.ts) on a `ws` server on 127.0.0.1 — the proxy's door
// (tunnelPath, proxy token) and the agent's (EGRESS_AGENT_PATH, egress token), 401 otherwise; a
// newer socket of one end replaces the older (CLOSE_REPLACED) and closes a peer paired with it;
// PAIRED to both when both are there; binary messages carried unchanged; when one end leaves the
// other is closed (CLOSE_PEER_GONE); endRun() closes both (CLOSE_RUN_ENDED) and refuses from then
// on; revokeAgent() closes the agent (CLOSE_TOKEN_REVOKED). It also serves the agent's policy.

export type Role = "proxy" | "agent";

export interface TestRelay {
  /** http://127.0.0.1:port — the control plane's base URL for both ends. */
  readonly url: string;
  /** The policy the agent reads; null: 503 (the control plane has none to give yet). */
  setPolicy(policy: AgentPolicy | null): void;
  /** Upgrades accepted so far per end (to see reconnects). */
  readonly accepted: Record<Role, number>;
  /** Resolves when both ends are paired (now, or at the next pairing). */
  paired(): Promise<void>;
  endRun(): void;
  revokeAgent(): void;
  close(): Promise<void>;
}

interface End {
  ws: WebSocket;
  paired: boolean;
}

export async function startTestRelay(options: {
  runId: string;
  proxyToken: string;
  agentToken: string;
}): Promise<TestRelay> {
  let policy: AgentPolicy | null = null;
  let ended = false;
  let agentRevoked = false;
  const ends: Record<Role, End | null> = { proxy: null, agent: null };
  const accepted: Record<Role, number> = { proxy: 0, agent: 0 };
  let pairedWaiters: Array<() => void> = [];
  const sockets = new Set<Socket>();
  const other = (role: Role): Role => (role === "proxy" ? "agent" : "proxy");

  function roleOf(req: IncomingMessage): Role | null {
    const token = readBearer(req.headers.authorization);
    const path = (req.url ?? "").split("?")[0];
    if (ended) return null;
    if (path === tunnelPath(options.runId) && token === options.proxyToken) return "proxy";
    if (path === EGRESS_AGENT_PATH && token === options.agentToken && !agentRevoked) return "agent";
    return null;
  }

  const server: Server = createServer((req, res) => {
    const path = (req.url ?? "").split("?")[0];
    const token = readBearer(req.headers.authorization);
    if (req.method !== "GET" || path !== EGRESS_AGENT_POLICY_PATH) {
      res.writeHead(404).end();
      return;
    }
    if (ended || agentRevoked || token !== options.agentToken) {
      res.writeHead(401, { "content-type": "application/json" }).end('{"code":"unauthorized"}');
      return;
    }
    if (policy === null) {
      res.writeHead(503).end();
      return;
    }
    res.writeHead(200, { "content-type": "application/json", "cache-control": "no-store" });
    res.end(JSON.stringify(policy));
  });
  server.on("connection", (socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
  });
  const wss = new WebSocketServer({ noServer: true, perMessageDeflate: false });

  function closeQuietly(end: End | null, code: number, reason: string): void {
    if (!end) return;
    for (const role of ["proxy", "agent"] as const) if (ends[role] === end) ends[role] = null;
    end.ws.close(code, reason);
  }

  function pairIfBoth(): void {
    const { proxy, agent } = ends;
    if (!proxy || !agent) return;
    for (const end of [proxy, agent]) {
      end.paired = true;
      end.ws.send(PAIRED);
    }
    const waiters = pairedWaiters;
    pairedWaiters = [];
    for (const w of waiters) w();
  }

  function left(role: Role, end: End): void {
    if (ends[role] !== end) return; // already replaced or closed by us
    ends[role] = null;
    const peer = ends[other(role)];
    if (end.paired && peer?.paired) closeQuietly(peer, CLOSE_PEER_GONE, "peer gone");
  }

  server.on("upgrade", (req, socket, head) => {
    const role = roleOf(req);
    if (role === null) {
      socket.end("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      accepted[role] += 1;
      // A newer connection of the same end takes over; a peer paired with the old one goes too.
      closeQuietly(ends[role], CLOSE_REPLACED, "replaced");
      if (ends[other(role)]?.paired) closeQuietly(ends[other(role)], CLOSE_PEER_GONE, "peer replaced");
      const end: End = { ws, paired: false };
      ends[role] = end;
      ws.on("message", (data: RawData, isBinary: boolean) => {
        // Only bytes are carried, and only between paired ends.
        if (!isBinary || !end.paired || ends[role] !== end) return;
        const peer = ends[other(role)];
        if (peer?.paired) peer.ws.send(data as Buffer, { binary: true });
      });
      ws.on("close", () => left(role, end));
      ws.on("error", () => left(role, end));
      pairIfBoth();
    });
  });

  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as AddressInfo;

  return {
    url: `http://127.0.0.1:${port}`,
    accepted,
    setPolicy(next) {
      policy = next;
    },
    paired() {
      if (ends.proxy?.paired && ends.agent?.paired) return Promise.resolve();
      return new Promise((resolve) => pairedWaiters.push(resolve));
    },
    endRun() {
      ended = true;
      closeQuietly(ends.proxy, CLOSE_RUN_ENDED, "run ended");
      closeQuietly(ends.agent, CLOSE_RUN_ENDED, "run ended");
    },
    revokeAgent() {
      agentRevoked = true;
      const agent = ends.agent;
      closeQuietly(agent, CLOSE_TOKEN_REVOKED, "token revoked");
      if (agent?.paired && ends.proxy?.paired) closeQuietly(ends.proxy, CLOSE_PEER_GONE, "agent gone");
    },
    async close() {
      for (const ws of wss.clients) ws.terminate();
      wss.close();
      for (const socket of sockets) socket.destroy();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
