import type { ComputeBackend } from "./backend";

// Placeholder until the sandbox0 backend lands: never configured.
export function sandbox0FromEnv(_env: Env): ComputeBackend | string {
  return "not built yet";
}
