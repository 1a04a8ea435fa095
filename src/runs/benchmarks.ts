import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { DEMO_SCRIPT } from "./demo-script";

// The built-in benchmarks a run may name (`benchmark`) instead of giving its commands inline.

/** Built-in benchmarks: a name → the commands it runs. */
export const BENCHMARKS: Readonly<Record<string, readonly string[]>> = {
  demo: [`node -e '${DEMO_SCRIPT.trim()}'`],
};

/** Whether `name` is a built-in benchmark. */
export const isBenchmark = (name: string): boolean => Object.hasOwn(BENCHMARKS, name);

/** The commands of the work sandbox: the inline ones or the benchmark's. */
export function commandsOf(spec: RunSpec): readonly string[] {
  if (spec.commands) return spec.commands;
  return BENCHMARKS[spec.benchmark ?? ""] ?? [];
}
