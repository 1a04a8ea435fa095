import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { generateApiKey } from "../../src/crypto/api-keys";
import { runs } from "../../src/db/schema";
import { issueProxyCredentials, revokeProxyCredentials } from "../../src/runs/proxy-credentials";
import { call, expectProblem, newTenant, withDb } from "./harness";
import { ring, tenantWithVault } from "./internal-api-fixtures";
import {
  auditBatch,
  auditRows,
  NO_AUDIT_ROWS,
  newRun,
  paths,
  postBatch,
  readyBody,
  setRunStatus,
  signed,
} from "./run-fixtures";

// Case C2: a run's proxy credential (its token) reaches the internal API of its own run only,
// and only while it is live: another run's token, a bad, API-key, ended-run, revoked or
// re-issued token is refused on the policy, ready and audit routes alike.

// case C2
describe("C2 a run's proxy credential reaches its own run only", { timeout: 60_000 }, () => {
  it("run A's token on run B's policy, ready and audit → 404 not_found (same tenant or another); B unchanged", async () => {
    const { t } = await tenantWithVault();
    const a = await newRun(t);
    const sameTenant = await newRun(t);
    const other = await newRun((await tenantWithVault()).t);
    for (const b of [sameTenant, other]) {
      expectProblem(await a.proxy("GET", paths.policy(b)), 404, "not_found");
      expectProblem(await a.proxy("POST", paths.ready(b), readyBody()), 404, "not_found");
      // Signed with B's own key and naming B: only the token is wrong.
      const batch = auditBatch(b.id, {
        blockedHosts: [
          {
            host: "x.example",
            count: 1,
            firstSeen: new Date().toISOString(),
            lastSeen: new Date().toISOString(),
          },
        ],
      });
      expectProblem(await postBatch(a, batch, { path: paths.audit(b), key: b.auditKey }), 404, "not_found");
      // A run id that does not exist answers the same.
      expectProblem(await a.proxy("GET", paths.policy({ id: "run_doesnotexist" })), 404, "not_found");
      const [row] = await withDb((db) => db.select().from(runs).where(eq(runs.id, b.id)));
      expect(row?.caCertPem).toBeNull();
      expect(row?.proxyReadyAt).toBeNull();
      expect(await auditRows(b.id)).toEqual(NO_AUDIT_ROWS);
    }
    // A's own token still works.
    expect((await a.proxy("GET", paths.policy(a))).status).toBe(200);
  });

  it("missing, garbage, unknown and API-key tokens → 401 unauthorized on every route", async () => {
    const { t } = await tenantWithVault();
    const run = await newRun(t);
    const body = signed(run.auditKey, auditBatch(run.id));
    const credentials: Record<string, Record<string, string>> = {
      "no token": {},
      garbage: { authorization: "Bearer garbage" },
      "unknown token of the right shape": { authorization: `Bearer bwp_${"A".repeat(43)}` },
      "token one character off": {
        authorization: `Bearer ${run.proxyToken.slice(0, -1)}${run.proxyToken.endsWith("A") ? "E" : "A"}`,
      },
      "token without scheme": { authorization: run.proxyToken },
      "token as basic auth": { authorization: `Basic ${btoa(`${run.proxyToken}:`)}` },
      "the tenant's API key": { authorization: `Bearer ${t.key}` },
      "an API key": { authorization: `Bearer ${generateApiKey().key}` },
    };
    for (const [label, headers] of Object.entries(credentials)) {
      for (const [method, path, payload, extra] of [
        ["GET", paths.policy(run), undefined, {}],
        ["POST", paths.ready(run), readyBody(), {}],
        ["POST", paths.audit(run), body.body, body.headers],
      ] as const) {
        const res = await call(null, method, path, payload, { ...extra, ...headers });
        try {
          expectProblem(res, 401, "unauthorized");
        } catch (e) {
          throw new Error(`${label} ${method} ${path}: ${(e as Error).message}`);
        }
        expect(res.text).not.toContain(run.proxyToken);
      }
    }
    // The API key is for /v1 and the proxy token for /internal, not the other way round.
    expectProblem(await call(run.proxyToken, "GET", "/v1/me"), 401, "unauthorized");
    expect(await auditRows(run.id)).toEqual(NO_AUDIT_ROWS);
  });

  it("an ended run's token → 401 on policy and ready; its audit batches are accepted until it is revoked", async () => {
    const { t } = await tenantWithVault();
    for (const status of ["finished", "stopped", "failed"] as const) {
      const run = await newRun(t);
      expect((await run.proxy("GET", paths.policy(run))).status).toBe(200);
      await setRunStatus(run.id, status);
      expectProblem(await run.proxy("GET", paths.policy(run)), 401, "unauthorized");
      expectProblem(await run.proxy("POST", paths.ready(run), readyBody()), 401, "unauthorized");
      // The proxy flushes its spool as it is shut down, which is when the run ends.
      const now = new Date().toISOString();
      const late = auditBatch(run.id, {
        blockedHosts: [{ host: "late.example", count: 2, firstSeen: now, lastSeen: now }],
      });
      expect((await postBatch(run, late)).status).toBe(204);
      expect((await auditRows(run.id)).blocked.map((r) => [r.host, r.seenCount])).toEqual([
        ["late.example", 2],
      ]);
      // Revoked (the coordinator does it once the proxy sandbox is gone): nothing more.
      await withDb((db) => revokeProxyCredentials(db, run.id));
      expectProblem(await postBatch(run, auditBatch(run.id)), 401, "unauthorized");
    }
  });

  it("a revoked or re-issued token → 401 everywhere, even for a running run", async () => {
    const { t } = await tenantWithVault();
    const run = await newRun(t);
    const fresh = await withDb((db) =>
      issueProxyCredentials(db, ring(), { id: run.id, userId: t.userId, environmentId: t.environmentId }),
    );
    expectProblem(await run.proxy("GET", paths.policy(run)), 401, "unauthorized");
    expect((await call(fresh.proxyToken, "GET", paths.policy(run))).status).toBe(200);
    await withDb((db) => revokeProxyCredentials(db, run.id));
    expectProblem(await call(fresh.proxyToken, "GET", paths.policy(run)), 401, "unauthorized");
    const [row] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect(row?.proxyTokenHash).toBeNull();
    expect(row?.auditKeyCiphertext).toBeNull();
  });

  it("re-issuing clears the previous launch's ready report: a relaunched proxy is not ready with an old CA", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    expect((await run.proxy("POST", paths.ready(run), readyBody())).status).toBe(204);
    await withDb((db) =>
      issueProxyCredentials(db, ring(), { id: run.id, userId: t.userId, environmentId: t.environmentId }),
    );
    const [row] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect([row?.caCertPem, row?.caFingerprint, row?.proxyReadyAt]).toEqual([null, null, null]);
  });
});
