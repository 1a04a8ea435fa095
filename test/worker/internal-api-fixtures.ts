import { env } from "cloudflare:workers";
import { loadConfig } from "../../src/config";
import { unwrap } from "../../src/errors";
import { putHost } from "../../src/vault/hosts";
import { createRule } from "../../src/vault/rules";
import { createSecret } from "../../src/vault/secrets";
import { newTenant, principal, withDb } from "./harness";
import { newCanary } from "./leaks";

// What the tests of the internal API a run's proxy calls (src/routes/internal.ts) set up: a
// tenant whose vault has one rule and one secret no rule uses, so a policy envelope can be told
// to carry the one and not the other. Apart from the tests so that the policy, credential and
// canary files set up the same vault.

export const ring = () => loadConfig(env).keyRing;

/** A tenant whose vault has a rule for `api.<tag>.example` and a secret no rule uses. */
export async function tenantWithVault() {
  const t = await newTenant();
  const tag = crypto.randomUUID().slice(0, 8);
  const used = newCanary("used");
  const unused = newCanary("unused");
  await withDb(async (db) => {
    const p = principal(t);
    unwrap(await createSecret(db, ring(), p, { name: "API_KEY", value: used }));
    unwrap(await createSecret(db, ring(), p, { name: "SPARE_KEY", value: unused }));
    unwrap(
      await createRule(db, p, {
        host: `api.${tag}.example`,
        secret: "API_KEY",
        inject: { scheme: "bearer" },
      }),
    );
    unwrap(await putHost(db, p, { pattern: `evil.${tag}.example`, action: "block" }));
  });
  return { t, tag, used, unused };
}
