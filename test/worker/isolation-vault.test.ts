import { describe, expect, it } from "vitest";
import { expectProblem } from "./harness";
import { caseTests } from "./isolation-cases";
import { expectStatus, twoVaults, version } from "./isolation-fixtures";
import { VAULT_CASES } from "./isolation-vault-cases";

// Tenant isolation of the vault's routes (case C1): A's key with B's secret, rule, host entry
// and model ids, on the vault's lists, settings, preview and dry run, never reaches B's vault.
// The cases are in isolation-vault-cases.ts; the sweeps over every route in
// isolation-routes.test.ts.

// case C1
describe("C1 tenant isolation: A's key never reaches B's vault", { timeout: 120_000 }, () => {
  caseTests(VAULT_CASES);

  it("PUT /v1/vault/rules/order with B's rule ids → 400 invalid_order; both orders unchanged", async () => {
    const { a, b } = await twoVaults();
    const bRules = expectStatus(await b.t.api("GET", "/v1/vault/rules"), 200, "B rules").json;
    const aRules = expectStatus(await a.t.api("GET", "/v1/vault/rules"), 200, "A rules").json;
    const bVersion = await version(b.t);
    const reversed = [...b.ids.rule].reverse();
    expectProblem(await a.t.api("PUT", "/v1/vault/rules/order", { ids: reversed }), 400, "invalid_order");
    expect((await b.t.api("GET", "/v1/vault/rules")).json).toEqual(bRules);
    expect((await a.t.api("GET", "/v1/vault/rules")).json).toEqual(aRules);
    expect(await version(b.t)).toBe(bVersion);
  });
});
