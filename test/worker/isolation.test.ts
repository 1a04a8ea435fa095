import { env } from "cloudflare:workers";
import { and, eq, isNull } from "drizzle-orm";
import { describe, expect, inject, it } from "vitest";
import { provisionApiKey } from "../../src/auth/provision";
import { loadConfig } from "../../src/config";
import { generateApiKey } from "../../src/crypto/api-keys";
import {
  apiKeys,
  bundles,
  notifications,
  runArtifacts,
  users,
  vaultHosts,
  vaultModels,
  vaultRules,
  vaultSecrets,
  vaultSettings,
  webhooks,
} from "../../src/db/schema";
import { unwrap } from "../../src/errors";
import * as notify from "../../src/notifications/service";
import { storeArtifacts } from "../../src/runs/artifacts";
import { storeAuditBatch } from "../../src/runs/proxy-reports";
import { RunSpec } from "../../src/runs/spec";
import { listHosts, putHost } from "../../src/vault/hosts";
import * as models from "../../src/vault/models";
import { createRule, listRules } from "../../src/vault/rules";
import { createSecret, listSecrets } from "../../src/vault/secrets";
import { getSettings, setDefault } from "../../src/vault/settings";
import * as hooks from "../../src/webhooks/service";
import { collectArchive, file, tarGz, upload } from "./archives";
import { type ApiResponse, BASE, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { findNeedles, leakNeedles, newCanary, responseText } from "./leaks";
import { auditBatch, auditRows, runWithAudit } from "./run-fixtures";

// Tenant isolation and the read/write boundary of the API (cases C1, C3, C4), driven by the
// OpenAPI document so that a new route cannot slip past: CASES below must name every operation
// the document lists, and the meta-test fails, naming the route, when one has no case.

type Resource = "secret" | "rule" | "host" | "model";

/** A tenant with a full vault: secrets, rules (so an order), host entries, a non-default setting. */
interface Vault {
  t: Tenant;
  role: "a" | "b";
  /** Unique per vault; every host pattern of the vault but "shared.example" contains it. */
  tag: string;
  /** Every secret value ever stored in this vault (canaries, case C4). */
  values: string[];
  /** Current ids per resource, in list order (rules: in rule order). */
  ids: Record<Resource, string[]>;
  /** A run of this tenant with audit rows for hosts that contain the tag. */
  runId: string;
  /** A webhook of this tenant, named after the tag (its signing secret is in `values`). */
  webhookId: string;
  /** A notification URL of this tenant, naming the tag (its signing secret is in `values`). */
  notificationId: string;
  /** A bundle of this tenant (its one file names the tag), by its sha256. */
  bundle: string;
  /** An artifact of the run (its path and bytes name the tag), and a cut entry beside it. */
  artifactId: string;
}

interface Ctx {
  a: Vault;
  b: Vault;
}

const COLLECTIONS: Record<Resource, { path: string; key: string }> = {
  secret: { path: "/v1/vault/secrets", key: "secrets" },
  rule: { path: "/v1/vault/rules", key: "rules" },
  host: { path: "/v1/vault/hosts", key: "hosts" },
  model: { path: "/v1/vault/models", key: "models" },
};

function expectStatus(res: ApiResponse, status: number, what: string): ApiResponse {
  if (res.status !== status) throw new Error(`${what}: expected ${status}, got ${res.status} ${res.text}`);
  return res;
}

// Fixtures are written through the vault service the routes call (same validation, same
// encryption, same transactions), not over HTTP: every call through the harness's entrypoint
// costs a little more than the one before it within a test file, and the route calls under test
// are what this file's budget is for.
const principal = (t: Tenant) => ({ userId: t.userId, environmentId: t.environmentId, keyId: "key_fixture" });

async function idsOf(t: Tenant): Promise<Record<Resource, string[]>> {
  const p = principal(t);
  return withDb(async (db) => ({
    secret: (await listSecrets(db, p)).map((s) => s.id),
    rule: (await listRules(db, p)).map((r) => r.id),
    host: (await listHosts(db, p)).map((h) => h.id),
    model: (await models.listModels(db, p)).map((m) => m.id),
  }));
}

async function fullVault(role: "a" | "b"): Promise<Vault> {
  const t = await newTenant();
  const p = principal(t);
  const ring = loadConfig(env).keyRing;
  const tag = `${role}${crypto.randomUUID().slice(0, 8)}`;
  const values: string[] = [];
  const only = `${role.toUpperCase()}_ONLY_KEY`;
  await withDb(async (db) => {
    // A name both vaults have, and one only this vault has.
    for (const name of ["API_KEY", only]) {
      const value = newCanary(`${role}${name}`);
      values.push(value);
      unwrap(await createSecret(db, ring, p, { name, value }));
    }
    unwrap(
      await createRule(db, p, {
        host: `api.${tag}.example`,
        secret: "API_KEY",
        inject: { scheme: "bearer" },
      }),
    );
    unwrap(
      await createRule(db, p, {
        host: `upload.${tag}.example`,
        secret: only,
        inject: { scheme: "raw", name: "X-Api-Key" },
        position: 0,
      }),
    );
    unwrap(await putHost(db, p, { pattern: `*.evil-${tag}.example`, action: "block" }));
    unwrap(await putHost(db, p, { pattern: `${role}-only.shared.example`, action: "allow" }));
    unwrap(await putHost(db, p, { pattern: `home.${tag}.example`, action: "allow", via: "tunnel" }));
    // Models: a name both vaults have, and one only this vault has; the key is a canary too.
    const modelKey = newCanary(`${role}model`);
    values.push(modelKey);
    unwrap(await createSecret(db, ring, p, { name: "MODEL_KEY", value: modelKey }));
    for (const name of ["shared-model", `${role}-only-model`]) {
      unwrap(
        await models.createModel(db, p, {
          name,
          provider: "openai-compatible",
          baseUrl: `https://llm.${tag}.example/v1`,
          secret: "MODEL_KEY",
        }),
      );
    }
    unwrap(await setDefault(db, p, "block"));
  });
  const run = await runWithAudit(t, [`blocked.${tag}.example`, `other.${tag}.example`]);
  const hook = await withDb((db) =>
    hooks.createWebhook(db, ring, p, { name: `hook-${tag}`, run: RunSpec.parse({ commands: ["true"] }) }),
  );
  values.push(hook.secret);
  const notification = await withDb(async (db) =>
    unwrap(
      await notify.createNotification(db, ring, p, {
        // The suite's own receiver (loopback): a run of this tenant that ends is sent there.
        url: `${inject("notificationReceiver")}/hook/iso${tag}`,
        events: ["run.ended"],
        origin: BASE,
      }),
    ),
  );
  values.push(notification.secret);
  const bundle = await upload(t.key, await tarGz([file(`${tag}.txt`, `bundle of ${tag}`)]));
  expectStatus(bundle, 201, "bundle upload");
  const archive = await collectArchive([{ path: `${tag}.json`, body: `{"result":"${tag}"}` }], {
    cut: [{ path: `${tag}-link`, reason: "symlink", size: null }],
  });
  await withDb((db) =>
    storeArtifacts(env, db, {
      runId: run.id,
      environmentId: t.environmentId,
      sandboxId: `sbx_${tag}`,
      sandboxName: "work",
      archive: new Blob([archive]).stream(),
    }),
  );
  const [artifact] = await withDb((db) =>
    db
      .select({ id: runArtifacts.id })
      .from(runArtifacts)
      .where(and(eq(runArtifacts.runId, run.id), isNull(runArtifacts.cutReason))),
  );
  return {
    t,
    role,
    tag,
    values,
    ids: await idsOf(t),
    runId: run.id,
    webhookId: hook.webhook.id,
    notificationId: notification.notification.id,
    bundle: bundle.json.sha256,
    artifactId: artifact?.id ?? "missing",
  };
}

async function twoVaults(): Promise<Ctx> {
  return { a: await fullVault("a"), b: await fullVault("b") };
}

let freshCount = 0;
/** A new resource of A's own, for the positive control after a refused cross-tenant call. */
async function fresh(v: Vault, resource: Resource): Promise<string> {
  const n = ++freshCount;
  const p = principal(v.t);
  const ring = loadConfig(env).keyRing;
  return withDb(async (db) => {
    if (resource === "secret") {
      return unwrap(await createSecret(db, ring, p, { name: `FRESH_${n}`, value: newCanary("fresh") })).id;
    }
    if (resource === "rule") {
      const host = `fresh${n}.${v.tag}.example`;
      return unwrap(await createRule(db, p, { host, secret: "API_KEY", inject: { scheme: "bearer" } })).id;
    }
    if (resource === "model") {
      const baseUrl = `https://fresh${n}.${v.tag}.example/v1`;
      return unwrap(
        await models.createModel(db, p, {
          name: `fresh-${n}`,
          provider: "openai-compatible",
          baseUrl,
          secret: "API_KEY",
        }),
      ).id;
    }
    return unwrap(await putHost(db, p, { pattern: `fresh${n}.${v.tag}.example`, action: "allow" })).id;
  });
}

/** A tenant's vault rows in the database, ciphertexts and timestamps included. */
async function rows(t: Tenant) {
  return withDb(async (db) => ({
    settings: await db.select().from(vaultSettings).where(eq(vaultSettings.environmentId, t.environmentId)),
    secrets: await db
      .select()
      .from(vaultSecrets)
      .where(eq(vaultSecrets.environmentId, t.environmentId))
      .orderBy(vaultSecrets.id),
    rules: await db
      .select()
      .from(vaultRules)
      .where(eq(vaultRules.environmentId, t.environmentId))
      .orderBy(vaultRules.id),
    hosts: await db
      .select()
      .from(vaultHosts)
      .where(eq(vaultHosts.environmentId, t.environmentId))
      .orderBy(vaultHosts.id),
    models: await db
      .select()
      .from(vaultModels)
      .where(eq(vaultModels.environmentId, t.environmentId))
      .orderBy(vaultModels.id),
  }));
}

/**
 * Everything a tenant can observe about its vault through its own key (every list, the settings
 * with the vault version, the compiled preview), plus its rows in the database.
 */
async function snapshot(t: Tenant) {
  const reads: Record<string, { status: number; body: unknown }> = {};
  for (const path of [
    ...Object.values(COLLECTIONS).map((c) => c.path),
    "/v1/vault/settings",
    "/v1/vault/policy-preview",
  ]) {
    const res = await t.api("GET", path);
    reads[path] = { status: res.status, body: res.json };
  }
  return { reads, rows: await rows(t) };
}

/** A tenant's webhook rows in the database, ciphertexts included. */
async function webhookRows(v: Vault) {
  return withDb((db) =>
    db.select().from(webhooks).where(eq(webhooks.environmentId, v.t.environmentId)).orderBy(webhooks.id),
  );
}

/** A tenant's notification rows in the database, ciphertexts included. */
async function notificationRows(v: Vault) {
  return withDb((db) =>
    db
      .select()
      .from(notifications)
      .where(eq(notifications.environmentId, v.t.environmentId))
      .orderBy(notifications.id),
  );
}

async function version(t: Tenant): Promise<number> {
  return (await withDb((db) => getSettings(db, principal(t)))).version;
}

// ---- the table: one case per operation of the OpenAPI document ----

type Body = (ctx: Ctx) => unknown;
type Case =
  /** `{id}` routes: A's key with each of B's ids → 404, nothing changes; A's own id works. */
  | { kind: "by-id"; resource: Resource; body?: Body; ok: number }
  /** Reads under one of a run's ids (`/v1/runs/{id}/...`): B's run → 404; A's run lists A's rows. */
  | { kind: "by-run"; key: string }
  /** Collection reads: A sees exactly A's items. */
  | { kind: "list"; resource: Resource }
  /** Other reads of the caller's vault: A sees A's vault only. */
  | { kind: "read"; check: (ctx: Ctx, res: ApiResponse) => Promise<void> }
  /** Writes without an id: change A's vault only; `refused` are attempts that must write nothing. */
  | {
      kind: "write";
      body: Body;
      ok: number;
      refused?: (ctx: Ctx) => { body: unknown; status: number; code: string }[];
    }
  /** Routes of runs (not of the vault): `id` says whether the route takes a run id. */
  | {
      kind: "run";
      id: boolean;
      body?: Body;
      /** What a GET of this route answers on A's own run here (default 200). */
      own?: number;
      check: (ctx: Ctx, method: string, path: string) => Promise<void>;
    }
  /** Routes of webhooks: `id` says whether the route takes a webhook id. */
  | {
      kind: "webhook";
      id: boolean;
      body?: Body;
      check: (ctx: Ctx, method: string, path: string) => Promise<void>;
    }
  /** Routes of notification URLs: `id` says whether the route takes a notification id. */
  | {
      kind: "notification";
      id: boolean;
      body?: Body;
      check: (ctx: Ctx, method: string, path: string) => Promise<void>;
    }
  /** Routes of API keys: `id` says whether the route takes a key id. */
  | {
      kind: "apiKey";
      id: boolean;
      body?: Body;
      check: (ctx: Ctx, method: string, path: string) => Promise<void>;
    }
  /** Routes of bundles: `id` says whether the route takes a bundle's hash. */
  | { kind: "bundle"; id: boolean; check: (ctx: Ctx, method: string, path: string) => Promise<void> }
  /** Not tenant-scoped on purpose; `inDocument` false for routes the document does not list. */
  | { kind: "unscoped"; reason: string; inDocument: boolean };

/**
 * A call on one run: B's run id → 404 with B's run unchanged; `own`: the status on A's own run.
 * `body`: a valid body, so the answer is about whose run it is, not about the body.
 */
function runAction(own: number | null, body?: unknown): Case {
  return {
    kind: "run",
    id: true,
    ...(body === undefined ? {} : { body: () => body }),
    ...(own === null ? {} : { own }),
    check: async ({ a, b }, method, path) => {
      const before = await b.t.api("GET", `/v1/runs/${b.runId}`);
      expectProblem(await a.t.api(method, path.replace("{id}", b.runId), body), 404, "not_found");
      expect((await b.t.api("GET", `/v1/runs/${b.runId}`)).json).toEqual(before.json);
      if (own !== null) expect((await a.t.api(method, path.replace("{id}", a.runId), body)).status).toBe(own);
    },
  };
}

const CASES: Record<string, Case> = {
  "GET /v1/openapi.json": {
    kind: "unscoped",
    inDocument: false,
    reason: "the API's public description: the same for everyone, served without a key, not listed in itself",
  },
  "GET /v1/me": {
    kind: "unscoped",
    inDocument: true,
    reason: "describes the caller's own key (user, environment, key id); takes no id, reads no vault",
  },

  "POST /v1/api-keys": {
    kind: "apiKey",
    id: false,
    body: ({ a }) => ({ name: `key-${a.tag}` }),
    check: async ({ a, b }, method, path) => {
      // The new key is A's: it speaks for A's environment; B's keys are unchanged.
      const bBefore = await keyRows(b);
      const made = expectStatus(await a.t.api(method, path, { name: `key-${a.tag}` }), 201, "create");
      const me = expectStatus(await call(made.json.key, "GET", "/v1/me"), 200, "new key").json;
      expect(me).toMatchObject({ userId: a.t.userId, environmentId: a.t.environmentId, keyId: made.json.id });
      expect((await keyRows(b)).map((k) => k.id)).not.toContain(made.json.id);
      expect(await keyRows(b)).toEqual(bBefore);
    },
  },
  "GET /v1/api-keys": {
    kind: "apiKey",
    id: false,
    check: async ({ a, b }, method, path) => {
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      expect(res.json.apiKeys.map((k: { id: string }) => k.id)).toEqual([a.t.keyId]);
      expect(res.text).not.toContain(b.t.keyId);
      expect(res.text).not.toContain(b.t.key.slice(0, 10));
    },
  },
  "DELETE /v1/api-keys/{id}": {
    kind: "apiKey",
    id: true,
    check: async ({ a, b }, method, path) => {
      // B's key id → 404 as for no key; B's key still works. A's own (a fresh one) → 204.
      const bBefore = await keyRows(b);
      expectProblem(await a.t.api(method, path.replace("{id}", b.t.keyId)), 404, "not_found");
      expect(await keyRows(b)).toEqual(bBefore);
      expectStatus(await b.t.api("GET", "/v1/me"), 200, "B's key still works");
      const own = expectStatus(await a.t.api("POST", "/v1/api-keys", { name: "spare" }), 201, "spare").json;
      expectStatus(await a.t.api(method, path.replace("{id}", own.id)), 204, "A's own");
      expectProblem(await call(own.key, "GET", "/v1/me"), 401, "unauthorized");
    },
  },

  "GET /v1/vault/secrets": { kind: "list", resource: "secret" },
  "POST /v1/vault/secrets": {
    kind: "write",
    ok: 201,
    // A name only B has: names are per vault, so this creates A's own secret.
    body: () => ({ name: "B_ONLY_KEY", value: newCanary("a-new") }),
  },
  "GET /v1/vault/secrets/{id}": { kind: "by-id", resource: "secret", ok: 200 },
  "PUT /v1/vault/secrets/{id}": {
    kind: "by-id",
    resource: "secret",
    ok: 200,
    body: () => ({ value: newCanary("a-replace") }),
  },
  "DELETE /v1/vault/secrets/{id}": { kind: "by-id", resource: "secret", ok: 204 },

  "GET /v1/vault/rules": { kind: "list", resource: "rule" },
  "POST /v1/vault/rules": {
    kind: "write",
    ok: 201,
    body: ({ a }) => ({
      host: `new.${a.tag}.example`,
      secret: "API_KEY",
      inject: { scheme: "bearer" },
      position: 0,
    }),
    // A rule can only name a secret of the caller's vault.
    refused: ({ a }) => [
      {
        body: { host: `new2.${a.tag}.example`, secret: "B_ONLY_KEY", inject: { scheme: "bearer" } },
        status: 400,
        code: "unknown_secret",
      },
    ],
  },
  "PUT /v1/vault/rules/order": {
    kind: "write",
    ok: 200,
    body: ({ a }) => ({ ids: [...a.ids.rule].reverse() }),
    refused: ({ a, b }) => [
      { body: { ids: b.ids.rule }, status: 400, code: "invalid_order" },
      { body: { ids: [...a.ids.rule, ...b.ids.rule] }, status: 400, code: "invalid_order" },
      { body: { ids: [...a.ids.rule.slice(1), b.ids.rule[0]] }, status: 400, code: "invalid_order" },
    ],
  },
  "GET /v1/vault/rules/{id}": { kind: "by-id", resource: "rule", ok: 200 },
  "PATCH /v1/vault/rules/{id}": {
    kind: "by-id",
    resource: "rule",
    ok: 200,
    body: ({ a }) => ({
      host: `patched.${a.tag}.example`,
      inject: { scheme: "raw", name: "x-token" },
      position: 0,
    }),
  },
  "DELETE /v1/vault/rules/{id}": { kind: "by-id", resource: "rule", ok: 204 },

  "GET /v1/vault/hosts": { kind: "list", resource: "host" },
  "POST /v1/vault/hosts": {
    kind: "write",
    ok: 200,
    // A pattern B has an entry for: A gets an entry of its own, B's stays as it was.
    body: () => ({ pattern: "b-only.shared.example", action: "block" }),
  },
  "POST /v1/vault/hosts/starter-pack": { kind: "write", ok: 200, body: () => ({}) },
  "POST /v1/vault/hosts/from-blocked": {
    kind: "write",
    ok: 200,
    // A's run's blocked host, and a host B has an entry for: A gets entries of its own.
    body: ({ a }) => ({ hosts: [`blocked.${a.tag}.example`, "b-only.shared.example"] }),
    refused: ({ a }) => [
      { body: { hosts: [`*.evil-${a.tag}.example`] }, status: 400, code: "invalid_host_pattern" },
      { body: { hosts: [] }, status: 400, code: "invalid_request" },
    ],
  },
  "GET /v1/vault/hosts/{id}": { kind: "by-id", resource: "host", ok: 200 },
  "PATCH /v1/vault/hosts/{id}": {
    kind: "by-id",
    resource: "host",
    ok: 200,
    body: () => ({ action: "block" }),
  },
  "DELETE /v1/vault/hosts/{id}": { kind: "by-id", resource: "host", ok: 204 },

  "GET /v1/vault/models": { kind: "list", resource: "model" },
  "POST /v1/vault/models": {
    kind: "write",
    ok: 201,
    // A name only B has: names are per vault, so this creates A's own model.
    body: ({ a }) => ({
      name: "b-only-model",
      provider: "openai",
      baseUrl: `https://new.${a.tag}.example/v1`,
      secret: "API_KEY",
    }),
    // A model can only name a secret of the caller's vault, and a name A has is A's conflict.
    refused: ({ a }) => [
      {
        body: {
          name: "x",
          provider: "openai-compatible",
          baseUrl: `https://x.${a.tag}.example`,
          secret: "B_ONLY_KEY",
        },
        status: 400,
        code: "unknown_secret",
      },
      {
        body: {
          name: "shared-model",
          provider: "openai-compatible",
          baseUrl: `https://x.${a.tag}.example`,
          secret: "API_KEY",
        },
        status: 409,
        code: "model_exists",
      },
    ],
  },
  "GET /v1/vault/models/{id}": { kind: "by-id", resource: "model", ok: 200 },
  "PATCH /v1/vault/models/{id}": {
    kind: "by-id",
    resource: "model",
    ok: 200,
    body: ({ a }) => ({ provider: "anthropic", baseUrl: `https://patched.${a.tag}.example/v1` }),
  },
  "DELETE /v1/vault/models/{id}": { kind: "by-id", resource: "model", ok: 204 },

  "GET /v1/vault/settings": {
    kind: "read",
    check: async ({ a, b }, res) => {
      // Both vaults made the same writes, so one more in A makes the two readings differ.
      expectStatus(await a.t.api("PUT", "/v1/vault/settings", { default: "allow" }), 200, "A allow");
      const mine = expectStatus(await a.t.api("GET", "/v1/vault/settings"), 200, "A settings");
      const theirs = expectStatus(await b.t.api("GET", "/v1/vault/settings"), 200, "B settings");
      expect(res.json).toEqual({ default: "block", version: theirs.json.version });
      expect(mine.json).toEqual({ default: "allow", version: theirs.json.version + 1 });
      expect(theirs.json.default).toBe("block");
    },
  },
  "PUT /v1/vault/settings": { kind: "write", ok: 200, body: () => ({ default: "allow" }) },

  "POST /v1/runs": {
    kind: "run",
    id: false,
    body: () => ({ commands: ["true"] }),
    check: async ({ a, b }, method, path) => {
      const bBefore = await b.t.api("GET", "/v1/runs");
      const made = expectStatus(await a.t.api(method, path, { commands: ["true"] }), 202, "launch");
      expect((await a.t.api("GET", `/v1/runs/${made.json.id}`)).status).toBe(200);
      expectProblem(await b.t.api("GET", `/v1/runs/${made.json.id}`), 404, "not_found");
      expect((await b.t.api("GET", "/v1/runs")).json.runs).toEqual(bBefore.json.runs);
    },
  },
  "GET /v1/runs": {
    kind: "run",
    id: false,
    check: async ({ a, b }, method, path) => {
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      expect(res.json.runs.map((r: { id: string }) => r.id)).toEqual([a.runId]);
      expect(res.text).not.toContain(b.runId);
    },
  },
  "GET /v1/runs/{id}": {
    kind: "run",
    id: true,
    check: async ({ a, b }, method, path) => {
      const res = expectProblem(await a.t.api(method, path.replace("{id}", b.runId)), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.runId)), 200, "read");
      expect(own.json.id).toBe(a.runId);
      expect(own.text).not.toContain(b.tag);
    },
  },
  // Actions on a run: B's run → 404 and unchanged; halt and resume also act on A's own run
  // (cancel does too, in the C3 walk, last: it ends the run).
  "POST /v1/runs/{id}/cancel": runAction(null),
  "POST /v1/runs/{id}/halt": runAction(202),
  "POST /v1/runs/{id}/resume": runAction(202),
  "POST /v1/runs/{id}/linger": runAction(202, { seconds: 600 }),
  // A's own run gets a fresh egress agent token; B's run keeps its own (no token minted for it).
  "POST /v1/runs/{id}/egress-agent-token": runAction(201),
  // A's run has no proxy running here (no compute backend in this suite): 409 proxy_gone.
  "GET /v1/runs/{id}/proxy": runAction(409),
  "GET /v1/runs/{id}/blocked-hosts": { kind: "by-run", key: "blockedHosts" },
  "POST /v1/webhooks": {
    kind: "webhook",
    id: false,
    body: () => ({ name: "new hook", run: { commands: ["true"] } }),
    check: async ({ a, b }, method, path) => {
      const bBefore = await webhookRows(b);
      const made = expectStatus(
        await a.t.api(method, path, { name: "new hook", run: { commands: ["true"] } }),
        201,
        "register",
      );
      expect((await a.t.api("GET", `/v1/webhooks/${made.json.id}`)).status).toBe(200);
      expectProblem(await b.t.api("GET", `/v1/webhooks/${made.json.id}`), 404, "not_found");
      expect(await webhookRows(b)).toEqual(bBefore);
    },
  },
  "GET /v1/webhooks": {
    kind: "webhook",
    id: false,
    check: async ({ a, b }, method, path) => {
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      expect(res.json.webhooks.map((w: { id: string }) => w.id)).toEqual([a.webhookId]);
      expect(res.text).not.toContain(b.webhookId);
      expect(res.text).not.toContain(b.tag);
    },
  },
  "GET /v1/webhooks/{id}": {
    kind: "webhook",
    id: true,
    check: async ({ a, b }, method, path) => {
      const res = expectProblem(await a.t.api(method, path.replace("{id}", b.webhookId)), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.webhookId)), 200, "read");
      expect(own.json).toMatchObject({ id: a.webhookId, name: `hook-${a.tag}` });
    },
  },
  "DELETE /v1/webhooks/{id}": {
    kind: "webhook",
    id: true,
    check: async ({ a, b }, method, path) => {
      const bBefore = await webhookRows(b);
      expectProblem(await a.t.api(method, path.replace("{id}", b.webhookId)), 404, "not_found");
      expect(await webhookRows(b)).toEqual(bBefore);
      expectStatus(await b.t.api("GET", `/v1/webhooks/${b.webhookId}`), 200, "B still has it");
      expectStatus(await a.t.api(method, path.replace("{id}", a.webhookId)), 204, "A's own");
    },
  },
  "POST /v1/webhooks/{id}/rotate-secret": {
    kind: "webhook",
    id: true,
    check: async ({ a, b }, method, path) => {
      const bBefore = await webhookRows(b);
      const res = expectProblem(await a.t.api(method, path.replace("{id}", b.webhookId)), 404, "not_found");
      expect(res.text).not.toContain("whsec_");
      expect(await webhookRows(b)).toEqual(bBefore);
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.webhookId)), 200, "A's own");
      expect(own.json.id).toBe(a.webhookId);
    },
  },
  "POST /v1/notifications": {
    kind: "notification",
    id: false,
    body: ({ a }) => ({ url: `${inject("notificationReceiver")}/hook/new${a.tag}` }),
    check: async ({ a, b }, method, path) => {
      const bBefore = await notificationRows(b);
      const made = expectStatus(
        await a.t.api(method, path, { url: `${inject("notificationReceiver")}/hook/new${a.tag}` }),
        201,
        "register",
      );
      expect((await a.t.api("GET", `/v1/notifications/${made.json.id}`)).status).toBe(200);
      expectProblem(await b.t.api("GET", `/v1/notifications/${made.json.id}`), 404, "not_found");
      expect(await notificationRows(b)).toEqual(bBefore);
    },
  },
  "GET /v1/notifications": {
    kind: "notification",
    id: false,
    check: async ({ a, b }, method, path) => {
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      expect(res.json.notifications.map((n: { id: string }) => n.id)).toEqual([a.notificationId]);
      expect(res.text).not.toContain(b.notificationId);
      expect(res.text).not.toContain(b.tag);
    },
  },
  "GET /v1/notifications/{id}": {
    kind: "notification",
    id: true,
    check: async ({ a, b }, method, path) => {
      const res = expectProblem(
        await a.t.api(method, path.replace("{id}", b.notificationId)),
        404,
        "not_found",
      );
      expect(res.text).not.toContain(b.tag);
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.notificationId)), 200, "read");
      expect(own.json.url).toContain(a.tag);
    },
  },
  "DELETE /v1/notifications/{id}": {
    kind: "notification",
    id: true,
    check: async ({ a, b }, method, path) => {
      const bBefore = await notificationRows(b);
      expectProblem(await a.t.api(method, path.replace("{id}", b.notificationId)), 404, "not_found");
      expect(await notificationRows(b)).toEqual(bBefore);
      expect((await a.t.api(method, path.replace("{id}", a.notificationId))).status).toBe(204);
    },
  },
  "GET /v1/notifications/{id}/deliveries": {
    kind: "notification",
    id: true,
    check: async ({ a, b }, method, path) => {
      expectProblem(await a.t.api(method, path.replace("{id}", b.notificationId)), 404, "not_found");
      const own = expectStatus(
        await a.t.api(method, path.replace("{id}", a.notificationId)),
        200,
        "deliveries",
      );
      expect(own.json).toEqual({ deliveries: [] });
    },
  },
  "GET /v1/runs/{id}/egress-routes": { kind: "by-run", key: "egressRoutes" },
  "GET /v1/runs/{id}/artifacts": {
    kind: "run",
    id: true,
    check: async ({ a, b }, method, path) => {
      const res = expectProblem(await a.t.api(method, path.replace("{id}", b.runId)), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.runId)), 200, "list");
      expect(own.json.artifacts.map((x: { path: string }) => x.path)).toEqual([`${a.tag}.json`]);
      expect(own.json.cut.map((x: { path: string }) => x.path)).toEqual([`${a.tag}-link`]);
      expect(own.text).not.toContain(b.tag);
      // A query parameter cannot widen the read either.
      const q = `?environmentId=${b.t.environmentId}&runId=${b.runId}`;
      expectProblem(await a.t.api(method, `${path.replace("{id}", a.runId)}${q}`), 400, "unknown_field");
    },
  },
  "GET /v1/runs/{id}/artifacts/{artifactId}": {
    kind: "run",
    id: true,
    check: async ({ a, b }, method, path) => {
      const at = (runId: string, artifactId: string) =>
        path.replace("{id}", runId).replace("{artifactId}", artifactId);
      // B's artifact under B's run, under A's own run; A's artifact under B's run: all 404.
      for (const [runId, artifactId] of [
        [b.runId, b.artifactId],
        [a.runId, b.artifactId],
        [b.runId, a.artifactId],
      ] as const) {
        const res = expectProblem(await a.t.api(method, at(runId, artifactId)), 404, "not_found");
        expect(res.text).not.toContain(b.tag);
      }
      const own = expectStatus(await a.t.api(method, at(a.runId, a.artifactId)), 200, "download");
      expect(own.text).toBe(`{"result":"${a.tag}"}`);
    },
  },
  "POST /v1/bundles": {
    kind: "bundle",
    id: false,
    check: async ({ a, b }) => {
      // A's upload is A's: B cannot read it or launch with it; B's bundles are unchanged.
      const bBefore = await bundleRows(b);
      const made = await upload(a.t.key, await tarGz([file("new.txt", `new in ${a.tag}`)]));
      expectStatus(made, 201, "upload");
      expectStatus(await a.t.api("GET", `/v1/bundles/${made.json.sha256}`), 200, "A reads its own");
      expectProblem(await b.t.api("GET", `/v1/bundles/${made.json.sha256}`), 404, "bundle_not_found");
      expectProblem(
        await b.t.api("POST", "/v1/runs", { commands: ["ls"], bundle: made.json.sha256 }),
        404,
        "bundle_not_found",
      );
      expect(await bundleRows(b)).toEqual(bBefore);
    },
  },
  "GET /v1/bundles/{sha256}": {
    kind: "bundle",
    id: true,
    check: async ({ a, b }, method, path) => {
      const res = expectProblem(
        await a.t.api(method, path.replace("{sha256}", b.bundle)),
        404,
        "bundle_not_found",
      );
      expect(res.text).not.toContain(b.t.environmentId);
      const own = expectStatus(await a.t.api(method, path.replace("{sha256}", a.bundle)), 200, "read");
      expect(own.json.sha256).toBe(a.bundle);
    },
  },
  "GET /v1/runs/{id}/model-calls": {
    kind: "run",
    id: true,
    check: async ({ a, b }, method, path) => {
      // One model call on each run, named after its tenant's tag.
      for (const v of [a, b]) {
        const call = {
          callId: `call_${v.tag}`,
          at: new Date().toISOString(),
          model: `model-${v.tag}`,
          provider: `provider-${v.tag}`,
          endpoint: "chat.completions" as const,
          stream: false,
          status: 200,
          inputTokens: 5,
          outputTokens: 7,
          cachedInputTokens: 0,
          refused: null,
          ms: 100,
        };
        const owner = { id: v.runId, userId: v.t.userId, environmentId: v.t.environmentId };
        await withDb((db) => storeAuditBatch(db, owner, auditBatch(v.runId, { modelCalls: [call] })));
      }
      const res = expectProblem(await a.t.api(method, path.replace("{id}", b.runId)), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.runId)), 200, "list");
      expect(own.json.calls.map((c: { model: string }) => c.model)).toEqual([`model-${a.tag}`]);
      expect(own.json.totals).toMatchObject({ calls: 1, inputTokens: 5, outputTokens: 7 });
      expect(own.text).not.toContain(b.tag);
      // A query parameter cannot widen the read either.
      const q = `?environmentId=${b.t.environmentId}&runId=${b.runId}`;
      expectProblem(await a.t.api(method, `${path.replace("{id}", a.runId)}${q}`), 400, "unknown_field");
    },
  },
  "GET /v1/blocked-hosts": {
    kind: "run",
    id: false,
    check: async ({ a, b }, method, path) => {
      // Environment-wide: A's runs' hosts only; B's run id as a filter is 404, as for no run.
      const bBefore = await auditRows(b.runId);
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      const hosts = res.json.blockedHosts as { host: string; runs: string[] }[];
      expect(hosts.map((h) => h.host).sort()).toEqual([`blocked.${a.tag}.example`, `other.${a.tag}.example`]);
      expect(hosts.every((h) => h.runs.length === 1 && h.runs[0] === a.runId)).toBe(true);
      expect(res.text).not.toContain(b.tag);
      expect(res.text).not.toContain(b.runId);
      const theirs = expectProblem(await a.t.api(method, `${path}?runId=${b.runId}`), 404, "not_found");
      expect(theirs.text).not.toContain(b.tag);
      expect(await auditRows(b.runId)).toEqual(bBefore);
      expectProblem(
        await a.t.api(method, `${path}?environmentId=${b.t.environmentId}`),
        400,
        "unknown_field",
      );
    },
  },
  "POST /v1/bug-reports": {
    kind: "run",
    id: false,
    body: ({ a }) => ({ runId: a.runId, title: `report ${a.tag}`, body: "it broke" }),
    check: async ({ a, b }, method, path) => {
      // B's run id in the body: 404 as for no run, and B's run (trace included) is unchanged.
      const before = await b.t.api("GET", `/v1/runs/${b.runId}`);
      const report = { runId: b.runId, title: `report ${a.tag}`, body: "it broke" };
      const res = expectProblem(await a.t.api(method, path, report), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
      expect((await b.t.api("GET", `/v1/runs/${b.runId}`)).json).toEqual(before.json);
      expect((await b.t.api("GET", `/v1/runs/${b.runId}/bug-reports`)).json.bugReports).toEqual([]);
      const made = expectStatus(await a.t.api(method, path, { ...report, runId: a.runId }), 201, "report");
      const mine = await a.t.api("GET", `/v1/runs/${a.runId}/bug-reports`);
      expect(mine.json.bugReports.map((r: { id: string }) => r.id)).toEqual([made.json.id]);
    },
  },
  "GET /v1/runs/{id}/bug-reports": {
    kind: "run",
    id: true,
    check: async ({ a, b }, method, path) => {
      for (const v of [a, b]) {
        const report = { runId: v.runId, title: `report ${v.tag}`, body: `body ${v.tag}` };
        expectStatus(await v.t.api("POST", "/v1/bug-reports", report), 201, `${v.role} report`);
      }
      const res = expectProblem(await a.t.api(method, path.replace("{id}", b.runId)), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
      const own = expectStatus(await a.t.api(method, path.replace("{id}", a.runId)), 200, "list");
      expect(own.json.bugReports.map((r: { title: string }) => r.title)).toEqual([`report ${a.tag}`]);
      expect(own.text).not.toContain(b.tag);
      // A query parameter cannot widen the read either.
      const q = `?environmentId=${b.t.environmentId}&runId=${b.runId}`;
      expectProblem(await a.t.api(method, `${path.replace("{id}", a.runId)}${q}`), 400, "unknown_field");
    },
  },
  "POST /v1/vault/dry-run": {
    kind: "run",
    id: false,
    body: ({ a }) => ({ runId: a.runId, changes: { default: "allow" } }),
    check: async ({ a, b }, method, path) => {
      // B's run id → 404 as for no run; B's secret names are unknown in A's vault; nothing written.
      const bBefore = await snapshot(b.t);
      const aVersion = await version(a.t);
      for (const body of [
        { runId: b.runId, changes: {} },
        { runId: b.runId, draft: { default: "block", hosts: [], rules: [] } },
      ]) {
        const res = expectProblem(await a.t.api(method, path, body), 404, "not_found");
        expect(res.text).not.toContain(b.tag);
      }
      const theirs = { host: `x.${a.tag}.example`, secret: "B_ONLY_KEY", inject: { scheme: "bearer" } };
      const body = { runId: a.runId, changes: { rules: { add: [theirs] } } };
      expectProblem(await a.t.api(method, path, body), 400, "unknown_secret");
      const own = expectStatus(
        await a.t.api(method, path, { runId: a.runId, changes: { default: "allow" } }),
        200,
        "A's own run",
      );
      expect((own.json.hosts as { host: string }[]).map((h) => h.host).sort()).toEqual([
        `blocked.${a.tag}.example`,
        `other.${a.tag}.example`,
      ]);
      expect(own.text).not.toContain(b.tag);
      for (const value of [...a.values, ...b.values]) expect(own.text).not.toContain(value);
      expect(await snapshot(b.t)).toEqual(bBefore);
      expect(await version(a.t)).toBe(aVersion);
    },
  },
  "GET /v1/vault/policy-preview": {
    kind: "read",
    check: async ({ a, b }, res) => {
      const hosts = expectStatus(await a.t.api("GET", "/v1/vault/hosts"), 200, "A hosts");
      const patterns = (hosts.json.hosts as { pattern: string }[]).map((h) => h.pattern).sort();
      expect((res.json.hosts as { pattern: string }[]).map((h) => h.pattern).sort()).toEqual(patterns);
      expect((res.json.rules as { host: string }[]).map((r) => r.host)).toEqual([
        `upload.${a.tag}.example`,
        `api.${a.tag}.example`,
      ]);
      expect(res.json.version).toBe(await version(a.t));
      expect(res.text).not.toContain(b.tag);
    },
  },
};

const METHODS = ["get", "put", "post", "delete", "patch", "head", "options", "trace"];

/** "METHOD /path" for every operation the live OpenAPI document lists. */
async function documentOperations(): Promise<string[]> {
  const doc = expectStatus(await call(null, "GET", "/v1/openapi.json"), 200, "openapi.json").json;
  const ops: string[] = [];
  for (const [path, item] of Object.entries(doc.paths as Record<string, object>)) {
    for (const method of Object.keys(item)) {
      if (METHODS.includes(method)) ops.push(`${method.toUpperCase()} ${path}`);
    }
  }
  return ops;
}

/** "METHOD /path" of every operation whose request body may be JSON. */
async function jsonBodyOperations(): Promise<Set<string>> {
  const doc = expectStatus(await call(null, "GET", "/v1/openapi.json"), 200, "openapi.json").json;
  const ops = new Set<string>();
  for (const [path, item] of Object.entries(doc.paths as Record<string, Record<string, unknown>>)) {
    for (const [method, op] of Object.entries(item)) {
      const content = (op as { requestBody?: { content?: Record<string, unknown> } }).requestBody?.content;
      if (!content || "application/json" in content) ops.add(`${method.toUpperCase()} ${path}`);
    }
  }
  return ops;
}

/** A tenant's API key rows (hashes and dates included). */
async function keyRows(v: Vault) {
  return withDb((db) =>
    db.select().from(apiKeys).where(eq(apiKeys.environmentId, v.t.environmentId)).orderBy(apiKeys.id),
  );
}

/** A tenant's bundle rows. */
async function bundleRows(v: Vault) {
  return withDb((db) =>
    db.select().from(bundles).where(eq(bundles.environmentId, v.t.environmentId)).orderBy(bundles.sha256),
  );
}

const split = (op: string) => {
  const [method, path] = op.split(" ") as [string, string];
  return { method, path };
};

/** A call of `op` that would succeed for its owner: a real id of `v` and a valid body. */
function sample(op: string, ctx: Ctx, v: Vault): { method: string; path: string; body: unknown } {
  const { method, path } = split(op);
  const c = CASES[op];
  const id =
    c?.kind === "by-id"
      ? (v.ids[c.resource][0] ?? "missing")
      : c?.kind === "by-run" || (c?.kind === "run" && c.id)
        ? v.runId
        : c?.kind === "webhook" && c.id
          ? v.webhookId
          : c?.kind === "notification" && c.id
            ? v.notificationId
            : c?.kind === "apiKey" && c.id
              ? v.t.keyId
              : "no_case_for_this_route";
  const body =
    c &&
    (c.kind === "by-id" ||
      c.kind === "write" ||
      c.kind === "run" ||
      c.kind === "webhook" ||
      c.kind === "notification" ||
      c.kind === "apiKey")
      ? c.body?.(ctx)
      : undefined;
  return {
    method,
    path: path.replace("{id}", id).replace("{sha256}", v.bundle).replace("{artifactId}", v.artifactId),
    body,
  };
}

// case C1 (the meta-test: a new route without a case fails here)
describe("C1 meta: every route has an isolation case", { timeout: 120_000 }, () => {
  it("the table names every operation of the OpenAPI document, and nothing else", async () => {
    const ops = await documentOperations();
    expect(ops.length).toBeGreaterThanOrEqual(19);
    const missing = ops.filter((op) => !(op in CASES));
    expect(
      missing,
      `operations without an isolation case (add them to CASES in test/worker/isolation.test.ts): ${missing.join(", ")}`,
    ).toEqual([]);
    const stale = Object.entries(CASES)
      .filter(([op, c]) => !ops.includes(op) && !(c.kind === "unscoped" && !c.inDocument))
      .map(([op]) => op);
    expect(stale, `cases for operations the document does not list: ${stale.join(", ")}`).toEqual([]);
    // A route that takes an id must be tested as one: A's key with B's id.
    const byId = (op: string) => {
      const c = CASES[op];
      return (
        c?.kind === "by-id" ||
        c?.kind === "by-run" ||
        (c?.kind === "run" && c.id) ||
        (c?.kind === "webhook" && c.id) ||
        (c?.kind === "notification" && c.id) ||
        (c?.kind === "apiKey" && c.id) ||
        (c?.kind === "bundle" && c.id)
      );
    };
    const untested = ops.filter((op) => op.includes("{") !== byId(op));
    expect(untested, `id routes need a by-id or by-run case (and only they): ${untested.join(", ")}`).toEqual(
      [],
    );
    for (const [op, c] of Object.entries(CASES)) {
      if (c.kind === "by-id") expect(split(op).path).toBe(`${COLLECTIONS[c.resource].path}/{id}`);
      if (c.kind === "by-run") expect(split(op).path).toMatch(/^\/v1\/runs\/\{id\}\/[a-z-]+$/);
      if (c.kind === "unscoped") expect(c.reason.length, `${op} needs a reason`).toBeGreaterThan(20);
    }
  });
});

// case C1
describe("C1 tenant isolation: A's key never reaches B's vault", { timeout: 120_000 }, () => {
  for (const [op, c] of Object.entries(CASES)) {
    const { method, path } = split(op);

    if (c.kind === "by-id") {
      it(`${op} with B's ids → 404 not_found, B unchanged (A's own id works)`, async () => {
        const ctx = await twoVaults();
        const { a, b } = ctx;
        const bBefore = await snapshot(b.t);
        const aBefore = await rows(a.t);
        const theirs = b.ids[c.resource];
        expect(theirs.length).toBeGreaterThan(0);
        for (const id of theirs) {
          const res = await a.t.api(method, path.replace("{id}", id), c.body?.(ctx));
          expectProblem(res, 404, "not_found");
        }
        expect(await snapshot(b.t)).toEqual(bBefore);
        // The refused change was rolled back in A too: not even A's version moved.
        expect(await rows(a.t)).toEqual(aBefore);
        const own = await fresh(a, c.resource);
        const res = await a.t.api(method, path.replace("{id}", own), c.body?.(ctx));
        expect(res.status, res.text).toBe(c.ok);
      });
    }

    if (c.kind === "by-run") {
      it(`${op} with B's run id → 404 not_found, B's rows unchanged (A's own run lists A's rows only)`, async () => {
        const { a, b } = await twoVaults();
        const bBefore = await auditRows(b.runId);
        expect(bBefore.blocked.length).toBeGreaterThan(0);
        const res = expectProblem(await a.t.api(method, path.replace("{id}", b.runId)), 404, "not_found");
        expect(res.text).not.toContain(b.tag);
        expect(await auditRows(b.runId)).toEqual(bBefore);
        const own = expectStatus(await a.t.api(method, path.replace("{id}", a.runId)), 200, op);
        const items = own.json[c.key] as { host: string }[];
        expect(items.map((i) => i.host).sort()).toEqual([
          `blocked.${a.tag}.example`,
          `other.${a.tag}.example`,
        ]);
        expect(own.text).not.toContain(b.tag);
        // A query parameter cannot widen the read either.
        const q = `?environmentId=${b.t.environmentId}&runId=${b.runId}`;
        expectProblem(await a.t.api(method, `${path.replace("{id}", a.runId)}${q}`), 400, "unknown_field");
      });
    }

    if (c.kind === "list") {
      it(`${op} lists only A's items`, async () => {
        const { a, b } = await twoVaults();
        const res = expectStatus(await a.t.api(method, path), 200, op);
        const listed = (res.json[COLLECTIONS[c.resource].key] as { id: string }[]).map((i) => i.id);
        expect([...listed].sort()).toEqual([...a.ids[c.resource]].sort());
        expect(b.ids[c.resource].length).toBeGreaterThan(0);
        for (const id of b.ids[c.resource]) expect(res.text).not.toContain(id);
        expect(res.text).not.toContain(b.tag);
        expect(res.text).not.toContain(b.t.environmentId);
        expect(res.text).not.toContain(b.t.userId);
      });
    }

    if (c.kind === "read") {
      it(`${op} shows A's vault only`, async () => {
        const ctx = await twoVaults();
        const bBefore = await snapshot(ctx.b.t);
        const res = expectStatus(await ctx.a.t.api(method, path), 200, op);
        await c.check(ctx, res);
        expect(await snapshot(ctx.b.t)).toEqual(bBefore);
      });
    }

    if (c.kind === "write") {
      it(`${op} changes only A's vault (B's version and data unchanged)`, async () => {
        const ctx = await twoVaults();
        const { a, b } = ctx;
        const bBefore = await snapshot(b.t);
        const aVersion = await version(a.t);
        for (const refused of c.refused?.(ctx) ?? []) {
          expectProblem(await a.t.api(method, path, refused.body), refused.status, refused.code);
        }
        expect(await version(a.t)).toBe(aVersion);
        const res = await a.t.api(method, path, c.body(ctx));
        expect(res.status, res.text).toBe(c.ok);
        if (typeof res.json?.id === "string") {
          for (const ids of Object.values(b.ids)) expect(ids).not.toContain(res.json.id);
        }
        expect(await version(a.t)).toBeGreaterThan(aVersion);
        expect(await snapshot(b.t)).toEqual(bBefore);
      });
    }

    if (c.kind === "run") {
      it(`${op}: A's key reaches A's runs only`, async () => {
        const ctx = await twoVaults();
        await c.check(ctx, method, path);
      });
    }

    if (c.kind === "webhook") {
      it(`${op}: A's key reaches A's webhooks only`, async () => {
        const ctx = await twoVaults();
        await c.check(ctx, method, path);
      });
    }

    if (c.kind === "notification") {
      it(`${op}: A's key reaches A's notification URLs only`, async () => {
        const ctx = await twoVaults();
        await c.check(ctx, method, path);
      });
    }

    if (c.kind === "apiKey") {
      it(`${op}: A's key reaches A's API keys only`, async () => {
        const ctx = await twoVaults();
        await c.check(ctx, method, path);
      });
    }

    if (c.kind === "bundle") {
      it(`${op}: A's key reaches A's bundles only (case H3)`, async () => {
        const ctx = await twoVaults();
        await c.check(ctx, method, path);
      });
    }

    if (c.kind === "unscoped") {
      it(`${op} is not tenant-scoped (${c.reason}); it tells A nothing about B`, async () => {
        const [a, b] = [await newTenant(), await newTenant()];
        const mine = expectStatus(await a.api(method, path), 200, `${op} as A`);
        const theirs = expectStatus(await b.api(method, path), 200, `${op} as B`);
        expect(mine.text).not.toContain(b.userId);
        expect(mine.text).not.toContain(b.environmentId);
        if (op === "GET /v1/me") {
          expect(mine.json).toMatchObject({ userId: a.userId, environmentId: a.environmentId });
        } else {
          // The same document for A, B and a caller without a key.
          expect(theirs.text).toBe(mine.text);
          expect((await call(null, method, path)).text).toBe(mine.text);
        }
      });
    }
  }

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

// case C3
describe("C3 bodies cannot override the authenticated user or environment", { timeout: 120_000 }, () => {
  /** The body text `body` with one more field, first, whatever its name (also `__proto__`). */
  const withField = (body: unknown, field: string, value: unknown) => {
    const rest = JSON.stringify(body ?? {}).slice(1, -1);
    return `{${JSON.stringify(field)}:${JSON.stringify(value)}${rest ? `,${rest}` : ""}}`;
  };

  it("every POST/PUT/PATCH with userId, environmentId, id, ownerId, ... → 400 unknown_field, nothing written", async () => {
    const ctx = await twoVaults();
    const { a, b } = ctx;
    const overrides: Record<string, unknown> = {
      userId: b.t.userId,
      environmentId: b.t.environmentId,
      environment_id: b.t.environmentId,
      ownerId: b.t.userId,
      keyId: "key_override",
      runId: "run_override",
      id: b.ids.secret[0],
      principal: { userId: b.t.userId, environmentId: b.t.environmentId },
      version: 1,
      // Computed, so it is an own field of the body (as JSON.parse makes it), not the prototype.
      ["__proto__"]: { environmentId: b.t.environmentId },
      constructor: { prototype: { environmentId: b.t.environmentId } },
    };
    const aBefore = await snapshot(a.t);
    const bBefore = await snapshot(b.t);
    // Operations with a JSON body (a bundle upload's body is its .tar.gz: no fields to add).
    const json = await jsonBodyOperations();
    const ops = (await documentOperations()).filter((op) => /^(POST|PUT|PATCH) /.test(op) && json.has(op));
    expect(ops.length).toBeGreaterThanOrEqual(9);
    const failures: string[] = [];
    for (const op of ops) {
      const { method, path, body } = sample(op, ctx, a);
      for (const [field, value] of Object.entries(overrides)) {
        // A field the route itself takes (POST /v1/bug-reports names its run) is no override;
        // its cross-tenant use is in that route's isolation case.
        if (typeof body === "object" && body !== null && Object.hasOwn(body, field)) continue;
        const res = await call(a.t.key, method, path, withField(body, field, value));
        if (res.status !== 400 || res.json?.code !== "unknown_field" || !res.json.detail.includes(field)) {
          failures.push(`${op} +${field}: ${res.status} ${res.text.slice(0, 200)}`);
        }
      }
      // Nested objects are strict too.
      const inject = (body as { inject?: object } | undefined)?.inject;
      if (inject) {
        const nested = { ...(body as object), inject: { ...inject, userId: b.t.userId } };
        const res = await call(a.t.key, method, path, nested);
        if (res.json?.code !== "unknown_field")
          failures.push(`${op} inject.userId: ${res.status} ${res.text}`);
      }
    }
    expect(failures).toEqual([]);
    expect(await snapshot(a.t)).toEqual(aBefore);
    expect(await snapshot(b.t)).toEqual(bBefore);

    // The same bodies without the extra field are accepted: the field alone was the reason.
    // Cancelling ends A's run, after which halt and resume have nothing to act on: cancel last.
    const cancelLast = [...ops].sort((x, y) => Number(x.endsWith("/cancel")) - Number(y.endsWith("/cancel")));
    for (const op of cancelLast) {
      a.ids = await idsOf(a.t);
      const c = CASES[op];
      const { method, path, body } = sample(op, ctx, a);
      const target = c?.kind === "by-id" ? path.replace(/[^/]+$/, await fresh(a, c.resource)) : path;
      const res = await call(a.t.key, method, target, body ?? {});
      expect(res.status, `${op}: ${res.text}`).toBeLessThan(300);
    }
    expect(await snapshot(b.t)).toEqual(bBefore);
  });

  it("query parameters cannot widen a read to another environment", async () => {
    const { a, b } = await twoVaults();
    const q = `?environmentId=${b.t.environmentId}&userId=${b.t.userId}&environment_id=${b.t.environmentId}`;
    for (const [resource, { path, key }] of Object.entries(COLLECTIONS) as [
      Resource,
      { path: string; key: string },
    ][]) {
      const res = expectStatus(await a.t.api("GET", `${path}${q}`), 200, path);
      expect((res.json[key] as { id: string }[]).map((i) => i.id).sort()).toEqual(
        [...a.ids[resource]].sort(),
      );
    }
    const settings = expectStatus(await a.t.api("GET", `/v1/vault/settings${q}`), 200, "settings");
    expect(settings.json.version).toBe(await version(a.t));
    // The preview's query is strict: an unknown parameter is refused, not ignored.
    const preview = expectProblem(await a.t.api("GET", `/v1/vault/policy-preview${q}`), 400, "unknown_field");
    expect(preview.text).not.toContain(b.tag);
  });
});

// case C4
describe("C4 secret values are never returned by any read", { timeout: 120_000 }, () => {
  it("no GET route (lists, items, preview, settings, me, openapi) returns a value or an encoding of one", async () => {
    const a = await fullVault("a");
    const { t } = a;
    // A basic-scheme rule (its header carries base64(user:password)) and a replaced value.
    const basic = `svcuser:${newCanary("basic")}`;
    a.values.push(basic);
    expectStatus(await t.api("POST", "/v1/vault/secrets", { name: "BASIC_KEY", value: basic }), 201, "basic");
    expectStatus(
      await t.api("POST", "/v1/vault/rules", {
        host: `basic.${a.tag}.example`,
        secret: "BASIC_KEY",
        inject: { scheme: "basic" },
      }),
      201,
      "basic rule",
    );
    const replaced = newCanary("replaced");
    a.values.push(replaced);
    const apiKeyId = (await t.api("GET", "/v1/vault/secrets")).json.secrets.find(
      (s: { name: string }) => s.name === "API_KEY",
    ).id;
    expectStatus(await t.api("PUT", `/v1/vault/secrets/${apiKeyId}`, { value: replaced }), 200, "replace");
    a.ids = await idsOf(t);

    const needles = (await Promise.all(a.values.map(leakNeedles))).flat();
    const responses: [string, ApiResponse][] = [];
    const gets = (await documentOperations()).filter((op) => op.startsWith("GET "));
    for (const op of gets) {
      const { path } = split(op);
      const c = CASES[op];
      const paths =
        c?.kind === "by-id"
          ? a.ids[c.resource].map((id) => path.replace("{id}", id))
          : c?.kind === "by-run" || (c?.kind === "run" && c.id)
            ? [path.replace("{id}", a.runId).replace("{artifactId}", a.artifactId)]
            : c?.kind === "webhook" && c.id
              ? [path.replace("{id}", a.webhookId)]
              : c?.kind === "notification" && c.id
                ? [path.replace("{id}", a.notificationId)]
                : c?.kind === "bundle" && c.id
                  ? [path.replace("{sha256}", a.bundle)]
                  : [path];
      if (path === "/v1/vault/policy-preview") paths.push(`${path}?egress=local`);
      expect(paths.length, `${op} has nothing to read`).toBeGreaterThan(0);
      for (const p of paths) responses.push([`GET ${p}`, await t.api("GET", p)]);
    }
    responses.push(["GET /v1/openapi.json", await call(null, "GET", "/v1/openapi.json")]);
    responses.push(["GET /v1/openapi.json (with key)", await t.api("GET", "/v1/openapi.json")]);

    const leaks = responses.flatMap(([where, res]) => findNeedles(where, responseText(res), needles));
    expect(leaks).toEqual([]);
    for (const [where, res] of responses) {
      const c = CASES[where.replace(/^(GET )(\S+)$/, (_m, g, p) => g + p.replace(a.runId, "{id}"))];
      expect(res.status, where).toBe(c?.kind === "run" ? (c.own ?? 200) : 200);
    }
    // The reads did show the vault (names, fingerprints), so the scan looked at real content.
    const secrets = responses.find(([where]) => where === "GET /v1/vault/secrets")?.[1];
    expect(secrets?.text).toContain("BASIC_KEY");
    expect(secrets?.text).toMatch(/fp_test2_[0-9a-f]{16}/);
  });
});

describe("C1 every route refuses a missing or bad key", { timeout: 120_000 }, () => {
  it("each operation of the document → 401 unauthorized for every kind of bad credential; nothing written", async () => {
    const ctx = await twoVaults();
    const { t } = ctx.a;
    // A real key of the same environment, revoked.
    const revoked = await withDb(async (db) => {
      const [user] = await db.select({ email: users.email }).from(users).where(eq(users.id, t.userId));
      if (!user) throw new Error("tenant user missing");
      return provisionApiKey(db, { email: user.email, keyName: "revoked" });
    });
    expect(revoked.environmentId).toBe(t.environmentId);
    expectStatus(await call(revoked.key, "GET", "/v1/me"), 200, "key before revocation");
    await withDb((db) =>
      db.update(apiKeys).set({ revokedAt: new Date() }).where(eq(apiKeys.id, revoked.keyId)),
    );

    const basic = btoa(`${t.key}:`);
    const credentials: Record<string, Record<string, string>> = {
      "no key": {},
      "unknown key": { authorization: `Bearer ${generateApiKey().key}` },
      "revoked key": { authorization: `Bearer ${revoked.key}` },
      "malformed key": { authorization: "Bearer not-a-key" },
      "key one character off": {
        authorization: `Bearer ${t.key.slice(0, -2)}${t.key.endsWith("AA") ? "BA" : "AA"}`,
      },
      "key without scheme": { authorization: t.key },
      "key as basic auth": { authorization: `Basic ${basic}` },
      "key in x-api-key": { "x-api-key": t.key },
    };
    const before = await snapshot(t);
    const ops = await documentOperations();
    const failures: string[] = [];
    for (const op of ops) {
      const { method, path, body } = sample(op, ctx, ctx.a);
      for (const [label, headers] of Object.entries(credentials)) {
        const res = await call(null, method, path, body, headers);
        try {
          expectProblem(res, 401, "unauthorized");
        } catch (e) {
          failures.push(`${op} (${label}): ${(e as Error).message}`);
        }
      }
    }
    expect(failures).toEqual([]);
    expect(await snapshot(t)).toEqual(before);
  });

  it("case K3: a key revoked through DELETE /v1/api-keys/{id}, or expired → 401 on every operation of the document; nothing written", async () => {
    const ctx = await twoVaults();
    const { t } = ctx.a;
    const made = async (name: string) => {
      const res = expectStatus(await t.api("POST", "/v1/api-keys", { name }), 201, name);
      expectStatus(await call(res.json.key, "GET", "/v1/me"), 200, `${name} before`);
      return res.json as { id: string; key: string };
    };
    const revoked = await made("revoked");
    const expired = await made("expired");
    expectStatus(await t.api("DELETE", `/v1/api-keys/${revoked.id}`), 204, "revoke");
    // The clock moved past the expiry (set in the row, not waited for).
    await withDb((db) =>
      db
        .update(apiKeys)
        .set({ expiresAt: new Date(Date.now() - 1000) })
        .where(eq(apiKeys.id, expired.id)),
    );
    const before = await snapshot(t);
    const refusedKeys = async () =>
      (await keyRows(ctx.a)).filter((k) => k.id === revoked.id || k.id === expired.id);
    const keysBefore = await refusedKeys();
    const failures: string[] = [];
    for (const op of await documentOperations()) {
      const { method, path, body } = sample(op, ctx, ctx.a);
      for (const [label, key] of [
        ["revoked", revoked.key],
        ["expired", expired.key],
      ] as const) {
        const res = await call(key, method, path, body);
        try {
          expectProblem(res, 401, "unauthorized");
        } catch (e) {
          failures.push(`${op} (${label}): ${(e as Error).message}`);
        }
      }
    }
    expect(failures).toEqual([]);
    expect(await snapshot(t)).toEqual(before);
    // Not even a last-used stamp: a refused key leaves no trace of its own.
    expect(await refusedKeys()).toEqual(keysBefore);
  });
});
