import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { and, eq, sql } from "drizzle-orm";
import { afterEach, describe, expect, it, vi } from "vitest";
import { createApp } from "../../src/app";
import { loadConfig } from "../../src/config";
import { MAX_AUDIT_BODY_BYTES, policyEtag, signAuditBatch } from "../../src/contract/proxy-wire";
import { generateApiKey } from "../../src/crypto/api-keys";
import { runEvents, runs, vaultSecrets } from "../../src/db/schema";
import { unwrap } from "../../src/errors";
import { PolicyEnvelope } from "../../src/policy/routing";
import { issueProxyCredentials, revokeProxyCredentials } from "../../src/runs/proxy-credentials";
import { putHost } from "../../src/vault/hosts";
import { createRule } from "../../src/vault/rules";
import { createSecret } from "../../src/vault/secrets";
import { getSettings } from "../../src/vault/settings";
import { type ApiResponse, BASE, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { captureLogs, findNeedles, leakNeedles, newCanary, responseText, scanDatabase } from "./leaks";
import {
  auditBatch,
  auditRows,
  newRun,
  paths,
  postBatch,
  readyBody,
  setRunStatus,
  signed,
  type TestRun,
} from "./run-fixtures";

// The internal API a run's proxy calls (src/routes/internal.ts) and the per-run audit reads
// (src/routes/run-audit.ts): cases C2 (a proxy credential reaches its own run only), D5 (replayed
// and foreign audit batches), B5 (the canary secret reaches only the right proxy), over the real
// Worker and the real Postgres. Responses must match test/proxy/control-plane.ts, the contract
// double the proxy is tested against.

const ring = () => loadConfig(env).keyRing;
const principal = (t: Tenant) => ({ userId: t.userId, environmentId: t.environmentId, keyId: "key_fixture" });

/** A tenant whose vault has a rule for `api.<tag>.example` and a secret no rule uses. */
async function tenantWithVault() {
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
      expect(await auditRows(b.id)).toEqual({ blocked: [], routes: [] });
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
    expect(await auditRows(run.id)).toEqual({ blocked: [], routes: [] });
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

describe("POST /internal/runs/{runId}/audit (D5)", { timeout: 60_000 }, () => {
  const at = (minute: number) => new Date(Date.UTC(2026, 0, 1, 12, minute)).toISOString();

  // case D5
  it("the same signed batch twice → stored once (204, then 409 already_stored)", async () => {
    const run = await newRun(await newTenant());
    const batch = auditBatch(run.id, {
      blockedHosts: [{ host: "evil.example", count: 3, firstSeen: at(0), lastSeen: at(1) }],
      egressRoutes: [{ host: "api.example", route: "direct", count: 5, firstSeen: at(0), lastSeen: at(2) }],
    });
    const { body, headers } = signed(run.auditKey, batch);
    const send = () =>
      run.proxy("POST", paths.audit(run), body, { ...headers, "content-type": "application/json" });
    const first = await send();
    expect(first.status, first.text).toBe(204);
    expect(first.text).toBe("");
    expectProblem(await send(), 409, "already_stored");
    // Re-signed later (a retry after a lost answer): still the same batch id, still once.
    expectProblem(await postBatch(run, batch), 409, "already_stored");
    const rows = await auditRows(run.id);
    expect(rows.blocked.map((r) => r.seenCount)).toEqual([3]);
    expect(rows.routes.map((r) => r.count)).toEqual([5]);
  });

  // case D5, and case D1 and case D2 for the audit channel
  it("a batch naming another run → 403 wrong_run; bad signature, another run's key, stale or future timestamp → 401 invalid_signature", async () => {
    const t = await newTenant();
    const a = await newRun(t);
    const b = await newRun(t);
    const rows = { blockedHosts: [{ host: "evil.example", count: 1, firstSeen: at(0), lastSeen: at(0) }] };
    // Signed with A's key, sent to A's path with A's token, but naming B.
    expectProblem(await postBatch(a, auditBatch(b.id, rows)), 403, "wrong_run");
    // Signed with B's key for A.
    expectProblem(await postBatch(a, auditBatch(a.id, rows), { key: b.auditKey }), 401, "invalid_signature");
    // Stale and future: outside the 5-minute window.
    const minutes = (n: number) => new Date(Date.now() + n * 60_000);
    expectProblem(await postBatch(a, auditBatch(a.id, rows), { at: minutes(-6) }), 401, "invalid_signature");
    expectProblem(await postBatch(a, auditBatch(a.id, rows), { at: minutes(6) }), 401, "invalid_signature");
    // Body changed after signing.
    const batch = auditBatch(a.id, rows);
    const { body, headers } = signed(a.auditKey, batch);
    const tampered = body.replace('"count":1', '"count":9');
    expect(tampered).not.toBe(body);
    expectProblem(await a.proxy("POST", paths.audit(a), tampered, headers), 401, "invalid_signature");
    // No signature at all.
    expectProblem(await a.proxy("POST", paths.audit(a), body), 401, "invalid_signature");
    // Signed, but not a batch: an extra field (a path has no place in an audit row).
    const withPath = JSON.stringify({ ...batch, path: "/secret" });
    const sig = signAuditBatch(a.auditKey, batch.batchId, new Date(), withPath);
    expectProblem(await a.proxy("POST", paths.audit(a), withPath, sig), 400, "invalid_request");
    // None of it was stored, not even the batch ids: the real batch is still accepted.
    expect(await auditRows(a.id)).toEqual({ blocked: [], routes: [] });
    expect(await auditRows(b.id)).toEqual({ blocked: [], routes: [] });
    expect((await postBatch(a, batch)).status).toBe(204);
  });

  it("counts add up across batches; first/last seen widen; a host both sources reported is 'both'", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const first = auditBatch(run.id, {
      blockedHosts: [
        { host: "evil.example", count: 3, firstSeen: at(10), lastSeen: at(12) },
        { host: "only-proxy.example", count: 1, firstSeen: at(10), lastSeen: at(10) },
      ],
      egressRoutes: [
        { host: "api.example", route: "tunnel", count: 4, firstSeen: at(10), lastSeen: at(11) },
        { host: "api.example", route: "refused", count: 1, firstSeen: at(10), lastSeen: at(10) },
      ],
    });
    const second = auditBatch(run.id, {
      source: "local_agent",
      blockedHosts: [
        { host: "evil.example", count: 2, firstSeen: at(5), lastSeen: at(11) },
        { host: "only-agent.example", count: 7, firstSeen: at(20), lastSeen: at(21) },
      ],
      egressRoutes: [{ host: "api.example", route: "tunnel", count: 6, firstSeen: at(11), lastSeen: at(30) }],
    });
    const third = auditBatch(run.id, {
      blockedHosts: [{ host: "only-agent.example", count: 1, firstSeen: at(22), lastSeen: at(22) }],
    });
    for (const batch of [first, second, third]) expect((await postBatch(run, batch)).status).toBe(204);
    const rows = await auditRows(run.id);
    expect(
      rows.blocked.map((r) => ({
        host: r.host,
        n: r.seenCount,
        first: r.firstSeen.toISOString(),
        last: r.lastSeen.toISOString(),
        source: r.source,
        userId: r.userId,
        environmentId: r.environmentId,
      })),
    ).toEqual([
      {
        host: "evil.example",
        n: 5,
        first: at(5),
        last: at(12),
        source: "both",
        userId: t.userId,
        environmentId: t.environmentId,
      },
      {
        host: "only-agent.example",
        n: 8,
        first: at(20),
        last: at(22),
        source: "both",
        userId: t.userId,
        environmentId: t.environmentId,
      },
      {
        host: "only-proxy.example",
        n: 1,
        first: at(10),
        last: at(10),
        source: "proxy",
        userId: t.userId,
        environmentId: t.environmentId,
      },
    ]);
    expect(
      rows.routes.map((r) => [r.host, r.route, r.count, r.firstSeen.toISOString(), r.lastSeen.toISOString()]),
    ).toEqual([
      ["api.example", "refused", 1, at(10), at(10)],
      ["api.example", "tunnel", 10, at(10), at(30)],
    ]);
    expect(rows.routes.every((r) => r.environmentId === t.environmentId)).toBe(true);
  });

  it("a body over MAX_AUDIT_BODY_BYTES → 413 payload_too_large, before it is read", async () => {
    const run = await newRun(await newTenant());
    const big = "x".repeat(MAX_AUDIT_BODY_BYTES + 1);
    const { headers } = signed(run.auditKey, auditBatch(run.id));
    expectProblem(await run.proxy("POST", paths.audit(run), big, headers), 413, "payload_too_large");
  });
});

describe("POST /internal/runs/{runId}/ready", { timeout: 60_000 }, () => {
  it("stores the CA and the ready time, appends one trace row even when called twice, then tells the hook", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const body = readyBody();
    const first = await run.proxy("POST", paths.ready(run), body);
    expect(first.status, first.text).toBe(204);
    const [stored] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect(stored?.caCertPem).toBe(body.caCertPem);
    expect(stored?.caFingerprint).toBe(body.caFingerprint256);
    expect(stored?.proxyReadyAt).toBeInstanceOf(Date);
    expect((await run.proxy("POST", paths.ready(run), body)).status).toBe(204);
    const [again] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect(again?.proxyReadyAt).toEqual(stored?.proxyReadyAt);
    const events = await withDb((db) => db.select().from(runEvents).where(eq(runEvents.runId, run.id)));
    expect(events.map((e) => [e.kind, e.key])).toEqual([["proxy", "proxy_ready"]]);
    expect(events[0]?.detail).toMatchObject({ caFingerprint256: body.caFingerprint256, policyVersion: 1 });

    // The injection point: an app built with onProxyReady is told after the CA is stored.
    const told: { runId: string; ca: string | null | undefined }[] = [];
    const app = createApp({
      onProxyReady: async (_env, runId) => {
        const [row] = await withDb((db) =>
          db.select({ ca: runs.caCertPem }).from(runs).where(eq(runs.id, runId)),
        );
        told.push({ runId, ca: row?.ca });
      },
    });
    const other = await newRun(t);
    const otherBody = readyBody();
    const ctx = createExecutionContext();
    const res = await app.fetch(
      new Request(`${BASE}${paths.ready(other)}`, {
        method: "POST",
        headers: { authorization: `Bearer ${other.proxyToken}`, "content-type": "application/json" },
        body: JSON.stringify(otherBody),
      }),
      env,
      ctx,
    );
    await waitOnExecutionContext(ctx);
    expect(res.status).toBe(204);
    expect(told).toEqual([{ runId: other.id, ca: otherBody.caCertPem }]);
  });

  it("a bad body → 400 with the exact code; nothing stored", async () => {
    const run = await newRun(await newTenant());
    expectProblem(await run.proxy("POST", paths.ready(run), "{not json"), 400, "invalid_json");
    expectProblem(
      await run.proxy("POST", paths.ready(run), readyBody({ runId: "run_other" })),
      400,
      "unknown_field",
    );
    expectProblem(
      await run.proxy("POST", paths.ready(run), readyBody({ caFingerprint256: "not-hex" })),
      400,
      "invalid_request",
    );
    expectProblem(
      await run.proxy("POST", paths.ready(run), readyBody({ caCertPem: "x".repeat(70 * 1024) })),
      413,
      "payload_too_large",
    );
    const [row] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect(row?.caCertPem).toBeNull();
    expect(await withDb((db) => db.select().from(runEvents).where(eq(runEvents.runId, run.id)))).toEqual([]);
  });
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
    for (const path of ["blocked-hosts", "egress-routes"]) {
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
        "public.runs.audit_key_ciphertext",
      ]),
    );
    expect(db.hits).toEqual([]);
  });
});

