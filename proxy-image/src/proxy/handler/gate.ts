import type { PolicyState } from "../policy-client";
import type { Upstream } from "../upstream";
import { type Connections, createConnections } from "./connections";
import type { DecideContext } from "./decide";
import { type AuditSink, auditRows, type DecisionRecord } from "./record";

// What every way in is handed, the same for each (HTTP/1.1 in h1.ts, HTTP/2 in h2.ts, Upgrade in
// upgrade.ts, the TLS ways in in tls-in.ts, CONNECT in connect.ts): where the bytes go, what a
// decision is made against right now, the policy version records and connections carry, a
// record's one way out, and the registry of open connections. One object, so no way in can
// decide against a context, or write a record, of its own making.

export interface PolicySource {
  current(): PolicyState;
}

export interface Gate {
  upstream: Upstream;
  /** What decide.ts decides against, read afresh for each decision. */
  context(): DecideContext;
  /** The policy version now: each record's, and each new connection's. */
  version(): number | null;
  /** A record's one way out: its log line, and the audit rows derived from it (record.ts). */
  emit(record: DecisionRecord): void;
  conns: Connections;
}

export interface GateOptions {
  policy: PolicySource;
  audit: AuditSink;
  upstream: Upstream;
  /** Which of the proxy's own lanes are served. */
  lanes: DecideContext["lanes"];
  log: (record: DecisionRecord) => void;
  /** The run's placeholder nonce (N2); unset: nothing swapped or counted. */
  placeholderNonce?: string | undefined;
}

export function createGate(options: GateOptions): Gate {
  const version = (): number | null => {
    const s = options.policy.current();
    return s.kind === "ready" ? s.policy.version : null;
  };
  return {
    upstream: options.upstream,
    context: () => ({
      policy: options.policy.current(),
      accepting: options.audit.accepting,
      tunnelUp: options.upstream.tunnelUp(),
      lanes: options.lanes,
      placeholderNonce: options.placeholderNonce,
    }),
    version,
    emit(record) {
      options.log(record);
      auditRows(options.audit, record);
    },
    conns: createConnections(version),
  };
}
