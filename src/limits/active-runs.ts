import { TERMINAL_STATES } from "@benchwright/shared/contract/run-states";
import { and, count, eq, notInArray } from "drizzle-orm";
import { environments, runs } from "../db/schema";
import type { Q } from "../db/types";
import { ApiError } from "../errors";

// Runs at once per environment (case K4): a launch is refused while the environment has
// RUNS_MAX_ACTIVE_PER_ENVIRONMENT runs that have not ended (a lingering run counts: it holds a
// proxy sandbox and its credentials). Checked inside the launch's own transaction, before the run
// row is written and before any sandbox is asked for, so a refused launch leaves nothing behind.

/** A guess, not a promise: runs end when they end. */
export const TOO_MANY_RUNS_RETRY_SECONDS = 30;

export async function admitRun(tx: Q, environmentId: string, maxActive: number): Promise<void> {
  // The environment's row lock makes the count and the caller's insert one step: two launches at
  // once cannot both see room for one more.
  await tx
    .select({ id: environments.id })
    .from(environments)
    .where(eq(environments.id, environmentId))
    .for("update");
  const [row] = await tx
    .select({ n: count() })
    .from(runs)
    .where(and(eq(runs.environmentId, environmentId), notInArray(runs.status, [...TERMINAL_STATES])));
  const active = row?.n ?? 0;
  if (active >= maxActive) {
    throw new ApiError(
      "too_many_runs",
      `This environment has ${active} runs that have not ended, the most this deployment runs at once (RUNS_MAX_ACTIVE_PER_ENVIRONMENT = ${maxActive}); wait for one to end or cancel one. Nothing was launched.`,
      TOO_MANY_RUNS_RETRY_SECONDS,
    );
  }
}
