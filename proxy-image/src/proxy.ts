import {
  createServer as createHttpServer,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { createServer as createNetServer, type Server as NetServer, type Socket } from "node:net";
import { Transform } from "node:stream";
import { pipeline } from "node:stream/promises";
import { createSecureContext, TLSSocket } from "node:tls";
import {
  type AuditSource,
  MODEL_LANE_HOST,
  type ModelCallRow,
  PROBE_HEADER,
  WIRING_PROBE_HOST,
} from "../../src/contract/proxy-wire";
import { canonicalHost, splitHostPort } from "../../src/policy/host";
import type { RunCa } from "./ca";
import { COMPUTE_PATH_PREFIX, type ComputeLane } from "./compute-lane";
import { checkFraming, decodersFor, filterRequestHeaders, filterResponseHeaders } from "./http-rules";
import { inject } from "./inject";
import type { ModelLane } from "./model-lane";
import type { PolicyState } from "./policy-client";
import { maskString, needlesFor, RedactStream } from "./redact";
import { TunnelError } from "./tunnel-client";
import type { Upstream } from "./upstream";

// The proxy's one decision path. Three ways in (transparent TLS routed by SNI, plain HTTP routed
// by Host, an explicit proxy port for CONNECT and absolute-form requests), one handler: canonical
// host → host policy → rule → resolve and check the address → forward with the credential →
// scrub the credential from what comes back. Every request is decided on its own, so keep-alive
// and pipelined follow-ups are checked again (B6).

export type { PolicyState };

export interface PolicySource {
  current(): PolicyState;
}

export interface AuditSink {
  /** A refused host: by this proxy, or by the user's egress agent at the tunnel's far end. */
  recordBlocked(host: string, source?: AuditSource): void;
  recordRoute(host: string, route: "direct" | "tunnel" | "refused"): void;
  /** One call through the model lane (token counts; no prompt, no output). */
  recordModelCall(row: ModelCallRow): void;
  /** False when the spool is full: refuse new egress rather than lose audit rows (E3). */
  readonly accepting: boolean;
}

export interface DecisionRecord {
  event: "decision";
  conn: number;
  listener: Listener;
  host: string | null;
  port: number | null;
  method: string;
  decision: "allow" | "block" | "refuse" | "error";
  reason: string;
  status: number;
  rule: number | null;
  policyVersion: number | null;
  bytesIn: number;
  bytesOut: number;
  ms: number;
}

export type Listener = "tls" | "http" | "explicit";

export interface ProxyOptions {
  ca: RunCa;
  policy: PolicySource;
  audit: AuditSink;
  upstream: Upstream;
  log?: (record: DecisionRecord | Record<string, unknown>) => void;
  /** Bounds (F2). */
  limits?: Partial<Limits>;
  /** Forwards https://<probe host>/compute/... to the control plane (see compute-lane.ts). */
  computeLane?: ComputeLane;
  /** Serves the run's declared model at MODEL_LANE_HOST (see model-lane.ts). */
  modelLane?: ModelLane;
}

interface Limits {
  maxConnections: number;
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  keepAliveTimeoutMs: number;
  handshakeTimeoutMs: number;
  maxHeaderBytes: number;
}

const DEFAULT_LIMITS: Limits = {
  maxConnections: 2048,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 120_000,
  keepAliveTimeoutMs: 5_000,
  handshakeTimeoutMs: 10_000,
  maxHeaderBytes: 16 * 1024,
};

interface ConnInfo {
  id: number;
  listener: Listener;
  /** CONNECT target (explicit proxy), canonical. */
  connectHost?: string;
  connectPort?: number;
  policyVersion: number | null;
}

class Refusal extends Error {
  constructor(
    readonly status: number,
    readonly decision: DecisionRecord["decision"],
    readonly reason: string,
    readonly body: string,
    readonly headers: Record<string, string> = {},
  ) {
    super(reason);
  }
}

export function createProxy(options: ProxyOptions) {
  const limits = { ...DEFAULT_LIMITS, ...options.limits };
  const log = options.log ?? ((r) => process.stdout.write(`${JSON.stringify(r)}\n`));
  const info = new WeakMap<Socket, ConnInfo>();
  const sockets = new Set<Socket>();
  // Connections the proxy answered with `Connection: close`. RFC 9112 §9.6: no later request on
  // such a connection is processed, so a request pipelined behind a refused one is dropped, never
  // forwarded (its framing may be exactly what the refusal was about).
  const closing = new WeakSet<Socket>();
  // Requests dispatched on a socket whose responses have not finished, and the latest of them. A
  // parse error answers 400 only when it cannot land in, or ahead of, another request's response.
  const pending = new WeakMap<Socket, { count: number; last: [IncomingMessage, ServerResponse] }>();
  let nextConn = 1;

  const serverOptions = {
    insecureHTTPParser: false, // case A6: never lenient
    // A missing Host is refused by targetOf, through the refusal path that closes the connection
    // and drops what is pipelined behind it. Node's own check (requireHostHeader) answers 400 but,
    // on Node 24, still hands the next pipelined request to the handler.
    requireHostHeader: false,
    joinDuplicateHeaders: false,
    maxHeaderSize: limits.maxHeaderBytes,
    headersTimeout: limits.headersTimeoutMs,
    requestTimeout: limits.requestTimeoutMs,
    keepAliveTimeout: limits.keepAliveTimeoutMs,
    // Node checks the header and request deadlines on this period (30 s by default, which would
    // let a stalled connection live far past them): a fraction of the header deadline (F2).
    connectionsCheckingInterval: Math.max(50, Math.min(1_000, Math.floor(limits.headersTimeoutMs / 4))),
  };

  const versionNow = (): number | null => {
    const s = options.policy.current();
    return s.kind === "ready" ? s.policy.version : null;
  };

  function track(socket: Socket, listener: Listener, extra: Partial<ConnInfo> = {}): ConnInfo {
    const conn: ConnInfo = { id: nextConn++, listener, policyVersion: versionNow(), ...extra };
    info.set(socket, conn);
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    return conn;
  }

  // Decrypted traffic of both TLS ways in lands on this server; it never listens itself.
  const inner: Server = createHttpServer(serverOptions, (req, res) => void handle(req, res));
  const plain: Server = createHttpServer(serverOptions, (req, res) => void handle(req, res));
  const explicit: Server = createHttpServer(serverOptions, (req, res) => void handle(req, res));
  // Node starts a server's deadline checker on 'listening', which `inner` never emits by itself:
  // without this, header and request deadlines never apply to TLS traffic (slowloris, F2).
  inner.emit("listening");
  for (const server of [inner, plain, explicit]) {
    // Node's header deadline starts at a message's first byte, so a connection that never sends
    // one would stay open for good: give it as long to start, then close it (F2). Cleared when a
    // request arrives; Node sets its own keep-alive deadline after each response.
    server.on("connection", (socket: Socket) => socket.setTimeout(limits.headersTimeoutMs));
    server.on("clientError", (err: Error & { code?: string }, socket: Socket) => {
      // The parser refused the message (A1–A5 and friends): answer 400 and close, forward nothing.
      const conn = info.get(socket);
      log({
        event: "malformed",
        conn: conn?.id ?? 0,
        listener: conn?.listener ?? "http",
        code: err.code ?? "unknown",
      });
      const open = pending.get(socket);
      // Either nothing is outstanding, or the one outstanding request is the malformed message
      // itself (its body failed to parse) and nothing of its response is written yet.
      const mine =
        !open ||
        open.count === 0 ||
        (open.count === 1 && !open.last[0].complete && !open.last[1].headersSent);
      if (socket.writable && mine)
        socket.end("HTTP/1.1 400 Bad Request\r\nConnection: close\r\nContent-Length: 0\r\n\r\n");
      socket.destroy();
    });
  }
  plain.on("connection", (socket: Socket) => track(socket, "http"));
  explicit.on("connection", (socket: Socket) => track(socket, "explicit"));

  const noCertContext = createSecureContext({});

  function terminateTls(raw: Socket, conn: Omit<ConnInfo, "id" | "policyVersion">): void {
    const tls = new TLSSocket(raw, {
      isServer: true,
      // Shared placeholder until SNI picks the leaf: without it Node builds a context per connection.
      secureContext: noCertContext,
      ALPNProtocols: ["http/1.1"],
      SNICallback: (servername, cb) => {
        const host = canonicalHost(servername);
        if (!host) return cb(new Error("SNI is not a valid host name"), undefined);
        options.ca.contextFor(host).then(
          (ctx) => cb(null, ctx),
          (e: Error) => cb(e, undefined),
        );
      },
    });
    track(tls, conn.listener, conn);
    const handshake = setTimeout(() => tls.destroy(), limits.handshakeTimeoutMs);
    tls.once("secure", () => {
      clearTimeout(handshake);
      inner.emit("connection", tls);
    });
    tls.on("error", (e: Error & { code?: string }) => {
      clearTimeout(handshake);
      // A client that does not trust the run CA, no SNI, a bad handshake: nothing was forwarded.
      log({
        event: "tls_error",
        conn: info.get(tls)?.id ?? 0,
        listener: conn.listener,
        code: e.code ?? e.message,
      });
      tls.destroy();
      raw.destroy();
    });
  }

  const tlsListener: NetServer = createNetServer((raw) => {
    raw.on("error", () => raw.destroy());
    terminateTls(raw, { listener: "tls" });
  });
  tlsListener.maxConnections = limits.maxConnections;
  plain.maxConnections = limits.maxConnections;
  explicit.maxConnections = limits.maxConnections;

  explicit.on("connect", (req: IncomingMessage, socket: Socket, head: Buffer) => {
    socket.on("error", () => socket.destroy());
    socket.setTimeout(0); // the tunnel's TLS connection gets deadlines of its own
    const started = Date.now();
    const conn = info.get(socket);
    const target = splitHostPort(req.url ?? "");
    const reply = (
      status: number,
      reason: string,
      decision: DecisionRecord["decision"],
      host: string | null,
    ) => {
      log(record(conn, "CONNECT", host, target?.port ?? null, decision, reason, status, null, 0, 0, started));
      socket.end(
        `HTTP/1.1 ${status} ${status === 403 ? "Forbidden" : "Bad Request"}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`,
      );
    };
    if (!target || target.port === null) return reply(400, "CONNECT target is not host:port", "refuse", null);
    if (target.port !== 443)
      return reply(403, `CONNECT to port ${target.port}: only 443 leaves`, "refuse", target.host);
    // The wiring probe is let into the tunnel whatever the policy says, and answered inside it.
    if (target.host !== WIRING_PROBE_HOST) {
      const state = options.policy.current();
      if (state.kind !== "ready")
        return reply(403, "no valid policy: all egress denied", "refuse", target.host);
      if (state.index.decideHost(target.host).action === "block") {
        options.audit.recordBlocked(target.host);
        options.audit.recordRoute(target.host, "refused");
        return reply(403, "host blocked by policy", "block", target.host);
      }
    }
    socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
    if (head.length > 0) socket.unshift(head);
    terminateTls(socket, { listener: "explicit", connectHost: target.host, connectPort: target.port });
  });

  function record(
    conn: ConnInfo | undefined,
    method: string,
    host: string | null,
    port: number | null,
    decision: DecisionRecord["decision"],
    reason: string,
    status: number,
    rule: number | null,
    bytesIn: number,
    bytesOut: number,
    started: number,
  ): DecisionRecord {
    return {
      event: "decision",
      conn: conn?.id ?? 0,
      listener: conn?.listener ?? "http",
      host,
      port,
      method,
      decision,
      reason,
      status,
      rule,
      policyVersion: versionNow(),
      bytesIn,
      bytesOut,
      ms: Date.now() - started,
    };
  }

  interface Target {
    host: string;
    port: number;
    scheme: "https" | "http";
    path: string;
  }

  /** Works out which host this request is for, refusing any disagreement between the signals. */
  function targetOf(req: IncomingMessage, conn: ConnInfo): Target {
    const hostValues = hostHeaderValues(req);
    if (hostValues.length !== 1) throw bad(400, `expected one Host header, got ${hostValues.length}`);
    const hostHeader = splitHostPort(hostValues[0] as string);
    if (!hostHeader) throw bad(400, "Host header is not a valid host");
    const url = req.url ?? "";

    if (conn.listener === "explicit" && !(req.socket instanceof TLSSocket)) {
      // Absolute-form through the explicit proxy port: plain http only (https goes via CONNECT).
      let abs: URL;
      try {
        abs = new URL(url);
      } catch {
        throw bad(400, "a proxy request needs an absolute http:// URL");
      }
      if (abs.protocol !== "http:") throw bad(400, "only http:// absolute-form; use CONNECT for https");
      const host = canonicalHost(abs.host);
      if (!host) throw bad(400, "request URL host is not valid");
      if (host !== hostHeader.host) throw bad(400, "request URL host and Host header disagree"); // case A9
      const port = abs.port ? Number(abs.port) : 80;
      // A Host without a port means port 80: `http://h:8080/` with `Host: h` disagrees too.
      if ((hostHeader.port ?? 80) !== port) throw bad(400, "Host port disagrees with URL");
      return { host, port, scheme: "http", path: `${abs.pathname}${abs.search}` };
    }

    let authority: string;
    let port: number;
    let scheme: Target["scheme"];
    if (req.socket instanceof TLSSocket) {
      const sni = canonicalHost(String((req.socket as TLSSocket & { servername?: string }).servername ?? ""));
      if (!sni) throw misdirected("no usable SNI");
      if (conn.connectHost && sni !== conn.connectHost)
        throw misdirected("SNI differs from the CONNECT target");
      authority = conn.connectHost ?? sni;
      port = conn.connectPort ?? 443;
      scheme = "https";
    } else {
      authority = hostHeader.host;
      port = 80;
      scheme = "http";
    }
    // Domain fronting (A8), CONNECT-then-other-Host (A7), redirected-to-one-Host-for-another (A10).
    if (hostHeader.host !== authority) throw misdirected("Host header differs from the connection's host");
    if (hostHeader.port !== null && hostHeader.port !== port) throw misdirected("Host port differs");
    let path = url;
    if (!url.startsWith("/")) {
      // Absolute-form on a transparent connection: allowed only when it names the same host.
      let abs: URL;
      try {
        abs = new URL(url);
      } catch {
        throw bad(400, "request target is neither origin-form nor absolute-form");
      }
      if (canonicalHost(abs.host) !== authority)
        throw bad(400, "request URL host differs from the connection's host");
      path = `${abs.pathname}${abs.search}`;
    }
    return { host: authority, port, scheme, path };
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const socket = req.socket;
    socket.setTimeout(0);
    if (closing.has(socket)) return;
    const open = pending.get(socket) ?? { count: 0, last: [req, res] };
    open.count++;
    open.last = [req, res];
    pending.set(socket, open);
    res.once("close", () => open.count--);
    const started = Date.now();
    const conn = info.get(req.socket) ?? track(req.socket, "http");
    let target: Target | null = null;
    let rule: number | null = null;
    let bytesIn = 0;
    let bytesOut = 0;
    try {
      const framing = checkFraming(req.rawHeaders);
      if (framing) throw bad(400, framing);
      target = targetOf(req, conn);
      // Case I6: plain http through the explicit proxy port goes to port 80 only.
      if (conn.listener === "explicit" && target.scheme === "http" && target.port !== 80) {
        options.audit.recordRoute(target.host, "refused");
        throw new Refusal(
          403,
          "refuse",
          `plain http to port ${target.port}`,
          portBody(target.host, target.port),
        );
      }
      // The platform's own probe (wiring step): answered here, before policy, never audited and
      // never forwarded. It proves the redirect and the CA trust, not anything about the policy.
      if (target.host === WIRING_PROBE_HOST) {
        // The compute lane shares the platform's host: only over TLS to this proxy, only its path.
        if (options.computeLane && target.scheme === "https" && target.path.startsWith(COMPUTE_PATH_PREFIX)) {
          const status = await options.computeLane(req, res, target.path);
          log(
            record(
              conn,
              req.method ?? "?",
              target.host,
              target.port,
              "allow",
              "compute lane",
              status,
              null,
              0,
              0,
              started,
            ),
          );
          return;
        }
        throw probeRefusal();
      }
      // The declared model's lane: outside host policy by design (the model is what the user
      // asked to evaluate), but never without an audit trail: a full spool refuses it too.
      if (target.host === MODEL_LANE_HOST && options.modelLane) {
        if (!options.audit.accepting) throw spoolFull();
        const state = options.policy.current();
        const spec = state.kind === "ready" ? state.policy.model : null;
        const secret = spec && state.kind === "ready" ? state.secrets[spec.secret] : undefined;
        if (spec && secret === undefined)
          throw new Refusal(503, "refuse", "model secret missing", "Policy incomplete.\n");
        const outcome = await options.modelLane(
          req,
          res,
          target.path,
          spec && secret !== undefined ? { spec, secret } : null,
        );
        if (outcome.call) options.audit.recordModelCall(outcome.call);
        log(
          record(
            conn,
            req.method ?? "?",
            target.host,
            target.port,
            outcome.call ? "allow" : "refuse",
            outcome.call ? "model lane" : `model lane: ${outcome.code ?? "refused"}`,
            outcome.status,
            null,
            0,
            0,
            started,
          ),
        );
        return;
      }

      const state = options.policy.current();
      if (state.kind !== "ready") {
        // E4: no valid policy, never any egress.
        throw new Refusal(
          403,
          "refuse",
          `no valid policy (${state.kind})`,
          blockedBody(target.host, "no valid policy is loaded"),
        );
      }
      const decision = state.index.decideHost(target.host);
      if (decision.action === "block") {
        options.audit.recordBlocked(target.host);
        options.audit.recordRoute(target.host, "refused");
        throw new Refusal(403, "block", "host blocked by policy", blockedBody(target.host));
      }
      if (!options.audit.accepting) throw spoolFull();

      const match = state.index.matchRule(target.host);
      let injection: ReturnType<typeof inject> | null = null;
      let needles: Buffer[] = [];
      if (match) {
        const secret = state.secrets[match.rule.secret];
        if (secret === undefined)
          throw new Refusal(503, "refuse", "rule secret missing", "Policy incomplete.\n");
        rule = match.index;
        // B3: a credential only travels over verified TLS; a plain-http request is upgraded.
        if (target.scheme === "http") target = { ...target, scheme: "https", port: 443 };
        injection = inject(match.rule.inject, secret, target.path);
        needles = needlesFor(secret, injection.injected);
      }

      // Through the user's machine, or straight out. A tunnelled host is never sent direct: with
      // the agent away it is refused, and the agent resolves and checks the address itself.
      const viaTunnel = decision.via === "tunnel";
      if (viaTunnel && !options.upstream.tunnelUp()) {
        options.audit.recordRoute(target.host, "refused");
        throw new Refusal(503, "refuse", "egress tunnel down", tunnelDownBody(target.host));
      }
      const resolved: Awaited<ReturnType<Upstream["resolve"]>> = viaTunnel
        ? { ok: true, address: target.host, port: target.port }
        : await options.upstream.resolve(target.host, target.port, state.index.blockedAddress);
      // The rest of the message may have failed to parse meanwhile (bad chunk framing, A4): a
      // request the client side already lost is not started upstream.
      if (req.destroyed || socket.destroyed) throw bad(400, "the request failed before it was forwarded");
      if (!resolved.ok) {
        options.audit.recordRoute(target.host, "refused");
        if (resolved.kind !== "dns") options.audit.recordBlocked(target.host);
        throw new Refusal(
          resolved.kind === "dns" ? 502 : 403,
          resolved.kind === "blocked" ? "block" : "refuse",
          resolved.reason,
          resolved.kind === "dns"
            ? `Could not resolve ${target.host}.\n`
            : blockedBody(
                target.host,
                resolved.kind === "blocked"
                  ? "it resolves to an address this run's policy blocks"
                  : "it resolves to a private or reserved address",
              ),
        );
      }

      const headers = filterRequestHeaders(req.rawHeaders);
      headers.push([
        "host",
        target.port === (target.scheme === "https" ? 443 : 80)
          ? target.host
          : `${target.host}:${target.port}`,
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
              bytesIn += chunk.length;
              done(null, chunk);
            },
          })
        : null;
      if (body) pipeline(req, body).catch(() => {});
      const pool = viaTunnel
        ? options.upstream.tunnelPoolFor(`${target.scheme}:`, target.host, target.port)
        : options.upstream.poolFor(`${target.scheme}:`, target.host, resolved.address, resolved.port);
      if (pool === null) {
        options.audit.recordRoute(target.host, "refused");
        throw new Refusal(503, "refuse", "no egress tunnel", tunnelDownBody(target.host));
      }
      let upstreamRes: Awaited<ReturnType<typeof pool.request>>;
      try {
        upstreamRes = await pool.request({
          method: req.method ?? "GET",
          path: injection?.path ?? target.path,
          headers: headers.flat(),
          body,
        });
      } catch (error) {
        if (error instanceof TunnelError) throw tunnelRefusal(target.host, error, options.audit);
        throw error;
      }
      options.audit.recordRoute(target.host, viaTunnel ? "tunnel" : "direct");

      const outHeaders = filterResponseHeaders(upstreamRes.headers);
      const stages: Transform[] = [];
      if (injection) {
        // The upstream may compress anyway, even in layers: decode every layer so the scrubber
        // sees plain bytes. An encoding it cannot read could carry the secret past it: refuse.
        const decoders = decodersFor(upstreamRes.headers["content-encoding"]);
        if (decoders === null) {
          upstreamRes.body.on("error", () => {}).destroy();
          throw new Refusal(
            502,
            "error",
            "response encoding cannot be scrubbed",
            "Upstream request failed.\n",
          );
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
            bytesOut += chunk.length;
            done(null, chunk);
          },
        }),
      );
      res.writeHead(upstreamRes.statusCode, outHeaders.flat());
      // One pipeline, so an error in any stage (a corrupt gzip body, say) ends the response
      // instead of surfacing as an unhandled stream error.
      await pipeline([upstreamRes.body, ...stages, res]);
      log(
        record(
          conn,
          req.method ?? "?",
          target.host,
          target.port,
          "allow",
          rule === null ? "allowed" : "allowed, credential injected",
          upstreamRes.statusCode,
          rule,
          bytesIn,
          bytesOut,
          started,
        ),
      );
    } catch (e) {
      const refusal =
        e instanceof Refusal
          ? e
          : new Refusal(
              502,
              "error",
              `upstream failed: ${(e as Error & { code?: string }).code ?? (e as Error).name}`,
              "Upstream request failed.\n",
            );
      log(
        record(
          conn,
          req.method ?? "?",
          target?.host ?? null,
          target?.port ?? null,
          refusal.decision,
          refusal.reason,
          refusal.status,
          rule,
          bytesIn,
          bytesOut,
          started,
        ),
      );
      closing.add(req.socket);
      if (!res.headersSent) {
        res.writeHead(refusal.status, {
          ...refusal.headers,
          "content-type": "text/plain; charset=utf-8",
          "content-length": Buffer.byteLength(refusal.body),
          connection: "close",
        });
        res.end(refusal.body);
      } else {
        res.destroy();
      }
    }
  }

  return {
    tls: tlsListener,
    http: plain,
    explicit,
    /** Policy changed: close every connection opened under another version, and upstream pools. */
    async policyChanged(): Promise<void> {
      const now = versionNow();
      for (const s of sockets) {
        if (info.get(s)?.policyVersion !== now) s.destroy();
      }
      await options.upstream.closeAll();
    },
    async close(): Promise<void> {
      for (const s of sockets) s.destroy();
      inner.close(); // stops its deadline checker; it has no listening socket of its own
      await Promise.all(
        [tlsListener, plain, explicit].map(
          (srv) => new Promise<void>((resolve) => (srv.listening ? srv.close(() => resolve()) : resolve())),
        ),
      );
      await options.upstream.closeAll();
    },
  };
}

