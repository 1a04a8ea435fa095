import {
  createServer as createHttpServer,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { createServer as createNetServer, type Server as NetServer, type Socket } from "node:net";
import { createSecureContext, TLSSocket } from "node:tls";
import { MODEL_LANE_HOST, WIRING_PROBE_HOST } from "../../../src/contract/proxy-wire";
import { canonicalHost } from "../../../src/policy/host";
import type { RunCa } from "../ca";
import type { ComputeLane } from "../compute-lane";
import { checkFraming } from "../http-rules";
import type { ModelLane } from "../model-lane";
import type { PolicyState } from "../policy-client";
import type { Upstream } from "../upstream";
import { readClientHello } from "./client-hello";
import { type DecideContext, type Decision, decide, destination, spliceable } from "./decide";
import { type Exchange, forwardHttp1 } from "./forward";
import { createStreamServer } from "./h2";
import {
  type AuditSink,
  auditRows,
  type DecisionRecord,
  type Listener,
  type RecordInput,
  record,
} from "./record";
import { bad, blockedRefusal, Refusal, type RefusalAudit, toRefusal } from "./refusal";
import { relay } from "./splice";
import {
  connectTarget,
  explicitPortRefusal,
  helloTarget,
  type Target,
  type TargetConn,
  targetOf,
} from "./target";
import { handleUpgrade, type UpgradeContext, upgradeWanted } from "./upgrade";

// The proxy's ways in and its one handler. Three ways in (transparent TLS routed by SNI, plain
// HTTP routed by Host, an explicit proxy port for CONNECT and absolute-form requests), one path
// for every request: what was asked (target.ts) -> the decision as a value (decide.ts: lanes,
// host policy, rule, route) -> forward with the credential and scrub it from what comes back
// (forward.ts) -> one record, from which the audit rows are derived (record.ts). Every request is
// decided on its own, so keep-alive and pipelined follow-ups are checked again (B6), and so is
// every HTTP/2 stream (h2.ts, I1) and every Upgrade handshake (upgrade.ts, I2).

export type { AuditSink, DecisionRecord, Listener, PolicyState };

export interface PolicySource {
  current(): PolicyState;
}

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
  /** Relay allowed hosts without a rule untouched under catch-all routing (default true). */
  splice?: boolean;
}

interface Limits {
  maxConnections: number;
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  keepAliveTimeoutMs: number;
  handshakeTimeoutMs: number;
  maxHeaderBytes: number;
  /** A spliced connection silent both ways this long is closed. */
  spliceIdleTimeoutMs: number;
}

const DEFAULT_LIMITS: Limits = {
  maxConnections: 2048,
  headersTimeoutMs: 10_000,
  requestTimeoutMs: 120_000,
  keepAliveTimeoutMs: 5_000,
  handshakeTimeoutMs: 10_000,
  maxHeaderBytes: 16 * 1024,
  spliceIdleTimeoutMs: 300_000,
};

interface ConnInfo extends TargetConn {
  id: number;
  policyVersion: number | null;
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
    // Upgrade requests go to handleUpgrade (I2), except h2c, forwarded as a plain request with
    // its Upgrade stripped, as before.
    shouldUpgradeCallback: upgradeWanted,
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

