// The bench's TLS upstream, in its own process so that its CPU is not the load generator's and
// the proxy's numbers are not muddied by it. Forked by the bench with an IPC channel:
//   parent → { kind: "start", certPem, keyPem, address, bodyBytes, secret }
//   child  → { kind: "listening", port }
//   parent → { kind: "counts", id }  child → { kind: "counts", id, requests, injected, connections }
// It answers every request with the same fixed body, and counts the requests that arrived with
// the bench's injected header, so the bench can show the proxy really injected on every request.
import { createServer } from "node:https";
import type { AddressInfo } from "node:net";

interface Start {
  kind: "start";
  certPem: string;
  keyPem: string;
  address: string;
  bodyBytes: number;
  secret: string;
  header: string;
}

const counts = { requests: 0, injected: 0, connections: 0 };

function start(msg: Start): void {
  const body = Buffer.alloc(msg.bodyBytes, "a");
  const server = createServer(
    { cert: msg.certPem, key: msg.keyPem, keepAliveTimeout: 30_000 },
    (req, res) => {
      counts.requests++;
      if (req.headers[msg.header] === msg.secret) counts.injected++;
      // Drain any request body, then answer: 200, fixed length, keep-alive unless the client said close.
      req.resume();
      req.on("end", () => {
        res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length });
        res.end(body);
      });
    },
  );
  server.on("secureConnection", () => counts.connections++);
  server.listen(0, msg.address, () => {
    process.send?.({ kind: "listening", port: (server.address() as AddressInfo).port });
  });
}

process.on("message", (msg: { kind: string; id?: number }) => {
  if (msg.kind === "start") start(msg as Start);
  else if (msg.kind === "counts") process.send?.({ kind: "counts", id: msg.id, ...counts });
});
// The bench going away takes the upstream with it.
process.on("disconnect", () => process.exit(0));