function hostHeaderValues(req: IncomingMessage): string[] {
  const out: string[] = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) {
    if (req.rawHeaders[i]?.toLowerCase() === "host") out.push(req.rawHeaders[i + 1] ?? "");
  }
  return out;
}

function bad(status: number, reason: string): Refusal {
  return new Refusal(status, "refuse", reason, `Bad request: ${reason}.\n`);
}

function probeRefusal(): Refusal {
  return new Refusal(
    403,
    "refuse",
    "wiring probe",
    "Benchwright wiring probe: this request reached the run's proxy.\n",
    { [PROBE_HEADER]: "refused" },
  );
}

function tunnelDownBody(host: string): string {
  return [
    `Refused by Benchwright: ${host} goes out through the run owner's own machine, and their egress agent is not connected.`,
    "It is never sent direct instead. Start the egress agent (the run's page says how) and try again.",
    "",
  ].join("\n");
}

/** The user's egress agent refused the connection (or it is gone): recorded, never retried direct. */
function tunnelRefusal(host: string, error: TunnelError, audit: AuditSink): Refusal {
  audit.recordRoute(host, "refused");
  switch (error.kind) {
    case "blocked":
    case "address":
      // The agent is the second enforcement point: its refusals are audited as its own.
      audit.recordBlocked(host, "local_agent");
      return new Refusal(
        403,
        "block",
        `refused by the egress agent (${error.kind})`,
        blockedBody(
          host,
          error.kind === "blocked"
            ? "the egress agent on the run owner's machine blocks it"
            : "on the run owner's network it resolves to an address the egress agent does not dial",
        ),
      );
    case "down":
      return new Refusal(503, "refuse", "egress tunnel down", tunnelDownBody(host));
    case "dns":
      return new Refusal(
        502,
        "refuse",
        "the egress agent could not resolve it",
        `Could not resolve ${host}.\n`,
      );
    default:
      return new Refusal(
        502,
        "error",
        `the egress agent could not connect (${error.kind})`,
        "Upstream request failed.\n",
      );
  }
}

function spoolFull(): Refusal {
  return new Refusal(
    503,
    "refuse",
    "audit spool full",
    "Egress paused: the run's audit log cannot be delivered yet.\n",
  );
}

function misdirected(reason: string): Refusal {
  return new Refusal(421, "refuse", reason, `Misdirected request: ${reason}.\n`);
}

function portBody(host: string, port: number): string {
  return [
    `Refused by Benchwright: http://${host}:${port}/ is not reachable from this run; plain http through the proxy goes to port 80 only.`,
    "Use port 80, or https (CONNECT to port 443).",
    "",
  ].join("\n");
}

/** What the agent reads when a host is refused: which host, why, and what the owner can do. */
function blockedBody(host: string, why = "this run's policy blocks it"): string {
  return [
    `Blocked by Benchwright: ${host} is not reachable from this run because ${why}.`,
    "The run's owner can allow it in the vault (Host policy → allow) and the change reaches this run within seconds.",
    "",
  ].join("\n");
}
