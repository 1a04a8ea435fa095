import {
  constants,
  createServer,
  type Http2Session,
  type IncomingHttpHeaders,
  type OutgoingHttpHeaders,
  type ServerHttp2Stream,
} from "node:http2";
import type { TLSSocket } from "node:tls";
import { checkFraming, filterRequestHeaders } from "../http-rules";
import type { Upstream } from "../upstream";
import type { ConnInfo } from "./connections";
import { decideRequest } from "./decide";
import { type Exchange, forward } from "./forward";
import type { Gate } from "./gate";
import { type Ending, requestRecord } from "./record";
import { bad, misdirected, toRefusal } from "./refusal";
import { type Target, targetOfStream } from "./target";

// HTTP/2 on a terminated TLS connection (I1): the connection's ALPN chose h2, and every stream on
// it is a request of its own, decided, injected, forwarded and scrubbed exactly as an HTTP/1.1
// request is (decide.ts, forward.ts), with one record each. A stream whose `:authority` is not the
// SNI's host is answered 421 and the others go on. Upstream, undici speaks h2 when the origin
// offers it, so gRPC (streamed bodies both ways, status in trailers) passes end to end.

export interface StreamLimits {
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  keepAliveTimeoutMs: number;
  maxHeaderBytes: number;
}

/** The connection a session runs on, for its streams' targets and records. */
type Bound = { tls: TLSSocket; conn: ConnInfo };

export function createStreamServer(gate: Gate, limits: StreamLimits) {
  const bound = new WeakMap<Http2Session, Bound>();
  let handing: Bound | null = null;
  // Never listens: terminated TLS sockets whose ALPN is h2 are handed to it (serve below).
  const server = createServer({
    settings: { maxConcurrentStreams: 100, maxHeaderListSize: limits.maxHeaderBytes },
    maxHeaderListPairs: 256,
  });
  server.on("session", (session: Http2Session) => {
    if (handing) bound.set(session, handing);
    // Deadlines (F2): a session must start a stream as soon as an HTTP/1.1 connection must send
    // its headers, may idle between streams as long as a keep-alive connection, and is closed
    // when silent for the request deadline while streams are open.
    let open = 0;
    session.setTimeout(limits.headersTimeoutMs);
    session.on("timeout", () => session.destroy());
    session.on("stream", (stream: ServerHttp2Stream) => {
      open++;
      session.setTimeout(limits.requestTimeoutMs);
      stream.once("close", () => {
        if (--open === 0 && !session.destroyed) session.setTimeout(limits.keepAliveTimeoutMs);
      });
    });
    session.on("error", () => session.destroy());
  });
  server.on("stream", (stream: ServerHttp2Stream, headers, flags: number, rawHeaders: string[]) => {
    const at = bound.get(stream.session as Http2Session);
    if (!at) return void stream.close(constants.NGHTTP2_REFUSED_STREAM);
    stream.on("error", () => {});
    void handleStream(
      gate,
      at,
      stream,
      headers,
      rawHeaders,
      (flags & constants.NGHTTP2_FLAG_END_STREAM) !== 0,
    );
  });

  return {
    /** Serves HTTP/2 on a terminated TLS connection whose ALPN is h2. */
    serve(tls: TLSSocket, conn: Bound["conn"]): void {
      // A server-side TLSSocket made without a tls.Server never clears `secureConnecting` (only
      // tls.Server's own handshake callback does), and the session would wait for a
      // 'secureConnect' that a server socket never emits. The handshake is done: say so.
      (tls as TLSSocket & { secureConnecting: boolean }).secureConnecting = false;
      // The server emits 'session' synchronously while taking the connection.
      handing = { tls, conn };
      try {
        server.emit("connection", tls);
      } finally {
        handing = null;
      }
    },
  };
}