  const upgradeContext: UpgradeContext = {
    upstream: options.upstream,
    decideContext: () => decideContext(),
    versionNow,
    emit: (r) => emit(r),
    connOf: (socket) => info.get(socket) ?? track(socket, "http"),
    idleMs: limits.spliceIdleTimeoutMs,
  };
  for (const server of [inner, plain, explicit]) {
    server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
      void handleUpgrade(upgradeContext, req, socket, head);
    });
  }
  // HTTP/2 connections (ALPN h2) of both TLS ways in: each stream decided on its own (I1).
  const streams = createStreamServer(
    { upstream: options.upstream, decideContext: () => decideContext(), versionNow, emit: (r) => emit(r) },
    limits,
  );

  const noCertContext = createSecureContext({});

  function terminateTls(raw: Socket, conn: Omit<ConnInfo, "id" | "policyVersion">): void {
    const tls = new TLSSocket(raw, {
      isServer: true,
      // Shared placeholder until SNI picks the leaf: without it Node builds a context per connection.
      secureContext: noCertContext,
      // h2 when the client offers it, for every host but the platform's own (their lanes speak
      // HTTP/1.1); no ALPN at all from the client means HTTP/1.1, as always.
      ALPNCallback: ({ servername, protocols }) => {
        const host = canonicalHost(servername ?? "");
        if (protocols.includes("h2") && host !== WIRING_PROBE_HOST && host !== MODEL_LANE_HOST) return "h2";
        return protocols.includes("http/1.1") ? "http/1.1" : undefined;
      },
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
      const conn = info.get(tls);
      if (tls.alpnProtocol === "h2" && conn) streams.serve(tls, conn);
      else inner.emit("connection", tls);
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

  /**
   * A TLS connection on either way in: spliced when its ClientHello names a host that decide.ts
   * lets through untouched (I3), else terminated. Only under catch-all routing is the
   * ClientHello read first; otherwise the connection goes straight to termination, as always.
   */
  function acceptTls(raw: Socket, conn: Omit<ConnInfo, "id" | "policyVersion">): void {
    const state = options.policy.current();
    if (options.splice === false || state.kind !== "ready" || state.policy.routing.mode !== "catch-all") {
      terminateTls(raw, conn);
      return;
    }
    readClientHello(raw, limits.handshakeTimeoutMs).then(
      (read) => {
        const ctx = decideContext();
        const host =
          read.parse.status === "done" && !read.parse.ech ? helloTarget(read.parse.sni, conn) : null;
        const decided = host === null ? null : spliceable(host, ctx);
        if (host === null || decided === null) {
          // Not spliced: the very bytes read go to the TLS terminator, which decides per request.
          raw.unshift(read.bytes);
          return terminateTls(raw, conn);
        }
        void spliceTo(raw, conn, decided, read.bytes, ctx.policy);
      },
      (e: Error & { code?: string }) => {
        log({
          event: "tls_error",
          conn: info.get(raw)?.id ?? 0,
          listener: conn.listener,
          code: e.code ?? e.message,
        });
        raw.destroy();
      },
    );
  }

  /** Resolves and checks the SNI's host as forwarding does, dials exactly that address, relays. */
  async function spliceTo(
    raw: Socket,
    connInfo: Omit<ConnInfo, "id" | "policyVersion">,
    decided: Extract<Decision, { kind: "forward" }>,
    hello: Buffer,
    policy: PolicyState,
  ): Promise<void> {
    const started = Date.now();
    const version = policy.kind === "ready" ? policy.policy.version : null;
    // Counted like any connection: policyChanged() and close() end it; the listener caps it.
    const conn = info.get(raw) ?? track(raw, connInfo.listener, connInfo);
    conn.policyVersion = version;
    const { target } = decided;
    const finish = (decision: DecisionRecord["decision"], reason: string, extra: Partial<RecordInput> = {}) =>
      emit(
        record({
          conn,
          method: "TLS",
          host: target.host,
          port: target.port,
          decision,
          reason,
          status: 0,
          started,
          policyVersion: version,
          mode: "splice",
          ...extra,
        }),
      );
    const resolved = await destination(options.upstream, target, decided.via, decided.blockedAddress);
    if (raw.destroyed) return;
    if (!resolved.ok) {
      // DNS failure, a private or reserved address: nothing dialled. Terminated instead, where
      // the same check refuses it readably (403 / 502) and the audit records it.
      raw.unshift(hello);
      return terminateTls(raw, connInfo);
    }
    let upstream: Socket;
    try {
      upstream = await options.upstream.dialRaw(resolved.address, resolved.port);
    } catch (e) {
      raw.destroy();
      return finish(
        "error",
        `upstream failed: ${(e as Error & { code?: string }).code ?? (e as Error).name}`,
        {
          bytesIn: hello.length,
        },
      );
    }
    if (raw.destroyed) {
      upstream.destroy();
      return;
    }
    const result = await relay(raw, upstream, hello, limits.spliceIdleTimeoutMs);
    finish("allow", result.error === null ? "spliced" : `spliced, ended: ${result.error}`, {
      bytesIn: result.bytesIn,
      bytesOut: result.bytesOut,
      route: "direct",
    });
  }

  const decideContext = (): DecideContext => ({
    policy: options.policy.current(),
    accepting: options.audit.accepting,
    tunnelUp: options.upstream.tunnelUp(),
    lanes: { compute: options.computeLane !== undefined, model: options.modelLane !== undefined },
  });

  const tlsListener: NetServer = createNetServer((raw) => {
    raw.on("error", () => raw.destroy());
    acceptTls(raw, { listener: "tls" });
  });
  tlsListener.maxConnections = limits.maxConnections;
  plain.maxConnections = limits.maxConnections;
  explicit.maxConnections = limits.maxConnections;

  explicit.on("connect", (req: IncomingMessage, socket: Socket, head: Buffer) => {
    socket.on("error", () => socket.destroy());
    socket.setTimeout(0); // the tunnel's TLS connection gets deadlines of its own
    const started = Date.now();
    const conn = info.get(socket);
    const target = connectTarget(req.url);
    const reply = (refusal: Refusal, host: string | null) => {
      emit(
        record({
          conn,
          method: "CONNECT",
          host,
          port: target?.port ?? null,
          decision: refusal.decision,
          reason: refusal.reason,
          status: refusal.status,
          started,
          policyVersion: versionNow(),
          ...refusal.audit,
        }),
      );
      socket.end(
        `HTTP/1.1 ${refusal.status} ${refusal.status === 403 ? "Forbidden" : "Bad Request"}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`,
      );
    };
    if (!target || target.port === null)
      return reply(connectRefusal(400, "CONNECT target is not host:port"), null);
    if (target.port !== 443)
      return reply(connectRefusal(403, `CONNECT to port ${target.port}: only 443 leaves`), target.host);
    // The wiring probe is let into the tunnel whatever the policy says, and answered inside it.
    if (target.host !== WIRING_PROBE_HOST) {
      const state = options.policy.current();
      if (state.kind !== "ready")
        return reply(connectRefusal(403, "no valid policy: all egress denied"), target.host);
      if (state.index.decideHost(target.host).action === "block")
        return reply(blockedRefusal(target.host), target.host);
    }
    socket.write("HTTP/1.1 200 Connection Established\r\n\r\n");
    if (head.length > 0) socket.unshift(head);
    acceptTls(socket, { listener: "explicit", connectHost: target.host, connectPort: target.port });
  });

  /** A record's one way out: the log line, and the audit rows derived from the same record. */
  function emit(r: DecisionRecord): void {
    log(r);
    auditRows(options.audit, r);
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
    const exchange: Exchange = { bytesIn: 0, bytesOut: 0, route: null };
    const finish = (
      decision: DecisionRecord["decision"],
      reason: string,
      status: number,
      audit: RefusalAudit = {},
    ) =>
      emit(
        record({
          conn,
          method: req.method ?? "?",
          host: target?.host ?? null,
          port: target?.port ?? null,
          decision,
          reason,
          status,
          rule,
          bytesIn: exchange.bytesIn,
          bytesOut: exchange.bytesOut,
          started,
          policyVersion: versionNow(),
          route: audit.route ?? exchange.route,
          ...(audit.blockedBy ? { blockedBy: audit.blockedBy } : {}),
        }),
      );
    try {
      const framing = checkFraming(req.rawHeaders);
      if (framing) throw bad(400, framing);
      target = targetOf(req, conn);
      const portRefusal = explicitPortRefusal(conn, target);
      if (portRefusal) throw portRefusal;
      const decided = decide(target, decideContext());
      switch (decided.kind) {
        case "refuse":
          rule = decided.rule;
          throw decided.refusal;
        case "compute": {
          const status = await (options.computeLane as ComputeLane)(req, res, target.path);
          return finish("allow", "compute lane", status);
        }
        case "model": {
          const outcome = await (options.modelLane as ModelLane)(req, res, target.path, decided.lane);
          if (outcome.call) options.audit.recordModelCall(outcome.call);
          return finish(
            outcome.call ? "allow" : "refuse",
            outcome.call ? "model lane" : `model lane: ${outcome.code ?? "refused"}`,
            outcome.status,
          );
        }
        case "forward": {
          rule = decided.rule?.index ?? null;
          target = decided.target;
          const status = await forwardHttp1(req, res, decided, options.upstream, exchange);
          return finish("allow", rule === null ? "allowed" : "allowed, credential injected", status);
        }
      }
    } catch (e) {
      const refusal = toRefusal(e);
      finish(refusal.decision, refusal.reason, refusal.status, refusal.audit);
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

/** A CONNECT the proxy does not open: the status line alone (the client reads no body). */
function connectRefusal(status: number, reason: string): Refusal {
  return new Refusal(status, "refuse", reason, "");
}
