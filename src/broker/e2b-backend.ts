import type { ComputeBackend } from "./backend";

// Placeholder until the e2b backend lands: never configured.
export function e2bFromEnv(_env: Env): ComputeBackend | string {
  return "not built yet";
}
