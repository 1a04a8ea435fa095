import { describe } from "vitest";
import { caseTests } from "./isolation-cases";
import { FILE_CASES } from "./isolation-file-cases";

// Tenant isolation of stored files (case C1): A's key never lists or downloads B's run
// artifacts, and never reads or launches with B's bundle (case H3). The cases are in
// isolation-file-cases.ts; the sweeps over every route in isolation-routes.test.ts.

// case C1, case H3
describe("C1 tenant isolation: A's key never reaches B's vault", { timeout: 120_000 }, () => {
  caseTests(FILE_CASES);
});
