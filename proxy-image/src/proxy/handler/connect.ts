import type { IncomingMessage } from "node:http";
import type { Socket } from "node:net";
import type { ConnInfo } from "./connections";
import { decideConnect } from "./decide";
import type { Gate } from "./gate";
import { record } from "./record";
import { connectTarget } from "./target";

// The explicit port's CONNECT: decided on its target before any TLS (decideConnect in decide.ts),
// then either refused, with its status line alone and one record, or answered 200 and its bytes
// handed to the TLS way in (tls-in.ts), where each request inside is decided like any other.

/** `acceptTls`: the TLS way in an opened tunnel's connection is handed to (tls-in.ts). */
export function connectHandler(
  gate: Gate,
  acceptTls: (raw: Socket, conn: Omit<ConnInfo, "id" | "policyVersion">) => void,
) {
  return (req: IncomingMessage, socket: Socket, head: Buffer): void => {
    socket.on("error", () => socket.destroy());
    socket.setTimeout(0); // the tunnel's TLS connection gets deadlines of its own
    const started = Date.now();
    const target = connectTarget(req.url);
    const decided = decideConnect(target, gate.context());
    if (decided.kind === "refuse") {
      const { refusal } = decided;
      gate.emit(
        record({
          conn: gate.conns.of(socket),
          method: "CONNECT",
          host: target && target.port !== null ? target.host : null,
          port: target?.port ?? null,
          decision: refusal.decision,
          reason: refusal.reason,
          status: refusal.status,
          started,
          policyVersion: gate.version(),
          ...refusal.audit,
        }),
      );
      socket.end(
        `HTTP/1.1 ${refusal.status} ${refusal.status === 403 ? "Forbidden" : "Bad Request"}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`,
      );
      return;
    }
    socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
    if (head.length > 0) socket.unshift(head);
    acceptTls(socket, { listener: "explicit", connectHost: decided.host, connectPort: decided.port });
  };
}
