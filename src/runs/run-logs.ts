import type { ListName } from "@benchwright/shared/contract/list";
import { and, asc, desc, eq, getTableColumns, lt, or, type SQL, sql } from "drizzle-orm";
import type { AnyPgColumn, PgTable } from "drizzle-orm/pg-core";
import { z } from "zod";
import type { Owner } from "../auth/owner";
import { blockedHostLog, egressRouteLog, limitRefusalLog, strayPlaceholderLog } from "../db/schema";
import type { Db } from "../db/types";
import { ok, type Result } from "../errors";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";
import { ownRun } from "./service";

// The four per-run tallies a run's proxy reports (hosts refused, routes taken, requests refused
// for a method or path limit, placeholders sent astray), read one way: a page of one run's rows,
// most recently seen first, then by the row's key ascending. GET /v1/runs/{id}/blocked-hosts,
// /egress-routes, /limit-refusals, /stray-placeholders and the run page's cards. Never a path,
// query or placeholder value: the tables hold none. Scoped by the caller's environment: another
// tenant's run is 404.

export type BlockedRow = typeof blockedHostLog.$inferSelect;
export type RouteRow = typeof egressRouteLog.$inferSelect;
export type LimitRefusal = typeof limitRefusalLog.$inferSelect;
export type StrayPlaceholder = typeof strayPlaceholderLog.$inferSelect;

/** A run tally table: its run, environment, when a row was last seen, and its key columns. */
interface RunLog<Row extends { lastSeen: Date }> {
  list: ListName;
  table: PgTable & { runId: AnyPgColumn; environmentId: AnyPgColumn; lastSeen: AnyPgColumn };
  /** The row's key after lastSeen, in order: it sorts rows last seen at the same time. */
  keys: AnyPgColumn[];
  keyOf: (row: Row) => string[];
}

// Timestamps are written from JS Dates only (milliseconds), so an ISO string keeps them exactly.
const Text = z.string().max(1024);
const positionShape = (keys: number) =>
  z
    .tuple([z.iso.datetime()])
    .rest(Text)
    .refine((p) => p.length === keys + 1);

async function listRunLog<Row extends { lastSeen: Date }>(
  db: Db,
  p: Owner,
  runId: string,
  page: PageRequest,
  log: RunLog<Row>,
): Promise<Result<Page<Row>>> {
  const run = await ownRun(db, p, runId);
  if (!run.ok) return run;
  const { table } = log;
  const { keys } = log;
  const at = await openCursor(page, log.list, p.environmentId, positionShape(keys.length));
  if (!at.ok) return at;
  let after: SQL | undefined;
  if (at.value) {
    const [time, ...key] = at.value;
    const seen = new Date(time);
    after = or(
      lt(table.lastSeen, seen),
      and(
        eq(table.lastSeen, seen),
        sql`(${sql.join(keys, sql`, `)}) > (${sql.join(
          key.map((k) => sql`${k}`),
          sql`, `,
        )})`,
      ),
    );
  }
  // The table is one of four, so drizzle cannot type its row here; RunLog ties it to Row.
  const rows = (await db
    .select(getTableColumns(table))
    .from(table)
    .where(and(eq(table.runId, run.value), eq(table.environmentId, p.environmentId), after))
    .orderBy(desc(table.lastSeen), ...keys.map((k) => asc(k)))
    .limit(page.limit + 1)) as unknown as Row[];
  return ok(
    await pageOf(page, log.list, p.environmentId, rows, (r) => [r.lastSeen.toISOString(), ...log.keyOf(r)]),
  );
}

const BLOCKED: RunLog<BlockedRow> = {
  list: "run-blocked-hosts",
  table: blockedHostLog,
  keys: [blockedHostLog.host],
  keyOf: (r) => [r.host],
};
const ROUTES: RunLog<RouteRow> = {
  list: "run-egress-routes",
  table: egressRouteLog,
  keys: [egressRouteLog.host, egressRouteLog.route],
  keyOf: (r) => [r.host, r.route],
};
const LIMITS: RunLog<LimitRefusal> = {
  list: "run-limit-refusals",
  table: limitRefusalLog,
  keys: [limitRefusalLog.host, limitRefusalLog.method, limitRefusalLog.limit],
  keyOf: (r) => [r.host, r.method, r.limit],
};
const STRAYS: RunLog<StrayPlaceholder> = {
  list: "run-stray-placeholders",
  table: strayPlaceholderLog,
  keys: [strayPlaceholderLog.host, strayPlaceholderLog.secret],
  keyOf: (r) => [r.host, r.secret],
};

/** A page of the hosts the run's boundary refused. */
export const listRunBlockedHosts = (db: Db, p: Owner, runId: string, page: PageRequest) =>
  listRunLog(db, p, runId, page, BLOCKED);
/** A page of the hosts the run reached and by which route. */
export const listEgressRoutes = (db: Db, p: Owner, runId: string, page: PageRequest) =>
  listRunLog(db, p, runId, page, ROUTES);
/** A page of the run's requests refused for a method or path limit. */
export const listLimitRefusals = (db: Db, p: Owner, runId: string, page: PageRequest) =>
  listRunLog(db, p, runId, page, LIMITS);
/** A page of the run's placeholders sent toward another host than their rule's. */
export const listStrayPlaceholders = (db: Db, p: Owner, runId: string, page: PageRequest) =>
  listRunLog(db, p, runId, page, STRAYS);
