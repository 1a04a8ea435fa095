import {
  createServer as createHttpServer,
  type IncomingMessage,
  type Server,
  type ServerResponse,
} from "node:http";
import { createServer as createNetServer, type Server as NetServer, type Socket } from "node:net";
import { WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import type { RunCa } from "../ca";
import type { ComputeLane } from "../compute-lane";
import { checkFraming } from "../http-rules";
import type { ModelLane } from "../model/lane";
import type { OriginalDst } from "../original-dst";
import type { PolicyState } from "../policy-client";
import type { Upstream } from "../upstream";
import { type DecideContext, decideRequest } from "./decide";
import { type Exchange, forwardHttp1 } from "./forward";
import { createStreamServer } from "./h2";
import {
  type AuditSink,
  auditRows,
  type DecisionRecord,
  type Ending,
  type Listener,
  record,
  requestRecord,
} from "./record";
import { bad, blockedRefusal, Refusal, toRefusal } from "./refusal";
import { connectTarget, type Target, targetOf } from "./target";
import { type ConnInfo, tlsWaysIn } from "./tls-in";
import { handleUpgrade, type UpgradeContext, upgradeWanted } from "./upgrade";

// The proxy's ways in and its one handler. Three ways in (transparent TLS routed by SNI, plain
// HTTP routed by Host, an explicit proxy port for CONNECT and absolute-form requests), and the
// same two transparent ones again for connections the sandbox dialled by address and the local
// backend DNATs here under default routing ("direct-tls", "direct-http", I4), one path
// for every request (the TLS ways in read a ClientHello first, and splice or terminate: tls-in.ts):
// what was asked (target.ts) -> the decision as a value (decide.ts: lanes,
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
  /** Serves the run's declared model at MODEL_LANE_HOST (see model/lane.ts). */
  modelLane?: ModelLane;
  /** Relay allowed hosts without a rule untouched (catch-all, and direct listeners; default true). */
  splice?: boolean;
  /**
   * Where a connection on a direct listener was dialled (original-dst.ts). Absent or null: the
   * direct listeners refuse every connection, since the proxy cannot know where to relay it.
   */
  originalDst?: OriginalDst | null;
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
  const directHttp: Server = createHttpServer(serverOptions, (req, res) => void handle(req, res));
  // Node starts a server's deadline checker on 'listening', which `inner` never emits by itself:
  // without this, header and request deadlines never apply to TLS traffic (slowloris, F2).
  inner.emit("listening");
  for (const server of [inner, plain, explicit, directHttp]) {
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
  directHttp.on("connection", (socket: Socket) => {
    const dialed = options.originalDst?.(socket) ?? null;
    if (dialed === null) notDialed(socket, "direct-http");
    else track(socket, "direct-http", { dialed });
  });

  /** A connection on a direct listener with no original destination: nowhere to take it. */
  function notDialed(socket: Socket, listener: Listener): void {
    log({ event: "no_original_destination", conn: 0, listener });
    socket.destroy();
  }

  const upgradeContext: UpgradeContext = {
    upstream: options.upstream,
    decideContext: () => decideContext(),
    versionNow,
    emit: (r) => emit(r),
    connOf: (socket) => info.get(socket) ?? track(socket, "http"),
    idleMs: limits.spliceIdleTimeoutMs,
  };
  for (const server of [inner, plain, explicit, directHttp]) {
    server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
      void handleUpgrade(upgradeContext, req, socket, head);
    });
  }
  // HTTP/2 connections (ALPN h2) of the TLS ways in (tls-in.ts): each stream decided on its own (I1).
  const streams = createStreamServer(
    { upstream: options.upstream, decideContext: () => decideContext(), versionNow, emit: (r) => emit(r) },
    limits,
  );

  const { acceptTls, acceptDirectTls } = tlsWaysIn({
    ca: options.ca,
    upstream: options.upstream,
    splice: options.splice !== false,
    originalDst: options.originalDst ?? null,
    limits,
    log,
    emit: (r) => emit(r),
    info,
    track,
    inner,
    streams,
    decideContext: () => decideContext(),
    versionNow,
    notDialed,
  });

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
  const directTls: NetServer = createNetServer((raw) => {
    raw.on("error", () => raw.destroy());
    acceptDirectTls(raw);
  });
  directTls.maxConnections = limits.maxConnections;
  directHttp.maxConnections = limits.maxConnections;
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
    const finish = (...end: Ending) =>
      emit(
        requestRecord(
          { conn, method: req.method ?? "?", started, target, rule, exchange, policyVersion: versionNow() },
          ...end,
        ),
      );
    try {
      const framing = checkFraming(req.rawHeaders);
      if (framing) throw bad(400, framing);
      target = targetOf(req, conn);
      const request = decideRequest(target, conn, decideContext());
      target = request.target;
      const decided = request.decided;
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
          // A call the lane refused itself (J1, J3) has a row too, but it is a refusal.
          const called = outcome.call !== null && outcome.call.refused === null;
          return finish(
            called ? "allow" : "refuse",
            called ? "model lane" : `model lane: ${outcome.code ?? "refused"}`,
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
    /** Connections the sandbox dialled by address, DNAT'd here with their original destination. */
    directTls,
    directHttp,
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
        [tlsListener, plain, explicit, directTls, directHttp].map(
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
