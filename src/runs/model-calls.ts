import { budgetOf, readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { and, asc, desc, eq, getTableColumns, gt, gte, lt, or, sql } from "drizzle-orm";
import { z } from "zod";
import type { Owner } from "../auth/owner";
import { auditBatches, modelCallLog, runEvents, runs } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";

// The model lane's calls of a run, as its proxy reported them: which model and provider, status,
// token counts, time and whether the lane refused the call itself (its budget spent); the totals
// and the spend against the run's modelBudget. Never a prompt or an output (none is recorded). Scoped by the caller's
// environment: another tenant's run is 404, as no run at all.

// A call as it is read back: every column but the scoping ones, so a reader lists no fields.
const { environmentId: _environmentId, runId: _runId, ...callColumns } = getTableColumns(modelCallLog);

export type ModelCall = Omit<typeof modelCallLog.$inferSelect, "environmentId" | "runId">;

export interface RunModel {
  /** The name the run declared (or, for a run without a launch record, the calls sent). */
  name: string;
  /** The provider the calls reached; else the one the model named at launch; null if neither. */
  provider: string | null;
  /** The provider's API host at launch (host[:port]); null when the launch did not record it. */
  baseHost: string | null;
}

/** The run's calls over its whole life, as reported so far. */
export interface ModelTotals {
  /** Every call the lane recorded, refused ones included. */
  calls: number;
  inputTokens: number;
  outputTokens: number;
  /** Of inputTokens, read from the provider's prompt cache. */
  cachedInputTokens: number;
  /** Calls the lane answered itself (over budget...), never sent upstream. */
  refused: number;
  /** Calls sent upstream that came back with a 4xx or 5xx. */
  errors: number;
  /** Of the calls sent upstream (a refusal takes no time worth counting); null before any. */
  latencyMs: { p50: number | null; p95: number | null };
}

/** One limit of the run's budget: what was spent against it (limit null: none set). */
export interface BudgetLine {
  used: number;
  limit: number | null;
}

/** Spend against the run's modelBudget: calls sent upstream, and tokens. */
export interface ModelSpend {
  calls: BudgetLine;
  inputTokens: BudgetLine;
  outputTokens: BudgetLine;
}

/** Tokens of the calls made in one minute (UTC). */
export interface MinuteTokens {
  minute: Date;
  inputTokens: number;
  outputTokens: number;
}

/** The most recent minutes the per-minute series covers (the chart's width). */
export const MINUTES_SHOWN = 60;

export interface ModelUse {
  model: RunModel | null;
  totals: ModelTotals;
  /** Null: the run set no modelBudget. */
  budget: ModelSpend | null;
  /**
   * Tokens per minute over the last MINUTES_SHOWN minutes up to the newest call (fewer when the
   * calls span fewer), oldest first, a row for every minute (zeros included).
   */
  perMinute: MinuteTokens[];
  /** When the run's proxy last delivered an audit batch (they are flushed every second or so). */
  lastReportedAt: Date | null;
}

// What createRun writes into the launch row of the trace (src/runs/service.ts).
const Launched = z.object({
  model: z.object({ name: z.string(), provider: z.string(), baseHost: z.string() }),
});

const num = (v: string | number | null | undefined): number => Number(v ?? 0);
const numOrNull = (v: string | number | null | undefined): number | null =>
  v === null || v === undefined ? null : Number(v);

/** The run's model (as declared and launched, and as reached), the totals of its calls, spend. */
export async function runModelUse(db: Db, p: Owner, runId: string): Promise<Result<ModelUse>> {
  const [run] = await db
    .select({ id: runs.id, spec: runs.spec })
    .from(runs)
    .where(and(eq(runs.id, runId), eq(runs.environmentId, p.environmentId)));
  if (!run) return fail("not_found", `No run ${runId}.`);
  const [launch] = await db
    .select({ detail: runEvents.detail })
    .from(runEvents)
    .where(and(eq(runEvents.runId, run.id), eq(runEvents.key, "t:queued")));
  const [newest] = await db
    .select({ model: modelCallLog.model, provider: modelCallLog.provider })
    .from(modelCallLog)
    .where(eq(modelCallLog.runId, run.id))
    .orderBy(desc(modelCallLog.at), asc(modelCallLog.callId))
    .limit(1);
  const sent = sql`${modelCallLog.refused} is null`;
  // Aggregates come back as strings (bigint) or null; times as epoch seconds, so no timestamp
  // text is parsed here.
  const [sums] = await db
    .select({
      calls: sql<string>`count(*)`,
      inputTokens: sql<string>`coalesce(sum(${modelCallLog.inputTokens}), 0)`,
      outputTokens: sql<string>`coalesce(sum(${modelCallLog.outputTokens}), 0)`,
      cachedInputTokens: sql<string>`coalesce(sum(${modelCallLog.cachedInputTokens}), 0)`,
      refused: sql<string>`count(*) filter (where ${modelCallLog.refused} is not null)`,
      errors: sql<string>`count(*) filter (where ${sent} and ${modelCallLog.status} >= 400)`,
      p50: sql<
        string | null
      >`percentile_disc(0.5) within group (order by ${modelCallLog.ms}) filter (where ${sent})`,
      p95: sql<
        string | null
      >`percentile_disc(0.95) within group (order by ${modelCallLog.ms}) filter (where ${sent})`,
      lastMinute: sql<
        string | null
      >`extract(epoch from date_trunc('minute', max(${modelCallLog.at})))::bigint`,
    })
    .from(modelCallLog)
    .where(eq(modelCallLog.runId, run.id));
  const [reported] = await db
    .select({ at: sql<string | null>`(extract(epoch from max(${auditBatches.receivedAt})) * 1000)::bigint` })
    .from(auditBatches)
    .where(eq(auditBatches.runId, run.id));

  const launched = Launched.safeParse(launch?.detail);
  const spec = readStoredSpec(run.spec);
  const declared = spec.model;
  const name = launched.success
    ? launched.data.model.name
    : typeof declared === "string"
      ? declared
      : (newest?.model ?? null);
  const model =
    name === null
      ? null
      : {
          name,
          provider: newest?.provider ?? (launched.success ? launched.data.model.provider : null),
          baseHost: launched.success ? launched.data.model.baseHost : null,
        };
  const totals: ModelTotals = {
    calls: num(sums?.calls),
    inputTokens: num(sums?.inputTokens),
    outputTokens: num(sums?.outputTokens),
    cachedInputTokens: num(sums?.cachedInputTokens),
    refused: num(sums?.refused),
    errors: num(sums?.errors),
    latencyMs: { p50: numOrNull(sums?.p50), p95: numOrNull(sums?.p95) },
  };
  const limits = budgetOf(spec);
  const lastMinute = numOrNull(sums?.lastMinute);
  const reportedAt = numOrNull(reported?.at);
  return ok({
    model,
    totals,
    budget: limits && {
      calls: { used: totals.calls - totals.refused, limit: limits.calls },
      inputTokens: { used: totals.inputTokens, limit: limits.inputTokens },
      outputTokens: { used: totals.outputTokens, limit: limits.outputTokens },
    },
    perMinute: lastMinute === null ? [] : await tokensPerMinute(db, run.id, lastMinute),
    lastReportedAt: reportedAt === null ? null : new Date(reportedAt),
  });
}

/** The per-minute series up to the minute of the newest call (epoch seconds), zeros filled in. */
async function tokensPerMinute(db: Db, runId: string, lastMinute: number): Promise<MinuteTokens[]> {
  const from = lastMinute - (MINUTES_SHOWN - 1) * 60;
  const rows = await db
    .select({
      minute: sql<string>`extract(epoch from date_trunc('minute', ${modelCallLog.at}))::bigint`,
      inputTokens: sql<string>`sum(${modelCallLog.inputTokens})`,
      outputTokens: sql<string>`sum(${modelCallLog.outputTokens})`,
    })
    .from(modelCallLog)
    .where(and(eq(modelCallLog.runId, runId), gte(modelCallLog.at, new Date(from * 1000))))
    .groupBy(sql`1`)
    .orderBy(sql`1`);
  const byMinute = new Map(rows.map((r) => [num(r.minute), r]));
  const first = Math.min(...byMinute.keys(), lastMinute);
  const series: MinuteTokens[] = [];
  for (let m = first; m <= lastMinute; m += 60) {
    const row = byMinute.get(m);
    series.push({
      minute: new Date(m * 1000),
      inputTokens: num(row?.inputTokens),
      outputTokens: num(row?.outputTokens),
    });
  }
  return series;
}

// Keyset position: the last call's (at, callId); newest first, then by id. `at` is stored from a
// JS Date (milliseconds), so an ISO string keeps it exactly.
const CursorShape = z.tuple([z.iso.datetime(), z.string().max(64)]);

/** A page of the run's calls, newest first. The caller has checked the run is theirs. */
export async function listModelCalls(
  db: Db,
  p: Owner,
  runId: string,
  page: PageRequest,
): Promise<Result<Page<ModelCall>>> {
  const position = await openCursor(page, "run-model-calls", p.environmentId, CursorShape);
  if (!position.ok) return position;
  const at = position.value;
  const rows = await db
    .select(callColumns)
    .from(modelCallLog)
    .where(
      and(
        eq(modelCallLog.runId, runId),
        eq(modelCallLog.environmentId, p.environmentId),
        at
          ? or(
              lt(modelCallLog.at, new Date(at[0])),
              and(eq(modelCallLog.at, new Date(at[0])), gt(modelCallLog.callId, at[1])),
            )
          : undefined,
      ),
    )
    .orderBy(desc(modelCallLog.at), asc(modelCallLog.callId))
    .limit(page.limit + 1);
  return ok(
    await pageOf(page, "run-model-calls", p.environmentId, rows, (r) => [r.at.toISOString(), r.callId]),
  );
}