async function handleStream(
  gate: Gate,
  at: Bound,
  stream: ServerHttp2Stream,
  headers: IncomingHttpHeaders,
  rawHeaders: string[],
  ended: boolean,
): Promise<void> {
  const started = Date.now();
  const method = String(headers[":method"] ?? "?");
  let target: Target | null = null;
  let rule: number | null = null;
  const exchange: Exchange = { bytesIn: 0, bytesOut: 0, route: null };
  const finish = (...end: Ending) =>
    gate.emit(
      requestRecord(
        { conn: at.conn, method, started, target, rule, exchange, policyVersion: gate.version() },
        ...end,
      ),
    );
  try {
    const framing = checkFraming(rawHeaders);
    if (framing) throw bad(400, framing);
    target = targetOfStream(
      {
        method: headers[":method"],
        scheme: headers[":scheme"],
        authority: headers[":authority"],
        path: headers[":path"],
        rawHeaders,
      },
      at.tls,
      at.conn,
    );
    const request = decideRequest(target, method, at.conn, gate.context());
    target = request.target;
    const decided = request.decided;
    switch (decided.kind) {
      case "refuse":
        rule = decided.rule;
        throw decided.refusal;
      case "compute":
      case "model":
        // Their hosts are offered http/1.1 only in ALPN; an h2 stream for one came by another SNI.
        throw misdirected("the platform's own hosts are served over HTTP/1.1 only");
      case "forward": {
        rule = decided.rule?.index ?? null;
        target = decided.target;
        const status = await respond(stream, method, rawHeaders, ended, decided, gate.upstream, exchange);
        return finish("allow", rule === null ? "allowed" : "allowed, credential injected", status);
      }
    }
  } catch (e) {
    const refusal = toRefusal(e);
    finish(refusal.decision, refusal.reason, refusal.status, refusal.audit);
    if (stream.destroyed) return;
    if (stream.headersSent) return void stream.close(constants.NGHTTP2_INTERNAL_ERROR);
    stream.respond({
      ":status": refusal.status,
      ...refusal.headers,
      "content-type": "text/plain; charset=utf-8",
      "content-length": Buffer.byteLength(refusal.body),
    });
    stream.end(refusal.body);
    // The request body, if any, is not wanted.
    stream.resume();
  }
}

/** Forwards one stream's request and writes the answer to it; resolves with the upstream status. */
async function respond(
  stream: ServerHttp2Stream,
  method: string,
  rawHeaders: string[],
  ended: boolean,
  decided: Parameters<typeof forward>[0],
  upstream: Upstream,
  exchange: Exchange,
): Promise<number> {
  const answer = await forward(decided, upstream, exchange, {
    method,
    headers: requestHeaders(rawHeaders),
    body: ended ? null : stream,
    lost: () => stream.destroyed,
  });
  const head: OutgoingHttpHeaders = { ":status": answer.status };
  for (const [k, v] of answer.headers) {
    const prior = head[k];
    head[k] = prior === undefined ? v : Array.isArray(prior) ? [...prior, v] : [String(prior), v];
  }
  // gRPC's trailers-only answer (an error before any message) is one HEADERS frame that ends the
  // stream; node would otherwise close a body-less response with an empty DATA frame, fine for
  // HTTP but not for a gRPC client reading the status.
  const bodyless =
    method === "HEAD" || answer.status === 204 || answer.status === 304 || head["grpc-status"] !== undefined;
  if (bodyless) {
    stream.respond(head, { endStream: true });
    answer.body.resume();
    return answer.status;
  }
  stream.respond(head, { waitForTrailers: true });
  stream.once("wantTrailers", () => {
    const trailers: OutgoingHttpHeaders = {};
    for (const [k, v] of answer.trailers()) trailers[k] = v;
    // With none, node ends the stream with an empty DATA frame.
    stream.sendTrailers(trailers);
  });
  await answer.sendTo(stream);
  return answer.status;
}

/**
 * An HTTP/2 request's fields as they go upstream: pseudo-headers and hop-by-hop fields dropped,
 * split `cookie` fields joined (RFC 9113 §8.2.3), and `te: trailers` kept, the one TE that HTTP/2
 * allows and that gRPC servers expect.
 */
function requestHeaders(rawHeaders: readonly string[]): Array<[string, string]> {
  const plain: string[] = [];
  const cookies: string[] = [];
  let trailers = false;
  for (let i = 0; i + 1 < rawHeaders.length; i += 2) {
    const name = (rawHeaders[i] as string).toLowerCase();
    const value = rawHeaders[i + 1] as string;
    if (name.startsWith(":")) continue;
    if (name === "cookie") cookies.push(value);
    else if (name === "te") trailers ||= value.trim().toLowerCase() === "trailers";
    else plain.push(name, value);
  }
  const out = filterRequestHeaders(plain);
  if (cookies.length > 0) out.push(["cookie", cookies.join("; ")]);
  if (trailers) out.push(["te", "trailers"]);
  return out;
}
