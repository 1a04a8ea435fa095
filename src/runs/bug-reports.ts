import { z } from "@hono/zod-openapi";
import { and, desc, eq, lt } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import type { Principal } from "../context";
import { randomId } from "../crypto/api-keys";
import { runEvents } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";
import { lockTrace } from "./events";
import { ownRun } from "./service";

// Bug reports on a run. Each is a row of the run's trace (kind "bug_report", key `bug:<id>`), so
// the owner sees it in the run as it happened, between the transitions around it. Scoped by the
// caller's environment: another tenant's run is not_found, exactly as a run that does not exist.

const MAX_BODY_BYTES = 16 * 1024;

// Postgres jsonb cannot hold U+0000 or a lone surrogate: refuse them here (400), not at insert.
const storable = (s: string) =>
  // biome-ignore lint/suspicious/noControlCharactersInRegex: U+0000 is what is refused
  !/\u0000|[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(s);

export const BugReportTitle = z
  .string()
  .min(1, "the title is empty")
  .max(200, "at most 200 characters")
  // biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
  .refine((s) => !/[\u0000-\u001f\u007f-\u009f]/.test(s), "one line, no control characters")
  .refine(storable, "not well-formed Unicode");

export const BugReportBody = z
  .string()
  .min(1, "the body is empty")
  .max(MAX_BODY_BYTES, "at most 16 KiB")
  .refine((s) => new TextEncoder().encode(s).byteLength <= MAX_BODY_BYTES, "at most 16 KiB (UTF-8)")
  .refine(storable, "no NUL characters, well-formed Unicode")
  .openapi({ description: "Plain text, at most 16 KiB in UTF-8" });

/** What a trace row of kind "bug_report" holds in `detail`; parsed again whenever it is read. */
export const StoredBugReport = z
  .object({ id: z.string(), title: z.string(), body: z.string(), reportedBy: z.string() })
  .strict();
export type StoredBugReport = z.infer<typeof StoredBugReport>;

export interface BugReport extends StoredBugReport {
  runId: string;
  createdAt: Date;
}

const keyOf = (id: string) => `bug:${id}`;
// A page's position: the last report's id, resolved within the run.
const CursorShape = z.tuple([z.string().min(1).max(64)]);

/** Files a report on one of the caller's runs; a run that has ended takes reports too. */
export async function createBugReport(
  db: Db,
  p: Principal,
  input: { runId: string; title: string; body: string },
): Promise<Result<BugReport>> {
  const run = await ownRun(db, p, input.runId);
  if (!run.ok) return run;
  const id = randomId("bug_");
  const detail: StoredBugReport = { id, title: input.title, body: input.body, reportedBy: p.keyId };
  const [row] = await db.transaction(async (tx) => {
    await lockTrace(tx, run.value);
    return tx
      .insert(runEvents)
      .values({ runId: run.value, key: keyOf(id), kind: "bug_report", detail })
      .returning({ at: runEvents.at });
  });
  if (!row) throw new Error("insert returned no event");
  return ok({ ...detail, runId: run.value, createdAt: row.at });
}

/**
 * The run's reports, newest first (trace order, reversed). The cursor is the last report's id:
 * it names nothing outside this run, and it is resolved within this run only.
 */
export async function listBugReports(
  db: Db,
  p: Owner,
  runId: string,
  page: PageRequest,
): Promise<Result<Page<BugReport>>> {
  const run = await ownRun(db, p, runId);
  if (!run.ok) return run;
  const ofRun = and(eq(runEvents.runId, run.value), eq(runEvents.kind, "bug_report"));
  const at = await openCursor(page, "run-bug-reports", p.environmentId, CursorShape);
  if (!at.ok) return at;
  let before: number | undefined;
  if (at.value) {
    const [found] = await db
      .select({ id: runEvents.id })
      .from(runEvents)
      .where(and(ofRun, eq(runEvents.key, keyOf(at.value[0]))));
    // Sealed for this environment, but another run's report: not a position in this list.
    if (!found) return fail("invalid_cursor", "cursor: a cursor of another run's reports");
    before = found.id;
  }
  const rows = await db
    .select({ id: runEvents.id, detail: runEvents.detail, at: runEvents.at })
    .from(runEvents)
    .where(and(ofRun, before === undefined ? undefined : lt(runEvents.id, before)))
    .orderBy(desc(runEvents.id))
    .limit(page.limit + 1);
  const reports = rows.map((r) => ({
    ...StoredBugReport.parse(r.detail),
    runId: run.value,
    createdAt: r.at,
  }));
  return ok(await pageOf(page, "run-bug-reports", p.environmentId, reports, (r) => [r.id]));
}
