import { request as httpRequest, type IncomingMessage, STATUS_CODES } from "node:http";
import type { Socket } from "node:net";
import type { Duplex } from "node:stream";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { checkFraming, decodersFor, filterRequestHeaders, filterResponseHeaders } from "../http-rules";
import { maskString, RedactStream } from "../redact";
import { TunnelError } from "../tunnel-client";
import type { Upstream } from "../upstream";
import { type Decision, decideRequest, destination } from "./decide";
import { scrubNeedles, upstreamHeaders } from "./forward";
import type { Gate } from "./gate";
import { swapRequest } from "./placeholders";
import { type RecordInput, record } from "./record";
import { bad, Refusal, toRefusal, tunnelRefusal } from "./refusal";
import { relay } from "./splice";
import { type Target, targetOf } from "./target";

// An HTTP/1.1 `Upgrade` request (WebSocket, or any other protocol) on a terminated or plain
// connection (I2). The handshake is a request like any other: its target worked out and checked
// (target.ts), decided (decide.ts), the rule's credential injected and the answer's headers
// masked. On `101` the two connections are joined and bytes relayed both ways (splice.ts relay)
// until either side closes: the upstream connection was dialled, fresh and unpooled, to the
// checked address of the decided host, so nothing sent after the upgrade can reach another host.
// Frames are relayed as bytes, not masked (see docs/proxy.md). One record per upgrade, written
// when it ends, with the bytes both ways.

/** `Upgrade: h2c` is not an upgrade the proxy makes: it would carry requests it never decides. */
export function upgradeWanted(req: IncomingMessage): boolean {
  const tokens = String(req.headers.upgrade ?? "")
    .split(",")
    .map((t) => t.trim().toLowerCase());
  return !tokens.includes("h2c");
}

/** `idleMs`: an upgraded connection silent both ways this long is closed. */
export async function handleUpgrade(
  gate: Gate,
  idleMs: number,
  req: IncomingMessage,
  socket: Socket,
  head: Buffer,
): Promise<void> {
  socket.setTimeout(0);
  socket.on("error", () => socket.destroy());
  const started = Date.now();
  const conn = gate.conns.of(socket) ?? gate.conns.track(socket, "http");
  let target: Target | null = null;
  let rule: number | null = null;
  const finish = (
    input: Omit<RecordInput, "conn" | "method" | "host" | "port" | "started" | "policyVersion">,
  ) =>
    gate.emit(
      record({
        conn,
        method: req.method ?? "?",
        host: target?.host ?? null,
        port: target?.port ?? null,
        rule,
        started,
        policyVersion: gate.version(),
        ...input,
      }),
    );
  try {
    const framing = checkFraming(req.rawHeaders);
    if (framing) throw bad(400, framing);
    // Its bytes would arrive in `head`, after the handshake, where the upstream reads frames.
    if (req.headers["transfer-encoding"] !== undefined || Number(req.headers["content-length"] ?? 0) > 0)
      throw bad(400, "an Upgrade request with a body");
    target = targetOf(req, conn);
    const request = decideRequest(target, req.method ?? "?", conn, gate.context());
    target = request.target;
    const decided = request.decided;
    if (decided.kind === "refuse") {
      rule = decided.rule;
      throw decided.refusal;
    }
    if (decided.kind !== "forward") throw bad(400, "no Upgrade on the platform's own lanes");
    rule = decided.rule?.index ?? null;
    target = decided.target;
    await upgrade(gate.upstream, idleMs, req, socket, head, decided, (r) => finish(r));
  } catch (e) {
    const refusal = toRefusal(e);
    finish({
      decision: refusal.decision,
      reason: refusal.reason,
      status: refusal.status,
      route: refusal.audit.route ?? null,
      ...(refusal.audit.blockedBy ? { blockedBy: refusal.audit.blockedBy } : {}),
      ...(refusal.audit.limit ? { limit: refusal.audit.limit } : {}),
    });
    if (socket.writable) {
      socket.end(
        responseHead(refusal.status, [
          ...Object.entries(refusal.headers),
          ["content-type", "text/plain; charset=utf-8"],
          ["content-length", String(Buffer.byteLength(refusal.body))],
          ["connection", "close"],
        ]) + refusal.body,
      );
    }
    socket.destroy();
  }
}

type Outcome = Omit<RecordInput, "conn" | "method" | "host" | "port" | "started" | "policyVersion">;

