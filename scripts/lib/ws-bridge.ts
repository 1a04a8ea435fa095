import type { AddressInfo } from "node:net";
import { createConnection, type Socket } from "node:net";
import { WebSocketServer } from "./node-ws";

// The Neon driver speaks Postgres over a WebSocket. Neon's cloud terminates that WebSocket for
// us; locally, this bridge does: one WebSocket ↔ one TCP connection to a single fixed Postgres.
// It ignores the driver's `?address=` so it can never be used to reach any other host.
// Hand-written because it is ~40 lines and Neon's own wsproxy is a Go binary, not an npm package.
export interface WsBridge {
  /** host:port to give the driver as `wsProxy` (no scheme). */
  readonly address: string;
  /**
   * Fault injection: while down, every connection is cut and new ones are dropped at once (the
   * database away, as the driver sees it); `refused` counts the ones dropped.
   */
  setDown(down: boolean): void;
  readonly refused: number;
  close(): Promise<void>;
}

export async function startWsBridge(target: { host: string; port: number }): Promise<WsBridge> {
  const wss = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  const sockets = new Set<Socket>();
  let down = false;
  let refused = 0;
  wss.on("connection", (ws) => {
    if (down) {
      refused += 1;
      ws.terminate();
      return;
    }
    const tcp = createConnection(target);
    sockets.add(tcp);
    const pending: Buffer[] = [];
    let connected = false;
    tcp.on("connect", () => {
      connected = true;
      for (const chunk of pending) tcp.write(chunk);
      pending.length = 0;
    });
    ws.on("message", (data: Buffer) => (connected ? tcp.write(data) : pending.push(data)));
    tcp.on("data", (data) => ws.send(data));
    ws.on("close", () => tcp.end());
    ws.on("error", () => tcp.destroy());
    tcp.on("close", () => {
      sockets.delete(tcp);
      ws.close();
    });
    tcp.on("error", () => ws.terminate());
  });
  await new Promise<void>((resolve, reject) => {
    wss.once("listening", resolve);
    wss.once("error", reject);
  });
  const { port } = wss.address() as AddressInfo;
  return {
    address: `127.0.0.1:${port}`,
    setDown: (value) => {
      down = value;
      if (!down) return;
      for (const s of sockets) s.destroy();
      for (const c of wss.clients) c.terminate();
    },
    get refused() {
      return refused;
    },
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        for (const c of wss.clients) c.terminate();
        wss.close(() => resolve());
      }),
  };
}
