import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { isTerminal, type RunState } from "@benchwright/shared/contract/run-states";
import { and, asc, desc, eq, gte, lt, sql } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { randomId } from "../crypto/api-keys";
import { runEvents, runs, sandboxes } from "../db/schema";
import type { Db, Q } from "../db/types";
import { ApiError, fail, ok, type Result } from "../errors";
import { admitRun } from "../limits/active-runs";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";
import { CreatedKey, createdMicros, olderThan } from "../lists/newest-first";
import { enqueueRunEnded } from "../notifications/service";
import { modelLane } from "../vault/models";
import { lockTrace, traceColumns } from "./events";
import type { RunNote, Transition } from "./types";

export type { RunNote, Transition } from "./types";

// Runs over Postgres. Reads are scoped by the caller's environment (another tenant's run is a
// 404). Writes of status, trace and notes come from the run coordinator only.

export { isTerminal };

export type RunRow = typeof runs.$inferSelect;

/** What the launch trace row records of the declared model: never its secret. */
export interface LaunchedModel {
  name: string;
  provider: string;
  /** The provider's API host (and port, if not 443). */
  baseHost: string;
}

/**
 * Records a launched run, queued. Shared by every launch (the API, the runs page, webhook
 * deliveries): a declared model must be in the vault (else ApiError unknown_model, nothing
 * written), the environment must have room for one more run (else too_many_runs, nothing
 * written), and what the model pointed at is kept in the launch row of the trace.
 */
export async function createRun(
  db: Q,
  p: Owner,
  spec: RunSpec,
  backend: string,
  maxActiveRuns: number,
): Promise<RunRow> {
  const id = randomId("run_");
  const [row] = await db.transaction(async (tx) => {
    await admitRun(tx, p.environmentId, maxActiveRuns);
    const lane = spec.model ? await modelLane(tx, p.environmentId, spec.model) : null;
    if (spec.model && !lane) {
      throw new ApiError(
        "unknown_model",
        `No model named ${JSON.stringify(spec.model)} in this vault; add it with POST /v1/vault/models, or launch without model.`,
      );
    }
    const model: LaunchedModel | null = lane
      ? { name: lane.name, provider: lane.provider, baseHost: new URL(lane.baseUrl).host }
      : null;
    const inserted = await tx
      .insert(runs)
      .values({ id, userId: p.userId, environmentId: p.environmentId, spec, backend })
      .returning();
    await tx.insert(runEvents).values({
      runId: id,
      key: "t:queued",
      kind: "transition",
      state: "queued",
      reason: "launched",
      ...(model
        ? {
            detail: {
              text: `Declares the model ${model.name} (${model.provider}, ${model.baseHost})${budgetText(spec)}.`,
              model,
            },
          }
        : {}),
    });
    return inserted;
  });
  if (!row) throw new Error("insert returned no run");
  return row;
}

/** The run's modelBudget for its launch row: ", with a budget of at most 1,000 calls...". */
function budgetText(spec: RunSpec): string {
  const b = spec.modelBudget;
  if (!b) return "";
  const limits = [
    [b.calls, "calls"],
    [b.inputTokens, "input tokens"],
    [b.outputTokens, "output tokens"],
  ] as const;
  const named = limits.flatMap(([n, what]) =>
    n === undefined ? [] : [`${n.toLocaleString("en-US")} ${what}`],
  );
  return named.length === 0
    ? ", with a budget that sets no limit"
    : `, with a budget of at most ${named.join(", ")}`;
}

export async function getRun(db: Db, p: Owner, id: string): Promise<Result<RunRow>> {
  const [row] = await db
    .select()
    .from(runs)
    .where(and(eq(runs.id, id), eq(runs.environmentId, p.environmentId)));
  return row ? ok(row) : fail("not_found", `No run ${id}.`);
}

/** A run by id alone: for the coordinator, which acts for the run, not for a caller. */
export async function loadRun(db: Q, id: string): Promise<RunRow | null> {
  const [row] = await db.select().from(runs).where(eq(runs.id, id));
  return row ?? null;
}

/** The run's id, if it belongs to the caller's environment; else not_found, as for no run at all. */
export async function ownRun(db: Db, p: Owner, runId: string): Promise<Result<string>> {
  const [row] = await db
    .select({ id: runs.id })
    .from(runs)
    .where(and(eq(runs.id, runId), eq(runs.environmentId, p.environmentId)));
  return row ? ok(row.id) : fail("not_found", `No run ${runId}.`);
}

/** Which runs a list shows; every filter is optional and they combine (all must hold). */
export interface RunsFilter {
  status?: RunState | undefined;
  /** The built-in benchmark the run ran (runs of commands have none). */
  benchmark?: string | undefined;
  /** Launched at or after. */
  since?: Date | undefined;
  /** Launched before. */
  until?: Date | undefined;
}

/** The built-in benchmark a run ran (the filter's `spec->>'benchmark'`), or null for commands. */
export function benchmarkOf(row: RunRow): string | null {
  const name = (row.spec as { readonly [key: string]: unknown }).benchmark;
  return typeof name === "string" ? name : null;
}

