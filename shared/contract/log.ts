// One shape for every log line of the Worker, the proxy and the agents: one JSON object per line,
// `level` and `ts` (ISO 8601, UTC) first, then the event's own fields as they were. Operators
// filter and alert on `level` and `event` (docs/operator-guide.md); Workers Logs indexes the
// fields of a JSON line. Plain TypeScript: the Worker, the proxy image and the local agent all
// import it, so the three cannot drift.

export type LogLevel = "debug" | "info" | "warn" | "error";

/** What every line says: its `event`, the snake_case name operators filter and alert on. */
export interface Evented {
  readonly event: string;
}

/** A record as a component's logger takes it: its event, then its own fields. */
export type LogRecord = { readonly event: string; readonly [field: string]: unknown };

/**
 * The line for a record. A record that already says its own `level` (the proxy's audit and policy
 * clients pass one) keeps it. `now` may be the ISO string already (the proxy caches it: log-lines.ts).
 */
export function logLine<R extends Evented>(
  level: LogLevel,
  record: R,
  now: Date | string = new Date(),
): string {
  return JSON.stringify({ level, ts: typeof now === "string" ? now : now.toISOString(), ...record });
}

/** Where a Worker's line goes: the console method of its level, so Workers Logs agrees with it. */
export function consoleLog<R extends Evented>(level: LogLevel, record: R): void {
  const line = logLine(level, record);
  if (level === "error") console.error(line);
  else if (level === "warn") console.warn(line);
  else console.log(line);
}

// The events above `info`, for every component (a record's own `level` wins). Everything else is
// `info`: a decision, an allowed or refused host, a connection made, a policy read. A refusal the
// policy asked for is the boundary working, not a warning.
const WARN_EVENTS = new Set([
  // proxy
  "tls_error",
  "malformed",
  "no_original_destination",
  "dns_error",
  // proxy: its end of the egress tunnel
  "tunnel_down",
  "tunnel_disconnected",
  "tunnel_error",
  "tunnel_session_error",
  // egress agent
  "disconnected",
  "connection_error",
  "session_error",
  "refused_upgrade",
  "policy_error",
  // local agent
  "sandbox_died",
]);
const ERROR_EVENTS = new Set(["tunnel_refused", "policy_invalid", "sandbox_failed", "proxy_start_failed"]);

/** The level of a record by its event (and its own `level`, if it has one). */
export function levelOf<T extends { event?: unknown; level?: unknown; problem?: unknown }>(
  record: T,
): LogLevel {
  const own = record.level;
  if (own === "debug" || own === "info" || own === "warn" || own === "error") return own;
  const event = typeof record.event === "string" ? record.event : "";
  if (ERROR_EVENTS.has(event)) return "error";
  // The model lane says what went wrong in `problem`; a call that went well has none.
  if (WARN_EVENTS.has(event) || (event === "model_lane" && record.problem !== undefined)) return "warn";
  return "info";
}
