import { describe } from "vitest";
import { ACCOUNT_CASES } from "./isolation-account-cases";
import { caseTests } from "./isolation-cases";

// Tenant isolation of a tenant's API keys, webhooks and notification URLs (case C1): A's key
// with B's ids never reaches B's; and the two routes that are not tenant-scoped (the caller's own
// key, the OpenAPI document) tell A nothing about B. The cases are in isolation-account-cases.ts;
// the sweeps over every route in isolation-routes.test.ts.

// case C1
describe("C1 tenant isolation: A's key never reaches B's vault", { timeout: 120_000 }, () => {
  caseTests(ACCOUNT_CASES);
});