/** A page of the environment's runs, newest first, as the filter picks them. */
export async function listRuns(
  db: Db,
  p: Owner,
  page: PageRequest,
  filter: RunsFilter = {},
): Promise<Result<Page<RunRow>>> {
  // The last item's (createdAt, id): pages stay stable while runs are added.
  const after = await openCursor(page, "runs", p.environmentId, CreatedKey);
  if (!after.ok) return after;
  const rows = await db
    .select({ run: runs, micros: createdMicros(runs.createdAt) })
    .from(runs)
    .where(
      and(
        eq(runs.environmentId, p.environmentId),
        filter.status === undefined ? undefined : eq(runs.status, filter.status),
        filter.benchmark === undefined ? undefined : sql`${runs.spec}->>'benchmark' = ${filter.benchmark}`,
        filter.since === undefined ? undefined : gte(runs.createdAt, filter.since),
        filter.until === undefined ? undefined : lt(runs.createdAt, filter.until),
        olderThan(runs.createdAt, runs.id, after.value),
      ),
    )
    .orderBy(desc(runs.createdAt), desc(runs.id))
    .limit(page.limit + 1);
  const found = await pageOf(page, "runs", p.environmentId, rows, (r) => [r.micros, r.run.id]);
  return ok({ items: found.items.map((r) => r.run), nextCursor: found.nextCursor });
}

export async function runTrace(db: Db, runId: string) {
  return db.select(traceColumns).from(runEvents).where(eq(runEvents.runId, runId)).orderBy(asc(runEvents.id));
}

export async function runSandboxes(db: Db, runId: string) {
  return db
    .select({
      id: sandboxes.id,
      kind: sandboxes.kind,
      taskIndex: sandboxes.taskIndex,
      backend: sandboxes.backend,
      status: sandboxes.status,
      routing: sandboxes.routing,
      createdAt: sandboxes.createdAt,
      destroyedAt: sandboxes.destroyedAt,
    })
    .from(sandboxes)
    .where(eq(sandboxes.runId, runId))
    .orderBy(asc(sandboxes.createdAt), asc(sandboxes.id));
}

// ---- the coordinator's writes; each is idempotent so that a retried alarm records once ----

/**
 * Moves the run to `to` and appends the trace row, in one transaction. The trace key is the state
 * (a run enters each state at most once), so a replay of the same step changes nothing. Entering
 * a terminal state also owes the run's end to the environment's notification URLs (the outbox
 * of src/notifications), in the same transaction. True when this call made the move; a caller
 * that ended the run then wakes its notifier (src/notifications/notifier.ts, afterTransition).
 */
export async function recordTransition(db: Db, runId: string, t: Transition): Promise<boolean> {
  const terminal = isTerminal(t.to);
  return db.transaction(async (tx) => {
    await lockTrace(tx, runId);
    const inserted = await tx
      .insert(runEvents)
      .values({
        runId,
        key: `t:${t.to}`,
        kind: "transition",
        state: t.to,
        reason: t.reason,
        detail: t.detail === undefined ? null : { text: t.detail },
      })
      .onConflictDoNothing()
      .returning({ id: runEvents.id });
    if (inserted.length === 0) return false;
    await tx
      .update(runs)
      .set({
        status: t.to,
        updatedAt: new Date(),
        ...(t.to === "fetching_vault" ? { startedAt: new Date() } : {}),
        ...(terminal ? { reason: t.reason, reasonDetail: t.detail ?? null, endedAt: new Date() } : {}),
      })
      .where(eq(runs.id, runId));
    if (terminal) await enqueueRunEnded(tx, runId);
    return true;
  });
}

/** Appends a note under "Network the platform changed" (once per code). */
export async function addNote(db: Db, runId: string, note: RunNote): Promise<void> {
  await db.transaction(async (tx) => {
    await lockTrace(tx, runId);
    const inserted = await tx
      .insert(runEvents)
      .values({ runId, key: `n:${note.code}`, kind: "note", reason: note.code, detail: note })
      .onConflictDoNothing()
      .returning({ id: runEvents.id });
    if (inserted.length === 0) return;
    await tx
      .update(runs)
      .set({ notes: sql`${runs.notes} || ${JSON.stringify([note])}::jsonb`, updatedAt: new Date() })
      .where(eq(runs.id, runId));
  });
}

/** Appends one trace row under a caller-chosen idempotency key. */
export async function addEvent(
  db: Db,
  runId: string,
  key: string,
  kind: "output" | "note" | "proxy",
  detail: unknown,
  reason: string | null = null,
): Promise<void> {
  await db.transaction(async (tx) => {
    await lockTrace(tx, runId);
    await tx.insert(runEvents).values({ runId, key, kind, reason, detail }).onConflictDoNothing();
  });
}

export async function setRunFields(
  db: Db,
  runId: string,
  fields: Partial<
    Pick<RunRow, "routing" | "policyVersion" | "proof" | "lingerSeconds" | "lingerUntil" | "lingerPausedAt">
  >,
): Promise<void> {
  await db
    .update(runs)
    .set({ ...fields, updatedAt: new Date() })
    .where(eq(runs.id, runId));
}

export type TraceRow = Awaited<ReturnType<typeof runTrace>>[number];

/** Whether the run is halted now: the last halt or resume note of its trace says. */
export function haltedNow(run: RunRow, trace: TraceRow[]): boolean {
  if (isTerminal(run.status)) return false;
  const last = trace.findLast(
    (e) => e.kind === "note" && typeof (e.detail as { halted?: unknown } | null)?.halted === "boolean",
  );
  return (last?.detail as { halted: boolean } | undefined)?.halted === true;
}
