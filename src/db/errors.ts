// Tells "the database is away" (→ 503, safe to retry later) from a bug (→ 500). Drizzle wraps
// driver errors, so walk the cause chain.
const UNAVAILABLE_SQLSTATE = /^(08|53|57P0[1-3])/; // connection exceptions, resources, shutdown
const UNAVAILABLE_MESSAGE =
  /timeout|terminated|ECONNREFUSED|ECONNRESET|connection (closed|refused|ended)|WebSocket|network|socket hang up|not queryable/i;

const SQLSTATE = /^[0-9A-Z]{5}$/;

/** The error and its causes, outermost first (a few levels: drizzle wraps the driver's error). */
function* causes(error: unknown): Generator<unknown> {
  for (let e: unknown = error, depth = 0; e && depth < 5; e = (e as { cause?: unknown }).cause, depth++)
    yield e;
}

function codeOf(e: unknown): string | null {
  const code = (e as { code?: unknown }).code;
  return typeof code === "string" && SQLSTATE.test(code) ? code : null;
}

export function isDatabaseUnavailable(error: unknown): boolean {
  for (const e of causes(error)) {
    const code = codeOf(e);
    if (code && UNAVAILABLE_SQLSTATE.test(code)) return true;
    // A server-side error with a SQLSTATE is a query problem, not an outage.
    if (code) return false;
    if (e instanceof Error && UNAVAILABLE_MESSAGE.test(e.message)) return true;
    if (typeof e === "object" && e !== null && (e as { type?: unknown }).type === "error") return true; // ws ErrorEvent
  }
  return false;
}

/** Postgres's SQLSTATE of the first error in the cause chain that has one, or null. */
export function sqlState(error: unknown): string | null {
  for (const e of causes(error)) {
    const code = codeOf(e);
    if (code) return code;
  }
  return null;
}
