import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import type { LogRecord } from "@benchwright/shared/contract/log";
import type { ModelCallRow } from "@benchwright/shared/contract/proxy-wire";
import type { ComputeLane } from "../compute-lane";
import { checkFraming } from "../http-rules";
import type { ModelLane } from "../model/lane";
import type { OriginalDst } from "../original-dst";
import { decideRequest } from "./decide";
import { type Exchange, forwardHttp1 } from "./forward";
import type { Gate } from "./gate";
import { type Ending, type Listener, requestRecord } from "./record";
import { bad, toRefusal } from "./refusal";
import { type Target, targetOf } from "./target";
import { handleUpgrade, upgradeWanted } from "./upgrade";

// HTTP/1.1 on every way in: the plain and explicit listeners, the direct one (I4), and `inner`,
// which never listens and takes the decrypted connections of the TLS ways in (tls-in.ts). One
// handler for every request: what was asked (target.ts) -> the decision as a value (decide.ts)
// -> a lane, or forward with the credential and scrub it from what comes back (forward.ts) -> one
// record (record.ts). Every request is decided on its own, so keep-alive and pipelined
// follow-ups are checked again (B6); an Upgrade handshake goes to upgrade.ts (I2).

export interface Http1Limits {
  headersTimeoutMs: number;
  requestTimeoutMs: number;
  keepAliveTimeoutMs: number;
  maxHeaderBytes: number;
  /** An upgraded connection silent both ways this long is closed. */
  spliceIdleTimeoutMs: number;
}

export interface Http1Options {
  limits: Http1Limits;
  /** Lines that are not a decision (a malformed message). */
  log: (line: LogRecord) => void;
  computeLane?: ComputeLane | undefined;
  modelLane?: ModelLane | undefined;
  /** Where a model-lane call's row goes (the audit). */
  recordModelCall: (row: ModelCallRow) => void;
  /** Where a direct-http connection was dialled; null: it is refused (notDialed). */
  originalDst: OriginalDst | null;
  /** A direct connection with no original destination: logged and closed. */
  notDialed: (socket: Socket, listener: Listener) => void;
}

export function http1Servers(gate: Gate, options: Http1Options) {
  const { limits, log } = options;
  // Connections the proxy answered with `Connection: close`. RFC 9112 §9.6: no later request on
  // such a connection is processed, so a request pipelined behind a refused one is dropped, never
  // forwarded (its framing may be exactly what the refusal was about).
  const closing = new WeakSet<Socket>();
  // Requests dispatched on a socket whose responses have not finished, and the latest of them. A
  // parse error answers 400 only when it cannot land in, or ahead of, another request's response.
  const pending = new WeakMap<Socket, { count: number; last: [IncomingMessage, ServerResponse] }>();

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

  // Decrypted traffic of both TLS ways in lands on this server; it never listens itself.
  const inner: Server = createServer(serverOptions, (req, res) => void handle(req, res));
  const plain: Server = createServer(serverOptions, (req, res) => void handle(req, res));
  const explicit: Server = createServer(serverOptions, (req, res) => void handle(req, res));
  const directHttp: Server = createServer(serverOptions, (req, res) => void handle(req, res));
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
      const conn = gate.conns.of(socket);
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
  plain.on("connection", (socket: Socket) => gate.conns.track(socket, "http"));
  explicit.on("connection", (socket: Socket) => gate.conns.track(socket, "explicit"));
  directHttp.on("connection", (socket: Socket) => {
    const dialed = options.originalDst?.(socket) ?? null;
    if (dialed === null) options.notDialed(socket, "direct-http");
    else gate.conns.track(socket, "direct-http", { dialed });
  });
  for (const server of [inner, plain, explicit, directHttp]) {
    server.on("upgrade", (req: IncomingMessage, socket: Socket, head: Buffer) => {
      void handleUpgrade(gate, limits.spliceIdleTimeoutMs, req, socket, head);
    });
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
    const conn = gate.conns.of(req.socket) ?? gate.conns.track(req.socket, "http");
    let target: Target | null = null;
    let rule: number | null = null;
    const exchange: Exchange = { bytesIn: 0, bytesOut: 0, route: null };
    const finish = (...end: Ending) =>
      gate.emit(
        requestRecord(
          { conn, method: req.method ?? "?", started, target, rule, exchange, policyVersion: gate.version() },
          ...end,
        ),
      );
    try {
      const framing = checkFraming(req.rawHeaders);
      if (framing) throw bad(400, framing);
      target = targetOf(req, conn);
      const request = decideRequest(target, req.method ?? "?", conn, gate.context());
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
          if (outcome.call) options.recordModelCall(outcome.call);
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
          const status = await forwardHttp1(req, res, decided, gate.upstream, exchange);
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

  return { inner, plain, explicit, directHttp };
}