/** Dials the decided host, sends the handshake, and relays once it answers 101. */
async function upgrade(
  upstream: Upstream,
  idleMs: number,
  req: IncomingMessage,
  socket: Socket,
  head: Buffer,
  decided: Extract<Decision, { kind: "forward" }>,
  done: (outcome: Outcome) => void,
): Promise<void> {
  const { target, via } = decided;
  // The handshake's headers and query have the rule's placeholder swapped as any request's (N2).
  const swapped = swapRequest(
    decided.placeholders,
    filterRequestHeaders(req.rawHeaders),
    decided.rule?.injection.path ?? target.path,
  );
  const needles = scrubNeedles(decided, swapped.basicForms);
  const strayPlaceholders = swapped.strays;
  const resolved = await destination(upstream, target, via, decided.blockedAddress, decided.dialed);
  if (!resolved.ok) throw resolved.refusal;
  const route = via === "tunnel" ? "tunnel" : "direct";
  let dialled: Duplex;
  try {
    dialled = await upstream.dialOnce(
      `${target.scheme}:`,
      target.host,
      via === "tunnel" ? null : resolved.address,
      via === "tunnel" ? target.port : resolved.port,
    );
  } catch (error) {
    if (error instanceof TunnelError) throw tunnelRefusal(target.host, error);
    throw error;
  }
  if (socket.destroyed) {
    dialled.destroy();
    return done({ decision: "error", reason: "client gone before the upgrade", status: 0, route });
  }
  const headers = upstreamHeaders(decided, swapped.headers);
  headers.push(["connection", "Upgrade"], ["upgrade", String(req.headers.upgrade)]);
  const answered = await new Promise<
    | { kind: "upgrade"; status: number; headers: IncomingMessage["headers"]; socket: Duplex; head: Buffer }
    | { kind: "response"; res: IncomingMessage }
  >((resolve, reject) => {
    const up = httpRequest({
      method: req.method ?? "GET",
      path: swapped.path,
      headers: headers.flat(),
      setHost: false,
      createConnection: () => dialled as Socket,
    });
    up.once("upgrade", (res: IncomingMessage, upSocket: Duplex, upHead: Buffer) =>
      resolve({
        kind: "upgrade",
        status: res.statusCode ?? 101,
        headers: res.headers,
        socket: upSocket,
        head: upHead,
      }),
    );
    up.once("response", (res: IncomingMessage) => resolve({ kind: "response", res }));
    // Kept for the request's life: a socket error while a declined answer streams lands here too.
    up.on("error", (e) => {
      dialled.destroy();
      reject(e);
    });
    socket.once("close", () => up.destroy());
    up.end();
  });

  if (answered.kind === "response") {
    // The upstream declined (a 401, a 404, a 426): its answer, masked like any, then close.
    const { res } = answered;
    const out = filterResponseHeaders(res.headers).map(([k, v]): [string, string] => [
      k,
      maskString(v, needles),
    ]);
    const decoders = needles.length > 0 ? decodersFor(res.headers["content-encoding"]) : [];
    if (decoders === null) {
      res.destroy();
      dialled.destroy();
      throw new Refusal(502, "error", "response encoding cannot be scrubbed", "Upstream request failed.\n");
    }
    const kept = out.filter(
      ([k]) =>
        !(
          k === "content-length" ||
          k === "transfer-encoding" ||
          (decoders.length > 0 && k === "content-encoding")
        ),
    );
    let bytesOut = 0;
    socket.write(responseHead(res.statusCode ?? 502, [...kept, ["connection", "close"]]));
    await pipeline([
      res,
      ...decoders,
      new RedactStream(needles),
      new Transform({
        transform(chunk: Buffer, _enc, cb) {
          bytesOut += chunk.length;
          cb(null, chunk);
        },
      }),
      socket,
    ]).catch(() => socket.destroy());
    dialled.destroy();
    return done({
      decision: "allow",
      reason: `upgrade declined by the upstream`,
      status: res.statusCode ?? 0,
      bytesOut,
      route,
      strayPlaceholders,
    });
  }

  const upgraded = answered;
  const out = filterResponseHeaders(upgraded.headers).map(([k, v]): [string, string] => [
    k,
    maskString(v, needles),
  ]);
  socket.write(
    responseHead(upgraded.status, [
      ...out,
      ["connection", "Upgrade"],
      ["upgrade", maskString(String(upgraded.headers.upgrade ?? req.headers.upgrade), needles)],
    ]),
  );
  // The upstream's first frames, read with its 101, go to the client before anything relayed.
  if (upgraded.head.length > 0) socket.write(upgraded.head);
  const result = await relay(socket, upgraded.socket, head, idleMs);
  const base = decided.rule ? "upgraded, credential injected" : "upgraded";
  done({
    decision: "allow",
    reason: result.error === null ? base : `${base}, ended: ${result.error}`,
    status: upgraded.status,
    bytesIn: result.bytesIn,
    bytesOut: result.bytesOut + upgraded.head.length,
    route,
    strayPlaceholders,
  });
}

/** An HTTP/1.1 status line and header block (values come from node's parser or the proxy). */
function responseHead(status: number, headers: ReadonlyArray<readonly [string, string]>): string {
  const lines = headers.map(([k, v]) => `${k}: ${v}\r\n`).join("");
  return `HTTP/1.1 ${status} ${STATUS_CODES[status] ?? "Unknown"}\r\n${lines}\r\n`;
}
