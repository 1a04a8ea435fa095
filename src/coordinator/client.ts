import { consoleLog } from "@benchwright/shared/contract/log";
import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import type { Owner } from "../auth/owner";
import { backendForLaunch } from "../broker/backends";
import { loadConfig } from "../config";
import type { Db } from "../db/types";
import { unwrap } from "../errors";
import { checkLaunchable } from "../runs/launch";
import * as runsService from "../runs/service";
import type { RunCoordinator } from "./run-coordinator";
import { endAware } from "./worker-ports";

// How the rest of the Worker reaches a run's coordinator (run-coordinator.ts): its stub, and the
// launch and cancel that go through it.

/** The run's coordinator: one Durable Object per run, named by the run id. */
export function coordinatorStub(env: Env, runId: string): DurableObjectStub<RunCoordinator> {
  return env.RUN_COORDINATOR.get(env.RUN_COORDINATOR.idFromName(runId));
}

/**
 * Launches a run (the API's and the runs page's launch): checked, recorded queued, started. If
 * the start call fails the run stays queued; the reaper's sweep starts or stops it. The launch
 * still answers with the run: a 5xx here would invite a retry (an Idempotency-Key keeps no 5xx),
 * and the retry would make a second run beside the queued one.
 */
export async function launchRun(
  env: Env,
  db: Db,
  p: Owner,
  spec: RunSpec,
  requestId: string,
): Promise<runsService.RunRow> {
  const config = loadConfig(env);
  unwrap(await checkLaunchable(db, p.environmentId, spec, config.resourceBounds));
  const run = await runsService.createRun(
    db,
    p,
    spec,
    backendForLaunch(env, spec.backend),
    config.maxActiveRuns,
  );
  try {
    await coordinatorStub(env, run.id).start(run.id, requestId);
  } catch (error) {
    consoleLog("error", {
      event: "run_start_deferred",
      runId: run.id,
      requestId,
      error: (error as Error).name,
    });
  }
  return run;
}

/**
 * Cancels a live run through its coordinator; a run whose coordinator never started has nothing
 * to tear down and is stopped here. "asked": it stops at its next step.
 */
export async function cancelRun(
  env: Env,
  db: Db,
  runId: string,
  requestId: string,
): Promise<"asked" | "stopped"> {
  if (await coordinatorStub(env, runId).cancel("cancelled", requestId)) return "asked";
  await endAware(env, db, runId, {
    to: "stopped",
    reason: "cancelled",
    detail: "Cancelled by the user before it started.",
  });
  return "stopped";
}
