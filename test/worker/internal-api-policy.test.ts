import { PolicyEnvelope, policyEtag } from "@benchwright/shared/contract/proxy-wire";
import { and, eq } from "drizzle-orm";
import { afterEach, describe, expect, it, vi } from "vitest";
import { vaultSecrets } from "../../src/db/schema";
import { unwrap } from "../../src/errors";
import { putHost } from "../../src/vault/hosts";
import { getSettings } from "../../src/vault/settings";
import { expectProblem, newTenant, principal, type Tenant, withDb } from "./harness";
import { tenantWithVault } from "./internal-api-fixtures";
import { captureLogs, findNeedles, leakNeedles, responseText } from "./leaks";
import { newRun, paths } from "./run-fixtures";

// GET /internal/runs/{runId}/policy, what a run's proxy fetches to enforce: the run's vault
// compiled at the time of the call, the values of the secrets its rules name (and no other),
// ETag and 304, the run's egress option, a vault that does not decrypt. Over the real Worker and
// the real Postgres; responses must match test/proxy/control-plane.ts, the contract double the
// proxy is tested against.

async function vaultVersion(t: Tenant): Promise<number> {
  return (await withDb((db) => getSettings(db, principal(t)))).version;
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe("GET /internal/runs/{runId}/policy", { timeout: 60_000 }, () => {
  it("the run's own token → its vault compiled now, with the value of the rule's secret only", async () => {
    const { t, tag, used, unused } = await tenantWithVault();
    const run = await newRun(t);
    const res = await run.proxy("GET", paths.policy(run));
    expect(res.status, res.text).toBe(200);
    const envelope = PolicyEnvelope.parse(res.json);
    expect(envelope.secrets).toEqual({ API_KEY: used });
    expect(res.text).not.toContain(unused);
    expect(envelope.policy.rules.map((r) => r.host)).toEqual([`api.${tag}.example`]);
    expect(envelope.policy.routing).toEqual({ mode: "default", reasons: [] });
    expect(envelope.policy.version).toBe(await vaultVersion(t));
    // The same document the public preview shows (which never carries values).
    const preview = await t.api("GET", "/v1/vault/policy-preview");
    expect(envelope.policy).toEqual(preview.json);
    // Byte-compatible with the contract double: JSON, ETag = the quoted version; never cached.
    expect(res.headers.get("content-type")).toMatch(/^application\/json/);
    expect(res.headers.get("etag")).toBe(policyEtag(envelope.policy.version));
    expect(res.headers.get("cache-control")).toBe("no-store");
  });

  it("If-None-Match with the current ETag → 304; a vault change bumps the version → 200 with a new ETag", async () => {
    const { t, tag } = await tenantWithVault();
    const run = await newRun(t);
    const first = await run.proxy("GET", paths.policy(run));
    const etag = first.headers.get("etag") ?? "";
    expect(etag).toMatch(/^"\d+"$/);
    for (const value of [etag, `W/${etag}`, `"999999", ${etag}`, "*"]) {
      const same = await run.proxy("GET", paths.policy(run), undefined, { "if-none-match": value });
      expect(same.status, value).toBe(304);
      expect(same.text).toBe("");
      expect(same.headers.get("etag")).toBe(etag);
      expect(same.headers.get("cache-control")).toBe("no-store");
    }
    await withDb(async (db) =>
      unwrap(await putHost(db, principal(t), { pattern: `*.blocked.${tag}.example`, action: "block" })),
    );
    const changed = await run.proxy("GET", paths.policy(run), undefined, { "if-none-match": etag });
    expect(changed.status).toBe(200);
    const next = PolicyEnvelope.parse(changed.json);
    expect(next.policy.version).toBe(Number(JSON.parse(etag)) + 1);
    expect(changed.headers.get("etag")).toBe(policyEtag(next.policy.version));
    // The new host entry is in force at once, with the routing it implies.
    expect(next.policy.routing).toEqual({ mode: "catch-all", reasons: ["wildcard_block"] });
  });

  it("the run's egress option is applied: local → catch-all (local_egress); no egress in the spec → direct", async () => {
    const { t } = await tenantWithVault();
    const local = await newRun(t, { spec: { commands: ["true"], egress: "local" } });
    const res = await local.proxy("GET", paths.policy(local));
    expect(res.json.policy.routing).toEqual({ mode: "catch-all", reasons: ["local_egress"] });
    const plain = await newRun(t, { spec: { commands: ["true"] } });
    expect((await plain.proxy("GET", paths.policy(plain))).json.policy.routing.mode).toBe("default");
    // An empty vault has nothing to enforce; the envelope says so and carries no secret.
    const empty = await newTenant();
    const bare = await newRun(empty);
    const none = await bare.proxy("GET", paths.policy(bare));
    expect(none.status).toBe(200);
    expect(none.json.policy.enforce).toBe(false);
    expect(none.json.secrets).toEqual({});
  });

  it("a rule's secret that does not decrypt → 503 vault_unreadable, never a partial envelope", async () => {
    const { t, used, unused } = await tenantWithVault();
    const run = await newRun(t);
    // The spare secret's ciphertext moved into the rule's secret row: bound to another id (B8).
    await withDb(async (db) => {
      const [spare] = await db
        .select({ c: vaultSecrets.ciphertext })
        .from(vaultSecrets)
        .where(and(eq(vaultSecrets.environmentId, t.environmentId), eq(vaultSecrets.name, "SPARE_KEY")));
      await db
        .update(vaultSecrets)
        .set({ ciphertext: spare?.c ?? "" })
        .where(and(eq(vaultSecrets.environmentId, t.environmentId), eq(vaultSecrets.name, "API_KEY")));
    });
    const logs = captureLogs();
    const res = expectProblem(await run.proxy("GET", paths.policy(run)), 503, "vault_unreadable");
    expect(res.json.detail).toContain("API_KEY");
    expect(res.headers.get("etag")).toBeNull();
    const needles = (await Promise.all([used, unused].map(leakNeedles))).flat();
    expect(findNeedles("response", responseText(res), needles)).toEqual([]);
    expect(logs.some((l) => l.includes("vault_unreadable"))).toBe(true);
    expect(findNeedles("logs", logs.join("\n"), needles)).toEqual([]);
  });
});
