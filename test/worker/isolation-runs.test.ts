import { describe } from "vitest";
import { caseTests } from "./isolation-cases";
import { RUN_CASES } from "./isolation-run-cases";

// Tenant isolation of runs' routes (case C1): A's key with B's run id, on the actions on a run,
// its audit reads, model calls and bug reports, and the environment-wide reads of runs, never
// reaches B's runs. The cases are in isolation-run-cases.ts; a run's artifacts are in
// isolation-files.test.ts, the sweeps over every route in isolation-routes.test.ts.

// case C1
describe("C1 tenant isolation: A's key never reaches B's vault", { timeout: 120_000 }, () => {
  caseTests(RUN_CASES);
});
