import { and, asc, desc, eq, gt, lt, or, sql } from "drizzle-orm";
import { z } from "zod";
import type { Principal } from "../context";
import { modelCallLog, runEvents, runs } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { badCursor, decodeCursor, encodeCursor } from "./cursor";
import type { Page } from "./service";
import { storedSpec } from "./spec";

// The model lane's calls of a run, as its proxy reported them: which model and provider, status,
// token counts and time. Never a prompt or an output (none is recorded). Scoped by the caller's
// environment: another tenant's run is 404, as no run at all.

export type ModelCall = typeof modelCallLog.$inferSelect;

export interface RunModel {
  /** The name the run declared (or, for a run without a launch record, the calls sent). */
  name: string;
  /** The provider the calls reached; else the one the model named at launch; null if neither. */
  provider: string | null;
  /** The provider's API host at launch (host[:port]); null when the launch did not record it. */
  baseHost: string | null;
}

export interface ModelUse {
  model: RunModel | null;
  totals: { calls: number; inputTokens: number; outputTokens: number };
}

// What createRun writes into the launch row of the trace (src/runs/service.ts).
const Launched = z.object({
  model: z.object({ name: z.string(), provider: z.string(), baseHost: z.string() }),
});

/** The run's model (as declared and launched, and as reached) and the totals of its calls. */
export async function runModelUse(db: Db, p: Principal, runId: string): Promise<Result<ModelUse>> {
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
  const [sums] = await db
    .select({
      calls: sql<string>`count(*)`,
      inputTokens: sql<string>`coalesce(sum(${modelCallLog.inputTokens}), 0)`,
      outputTokens: sql<string>`coalesce(sum(${modelCallLog.outputTokens}), 0)`,
    })
    .from(modelCallLog)
    .where(eq(modelCallLog.runId, run.id));

  const launched = Launched.safeParse(launch?.detail);
  const declared = storedSpec(run.spec).model;
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
  return ok({
    model,
    totals: {
      calls: Number(sums?.calls ?? 0),
      inputTokens: Number(sums?.inputTokens ?? 0),
      outputTokens: Number(sums?.outputTokens ?? 0),
    },
  });
}

// Keyset position: the last call's (at, callId); newest first, then by id. `at` is stored from a
// JS Date (milliseconds), so an ISO string keeps it exactly.
const CursorShape = z.tuple([z.iso.datetime(), z.string().max(64)]);

/** A page of the run's calls, newest first. The caller has checked the run is theirs. */
export async function listModelCalls(
  db: Db,
  p: Principal,
  runId: string,
  limit: number,
  cursor: string | undefined,
): Promise<Result<Page<ModelCall>>> {
  const at = cursor === undefined ? null : decodeCursor(cursor, CursorShape);
  if (cursor !== undefined && !at) return badCursor();
  const rows = await db
    .select()
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
    .limit(limit + 1);
  const items = rows.slice(0, limit);
  const last = items.at(-1);
  return ok({
    items,
    nextCursor: rows.length > limit && last ? encodeCursor([last.at.toISOString(), last.callId]) : null,
  });
}
