import { LIMIT_KINDS } from "@benchwright/shared/contract/http-limits";
import { and, asc, desc, eq, getTableColumns, lt, or, sql } from "drizzle-orm";
import { z } from "zod";
import type { Owner } from "../auth/owner";
import { limitRefusalLog, strayPlaceholderLog } from "../db/schema";
import type { Db } from "../db/types";
import { ok, type Result } from "../errors";
import { badCursor, decodeCursor, encodeCursor } from "./cursor";
import { ownRun, type Page } from "./service";

// The reads of what a run's proxy reported about placeholders and limits: the requests it
// refused for a method or path limit (limit_refusal_log, case N3) and the placeholders it saw
// sent toward a host other than their rule's, out unswapped (stray_placeholder_log, case N2).
// GET /v1/runs/{id}/limit-refusals and /stray-placeholders, and the run page. Never a path or a
// placeholder value: the tables hold neither. Scoped by the caller's environment: another
// tenant's run is 404.

const { environmentId: _e1, runId: _r1, ...limitColumns } = getTableColumns(limitRefusalLog);
const { environmentId: _e2, runId: _r2, ...strayColumns } = getTableColumns(strayPlaceholderLog);

export type LimitRefusal = Omit<typeof limitRefusalLog.$inferSelect, "environmentId" | "runId">;
export type StrayPlaceholder = Omit<typeof strayPlaceholderLog.$inferSelect, "environmentId" | "runId">;

// Newest first, then by the row's key ascending. A cursor is the last row's (lastSeen, key...),
// led by the list's name so that one list's cursor is never read as a position in the other.
// Timestamps are written from JS Dates only (milliseconds), so an ISO string keeps them exactly.
const Text = z.string().max(1024);
const LimitCursor = z.tuple([z.literal("limit"), z.iso.datetime(), Text, Text, z.enum(LIMIT_KINDS)]);
const StrayCursor = z.tuple([z.literal("stray"), z.iso.datetime(), Text, Text]);

function pageOf<T>(rows: T[], limit: number, position: (row: T) => unknown[]): Page<T> {
  const items = rows.slice(0, limit);
  const last = items.at(-1);
  return { items, nextCursor: rows.length > limit && last ? encodeCursor(position(last)) : null };
}

/** A page of the run's requests refused for a method or path limit, newest first. */
export async function listLimitRefusals(
  db: Db,
  p: Owner,
  runId: string,
  limit: number,
  cursor: string | undefined,
): Promise<Result<Page<LimitRefusal>>> {
  const run = await ownRun(db, p, runId);
  if (!run.ok) return run;
  const at = cursor === undefined ? null : decodeCursor(cursor, LimitCursor);
  if (cursor !== undefined && !at) return badCursor();
  const log = limitRefusalLog;
  const rows = await db
    .select(limitColumns)
    .from(log)
    .where(
      and(
        eq(log.runId, run.value),
        eq(log.environmentId, p.environmentId),
        at
          ? or(
              lt(log.lastSeen, new Date(at[1])),
              and(
                eq(log.lastSeen, new Date(at[1])),
                sql`(${log.host}, ${log.method}, ${log.limit}) > (${at[2]}, ${at[3]}, ${at[4]})`,
              ),
            )
          : undefined,
      ),
    )
    .orderBy(desc(log.lastSeen), asc(log.host), asc(log.method), asc(log.limit))
    .limit(limit + 1);
  return ok(pageOf(rows, limit, (r) => ["limit", r.lastSeen.toISOString(), r.host, r.method, r.limit]));
}

/** A page of the run's placeholders sent toward another host than their rule's, newest first. */
export async function listStrayPlaceholders(
  db: Db,
  p: Owner,
  runId: string,
  limit: number,
  cursor: string | undefined,
): Promise<Result<Page<StrayPlaceholder>>> {
  const run = await ownRun(db, p, runId);
  if (!run.ok) return run;
  const at = cursor === undefined ? null : decodeCursor(cursor, StrayCursor);
  if (cursor !== undefined && !at) return badCursor();
  const log = strayPlaceholderLog;
  const rows = await db
    .select(strayColumns)
    .from(log)
    .where(
      and(
        eq(log.runId, run.value),
        eq(log.environmentId, p.environmentId),
        at
          ? or(
              lt(log.lastSeen, new Date(at[1])),
              and(
                eq(log.lastSeen, new Date(at[1])),
                sql`(${log.host}, ${log.secret}) > (${at[2]}, ${at[3]})`,
              ),
            )
          : undefined,
      ),
    )
    .orderBy(desc(log.lastSeen), asc(log.host), asc(log.secret))
    .limit(limit + 1);
  return ok(pageOf(rows, limit, (r) => ["stray", r.lastSeen.toISOString(), r.host, r.secret]));
}
