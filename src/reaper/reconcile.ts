import { consoleLog } from "@benchwright/shared/contract/log";
import { TERMINAL_STATES } from "@benchwright/shared/contract/run-states";
import { and, eq, inArray, lt, notInArray, or } from "drizzle-orm";
import type { BrokerApi } from "../broker/interface";
import { brokerStub, sweepBrokerStub } from "../broker/sandbox-broker";
import { loadConfig } from "../config";
import { coordinatorStub } from "../coordinator/client";
import { endAware } from "../coordinator/worker-ports";
import { openDb } from "../db/client";
import { runs, sandboxes } from "../db/schema";
import { purgeExpiredKeys } from "../idempotency/store";
import { wakeNotifier } from "../notifications/notifier";
import { overdueRuns } from "../notifications/service";
import { reapSetupImages, type SetupImageReap } from "../setup-images/reap";

// The cron trigger's backstop (wrangler.toml [triggers]). Each run's coordinator drives it with
// its own alarm; this only catches what an alarm missed, and is idempotent:
//   - a run whose row has not moved for STALE_MS: its coordinator is started (a lost launch call)
//     or its alarm re-armed. A live run (alarm pending) is left as it is: never reaped here.
//   - sandboxes still recorded live for a run that ended more than ORPHAN_MS ago: torn down.
//   - sandboxes the backend has that no live record owns (the broker's sweepUnowned, on the
//     sweep's own broker instance: a run's teardown goes to that run's broker).
//   - a run stuck in a setup state past STUCK_MS, or running past MAX_RUN_MS: stopped (`reaped`).
//   - a lingering run whose window lapsed more than LINGER_GRACE_MS ago (its own alarm should
//     have ended it on time): ended through its coordinator (`linger_lapsed`).
//   - Idempotency-Keys past their day (src/idempotency): forgotten.
//   - a run-end notification overdue by NOTIFY_GRACE_MS (src/notifications): its notifier woken.
//   - setup images (src/setup-images/reap.ts): abandoned builds deleted, unused ones dropped
//     (their stored artifacts through the sweep's broker, then their rows).

export const STALE_MS = 2 * 60_000;
export const ORPHAN_MS = 5 * 60_000;
/**
 * A run still in a setup state this long after it entered it is stuck (each setup step has a
 * deadline of seconds: vault retries, proxy ready 30 s, wiring 60 s); a run running this long is
 * past the longest run we allow. Either is stopped with reason `reaped`.
 */
export const STUCK_MS = 15 * 60_000;
export const MAX_RUN_MS = 24 * 60 * 60_000;
export const LINGER_GRACE_MS = 5 * 60_000;
/** A notification attempt this overdue means its notifier never got its wake-up call. */
export const NOTIFY_GRACE_MS = 2 * 60_000;
const SETUP_STATES = ["queued", "fetching_vault", "starting_proxy", "starting_sandboxes", "wiring"] as const;
const BATCH = 100;

export interface ReconcileReport {
  reaped: Record<string, "stopping" | "stopped" | "error">;
  nudged: Record<string, "started" | "rearmed" | "alive" | "over" | "error">;
  tornDown: Record<string, "destroyed" | "error">;
  /** Backend sandboxes no live record owns (see SandboxBroker.sweepUnowned), or why not swept. */
  unowned: { destroyed: string[]; errors: string[] } | { skipped: string };
  /** Idempotency-Keys forgotten (past their 24 hours), or -1 if the delete failed. */
  expiredKeys: number;
  /** Runs whose notifier had an overdue delivery and was woken (its wake-up call was lost). */
  notifiersWoken: string[];
  /** Setup image rows deleted, marked or kept (ids), or why the step did not run. */
  setupImages: SetupImageReap | { skipped: string };
}

