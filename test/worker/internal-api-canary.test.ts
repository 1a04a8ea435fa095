import { eq, sql } from "drizzle-orm";
import { afterEach, describe, expect, it, vi } from "vitest";
import { vaultSecrets } from "../../src/db/schema";
import { type ApiResponse, call, expectProblem, withDb } from "./harness";
import { tenantWithVault } from "./internal-api-fixtures";
import { captureLogs, findNeedles, leakNeedles, responseText, scanDatabase } from "./leaks";
import { auditBatch, newRun, paths, postBatch, readyBody } from "./run-fixtures";

// Case B5: a run's secret values (canaries here) reach its own proxy's policy envelope and
// nothing else, nor do its proxy token and audit key: one sweep over every internal route, right
// and wrong calls, then the logs, every error body and the database's plaintext columns.

afterEach(() => {
  vi.restoreAllMocks();
});

describe("B5 the canary secret reaches only its run's proxy", { timeout: 120_000 }, () => {
  it("0 canaries (nor the proxy token or audit key) in logs, error bodies and database plaintext", async () => {
    const { t, used, unused } = await tenantWithVault();
    const run = await newRun(t);
    const other = await newRun((await tenantWithVault()).t);
    const logs = captureLogs();
    const responses: [string, ApiResponse][] = [];
    const record = async (where: string, res: Promise<ApiResponse>) => {
      const r = await res;
      responses.push([where, r]);
      return r;
    };

    const ok = await record("policy (right token)", run.proxy("GET", paths.policy(run)));
    expect(ok.json.secrets).toEqual({ API_KEY: used });
    await record(
      "policy 304",
      run.proxy("GET", paths.policy(run), undefined, { "if-none-match": ok.headers.get("etag") ?? "" }),
    );
    await record("policy, other run's token", other.proxy("GET", paths.policy(run)));
    await record("policy, API key", call(t.key, "GET", paths.policy(run)));
    await record("policy, no token", call(null, "GET", paths.policy(run)));
    await record("ready", run.proxy("POST", paths.ready(run), readyBody()));
    await record("ready, bad body", run.proxy("POST", paths.ready(run), readyBody({ caCertPem: used })));
    const now = new Date().toISOString();
    const batch = auditBatch(run.id, {
      blockedHosts: [{ host: "evil.example", count: 1, firstSeen: now, lastSeen: now }],
      limitRefusals: [
        { host: "api.example", method: "DELETE", limit: "path", count: 1, firstSeen: now, lastSeen: now },
      ],
      strayPlaceholders: [
        { host: "evil.example", secret: "API_KEY", count: 1, firstSeen: now, lastSeen: now },
      ],
    });
    await record("audit", postBatch(run, batch));
    await record("audit replay", postBatch(run, batch));
    await record("audit, wrong run", postBatch(run, auditBatch(other.id)));
    await record("audit, bad signature", postBatch(run, auditBatch(run.id), { key: other.auditKey }));
    // Secrets that do not decrypt: the error names the secret, never its value.
    await withDb((db) =>
      db
        .update(vaultSecrets)
        .set({ ciphertext: sql`${vaultSecrets.ciphertext} || 'x'` })
        .where(eq(vaultSecrets.environmentId, t.environmentId)),
    );
    const broken = await record("policy, undecryptable", run.proxy("GET", paths.policy(run)));
    expectProblem(broken, 503, "vault_unreadable");
    for (const path of ["blocked-hosts", "egress-routes", "limit-refusals", "stray-placeholders"]) {
      await record(`public ${path}`, t.api("GET", `/v1/runs/${run.id}/${path}`));
    }

    const secretNeedles = (await Promise.all([used, unused].map(leakNeedles))).flat();
    const credentialNeedles = [run.proxyToken, run.auditKey, run.auditKey.slice("whsec_".length)];
    const leaks = responses
      .filter(([where]) => where !== "policy (right token)")
      .flatMap(([where, res]) =>
        findNeedles(where, responseText(res), [...secretNeedles, ...credentialNeedles]),
      );
    expect(leaks).toEqual([]);
    expect(findNeedles("logs", logs.join("\n"), [...secretNeedles, ...credentialNeedles])).toEqual([]);
    // The database holds ciphertexts, the token's hash, never a plaintext.
    const db = await scanDatabase([...secretNeedles, ...credentialNeedles]);
    expect(db.columns).toEqual(
      expect.arrayContaining([
        "public.runs.spec",
        "public.run_events.detail",
        "public.blocked_host_log.host",
        "public.stray_placeholder_log.secret",
        "public.runs.audit_key_ciphertext",
      ]),
    );
    expect(db.hits).toEqual([]);
  });
});
