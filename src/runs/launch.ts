import { Resources } from "@benchwright/shared/contract/local-agent";
import {
  MAX_LINGER_SECONDS,
  type ResourceBounds,
  type RunResources,
  type RunSpec,
} from "@benchwright/shared/contract/run-spec";
import { findBundle } from "../bundles/rows";
import type { Q } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { BENCHMARKS, isBenchmark } from "./benchmarks";

// What the schema cannot say about a launch, each a check that answers with the failure to
// report (its own problem code) rather than throwing: the caller decides how to answer it.

const PASSED: Result<void> = ok(undefined);

/** The 24 h cap has its own code, so a client can tell it from any other invalid field. */
export function checkLinger(seconds: number | undefined): Result<void> {
  if (seconds !== undefined && seconds > MAX_LINGER_SECONDS) {
    return fail(
      "linger_too_long",
      `A proxy may linger at most ${MAX_LINGER_SECONDS} seconds (24 h); ${seconds} were asked for.`,
    );
  }
  return PASSED;
}

/** A budget limits the declared model's lane: without a model there is nothing it could limit. */
export function checkModelBudget(spec: RunSpec): Result<void> {
  if (spec.modelBudget !== undefined && spec.model === undefined) {
    return fail(
      "model_budget_without_model",
      "modelBudget limits the run's declared model: give model too, or launch without modelBudget.",
    );
  }
  return PASSED;
}

/** resources_out_of_bounds unless each asked limit is within the contract's floor and the operator's cap. */
export function checkResources(resources: RunResources | undefined, bounds: ResourceBounds): Result<void> {
  if (!resources) return PASSED;
  const floor = Resources.shape;
  const fields = [
    ["memoryMb", resources.memoryMb, floor.memoryMb.minValue ?? 0, bounds.memoryMb, "MiB"],
    ["pids", resources.pids, floor.pids.minValue ?? 0, bounds.pids, ""],
    ["cpus", resources.cpus, floor.cpus.minValue ?? 0, bounds.cpus, ""],
  ] as const;
  const wrong = fields.flatMap(([name, value, min, max, unit]) =>
    value === undefined || (value >= min && value <= max)
      ? []
      : [`resources.${name} ${value} is outside ${min}–${max}${unit ? ` ${unit}` : ""}`],
  );
  if (wrong.length > 0) {
    return fail("resources_out_of_bounds", `${wrong.join("; ")} (this deployment's bounds).`);
  }
  return PASSED;
}

/**
 * Every launch's checks (the API's, a webhook template's and its deliveries', the runs page's):
 * the benchmark must exist, a linger stay within 24 h, the resources within the deployment's
 * bounds, a model budget come with a model, and a named bundle be one of the caller's
 * environment (case H3). The first that fails is the answer.
 */
export async function checkLaunchable(
  db: Q,
  environmentId: string,
  spec: RunSpec,
  bounds: ResourceBounds,
): Promise<Result<void>> {
  if (spec.benchmark !== undefined && !isBenchmark(spec.benchmark)) {
    return fail(
      "unknown_benchmark",
      `No benchmark ${JSON.stringify(spec.benchmark)}; known: ${Object.keys(BENCHMARKS).join(", ")}.`,
    );
  }
  for (const checked of [
    checkLinger(spec.lingerSeconds),
    checkModelBudget(spec),
    checkResources(spec.resources, bounds),
  ]) {
    if (!checked.ok) return checked;
  }
  if (spec.bundle !== undefined && !(await findBundle(db, environmentId, spec.bundle))) {
    return fail(
      "bundle_not_found",
      `No bundle ${spec.bundle} in this environment; upload it with POST /v1/bundles first.`,
    );
  }
  return PASSED;
}
