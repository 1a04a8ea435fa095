// The demo's (and the end-to-end tests') upstream: runs inside a network namespace of its own,
// started by scripts/lib/demo-upstream.ts. Plain JavaScript so that it needs nothing but node.
//
// stdin: one JSON line { certPem, keyPem, expectedKey, httpsPort, directPort }.
// HTTPS: every request gets JSON { host, path, keyPresent, keyMatches } back: whether an
// Authorization header came and whether it is `Bearer <expectedKey>`; never the header itself.
// TCP directPort: writes "direct\n" and closes (something a sandbox could reach if nothing stopped it).
// stdout: one JSON line per request seen, then "ready" once listening.

import { createServer } from "node:https";
import { createServer as createTcpServer } from "node:net";

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (d) => {
  input += d;
});
process.stdin.on("end", () => {
  const config = JSON.parse(input);
  const https = createServer({ cert: config.certPem, key: config.keyPem }, (req, res) => {
    const auth = req.headers.authorization;
    const seen = {
      event: "request",
      host: req.headers.host ?? null,
      path: req.url,
      keyPresent: auth !== undefined,
      keyMatches: auth === `Bearer ${config.expectedKey}`,
    };
    process.stdout.write(`${JSON.stringify(seen)}\n`);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(seen));
  });
  const direct = createTcpServer((socket) => {
    process.stdout.write(`${JSON.stringify({ event: "direct", from: socket.remoteAddress })}\n`);
    socket.end("direct\n");
    socket.on("error", () => {});
  });
  https.listen(config.httpsPort, "0.0.0.0", () => {
    direct.listen(config.directPort, "0.0.0.0", () => process.stdout.write("ready\n"));
  });
});
