import type { IncomingMessage, ServerResponse } from "node:http";
import { pipeline as pipelineCb, type Readable, Transform, type Writable } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { EgressRoute } from "@benchwright/shared/contract/proxy-wire";
import type { Dispatcher } from "undici";
import { relayBody } from "../body-relay";
import { decodersFor, filterRequestHeaders, filterResponseHeaders } from "../http-rules";
import { maskString, needlesFor, Redactor } from "../redact";
import { TunnelError } from "../tunnel-client";
import type { Upstream } from "../upstream";
import { type Decision, destination } from "./decide";
import { swapBody, swapRequest } from "./placeholders";
import { bad, Refusal, tunnelDownBody, tunnelRefusal } from "./refusal";
import { upstreamExchange } from "./send";

// Terminated forwarding of one decided request, from an HTTP/1.1 request or an HTTP/2 stream
// alike: dial exactly the checked address, send the request with the rule's credential (if any),
// and scrub that credential from what comes back (B7), headers, body and trailers. What happened
// is written into `exchange` as it happens, so a failure half-way still leaves an accurate
// record (bytes so far, whether the host was reached).

/** Progress of one forwarded exchange, read by the handler for its record. */
export interface Exchange {
  bytesIn: number;
  bytesOut: number;
  /** Set once the upstream answered: the route the host was reached by. */
  route: EgressRoute | null;
  /** Set as the request goes out: secret names of run placeholders sent unswapped (N2). */
  strayPlaceholders?: readonly string[];
}

/** A request as it goes upstream, from either HTTP version. */
export interface Outgoing {
  method: string;
  /** The client's headers, filtered (no Host, no hop-by-hop), lowercase names, in order. */
  headers: Array<[string, string]>;
  /** The request body, or null when it has none. */
  body: Readable | null;
  /** True when the client side is gone already: then nothing is started upstream. */
  lost(): boolean;
}

/** The upstream's answer, made safe for the client; the caller sends its body with `sendTo`. */
export interface Incoming {
  status: number;
  /** Filtered, and masked when a credential was injected. */
  headers: Array<[string, string]>;
  /** The upstream's body as it came (to discard when the answer has none). */
  body: Readable;
  /**
   * Relays the body to `dest`, decoded (if the upstream compressed anyway), masked and counted,
   * then ends `dest`; resolves once `dest` has finished, rejects as `pipeline()` would.
   */
  sendTo(dest: Writable): Promise<void>;
  /** The upstream's trailers, filtered and masked; complete once the body has ended. */
  trailers(): Array<[string, string]>;
}

/** Sends one decided request upstream; resolves once the upstream's response head is in. */
export async function forward(
  decided: Extract<Decision, { kind: "forward" }>,
  upstream: Upstream,
  exchange: Exchange,
  out: Outgoing,
): Promise<Incoming> {
  const { target, via } = decided;
  const injection = decided.rule?.injection ?? null;
  const viaTunnel = via === "tunnel";
  const resolved = await destination(upstream, target, via, decided.blockedAddress, decided.dialed);
  // The rest of the message may have failed to parse meanwhile (bad chunk framing, A4): a
  // request the client side already lost is not started upstream.
  if (out.lost()) throw bad(400, "the request failed before it was forwarded");
  if (!resolved.ok) throw resolved.refusal;

  const swapped = swapRequest(decided.placeholders, out.headers, injection?.path ?? target.path);
  const needles = scrubNeedles(decided, swapped.basicForms);
  const headers = upstreamHeaders(decided, swapped.headers);
  // Count the body on its way to the upstream. (A 'data' listener on the request itself would
  // switch it to flowing mode while the address is still being resolved, and the body would be
  // gone before the upstream request reads it.) pipeline() carries an aborted request on to undici.
  const counted = out.body
    ? new Transform({
        transform(chunk: Buffer, _enc, done) {
          exchange.bytesIn += chunk.length;
          done(null, chunk);
        },
      })
    : null;
  if (out.body && counted) pipeline(out.body, counted).catch(() => {});
  // A rule that opts in has its placeholder swapped in the body too: read whole, sent with its
  // new length (N2).
  const own = decided.placeholders?.own;
  const body = counted && own?.body ? await swapBody(counted, headers, own) : counted;
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
  let answer: Awaited<ReturnType<typeof upstreamExchange>>;
  exchange.strayPlaceholders = swapped.strays;
  try {
    answer = await upstreamExchange(pool as Dispatcher, {
      method: out.method,
      path: swapped.path,
      headers: flatHeaders(headers),
      body,
    });
  } catch (error) {
    if (error instanceof TunnelError) throw tunnelRefusal(target.host, error);
    throw error;
  }
  exchange.route = viaTunnel ? "tunnel" : "direct";

  const outHeaders = filterResponseHeaders(answer.headers);
  let decoders: Transform[] = [];
  if (injection) {
    // The upstream may compress anyway, even in layers: decode every layer so the scrubber
    // sees plain bytes. An encoding it cannot read could carry the secret past it: refuse.
    const found = decodersFor(answer.headers["content-encoding"]);
    if (found === null) {
      answer.body.on("error", () => {}).destroy();
      throw new Refusal(502, "error", "response encoding cannot be scrubbed", "Upstream request failed.\n");
    }
    decoders = found;
    if (decoders.length > 0) {
      for (let i = outHeaders.length - 1; i >= 0; i--) {
        const k = outHeaders[i]?.[0];
        if (k === "content-encoding" || k === "content-length") outHeaders.splice(i, 1);
      }
    }
    for (const h of outHeaders) h[1] = maskString(h[1], needles);
  }
  return {
    status: answer.status,
    headers: outHeaders,
    body: answer.body,
    sendTo: (dest) => {
      let source: Readable = answer.body;
      if (decoders.length > 0) {
        // Rare (an upstream that compresses against `accept-encoding: identity`): a pipeline
        // of decoders, whose error or abort reaches the relay through its last stage.
        source = decoders[decoders.length - 1] as Transform;
        pipelineCb([answer.body, ...decoders], () => {});
      }
      // Held back: only an end that could be the start of a needle (B7), so a secret split across
      // chunks (or gRPC messages) is still caught.
      return relayBody(source, dest, injection ? new Redactor(needles, true) : null, exchange);
    },
    trailers: () => {
      const kept = filterResponseHeaders(answer.trailers);
      for (const t of kept) t[1] = maskString(t[1], needles);
      return kept;
    },
  };
}

