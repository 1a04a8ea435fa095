import { and, asc, eq, gt, sql } from "drizzle-orm";
import { z } from "zod";
import { runEvents } from "../db/schema";
import type { Q, Tx } from "../db/types";
import { decodeCursor, encodeCursor } from "./cursor";

// A run's trace read after a cursor (case O2). The cursor is the position of the last event read:
// opaque to callers, and bound to its run, so another run's cursor is refused, not reinterpreted.
//
// Invariant: a reader that has seen event N of a run has seen every event of that run before N.
// The ids come from one global sequence, and several writers append to one run (the coordinator,
// the proxy's reports, bug reports, the tunnel relay); two of them could take ids 10 and 11 and
// commit 11 first, and a reader at 11 would never see 10. So every writer appends under the run's
// trace lock (lockTrace, held to the end of its transaction): a run's events commit in id order.

/** The most events one page carries; a page that is full says there may be more. */
export const EVENTS_PAGE_MAX = 200;

export interface TraceEvent {
  /** The position of this event: an `after` that reads what follows it. */
  cursor: string;
  kind: (typeof runEvents.$inferSelect)["kind"];
  state: string | null;
  reason: string | null;
  detail: unknown;
  at: Date;
}

const Position = z.tuple([z.literal("ev"), z.string(), z.number().int().nonnegative()]);

/** The cursor of a position in a run's trace (0: before its first event). */
export const eventCursor = (runId: string, id: number) => encodeCursor(["ev", runId, id]);

/** The position a cursor names in this run's trace; null when it is not one of this run's. */
export function positionOf(runId: string, cursor: string): number | null {
  const position = decodeCursor(cursor, Position);
  return position && position[1] === runId ? position[2] : null;
}

/**
 * Takes the run's trace lock until the transaction ends. Every append to run_events goes through
 * it, so that the ids of one run commit in order (see the header).
 */
export async function lockTrace(tx: Tx, runId: string): Promise<void> {
  await tx.execute(sql`select pg_advisory_xact_lock(hashtextextended(${`run_events:${runId}`}, 0))`);
}

/** An event as the API writes it (JSON, and each Server-Sent Event's data). */
export const traceEventJson = (e: TraceEvent) => ({ ...e, at: e.at.toISOString() });

/** A trace event's columns as every reader returns them (the run's trace, its event pages). */
export const traceColumns = {
  kind: runEvents.kind,
  state: runEvents.state,
  reason: runEvents.reason,
  detail: runEvents.detail,
  at: runEvents.at,
};

/** Up to `limit` events after `position`, oldest first. */
export async function eventsAfter(
  db: Q,
  runId: string,
  position: number,
  limit: number,
): Promise<{ events: TraceEvent[]; position: number }> {
  const rows = await db
    .select({ id: runEvents.id, ...traceColumns })
    .from(runEvents)
    .where(and(eq(runEvents.runId, runId), gt(runEvents.id, position)))
    .orderBy(asc(runEvents.id))
    .limit(Math.min(limit, EVENTS_PAGE_MAX));
  return {
    events: rows.map(({ id, ...e }) => ({ cursor: eventCursor(runId, id), ...e })),
    position: rows.at(-1)?.id ?? position,
  };
}
