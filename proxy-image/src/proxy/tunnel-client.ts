import {
  type ClientHttp2Session,
  type ClientHttp2Stream,
  constants as h2,
  connect as http2Connect,
  type IncomingHttpHeaders,
} from "node:http2";
import { isIP, type Socket } from "node:net";
import type { Duplex } from "node:stream";
import { type SecureContext, connect as tlsConnect } from "node:tls";
import type { LogRecord } from "@benchwright/shared/contract/log";
import { bearer } from "@benchwright/shared/contract/proxy-wire";
import {
  CLOSE_REPLACED,
  CLOSE_RUN_ENDED,
  MAX_TUNNEL_MESSAGE,
  PAIRED,
  REFUSAL_HEADER,
  SESSION_WINDOW,
  STREAM_WINDOW,
  TunnelRefusal,
  toWebSocketUrl,
  tunnelPath,
} from "@benchwright/shared/contract/tunnel";
import { createWebSocketStream, WebSocket } from "ws";

// The proxy's end of the egress tunnel (shared/contract/tunnel.ts): it dials the control plane's
// relay, waits for PAIRED, and speaks HTTP/2 as the client over the WebSocket's bytes; each
// upstream connection is one CONNECT stream that the user's egress agent answers. HTTP/2 is
// node:http2 — maintained, in Node core, no extra dependency — and its per-stream and
// per-connection flow control is the tunnel's back-pressure: a slow reader here stops the window
// updates, so the agent stops reading its upstream socket, so the upstream's TCP window closes.
//
// While no session is paired the tunnel is down and open() refuses ("down"): tunnelled egress
// never silently goes direct. The bytes in a stream are the proxy's own TLS with the upstream
// (tunnelConnect), so the agent and the relay never see a request or a credential.

export type TunnelErrorKind = TunnelRefusal | "down";

/** Why a tunnelled connection could not be had. The message names the target, never a secret. */
export class TunnelError extends Error {
  override readonly name = "TunnelError";
  constructor(
    readonly kind: TunnelErrorKind,
    message: string,
  ) {
    super(message);
  }
}

export interface TunnelClientOptions {
  /** Base URL of the control plane (http(s) or ws(s)); the WebSocket goes to tunnelPath(runId). */
  controlPlaneUrl: string;
  runId: string;
  proxyToken: string;
  log?: (record: LogRecord) => void;
  /** Reconnect backoff, doubled per failure up to max, reset by a pairing. Default 200..5000. */
  reconnectMs?: { min: number; max: number };
  /** How long open() waits for the agent's answer. Default 15 s. */
  openTimeoutMs?: number;
}

/** The authority of the tunnel's HTTP/2 connection: a placeholder, nothing resolves it. */
const SESSION_AUTHORITY = "http://egress-agent.benchwright.invalid";
const KEEPALIVE_MS = 30_000;

/** `host:port` with an IPv6 literal in brackets, as `:authority` wants it. */
export function authorityOf(host: string, port: number): string {
  const bracketed = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host;
  return `${bracketed}:${port}`;
}

export class TunnelClient {
  private readonly options: TunnelClientOptions;
  private readonly log: (record: LogRecord) => void;
  private readonly listeners = new Set<(up: boolean) => void>();
  private ws: WebSocket | null = null;
  private session: ClientHttp2Session | null = null;
  private isUp = false;
  private started = false;
  private stopped = false;
  private failures = 0;
  private timer: NodeJS.Timeout | null = null;
  private keepalive: NodeJS.Timeout | null = null;

  constructor(options: TunnelClientOptions) {
    this.options = options;
    this.log = options.log ?? (() => {});
    // Fail at construction, not at the first dial, on a URL we could never use.
    toWebSocketUrl(options.controlPlaneUrl, tunnelPath(options.runId));
  }

  /** A session is open and paired with an agent: open() can succeed. */
  get up(): boolean {
    return this.isUp;
  }

