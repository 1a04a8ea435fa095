import type { Socket } from "node:net";
import type { Dialed } from "../original-dst";
import type { Listener } from "./record";
import type { TargetConn } from "./target";

// The proxy's open client connections, on every way in: what each said before any request (its
// listener, its CONNECT target, the address it dialled), the policy version it was opened under,
// and the set that a policy change walks to end the connections of another version.

/** What the proxy knows of one client connection. */
export interface ConnInfo extends TargetConn {
  id: number;
  policyVersion: number | null;
  /** A direct listener's connection: the address the sandbox dialled (decided and relayed to). */
  dialed?: Dialed;
}

export interface Connections {
  /** What is known of `socket`, if it was counted. */
  of(socket: Socket): ConnInfo | undefined;
  /** Counts a connection (the listener's cap, closed on a policy change). */
  track(socket: Socket, listener: Listener, extra?: Partial<ConnInfo>): ConnInfo;
  /** Ends every connection opened under a policy version other than `version`. */
  endStale(version: number | null): void;
  endAll(): void;
}

/** `version`: the policy version now, which a new connection is opened under. */
export function createConnections(version: () => number | null): Connections {
  const info = new WeakMap<Socket, ConnInfo>();
  const sockets = new Set<Socket>();
  let nextConn = 1;
  return {
    of: (socket) => info.get(socket),
    track(socket, listener, extra = {}) {
      const conn: ConnInfo = { id: nextConn++, listener, policyVersion: version(), ...extra };
      info.set(socket, conn);
      sockets.add(socket);
      socket.once("close", () => sockets.delete(socket));
      return conn;
    },
    endStale(now) {
      for (const s of sockets) {
        if (info.get(s)?.policyVersion !== now) s.destroy();
      }
    },
    endAll() {
      for (const s of sockets) s.destroy();
    },
  };
}