/**
 * What the response is masked of (B7): every form of the rule's secret and of what was injected,
 * and of each `Basic` credential a placeholder swap made (N2).
 */
export function scrubNeedles(
  decided: Extract<Decision, { kind: "forward" }>,
  basicForms: readonly string[],
): Buffer[] {
  const rule = decided.rule;
  if (!rule) return [];
  const needles = needlesFor(rule.secret, rule.injection.injected);
  if (basicForms.length === 0) return needles;
  return [...needles, ...basicForms.flatMap((form) => needlesFor(rule.secret, form))];
}

function flatHeaders(pairs: ReadonlyArray<[string, string]>): string[] {
  const flat: string[] = new Array(pairs.length * 2);
  for (let i = 0; i < pairs.length; i++) {
    const [k, v] = pairs[i] as [string, string];
    flat[2 * i] = k;
    flat[2 * i + 1] = v;
  }
  return flat;
}

/**
 * The headers a decided request goes upstream with: the client's (filtered), the target's
 * `Host`, and the rule's credential in place of whatever the client sent under that name.
 */
export function upstreamHeaders(
  decided: Extract<Decision, { kind: "forward" }>,
  filtered: ReadonlyArray<[string, string]>,
): Array<[string, string]> {
  const { target } = decided;
  const injection = decided.rule?.injection ?? null;
  const name = injection?.header?.[0];
  // One pass: with a credential, the client's own header of that name and its accept-encoding go.
  const headers: Array<[string, string]> = [];
  for (const h of filtered) {
    if (injection && (h[0] === name || h[0] === "accept-encoding")) continue;
    headers.push(h);
  }
  // (A credential header named host, should a spec ever allow one, replaces the target's.)
  if (!injection || name !== "host")
    headers.push([
      "host",
      target.port === (target.scheme === "https" ? 443 : 80) ? target.host : `${target.host}:${target.port}`,
    ]);
  if (injection) {
    if (injection.header) headers.push(injection.header);
    // Identity encoding so the scrubber sees plain bytes (B7).
    headers.push(["accept-encoding", "identity"]);
  }
  return headers;
}

/** Forwards an HTTP/1.1 request; resolves with the upstream's status once the response is sent. */
export async function forwardHttp1(
  req: IncomingMessage,
  res: ServerResponse,
  decided: Extract<Decision, { kind: "forward" }>,
  upstream: Upstream,
  exchange: Exchange,
): Promise<number> {
  const hasBody =
    req.headers["transfer-encoding"] !== undefined || Number(req.headers["content-length"] ?? 0) > 0;
  const answer = await forward(decided, upstream, exchange, {
    method: req.method ?? "GET",
    headers: filterRequestHeaders(req.rawHeaders),
    body: hasBody ? req : null,
    lost: () => req.destroyed || req.socket.destroyed,
  });
  // HTTP/1.1 clients get no trailers (as before): the response may not be chunked at all.
  res.writeHead(answer.status, answer.headers.flat());
  // An error anywhere (a corrupt gzip body, say) ends the response instead of surfacing as an
  // unhandled stream error.
  await answer.sendTo(res);
  return answer.status;
}
