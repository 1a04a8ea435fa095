import { and, eq, inArray, lt, notInArray } from "drizzle-orm";
import { brokerStub } from "../broker/sandbox-broker";
import { loadConfig } from "../config";
import { coordinatorStub } from "../coordinator/run-coordinator";
import { openDb } from "../db/client";
import { runs, sandboxes } from "../db/schema";
import { TERMINAL_STATES } from "../runs/service";

// The cron trigger's backstop (wrangler.toml [triggers]). Each run's coordinator drives it with
// its own alarm; this only catches what an alarm missed, and is idempotent:
//   - a run whose row has not moved for STALE_MS: its coordinator is started (a lost launch call)
//     or its alarm re-armed. A live run (alarm pending) is left as it is: never reaped here.
//   - sandboxes still recorded live for a run that ended more than ORPHAN_MS ago: torn down.

export const STALE_MS = 2 * 60_000;
export const ORPHAN_MS = 5 * 60_000;
const BATCH = 100;

export interface ReconcileReport {
  nudged: Record<string, "started" | "rearmed" | "alive" | "over" | "error">;
  tornDown: Record<string, "destroyed" | "error">;
}

export async function reconcile(env: Env, now = Date.now()): Promise<ReconcileReport> {
  const { db, close } = openDb(loadConfig(env));
  const report: ReconcileReport = { nudged: {}, tornDown: {} };
  try {
    const quiet = await db
      .select({ id: runs.id })
      .from(runs)
      .where(and(notInArray(runs.status, [...TERMINAL_STATES]), lt(runs.updatedAt, new Date(now - STALE_MS))))
      .limit(BATCH);
    for (const { id } of quiet) {
      try {
        report.nudged[id] = await coordinatorStub(env, id).ensure(id);
      } catch {
        report.nudged[id] = "error";
      }
    }
    const orphaned = await db
      .selectDistinct({ runId: sandboxes.runId })
      .from(sandboxes)
      .innerJoin(runs, eq(runs.id, sandboxes.runId))
      .where(
        and(
          inArray(sandboxes.status, ["creating", "ready"]),
          inArray(runs.status, [...TERMINAL_STATES]),
          lt(runs.endedAt, new Date(now - ORPHAN_MS)),
        ),
      )
      .limit(BATCH);
    for (const { runId } of orphaned) {
      try {
        await brokerStub(env).destroyRun(runId);
        report.tornDown[runId] = "destroyed";
      } catch {
        report.tornDown[runId] = "error";
      }
    }
  } finally {
    await close().catch(() => {});
  }
  // Ids and outcomes only.
  console.log(JSON.stringify({ event: "reconcile", ...report }));
  return report;
}
