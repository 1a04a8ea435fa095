import { connect, createServer, type Server, type Socket } from "node:net";

// Host-side listeners of a run, on the host end of its link (only that link may reach them:
// the host table's `services` set):
// - the control-plane relay: the proxy sandbox's only way to the control plane, which listens on
//   the host's loopback. Plain TCP, so the proxy speaks to the control plane end to end.
// - the probe: a listener "outside the run" that answers and hangs up. The wiring program proves
//   catch-all routing by failing to reach it; under default routing it is reachable.

export interface HostListener {
  port: number;
  close(): Promise<void>;
}

async function listen(server: Server, host: string, sockets: Set<Socket>): Promise<HostListener> {
  server.on("connection", (s) => {
    sockets.add(s);
    s.on("close", () => sockets.delete(s));
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, host, () => resolve());
  });
  const address = server.address();
  if (address === null || typeof address === "string") throw new Error("listener has no port");
  return {
    port: address.port,
    close: () =>
      new Promise<void>((resolve) => {
        for (const s of sockets) s.destroy();
        server.close(() => resolve());
      }),
  };
}

/** Relays TCP from `allowFrom` (the proxy namespace's address) to the control plane. */
export function startRelay(options: {
  host: string;
  allowFrom: string;
  target: { host: string; port: number };
}): Promise<HostListener> {
  const sockets = new Set<Socket>();
  const server = createServer((client) => {
    if (client.remoteAddress !== options.allowFrom) {
      client.destroy();
      return;
    }
    const upstream = connect(options.target);
    sockets.add(upstream);
    upstream.on("close", () => sockets.delete(upstream));
    client.pipe(upstream);
    upstream.pipe(client);
    client.on("error", () => upstream.destroy());
    upstream.on("error", () => client.destroy());
    client.on("close", () => upstream.destroy());
    upstream.on("close", () => client.destroy());
  });
  return listen(server, options.host, sockets);
}

export function startProbe(host: string): Promise<HostListener> {
  const sockets = new Set<Socket>();
  const server = createServer((s) => {
    s.on("error", () => {});
    s.end();
  });
  return listen(server, host, sockets);
}
