// The minimal Node MITM: the floor a TLS-terminating, credential-injecting Node proxy can reach on
// this machine, measured beside the proxy in the same run. It does what the proxy must do per
// request and nothing else: TLS terminated with a leaf from a run-CA-like CA (ECDSA P-256, served
// with its CA, chosen by SNI), Node's HTTP/1.1 server, an undici Pool to the upstream (verified
// TLS, the upstream's name for SNI, a fixed address), one header added. No policy, no parsing of
// its own, no audit, no scrubbing, no log. The bench bundles it with the proxy's esbuild options
// and forks it, so it is a process like the proxy (its CPU and memory are its own):
//   parent → { kind: "start", certPem, keyPem, upstream: { address, port, servername, caPem },
//              header, secret }
//   child  → { kind: "listening", port }
import { createServer } from "node:https";
import type { AddressInfo } from "node:net";
import { pipeline } from "node:stream/promises";
import { createSecureContext, rootCertificates } from "node:tls";
import { buildConnector, Pool } from "../../proxy-image/src/proxy/undici";

interface Start {
  kind: "start";
  certPem: string;
  keyPem: string;
  upstream: { address: string; port: number; servername: string; caPem: string };
  header: string;
  secret: string;
}

// undici refuses hop-by-hop request headers; a proxy drops them both ways anyway.
const HOP = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade"]);

function start(msg: Start): void {
  const up = msg.upstream;
  const connect = buildConnector({
    // Parsed once, as the proxy does: the system roots plus the bench upstream's CA.
    secureContext: createSecureContext({ ca: [...rootCertificates, up.caPem] }),
    servername: up.servername,
    rejectUnauthorized: true,
    timeout: 10_000,
  });
  // The same limits as the proxy's pools (proxy-image/src/proxy/upstream.ts).
  const pool = new Pool(`https://${up.address}:${up.port}`, {
    connections: 64,
    pipelining: 1,
    keepAliveTimeout: 30_000,
    connect,
  });
  const leaf = createSecureContext({ cert: msg.certPem, key: msg.keyPem });
  const server = createServer(
    { SNICallback: (_name, cb) => cb(null, leaf), ALPNProtocols: ["http/1.1"], keepAliveTimeout: 5_000 },
    (req, res) => {
      const headers: Record<string, string | string[]> = {};
      for (const [k, v] of Object.entries(req.headers)) if (v !== undefined && !HOP.has(k)) headers[k] = v;
      headers[msg.header] = msg.secret;
      const hasBody =
        req.headers["transfer-encoding"] !== undefined || Number(req.headers["content-length"] ?? 0) > 0;
      pool
        .request({ method: req.method ?? "GET", path: req.url ?? "/", headers, body: hasBody ? req : null })
        .then(async (r) => {
          const out: Record<string, string | string[]> = {};
          for (const [k, v] of Object.entries(r.headers)) if (v !== undefined && !HOP.has(k)) out[k] = v;
          res.writeHead(r.statusCode, out);
          await pipeline(r.body, res);
        })
        .catch(() => {
          if (!res.headersSent) res.writeHead(502).end();
          else res.destroy();
        });
    },
  );
  server.listen(0, "127.0.0.1", () => {
    process.send?.({ kind: "listening", port: (server.address() as AddressInfo).port });
  });
}

process.on("message", (msg: { kind: string }) => {
  if (msg.kind === "start") start(msg as Start);
});
// The bench going away takes it along.
process.on("disconnect", () => process.exit(0));