  /** Called with every change of `up`. Returns the unsubscribe function. */
  onChange(listener: (up: boolean) => void): () => void {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  }

  start(): void {
    if (this.started || this.stopped) return;
    this.started = true;
    this.dial();
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const ws = this.ws;
    this.teardown();
    if (ws && ws.readyState !== WebSocket.CLOSED) {
      const closed = new Promise<void>((resolve) => ws.once("close", () => resolve()));
      ws.close(1000, "proxy stopping");
      // A peer that never answers the close handshake does not hold us up.
      const force = setTimeout(() => ws.terminate(), 2_000);
      await closed;
      clearTimeout(force);
    }
  }

  /**
   * One upstream connection through the user's machine: a CONNECT stream to host:port (host
   * canonical; an IPv6 literal with or without brackets). Resolves once the agent answered 200,
   * with the stream as a byte pipe; rejects with a TunnelError otherwise.
   */
  open(host: string, port: number, signal?: AbortSignal): Promise<Duplex> {
    const target = authorityOf(host, port);
    const session = this.session;
    if (!this.isUp || !session || session.closed || session.destroyed) {
      return Promise.reject(new TunnelError("down", `the egress tunnel is down (${target} refused)`));
    }
    if (signal?.aborted) return Promise.reject(signal.reason);
    return new Promise<Duplex>((resolve, reject) => {
      let stream: ClientHttp2Stream;
      try {
        stream = session.request({
          [h2.HTTP2_HEADER_METHOD]: "CONNECT",
          [h2.HTTP2_HEADER_AUTHORITY]: target,
        });
      } catch {
        // The session went away between the check and the request.
        reject(new TunnelError("down", `the egress tunnel is down (${target} refused)`));
        return;
      }
      // Errors after the answer reach whoever reads the stream through 'close'; none may go
      // unhandled in between (the proxy must not crash on a peer's reset).
      stream.on("error", () => {});
      let settled = false;
      const finish = (error: unknown | null) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        stream.off("response", onResponse);
        stream.off("close", onClose);
        stream.off("error", onError);
        if (error === null) {
          resolve(stream);
          return;
        }
        // Answered or not, this stream is finished: cancel it so neither side holds it.
        if (!stream.destroyed) stream.close(h2.NGHTTP2_CANCEL);
        reject(error);
      };
      const timeoutMs = this.options.openTimeoutMs ?? 15_000;
      const timer = setTimeout(
        () => finish(new TunnelError("unreachable", `the egress agent did not answer for ${target}`)),
        timeoutMs,
      );
      const onAbort = () => finish(signal?.reason ?? new Error("aborted"));
      const onResponse = (headers: IncomingHttpHeaders) => {
        const status = Number(headers[h2.HTTP2_HEADER_STATUS]);
        if (status === 200) {
          finish(null);
          return;
        }
        const named = TunnelRefusal.safeParse(headers[REFUSAL_HEADER]);
        const kind: TunnelRefusal = named.success ? named.data : "unreachable";
        finish(new TunnelError(kind, `the egress agent refused ${target}: ${kind}`));
      };
      const downOrUnreachable = () =>
        this.isUp && this.session === session && !session.destroyed
          ? new TunnelError("unreachable", `the tunnel stream to ${target} failed before the agent answered`)
          : new TunnelError("down", `the egress tunnel went down while opening ${target}`);
      const onClose = () => finish(downOrUnreachable());
      const onError = () => finish(downOrUnreachable());
      stream.on("response", onResponse);
      stream.on("close", onClose);
      stream.on("error", onError);
      signal?.addEventListener("abort", onAbort, { once: true });
    });
  }

  private dial(): void {
    if (this.stopped) return;
    const url = toWebSocketUrl(this.options.controlPlaneUrl, tunnelPath(this.options.runId));
    const ws = new WebSocket(url, {
      headers: { authorization: bearer(this.options.proxyToken) },
      perMessageDeflate: false,
      maxPayload: MAX_TUNNEL_MESSAGE,
      handshakeTimeout: 10_000,
    });
    this.ws = ws;
    const current = () => this.ws === ws;
    ws.on("unexpected-response", (_request, response) => {
      this.log({ event: "tunnel_refused", status: response.statusCode ?? 0 });
      response.resume();
      // Handling this event leaves the socket connecting for ever; terminate() gives the 'close'
      // that schedules the next attempt.
      ws.terminate();
    });
    let ping: NodeJS.Timeout | null = null;
    ws.on("open", () => {
      if (!current()) return;
      this.log({ event: "tunnel_connected" });
      // Keeps a socket that waits for its peer alive through intermediaries that drop idle ones.
      ping = setInterval(() => ws.ping(), KEEPALIVE_MS);
      ping.unref();
    });
    ws.on("message", (data, isBinary) => {
      if (!current() || isBinary) return;
      if (data.toString() !== PAIRED) return;
      if (this.session) {
        // A second PAIRED means a new peer on a socket that carries the old session's bytes:
        // start over on a fresh socket rather than mix two HTTP/2 connections.
        this.log({ event: "tunnel_repaired" });
        ws.terminate();
        return;
      }
      this.pair(ws);
    });
    ws.on("error", (error) => {
      // 'close' follows; the message is the transport's (no header or token is in it).
      if (current()) this.log({ event: "tunnel_error", message: error.message.slice(0, 200) });
    });
    ws.on("close", (code) => {
      if (ping) clearInterval(ping);
      if (!current()) return;
      this.teardown();
      this.log({ event: "tunnel_disconnected", code });
      if (this.stopped) return;
      if (code === CLOSE_RUN_ENDED || code === CLOSE_REPLACED) {
        // The run is over, or a newer proxy for this run took over: nothing to come back for.
        this.stopped = true;
        this.log({ event: "tunnel_stopped", why: code === CLOSE_RUN_ENDED ? "run ended" : "replaced" });
        return;
      }
      this.scheduleReconnect();
    });
  }

  private pair(ws: WebSocket): void {
    // Created inside the PAIRED handler, synchronously: the agent's first bytes may be the very
    // next message, and a message with no listener yet would be lost.
    const duplex = createWebSocketStream(ws);
    duplex.on("error", () => {}); // the session and the socket's close report it
    const session = http2Connect(SESSION_AUTHORITY, {
      createConnection: () => duplex as unknown as Socket,
      settings: { initialWindowSize: STREAM_WINDOW, enablePush: false },
    });
    this.session = session;
    this.log({ event: "tunnel_paired" });
    session.on("remoteSettings", () => {
      if (this.session !== session || this.isUp) return;
      session.setLocalWindowSize(SESSION_WINDOW);
      this.failures = 0;
      this.setUp(true);
    });
    session.on("error", (error) => {
      this.log({ event: "tunnel_session_error", message: error.message.slice(0, 200) });
    });
    session.on("close", () => {
      // The HTTP/2 connection is the pair: without it the socket is useless, start over.
      if (this.session !== session) return;
      this.teardown();
      if (this.ws === ws) ws.terminate();
    });
    // An HTTP/2 PING end to end: keeps idle sockets alive through the relay, and a pair whose
    // far end vanished without a close (no answer by the next PING) is given up and redialled.
    let awaiting = false;
    this.keepalive = setInterval(() => {
      if (session.destroyed) return;
      if (awaiting) {
        session.destroy();
        return;
      }
      awaiting = true;
      const sent = session.ping((error) => {
        awaiting = false;
        if (error) session.destroy();
      });
      if (!sent) session.destroy();
    }, KEEPALIVE_MS);
    this.keepalive.unref();
  }

  private teardown(): void {
    if (this.keepalive) clearInterval(this.keepalive);
    this.keepalive = null;
    const session = this.session;
    this.session = null;
    if (session && !session.destroyed) session.destroy();
    this.setUp(false);
  }

  private setUp(up: boolean): void {
    if (this.isUp === up) return;
    this.isUp = up;
    this.log({ event: up ? "tunnel_up" : "tunnel_down" });
    for (const listener of this.listeners) {
      try {
        listener(up);
      } catch {
        // A listener's failure is its own.
      }
    }
  }

  private scheduleReconnect(): void {
    const { min, max } = this.options.reconnectMs ?? { min: 200, max: 5_000 };
    const ceiling = Math.min(max, min * 2 ** Math.min(this.failures, 20));
    this.failures += 1;
    // Jitter: a relay restart must not see every proxy come back in the same millisecond.
    const delay = Math.round(ceiling / 2 + (Math.random() * ceiling) / 2);
    this.timer = setTimeout(() => {
      this.timer = null;
      this.dial();
    }, delay);
  }
}

