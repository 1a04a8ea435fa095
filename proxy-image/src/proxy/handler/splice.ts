import type { Socket } from "node:net";
import type { Duplex } from "node:stream";

// A spliced connection: the client's TLS goes to the upstream untouched, so the client sees the
// upstream's own certificate and negotiates what it likes with it (h2, gRPC, WebSocket, a pinned
// key). The decision was made on the ClientHello's SNI before this (decide.ts spliceable), and
// the upstream socket was dialled to the address checked for exactly that name. From here on the
// proxy only moves bytes: pipe() carries backpressure both ways (a slow reader pauses the other
// side), and a connection silent both ways for `idleMs` is closed.

export interface SpliceResult {
  /** Client to upstream, the buffered ClientHello included. */
  bytesIn: number;
  /** Upstream to client. */
  bytesOut: number;
  /** What ended it abnormally (a socket error code, "idle timeout"); null for a clean close. */
  error: string | null;
}

const HANG_UPS = new Set(["EPIPE", "ECONNRESET", "ERR_HTTP2_STREAM_ERROR"]);

/** Relays until both sides have closed; `first` (what was read of the client so far) goes first. */
export function relay(
  client: Socket,
  upstream: Socket | Duplex,
  first: Buffer,
  idleMs: number,
): Promise<SpliceResult> {
  return new Promise((resolve) => {
    const result: SpliceResult = { bytesIn: first.length, bytesOut: 0, error: null };
    const fail = (why: string) => {
      // A peer that hangs up abruptly (a reset, a write after its close; through the egress
      // tunnel, its stream reset) ends a relay normally.
      if (!HANG_UPS.has(why)) result.error ??= why;
      client.destroy();
      upstream.destroy();
    };
    let open = 2;
    const closed = (other: Socket | Duplex) => () => {
      // One side is gone: finish writing to the other, and keep reading it (pipe() stopped when
      // its destination closed) so its own close is seen; the idle timeout ends one that stalls.
      if (!other.writableEnded) other.end();
      other.resume();
      if (--open === 0) resolve(result);
    };
    client.on("error", (e: Error & { code?: string }) => fail(e.code ?? "client error"));
    upstream.on("error", (e: Error & { code?: string }) => fail(e.code ?? "upstream error"));
    client.once("close", closed(upstream));
    upstream.once("close", closed(client));
    client.setTimeout(idleMs, () => fail("idle timeout"));
    // A plain stream through the egress tunnel has no timer of its own; the client's covers it.
    if ("setTimeout" in upstream) upstream.setTimeout(idleMs, () => fail("idle timeout"));
    // The client sent its bytes as it chose to; holding a small segment back (Nagle) only adds a
    // round trip's wait to a relayed request or answer.
    client.setNoDelay(true);
    if ("setNoDelay" in upstream) upstream.setNoDelay(true);
    upstream.write(first);
    client.on("data", (chunk: Buffer) => {
      result.bytesIn += chunk.length;
    });
    upstream.on("data", (chunk: Buffer) => {
      result.bytesOut += chunk.length;
    });
    client.pipe(upstream);
    upstream.pipe(client);
  });
}
