import { type Api, ApiError, NetworkError, type Schemas } from "../api";
import { sseFrames } from "./follow-sse";
import { type Ctx, Failed, RunNotCompleted } from "./shared";

// `benchwright runs follow` (and launch --follow): the run's trace as the API streams it
// (GET /v1/runs/{id}/events, Server-Sent Events), printed as it comes, until the run's commands
// are over; the exit status is the run's outcome (case O1). A 429, a 5xx or a connection that
// drops is waited out (the answer's Retry-After, else a backoff) and the stream is asked for
// again from the last event's id, so nothing is lost or printed twice (case O2).

type Run = Schemas["Run"];
/** A trace event as the events route sends it: a run event with its position. */
type StreamedEvent = Schemas["RunTraceEvent"];

/** Commands are over: the run ended, or its proxy lingers after them. */
const OVER = new Set(["finished", "stopped", "failed", "lingering"]);

export interface Backoff {
  /** The first wait, doubled after each failure in a row, up to maxMs. */
  firstMs: number;
  maxMs: number;
  /** Failures in a row (nothing read in between) before follow gives up with the last error. */
  attempts: number;
  /** No byte for this long (the API sends a keep-alive every 15 s): the connection is dead. */
  idleMs: number;
}

const BACKOFF: Backoff = { firstMs: 1000, maxMs: 30_000, attempts: 8, idleMs: 45_000 };

/** The connection dropped while the stream was being read (exit 1 once retries run out). */
class Dropped extends Failed {}

/** The lines an event adds to the log a person follows (output as printed, the rest tagged). */
export function eventLines(e: Schemas["RunEvent"]): string[] {
  const d = (e.detail ?? {}) as Record<string, unknown>;
  switch (e.kind) {
    case "transition":
      return [
        `· ${e.state}${e.reason ? ` (${e.reason})` : ""}${typeof d.text === "string" ? `: ${d.text}` : ""}`,
      ];
    case "note":
      return [`· [${d.level ?? "note"}] ${d.code ?? e.reason}: ${d.text ?? ""}`];
    case "output": {
      const who = d.name && d.name !== "work" ? `[${d.name}] ` : "";
      if (typeof d.text === "string") {
        const tag = d.stream === "stderr" ? "! " : "  ";
        return d.text
          .replace(/\n$/, "")
          .split("\n")
          .map((l) => `${tag}${who}${l}`);
      }
      if ("exitCode" in d)
        return [`· ${who}command ${Number(d.command ?? 0) + 1} exited ${d.exitCode ?? "by a signal"}`];
      return [];
    }
    case "bug_report":
      return [`· bug report: ${typeof d.title === "string" ? d.title : (e.reason ?? "")}`];
    default:
      return [];
  }
}

const transient = (error: unknown) =>
  error instanceof NetworkError ||
  error instanceof Dropped ||
  (error instanceof ApiError && (error.status === 429 || error.status >= 500));

/** Waits before the next try after a transient failure; throws the error when it is not one. */
function retrier(ctx: Ctx, backoff: Backoff) {
  let failures = 0;
  return {
    progress: () => {
      failures = 0;
    },
    async after(error: unknown): Promise<void> {
      if (!transient(error) || ++failures > backoff.attempts) throw error;
      const askedSeconds = error instanceof ApiError ? error.retryAfter : null;
      const ms =
        askedSeconds === null
          ? Math.min(backoff.maxMs, backoff.firstMs * 2 ** (failures - 1))
          : askedSeconds * 1000;
      const what =
        error instanceof ApiError ? `HTTP ${error.status} ${error.code}` : (error as Error).message;
      ctx.err(`${what}; trying again in ${(ms / 1000).toFixed(0)} s (${failures} of ${backoff.attempts})`);
      await new Promise((resolve) => setTimeout(resolve, ms));
    },
  };
}

/**
 * One connection to the run's event stream from `cursor`: each event goes to `onEvent` (which
 * says whether the run's commands are over); "over" when they are or the stream ended the run,
 * "closed" when the API closed it before (a stream has a lifetime). Throws Dropped when the
 * connection breaks or goes quiet mid-stream.
 */
