import { createServer as createNetServer, type Server as NetServer, type Socket } from "node:net";
import type { LogRecord } from "@benchwright/shared/contract/log";
import type { RunCa } from "../ca";
import type { ComputeLane } from "../compute-lane";
import type { ModelLane } from "../model/lane";
import type { OriginalDst } from "../original-dst";
import type { PolicyState } from "../policy-client";
import type { Upstream } from "../upstream";
import { connectHandler } from "./connect";
import { createGate, type PolicySource } from "./gate";
import { http1Servers } from "./h1";
import { createStreamServer } from "./h2";
import type { AuditSink, DecisionRecord, Listener } from "./record";
import { tlsWaysIn } from "./tls-in";

// The proxy's ways in, wired. Three ways in (transparent TLS routed by SNI, plain HTTP routed by
// Host, an explicit proxy port for CONNECT and absolute-form requests), and the same two
// transparent ones again for connections the sandbox dialled by address and the local backend
// DNATs here under default routing ("direct-tls", "direct-http", I4). Each is handed the one
// Gate (gate.ts): the TLS ways in read a ClientHello first and splice or terminate (tls-in.ts), a
// CONNECT is decided on its target and then read as TLS (connect.ts), decrypted or plain
// HTTP/1.1 goes to the one request handler (h1.ts), HTTP/2 streams to h2.ts (I1), Upgrade
// handshakes to upgrade.ts (I2); every one of them decided by decide.ts, with one record each
// (record.ts).

export type { AuditSink, DecisionRecord, Listener, PolicySource, PolicyState };

export interface ProxyOptions {
  ca: RunCa;
  policy: PolicySource;
  audit: AuditSink;
  upstream: Upstream;
  log?: (record: DecisionRecord | LogRecord) => void;
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
  /** The run's placeholder nonce (BW_PLACEHOLDER_NONCE, N2); unset: no placeholder is swapped. */
  placeholderNonce?: string | undefined;
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
  const originalDst = options.originalDst ?? null;
  const gate = createGate({
    policy: options.policy,
    audit: options.audit,
    upstream: options.upstream,
    lanes: { compute: options.computeLane !== undefined, model: options.modelLane !== undefined },
    log,
    placeholderNonce: options.placeholderNonce,
  });

  /** A connection on a direct listener with no original destination: nowhere to take it. */
  function notDialed(socket: Socket, listener: Listener): void {
    log({ event: "no_original_destination", conn: 0, listener });
    socket.destroy();
  }

  const { inner, plain, explicit, directHttp } = http1Servers(gate, {
    limits,
    log,
    computeLane: options.computeLane,
    modelLane: options.modelLane,
    recordModelCall: (row) => options.audit.recordModelCall(row),
    originalDst,
    notDialed,
  });
  // HTTP/2 connections (ALPN h2) of the TLS ways in (tls-in.ts): each stream decided on its own (I1).
  const streams = createStreamServer(gate, limits);
  const { acceptTls, acceptDirectTls } = tlsWaysIn(gate, {
    ca: options.ca,
    splice: options.splice !== false,
    originalDst,
    limits,
    log,
    inner,
    streams,
    notDialed,
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
  explicit.on("connect", connectHandler(gate, acceptTls));

  return {
    tls: tlsListener,
    http: plain,
    explicit,
    /** Connections the sandbox dialled by address, DNAT'd here with their original destination. */
    directTls,
    directHttp,
    /** Policy changed: close every connection opened under another version, and upstream pools. */
    async policyChanged(): Promise<void> {
      gate.conns.endStale(gate.version());
      await options.upstream.closeAll();
    },
    async close(): Promise<void> {
      gate.conns.endAll();
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