export interface TunnelConnectOptions {
  /** Trust roots for upstream TLS (the proxy's usual ones). */
  secureContext: SecureContext;
  /** Bound on the CONNECT answer plus the TLS handshake. */
  timeoutMs: number;
}

/** undici's connector callback (its types say net.Socket; a Duplex serves, see the http: case). */
type ConnectCallback = (...args: [null, Socket] | [Error, null]) => void;
interface ConnectOpts {
  hostname: string;
  host?: string;
  protocol: string;
  port: string | number;
  servername?: string | null;
}

/**
 * An undici `connect` function (the Pool option; see undici's buildConnector) that opens each
 * connection as a tunnel stream. https: TLS with the upstream inside the stream, verified against
 * the host name (SNI omitted for an IP literal); http: the stream itself. Failures reach the
 * caller of pool.request() as the TunnelError itself (undici passes connect errors through).
 */
export function tunnelConnect(client: TunnelClient, options: TunnelConnectOptions) {
  return (opts: ConnectOpts, callback: ConnectCallback): void => {
    const https = opts.protocol === "https:";
    const port = Number(opts.port) || (https ? 443 : 80);
    const host = opts.hostname;
    const bare = host.replace(/^\[|\]$/g, "");
    const controller = new AbortController();
    let done = false;
    let socket: Duplex | null = null;
    let raw: Duplex | null = null;
    const finish = (error: Error | null, result: Duplex | null) => {
      if (done) return;
      done = true;
      clearTimeout(timer);
      if (error || !result) {
        socket?.destroy();
        raw?.destroy();
        callback(error ?? new TunnelError("unreachable", "no connection"), null);
        return;
      }
      callback(null, result as Socket);
    };
    const timer = setTimeout(() => {
      const error = new TunnelError("unreachable", `connecting to ${authorityOf(bare, port)} timed out`);
      controller.abort(error);
      finish(error, null);
    }, options.timeoutMs);
    client.open(bare, port, controller.signal).then(
      (stream) => {
        if (done) {
          stream.destroy();
          return;
        }
        raw = stream;
        if (!https) {
          // The stream itself, no shims: undici 7's HTTP/1.1 client calls ref/unref only when
          // present and sets TCP options only in its own connector (tested over plain http).
          socket = stream;
          finish(null, socket);
          return;
        }
        const servername = opts.servername || (isIP(bare) ? undefined : bare);
        const tls = tlsConnect({
          socket: stream as unknown as Socket,
          ...(servername ? { servername } : {}),
          secureContext: options.secureContext,
          rejectUnauthorized: true,
          ALPNProtocols: ["http/1.1"],
        });
        socket = tls;
        tls.once("secureConnect", () => finish(null, tls));
        // A failed handshake (a bad certificate) is the TLS error itself, not a tunnel refusal.
        tls.once("error", (error) => finish(error, null));
        tls.once("close", () => finish(new TunnelError("unreachable", "the tunnel stream closed"), null));
      },
      (error: Error) => finish(error, null),
    );
  };
}
