import type { LimitKindName } from "@benchwright/shared/contract/http-limits";
import type { ProxyListener } from "@benchwright/shared/contract/proxy-view";
import type { AuditSource, EgressRoute, ModelCallRow } from "@benchwright/shared/contract/proxy-wire";
import type { RefusalAudit } from "./refusal";

// One canonical record per decided request (and per CONNECT refusal, and per spliced
// connection), as smokescreen keeps one per connection: what was asked, what was decided, how it
// left, how much went each way. The audit's rows are derived from this same record (auditRows),
// so the route log and the audit cannot drift apart. Nothing in it names a secret, a path, a
// query or a body.

export type Listener = ProxyListener;

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
  /** The route the audit counts for the host (reached direct or by tunnel, or refused); null: none. */
  route: EgressRoute | null;
  /** Who refused the host as blocked (a blocked-host row); null: nobody. */
  blockedBy: AuditSource | null;
  /** The method or path limit the request was outside (a limit-refusal row, N3); null: none. */
  limit: LimitKindName | null;
  /**
   * "terminate": the proxy read the HTTP request (over its own TLS, or plain) and decided it;
   * "splice": a TLS connection relayed untouched, decided on its ClientHello's SNI (status 0);
   * "close": refused on its ClientHello and closed, no HTTP exchange (status 0): a direct
   * connection without a name to present a certificate for, or whose handshake then failed.
   */
  mode: "terminate" | "splice" | "close";
  /** Secret names whose run placeholders went out unswapped (N2); absent when none. */
  strayPlaceholders?: string[];
}

export interface AuditSink {
  /** A refused host: by this proxy, or by the user's egress agent at the tunnel's far end. */
  recordBlocked(host: string, source?: AuditSource): void;
  recordRoute(host: string, route: EgressRoute): void;
  /** A run placeholder sent to `host` unswapped (N2): counted by secret name, never the value. */
  recordStrayPlaceholder(host: string, secret: string): void;
  /** One call through the model lane (token counts; no prompt, no output). */
  recordModelCall(row: ModelCallRow): void;
  /** A request refused for a method or path limit: host, method and which limit, never the path. */
  recordLimitRefusal(host: string, method: string, limit: LimitKindName): void;
  /** False when the spool is full: refuse new egress rather than lose audit rows (E3). */
  readonly accepting: boolean;
}

/** The connection a record belongs to. */
export interface RecordConn {
  id: number;
  listener: Listener;
}

export interface RecordInput {
  conn: RecordConn | undefined;
  method: string;
  host: string | null;
  port: number | null;
  decision: DecisionRecord["decision"];
  reason: string;
  status: number;
  rule?: number | null;
  bytesIn?: number;
  bytesOut?: number;
  started: number;
  policyVersion: number | null;
  route?: EgressRoute | null;
  blockedBy?: AuditSource | null;
  limit?: LimitKindName | null;
  mode?: DecisionRecord["mode"];
  strayPlaceholders?: readonly string[] | undefined;
}

export function record(input: RecordInput): DecisionRecord {
  return {
    event: "decision",
    conn: input.conn?.id ?? 0,
    listener: input.conn?.listener ?? "http",
    host: input.host,
    port: input.port,
    method: input.method,
    decision: input.decision,
    reason: input.reason,
    status: input.status,
    rule: input.rule ?? null,
    policyVersion: input.policyVersion,
    bytesIn: input.bytesIn ?? 0,
    bytesOut: input.bytesOut ?? 0,
    ms: Date.now() - input.started,
    route: input.route ?? null,
    blockedBy: input.blockedBy ?? null,
    limit: input.limit ?? null,
    mode: input.mode ?? "terminate",
    ...(input.strayPlaceholders?.length ? { strayPlaceholders: [...input.strayPlaceholders] } : {}),
  };
}

/** A request's record as it stands when it ends, from the HTTP/1.1 and HTTP/2 handlers alike. */
export interface RequestSoFar {
  conn: RecordConn | undefined;
  method: string;
  started: number;
  target: { host: string; port: number } | null;
  rule: number | null;
  exchange: {
    bytesIn: number;
    bytesOut: number;
    route: EgressRoute | null;
    strayPlaceholders?: readonly string[];
  };
  policyVersion: number | null;
}

/** How a request ended: its decision, why, the status sent, and the refusal's audit source. */
export type Ending = [
  decision: DecisionRecord["decision"],
  reason: string,
  status: number,
  audit?: RefusalAudit,
];

export function requestRecord(
  r: RequestSoFar,
  ...[decision, reason, status, audit = {}]: Ending
): DecisionRecord {
  return record({
    conn: r.conn,
    method: r.method,
    host: r.target?.host ?? null,
    port: r.target?.port ?? null,
    decision,
    reason,
    status,
    rule: r.rule,
    bytesIn: r.exchange.bytesIn,
    bytesOut: r.exchange.bytesOut,
    started: r.started,
    policyVersion: r.policyVersion,
    route: audit.route ?? r.exchange.route,
    ...(audit.blockedBy ? { blockedBy: audit.blockedBy } : {}),
    ...(audit.limit ? { limit: audit.limit } : {}),
    strayPlaceholders: r.exchange.strayPlaceholders,
  });
}

/**
 * The audit rows a final record stands for: a blocked-host row, a route row, a limit-refusal row
 * and stray placeholders, each if any.
 */
export function auditRows(audit: AuditSink, r: DecisionRecord): void {
  if (r.host === null) return;
  if (r.blockedBy) audit.recordBlocked(r.host, r.blockedBy);
  if (r.route) audit.recordRoute(r.host, r.route);
  for (const secret of r.strayPlaceholders ?? []) audit.recordStrayPlaceholder(r.host, secret);
  if (r.limit) audit.recordLimitRefusal(r.host, r.method, r.limit);
}