export async function reconcile(env: Env, now = Date.now()): Promise<ReconcileReport> {
  const config = loadConfig(env);
  const { db, close } = openDb(config);
  const report: ReconcileReport = {
    reaped: {},
    nudged: {},
    tornDown: {},
    unowned: { skipped: "not reached" },
    expiredKeys: 0,
    notifiersWoken: [],
    setupImages: { skipped: "not reached" },
  };
  try {
    const stuck = await db
      .select({ id: runs.id })
      .from(runs)
      .where(
        or(
          and(inArray(runs.status, [...SETUP_STATES]), lt(runs.updatedAt, new Date(now - STUCK_MS))),
          and(eq(runs.status, "running"), lt(runs.startedAt, new Date(now - MAX_RUN_MS))),
          and(eq(runs.status, "lingering"), lt(runs.lingerUntil, new Date(now - LINGER_GRACE_MS))),
        ),
      )
      .limit(BATCH);
    for (const { id } of stuck) {
      try {
        // Through its coordinator, which tears its sandboxes down; a run that never had one
        // has nothing to tear down and is stopped here.
        if (await coordinatorStub(env, id).cancel("reaped")) {
          report.reaped[id] = "stopping";
        } else {
          await endAware(env, db, id, {
            to: "stopped",
            reason: "reaped",
            detail: "Stopped by the sweeper: the run never reached its coordinator in time.",
          });
          report.reaped[id] = "stopped";
        }
      } catch {
        report.reaped[id] = "error";
      }
    }
    const quiet = await db
      .select({ id: runs.id })
      .from(runs)
      .where(and(notInArray(runs.status, [...TERMINAL_STATES]), lt(runs.updatedAt, new Date(now - STALE_MS))))
      .limit(BATCH);
    for (const { id } of quiet) {
      if (id in report.reaped) continue;
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
        report.tornDown[runId] = (await brokerStub(env, runId).destroyRun(runId)).ok ? "destroyed" : "error";
      } catch {
        report.tornDown[runId] = "error";
      }
    }
    try {
      report.expiredKeys = await purgeExpiredKeys(db, now);
    } catch {
      report.expiredKeys = -1;
    }
    try {
      for (const runId of await overdueRuns(db, now, NOTIFY_GRACE_MS, BATCH)) {
        await wakeNotifier(env, runId);
        report.notifiersWoken.push(runId);
      }
    } catch {
      // The next sweep looks again.
    }
    try {
      const broker: Pick<BrokerApi, "dropSetupImages"> = sweepBrokerStub(env);
      report.setupImages = await reapSetupImages(
        db,
        (images) => broker.dropSetupImages(images),
        config.setupImages.unusedMs,
        now,
      );
    } catch {
      report.setupImages = { skipped: "database_error" };
    }
    try {
      const swept = await sweepBrokerStub(env).sweepUnowned();
      // The backend is away: the next sweep tries again.
      report.unowned = swept.ok ? swept.value : { skipped: "backend_unreachable" };
    } catch {
      report.unowned = { skipped: "backend_unreachable" };
    }
  } finally {
    await close().catch(() => {});
  }
  // Ids and outcomes only. A sweep that had to act is a warning (something's own alarm or teardown
  // missed it); one that failed at something is an error (docs/operator-guide.md).
  consoleLog(sweepLevel(report), { event: "reconcile", ...report });
  return report;
}

function sweepLevel(report: ReconcileReport): "info" | "warn" | "error" {
  const outcomes = [
    ...Object.values(report.reaped),
    ...Object.values(report.nudged),
    ...Object.values(report.tornDown),
  ];
  const unowned = "destroyed" in report.unowned ? report.unowned : null;
  const images = "lapsed" in report.setupImages ? report.setupImages : null;
  const imagesFailed =
    images?.error !== undefined ||
    ("skipped" in report.setupImages && report.setupImages.skipped === "database_error");
  if (outcomes.includes("error") || (unowned?.errors.length ?? 0) > 0 || imagesFailed) return "error";
  // An abandoned build is something a run's teardown missed; dropping unused images is routine.
  const acted =
    Object.keys(report.reaped).length +
    Object.keys(report.tornDown).length +
    report.notifiersWoken.length +
    (images?.lapsed.length ?? 0);
  return acted > 0 || (unowned?.destroyed.length ?? 0) > 0 ? "warn" : "info";
}