describe("GET /v1/runs/{id}/blocked-hosts and /egress-routes", { timeout: 60_000 }, () => {
  const minute = (n: number) => new Date(Date.UTC(2026, 1, 1, 9, n)).toISOString();

  async function runWithAudit(t: Tenant): Promise<TestRun> {
    const run = await newRun(t);
    // Seven hosts, two of them sharing a last-seen time (ties break by host name).
    const blockedHosts = [0, 1, 2, 3, 4, 5, 5].map((n, i) => ({
      host: `h${i}.blocked.example`,
      count: i + 1,
      firstSeen: minute(0),
      lastSeen: minute(n),
    }));
    const egressRoutes = (["direct", "tunnel", "refused"] as const).flatMap((route, r) =>
      [0, 1].map((i) => ({
        host: `e${i}.example`,
        route,
        count: 1,
        firstSeen: minute(0),
        lastSeen: minute(r),
      })),
    );
    expect((await postBatch(run, auditBatch(run.id, { blockedHosts, egressRoutes }))).status).toBe(204);
    return run;
  }

  async function walk(t: Tenant, path: string, key: string, limit: number) {
    const pages: unknown[][] = [];
    let cursor: string | null = null;
    do {
      const q: string = cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
      const res = await t.api("GET", `${path}?limit=${limit}${q}`);
      expect(res.status, res.text).toBe(200);
      pages.push(res.json[key]);
      cursor = res.json.nextCursor;
    } while (cursor && pages.length < 20);
    return pages;
  }

  it("pages most recent first, by an opaque cursor, each row once", async () => {
    const t = await newTenant();
    const run = await runWithAudit(t);
    const all = await t.api("GET", `/v1/runs/${run.id}/blocked-hosts`);
    expect(all.status).toBe(200);
    expect(all.json.nextCursor).toBeNull();
    expect(all.json.blockedHosts.map((h: { host: string }) => h.host)).toEqual([
      "h5.blocked.example",
      "h6.blocked.example",
      "h4.blocked.example",
      "h3.blocked.example",
      "h2.blocked.example",
      "h1.blocked.example",
      "h0.blocked.example",
    ]);
    expect(all.json.blockedHosts[0]).toEqual({
      host: "h5.blocked.example",
      seenCount: 6,
      firstSeen: minute(0),
      lastSeen: minute(5),
      source: "proxy",
    });
    for (const limit of [1, 2, 3, 7]) {
      const pages = await walk(t, `/v1/runs/${run.id}/blocked-hosts`, "blockedHosts", limit);
      expect(pages.flat()).toEqual(all.json.blockedHosts);
      expect(pages.every((p) => p.length <= limit)).toBe(true);
    }

    const routes = await t.api("GET", `/v1/runs/${run.id}/egress-routes`);
    expect(
      routes.json.egressRoutes.map((r: { host: string; route: string }) => `${r.route} ${r.host}`),
    ).toEqual([
      "refused e0.example",
      "refused e1.example",
      "tunnel e0.example",
      "tunnel e1.example",
      "direct e0.example",
      "direct e1.example",
    ]);
    for (const limit of [1, 4]) {
      const pages = await walk(t, `/v1/runs/${run.id}/egress-routes`, "egressRoutes", limit);
      expect(pages.flat()).toEqual(routes.json.egressRoutes);
    }
  });

  it("bad paging → 400 with the exact code; a run without audit rows → empty", async () => {
    const t = await newTenant();
    const run = await runWithAudit(t);
    const base = `/v1/runs/${run.id}/blocked-hosts`;
    for (const q of ["limit=0", "limit=201", "limit=x"])
      expectProblem(await t.api("GET", `${base}?${q}`), 400, "invalid_request");
    expectProblem(await t.api("GET", `${base}?cursor=garbage`), 400, "invalid_request");
    expectProblem(await t.api("GET", `${base}?runId=${run.id}`), 400, "unknown_field");
    // A cursor of the other list does not fit this one.
    const routes = await t.api("GET", `/v1/runs/${run.id}/egress-routes?limit=1`);
    expectProblem(await t.api("GET", `${base}?cursor=${routes.json.nextCursor}`), 400, "invalid_request");
    const quiet = await newRun(t);
    expect((await t.api("GET", `/v1/runs/${quiet.id}/egress-routes`)).json).toEqual({
      egressRoutes: [],
      nextCursor: null,
    });
  });

  it("another tenant's run → 404 not_found (as a run that does not exist); no key → 401", async () => {
    const a = await newTenant();
    const b = await newTenant();
    const theirs = await runWithAudit(b);
    for (const path of ["blocked-hosts", "egress-routes"]) {
      const res = expectProblem(await a.api("GET", `/v1/runs/${theirs.id}/${path}`), 404, "not_found");
      expect(res.text).not.toContain("blocked.example");
      expectProblem(await a.api("GET", `/v1/runs/run_doesnotexist/${path}`), 404, "not_found");
      expectProblem(await call(null, "GET", `/v1/runs/${theirs.id}/${path}`), 401, "unauthorized");
      // The run's proxy token is not an API key.
      expectProblem(
        await call(theirs.proxyToken, "GET", `/v1/runs/${theirs.id}/${path}`),
        401,
        "unauthorized",
      );
      expect((await b.api("GET", `/v1/runs/${theirs.id}/${path}`)).status).toBe(200);
    }
  });
});
