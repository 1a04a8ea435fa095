import { and, asc, desc, eq, gte, inArray, sql } from "drizzle-orm";
import { z } from "zod";
import type { Owner } from "../auth/owner";
import { blockedHostLog, runs } from "../db/schema";
import type { Db } from "../db/types";
import { ok, type Result } from "../errors";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";
import { ownRun } from "./service";

// The blocked hosts across the environment's runs with their refusals per day (GET
// /v1/blocked-hosts, the vault page). One run's tallies are read in run-logs.ts, the model
// lane's calls in model-calls.ts. Scoped by the caller's environment: another tenant's run is 404.

// ---- across the environment's runs ----

// Blocked hosts across all runs of the caller's environment ("Recent blocked hosts"): one row
// per host, aggregated from blocked_host_log. Filters pick which hosts are listed; a row's
// numbers are always the whole environment's, so a host filtered by one run still shows how
// often the other runs hit it too.

export type BlockedSource = "proxy" | "local_agent" | "both";

export interface AccountBlockedHost {
  host: string;
  /** Refusals, summed over the runs. */
  seenCount: number;
  firstSeen: Date;
  lastSeen: Date;
  /** `both` when the runs' rows have different sources, or any of them is `both`. */
  source: BlockedSource;
  /** Ids of the newest runs (by launch) that saw it, at most RUNS_PER_HOST, newest first. */
  runs: string[];
  runCount: number;
}

export interface BlockedHostsQuery extends PageRequest {
  /** Only hosts this run (of the caller's environment) saw. */
  runId?: string | undefined;
  /** Only hosts whose aggregated source is this. */
  source?: BlockedSource | undefined;
}

export const RUNS_PER_HOST = 10;

// The keyset position is the last row's (lastSeen, host). Audit times are written from JS Dates
// (milliseconds), so the ISO string holds the aggregated max exactly.
const AccountCursorShape = z.tuple([z.iso.datetime(), z.string().min(1).max(1024)]);

export async function listBlockedHosts(
  db: Db,
  p: Owner,
  query: BlockedHostsQuery,
): Promise<Result<Page<AccountBlockedHost>>> {
  const { limit, runId, source } = query;
  const parsed = await openCursor(query, "blocked-hosts", p.environmentId, AccountCursorShape);
  if (!parsed.ok) return parsed;
  const at = parsed.value ? { lastSeen: parsed.value[0], host: parsed.value[1] } : null;
  if (runId !== undefined) {
    const run = await ownRun(db, p, runId);
    if (!run.ok) return run;
  }

  const log = blockedHostLog;
  const lastSeen = sql<Date>`max(${log.lastSeen})`;
  const aggregatedSource = sql<BlockedSource>`case when count(distinct ${log.source}) > 1 or bool_or(${log.source} = 'both') then 'both' else min(${log.source}) end`;
  const rows = await db
    .select({
      host: log.host,
      seenCount: sql<number>`sum(${log.seenCount})::bigint`.mapWith(Number),
      firstSeen: sql<Date>`min(${log.firstSeen})`.mapWith(log.firstSeen),
      lastSeen: lastSeen.mapWith(log.lastSeen),
      source: aggregatedSource,
      // Newest runs first, as GET /v1/runs lists them.
      runs: sql<
        string[]
      >`(array_agg(${log.runId} order by ${runs.createdAt} desc, ${log.runId} desc))[1:${sql.raw(String(RUNS_PER_HOST))}]`,
      runCount: sql<number>`count(*)::int`.mapWith(Number),
    })
    .from(log)
    .innerJoin(runs, eq(runs.id, log.runId))
    .where(
      and(
        eq(log.environmentId, p.environmentId),
        runId === undefined
          ? undefined
          : inArray(
              log.host,
              db
                .select({ host: log.host })
                .from(log)
                .where(and(eq(log.environmentId, p.environmentId), eq(log.runId, runId))),
            ),
      ),
    )
    .groupBy(log.host)
    .having(
      and(
        source === undefined ? undefined : sql`${aggregatedSource} = ${source}`,
        at
          ? sql`(${lastSeen} < ${at.lastSeen}::timestamptz or (${lastSeen} = ${at.lastSeen}::timestamptz and ${log.host} > ${at.host}))`
          : undefined,
      ),
    )
    .orderBy(desc(lastSeen), asc(log.host))
    .limit(limit + 1);
  return ok(
    await pageOf(query, "blocked-hosts", p.environmentId, rows, (r) => [r.lastSeen.toISOString(), r.host]),
  );
}

export interface BlockedDay {
  /** The UTC day, YYYY-MM-DD. */
  day: string;
  /** Refusals counted on that day (see blockedPerDay). */
  refusals: number;
  /** Hosts refused that day. */
  hosts: number;
}

/** Days the vault page's chart covers, today included. */
export const BLOCKED_DAYS = 14;

/**
 * Refusals per UTC day over the last `days` days (today included), every day present, oldest
 * first. blocked_host_log keeps one row per run and host (a count, first and last seen), not each
 * refusal, so a row's count falls on the day of its last refusal: exact for runs within a day,
 * and a run's longest linger is 24 h.
 */
export async function blockedPerDay(
  db: Db,
  p: Owner,
  now: Date,
  days: number = BLOCKED_DAYS,
): Promise<BlockedDay[]> {
  const today = Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate());
  const from = new Date(today - (days - 1) * 86_400_000);
  const log = blockedHostLog;
  const day = sql<string>`to_char(${log.lastSeen} at time zone 'UTC', 'YYYY-MM-DD')`;
  const rows = await db
    .select({
      day,
      refusals: sql<number>`sum(${log.seenCount})::bigint`.mapWith(Number),
      hosts: sql<number>`count(distinct ${log.host})::int`.mapWith(Number),
    })
    .from(log)
    .where(and(eq(log.environmentId, p.environmentId), gte(log.lastSeen, from)))
    .groupBy(day);
  const byDay = new Map(rows.map((r) => [r.day, r]));
  return Array.from({ length: days }, (_, i) => {
    const d = new Date(from.getTime() + i * 86_400_000).toISOString().slice(0, 10);
    return byDay.get(d) ?? { day: d, refusals: 0, hosts: 0 };
  });
}
