import { and, asc, desc, eq, gt, gte, inArray, lt, or, sql } from "drizzle-orm";
import { z } from "zod";
import type { Owner } from "../auth/owner";
import { blockedHostLog, egressRouteLog, runs } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { badCursor, decodeCursor, encodeCursor } from "./cursor";
import { ownRun, type Page } from "./service";

// The reads of what runs' proxies reported about hosts (blocked_host_log, egress_route_log), one
// function a read: a run's refused hosts and its routes (GET /v1/runs/{id}/blocked-hosts and
// /egress-routes, the run page), and the blocked hosts across the environment with their
// refusals per day (GET /v1/blocked-hosts, the vault page). The model lane's calls are read in
// model-calls.ts. Scoped by the caller's environment: another tenant's run is 404.

// ---- one run's ----

export type BlockedRow = typeof blockedHostLog.$inferSelect;
export type RouteRow = typeof egressRouteLog.$inferSelect;

/** Keyset position of a run's pages: the last item's (lastSeen, host[, route]); newest first. */
interface Position {
  lastSeen: Date;
  host: string;
  route?: RouteRow["route"] | undefined;
}

// Timestamps are written from JS Dates only (milliseconds), so an ISO string keeps them exactly.
const RunCursorShape = z.union([
  z.tuple([z.iso.datetime(), z.string().max(1024)]),
  z.tuple([z.iso.datetime(), z.string().max(1024), z.enum(["direct", "tunnel", "refused"])]),
]);

const encodePosition = (p: Position) =>
  encodeCursor([p.lastSeen.toISOString(), p.host, ...(p.route ? [p.route] : [])]);

function decodePosition(cursor: string, withRoute: boolean): Position | null {
  const parsed = decodeCursor(cursor, RunCursorShape);
  if (!parsed || parsed.length !== (withRoute ? 3 : 2)) return null;
  const [at, host, route] = parsed;
  return { lastSeen: new Date(at), host, route };
}

/** A page of the hosts the run's boundary refused, newest first. */
export async function listRunBlockedHosts(
  db: Db,
  p: Owner,
  runId: string,
  limit: number,
  cursor: string | undefined,
): Promise<Result<Page<BlockedRow>>> {
  const run = await ownRun(db, p, runId);
  if (!run.ok) return run;
  const at = cursor === undefined ? null : decodePosition(cursor, false);
  if (cursor !== undefined && !at) return badCursor();
  const rows = await db
    .select()
    .from(blockedHostLog)
    .where(
      and(
        eq(blockedHostLog.runId, run.value),
        eq(blockedHostLog.environmentId, p.environmentId),
        at
          ? or(
              lt(blockedHostLog.lastSeen, at.lastSeen),
              and(eq(blockedHostLog.lastSeen, at.lastSeen), gt(blockedHostLog.host, at.host)),
            )
          : undefined,
      ),
    )
    .orderBy(desc(blockedHostLog.lastSeen), asc(blockedHostLog.host))
    .limit(limit + 1);
  const items = rows.slice(0, limit);
  const last = items.at(-1);
  return ok({ items, nextCursor: rows.length > limit && last ? encodePosition(last) : null });
}

/** A page of the hosts the run reached and by which route, newest first. */
export async function listEgressRoutes(
  db: Db,
  p: Owner,
  runId: string,
  limit: number,
  cursor: string | undefined,
): Promise<Result<Page<RouteRow>>> {
  const run = await ownRun(db, p, runId);
  if (!run.ok) return run;
  const at = cursor === undefined ? null : decodePosition(cursor, true);
  if (cursor !== undefined && !at) return badCursor();
  const rows = await db
    .select()
    .from(egressRouteLog)
    .where(
      and(
        eq(egressRouteLog.runId, run.value),
        eq(egressRouteLog.environmentId, p.environmentId),
        at?.route
          ? or(
              lt(egressRouteLog.lastSeen, at.lastSeen),
              and(
                eq(egressRouteLog.lastSeen, at.lastSeen),
                or(
                  gt(egressRouteLog.host, at.host),
                  and(eq(egressRouteLog.host, at.host), gt(egressRouteLog.route, at.route)),
                ),
              ),
            )
          : undefined,
      ),
    )
    .orderBy(desc(egressRouteLog.lastSeen), asc(egressRouteLog.host), asc(egressRouteLog.route))
    .limit(limit + 1);
  const items = rows.slice(0, limit);
  const last = items.at(-1);
  return ok({ items, nextCursor: rows.length > limit && last ? encodePosition(last) : null });
}

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

export interface BlockedHostsQuery {
  /** 1..MAX_LIMIT. */
  limit: number;
  /** nextCursor of the previous page. */
  cursor?: string | undefined;
  /** Only hosts this run (of the caller's environment) saw. */
  runId?: string | undefined;
  /** Only hosts whose aggregated source is this. */
  source?: BlockedSource | undefined;
}

export const MAX_LIMIT = 100;
export const RUNS_PER_HOST = 10;

// The keyset position is the last row's (lastSeen, host). Audit times are written from JS Dates
// (milliseconds), so the ISO string holds the aggregated max exactly.
const AccountCursorShape = z.tuple([z.iso.datetime(), z.string().min(1).max(1024)]);

export async function listBlockedHosts(
  db: Db,
  p: Owner,
  query: BlockedHostsQuery,
): Promise<Result<Page<AccountBlockedHost>>> {
  const { limit, cursor, runId, source } = query;
  if (!Number.isInteger(limit) || limit < 1 || limit > MAX_LIMIT) {
    return fail("invalid_request", `limit: from 1 to ${MAX_LIMIT}`);
  }
  const parsed = cursor === undefined ? null : decodeCursor(cursor, AccountCursorShape);
  if (cursor !== undefined && !parsed) return badCursor();
  const at = parsed ? { lastSeen: parsed[0], host: parsed[1] } : null;
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
  const items = rows.slice(0, limit);
  const last = items.at(-1);
  return ok({
    items,
    nextCursor: rows.length > limit && last ? encodeCursor([last.lastSeen.toISOString(), last.host]) : null,
  });
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