async function streamOnce(
  client: Api,
  id: string,
  cursor: string | null,
  idleMs: number,
  onEvent: (e: StreamedEvent, cursor: string | null) => boolean,
): Promise<"over" | "closed"> {
  const abort = new AbortController();
  let idle = setTimeout(() => abort.abort(), idleMs);
  try {
    const headers: Record<string, string> = { accept: "text/event-stream" };
    if (cursor) headers["last-event-id"] = cursor;
    const res = await client.stream("/v1/runs/{id}/events", { id }, headers, abort.signal);
    try {
      for await (const frame of sseFrames(res.body as ReadableStream<Uint8Array>)) {
        clearTimeout(idle);
        idle = setTimeout(() => abort.abort(), idleMs);
        if (frame.event === "end") return "over";
        if (frame.event === "message" && onEvent(JSON.parse(frame.data) as StreamedEvent, frame.id))
          return "over";
      }
    } catch (error) {
      if (error instanceof SyntaxError) throw error;
      throw new Dropped(`the event stream broke (${(error as Error).message})`);
    }
    return "closed";
  } finally {
    clearTimeout(idle);
    abort.abort();
  }
}

/**
 * Prints the run's trace as it grows until its commands are over (ended, or lingering). People
 * get the events as lines and, on a terminal, a status line that redraws; --json prints NDJSON:
 * `{"event": ...}` per event, then `{"run": ...}` (the run as GET /v1/runs/{id} answers). A run
 * that did not complete (a command failed, it stopped or failed) exits 4.
 */
export async function follow(ctx: Ctx, client: Api, id: string, backoff: Backoff = BACKOFF): Promise<Run> {
  const live = !ctx.json && process.stderr.isTTY === true;
  const since = Date.now();
  const retry = retrier(ctx, backoff);
  // Where the stream is: the last event's id, and the run's state as its transitions say.
  const at = { cursor: null as string | null, state: "queued", lingered: null as string | null };
  const onEvent = (e: StreamedEvent, cursor: string | null) => {
    at.cursor = cursor ?? at.cursor;
    retry.progress();
    if (e.kind === "transition" && e.state) {
      at.state = e.state;
      if (e.state === "lingering") at.lingered = e.reason;
    }
    if (live) process.stderr.write("\r\x1b[2K");
    if (ctx.json) ctx.out(JSON.stringify({ event: e }));
    else for (const line of eventLines(e)) ctx.out(line);
    const over = OVER.has(at.state);
    if (live && !over)
      process.stderr.write(`${id} · ${at.state} · ${((Date.now() - since) / 1000).toFixed(0)}s`);
    return over;
  };
  for (;;) {
    const before = at.cursor;
    try {
      if ((await streamOnce(client, id, at.cursor, backoff.idleMs, onEvent)) === "over") break;
      // Closed by the API with nothing sent: as a failure, so that a stream that keeps closing
      // at once is not asked for again in a tight loop.
      if (at.cursor === before) await retry.after(new Dropped("the event stream closed with nothing new"));
    } catch (error) {
      await retry.after(error);
    }
  }
  let run: Run;
  for (;;) {
    try {
      run = await client.call("get", "/v1/runs/{id}", { params: { id } });
      break;
    } catch (error) {
      await retry.after(error);
    }
  }
  // A lingering run has no reason yet (the run has not ended); its commands' outcome is the
  // reason it moved to lingering with.
  const reason = run.status === "lingering" ? at.lingered : run.reason;
  if (ctx.json) ctx.out(JSON.stringify({ run }));
  else {
    for (const line of [
      `${run.id} ${run.status}${reason ? `: ${reason}` : ""}${run.reasonDetail ? ` (${run.reasonDetail})` : ""}`,
      ...(run.status === "lingering" && run.linger.until
        ? [`its proxy lingers until ${run.linger.until}: benchwright runs linger ${run.id} 0 ends it`]
        : []),
      `blocked hosts: benchwright logs blocked-hosts ${run.id}`,
    ])
      ctx.out(line);
  }
  if (reason !== "completed") {
    throw new RunNotCompleted(`run ${run.id} ${run.status}: ${reason ?? "no reason"}`);
  }
  return run;
}
