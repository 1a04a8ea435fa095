import type { IncomingMessage, ServerResponse } from "node:http";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { EgressRoute } from "../../../src/contract/proxy-wire";
import { decodersFor, filterRequestHeaders, filterResponseHeaders } from "../http-rules";
import { maskString, needlesFor, RedactStream } from "../redact";
import { TunnelError } from "../tunnel-client";
import type { Upstream } from "../upstream";
import { type Decision, destination } from "./decide";
import { bad, Refusal, tunnelDownBody, tunnelRefusal } from "./refusal";

// Terminated HTTP/1 forwarding of one decided request: dial exactly the checked address, send
// the request with the rule's credential (if any), and scrub that credential from what comes
// back (B7). What happened is written into `exchange` as it happens, so a failure half-way still
// leaves an accurate record (bytes so far, whether the host was reached).

/** Progress of one forwarded exchange, read by the handler for its record. */
export interface Exchange {
  bytesIn: number;
  bytesOut: number;
  /** Set once the upstream answered: the route the host was reached by. */
  route: EgressRoute | null;
}

/** Forwards the request; resolves with the upstream's status once the response is sent. */
export async function forwardHttp1(
  req: IncomingMessage,
  res: ServerResponse,
  decided: Extract<Decision, { kind: "forward" }>,
  upstream: Upstream,
  exchange: Exchange,
): Promise<number> {
  const { target, via } = decided;
  const injection = decided.rule?.injection ?? null;
  const needles: Buffer[] = decided.rule
    ? needlesFor(decided.rule.secret, decided.rule.injection.injected)
    : [];
  const viaTunnel = via === "tunnel";
  const resolved = await destination(upstream, target, via, decided.blockedAddress);
  // The rest of the message may have failed to parse meanwhile (bad chunk framing, A4): a
  // request the client side already lost is not started upstream.
  if (req.destroyed || req.socket.destroyed) throw bad(400, "the request failed before it was forwarded");
  if (!resolved.ok) throw resolved.refusal;

  const headers = filterRequestHeaders(req.rawHeaders);
  headers.push([
    "host",
    target.port === (target.scheme === "https" ? 443 : 80) ? target.host : `${target.host}:${target.port}`,
  ]);
  if (injection) {
    const name = injection.header?.[0];
    const kept = name ? headers.filter(([k]) => k !== name) : headers;
    kept.splice(0, kept.length, ...kept.filter(([k]) => k !== "accept-encoding"));
    if (injection.header) kept.push(injection.header);
    // Identity encoding so the scrubber sees plain bytes (B7).
    kept.push(["accept-encoding", "identity"]);
    headers.splice(0, headers.length, ...kept);
  }
  const hasBody =
    req.headers["transfer-encoding"] !== undefined || Number(req.headers["content-length"] ?? 0) > 0;
  // Count the body on its way to the upstream. (A 'data' listener on `req` itself would switch
  // it to flowing mode while the address is still being resolved, and the body would be gone
  // before the upstream request reads it.) pipeline() carries an aborted request on to undici.
  const body = hasBody
    ? new Transform({
        transform(chunk: Buffer, _enc, done) {
          exchange.bytesIn += chunk.length;
          done(null, chunk);
        },
      })
    : null;
  if (body) pipeline(req, body).catch(() => {});
  const pool = viaTunnel
    ? upstream.tunnelPoolFor(`${target.scheme}:`, target.host, target.port)
    : upstream.poolFor(`${target.scheme}:`, target.host, resolved.address, resolved.port);
  if (pool === null)
    throw new Refusal(
      503,
      "refuse",
      "no egress tunnel",
      tunnelDownBody(target.host),
      {},
      { route: "refused" },
    );
  let upstreamRes: Awaited<ReturnType<typeof pool.request>>;
  try {
    upstreamRes = await pool.request({
      method: req.method ?? "GET",
      path: injection?.path ?? target.path,
      headers: headers.flat(),
      body,
    });
  } catch (error) {
    if (error instanceof TunnelError) throw tunnelRefusal(target.host, error);
    throw error;
  }
  exchange.route = viaTunnel ? "tunnel" : "direct";

  const outHeaders = filterResponseHeaders(upstreamRes.headers);
  const stages: Transform[] = [];
  if (injection) {
    // The upstream may compress anyway, even in layers: decode every layer so the scrubber
    // sees plain bytes. An encoding it cannot read could carry the secret past it: refuse.
    const decoders = decodersFor(upstreamRes.headers["content-encoding"]);
    if (decoders === null) {
      upstreamRes.body.on("error", () => {}).destroy();
      throw new Refusal(502, "error", "response encoding cannot be scrubbed", "Upstream request failed.\n");
    }
    if (decoders.length > 0) {
      stages.push(...decoders);
      for (let i = outHeaders.length - 1; i >= 0; i--) {
        const k = outHeaders[i]?.[0];
        if (k === "content-encoding" || k === "content-length") outHeaders.splice(i, 1);
      }
    }
    for (const h of outHeaders) h[1] = maskString(h[1], needles);
    stages.push(new RedactStream(needles));
  }
  stages.push(
    new Transform({
      transform(chunk: Buffer, _enc, done) {
        exchange.bytesOut += chunk.length;
        done(null, chunk);
      },
    }),
  );
  res.writeHead(upstreamRes.statusCode, outHeaders.flat());
  // One pipeline, so an error in any stage (a corrupt gzip body, say) ends the response
  // instead of surfacing as an unhandled stream error.
  await pipeline([upstreamRes.body, ...stages, res]);
  return upstreamRes.statusCode;
}
