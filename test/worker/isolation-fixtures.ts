import { env } from "cloudflare:workers";
import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { and, eq, isNull } from "drizzle-orm";
import { expect, inject } from "vitest";
import { loadConfig } from "../../src/config";
import {
  apiKeys,
  runArtifacts,
  vaultHosts,
  vaultModels,
  vaultRules,
  vaultSecrets,
  vaultSettings,
} from "../../src/db/schema";
import { unwrap } from "../../src/errors";
import * as notify from "../../src/notifications/service";
import { storeArtifacts } from "../../src/runs/artifacts";
import { listHosts, putHost } from "../../src/vault/hosts";
import * as models from "../../src/vault/models";
import { createRule, listRules } from "../../src/vault/rules";
import { createSecret, listSecrets } from "../../src/vault/secrets";
import { getSettings, setDefault } from "../../src/vault/settings";
import * as hooks from "../../src/webhooks/service";
import { collectArchive, file, tarGz, upload } from "./archives";
import { type ApiResponse, BASE, expectProblem, newTenant, principal, type Tenant, withDb } from "./harness";
import { newCanary } from "./leaks";
import { runWithAudit } from "./run-fixtures";
import { plantSetupImage } from "./setup-image-fixtures";

// The two tenants every isolation test sets up (A and B, each with a full vault, a run with
// audit rows, a webhook, a notification URL, a bundle, an artifact and a setup image), what a tenant's state
// reads as (so "B unchanged" is one comparison), and the shape of a case of the table in
// isolation-cases.ts. Apart from the tests so that each resource family's file and the sweeps over
// the whole document set up the same tenants.

export type Resource = "secret" | "rule" | "host" | "model";

/** A tenant with a full vault: secrets, rules (so an order), host entries, a non-default setting. */
export interface Vault {
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
  /** A setup image the run built (its setup command names the tag), by its key. */
  setupImage: string;
}

export interface Ctx {
  a: Vault;
  b: Vault;
}

export const COLLECTIONS: Record<Resource, { path: string; key: string }> = {
  secret: { path: "/v1/vault/secrets", key: "secrets" },
  rule: { path: "/v1/vault/rules", key: "rules" },
  host: { path: "/v1/vault/hosts", key: "hosts" },
  model: { path: "/v1/vault/models", key: "models" },
};

export function expectStatus(res: ApiResponse, status: number, what: string): ApiResponse {
  if (res.status !== status) throw new Error(`${what}: expected ${status}, got ${res.status} ${res.text}`);
  return res;
}

// Fixtures are written through the vault service the routes call (same validation, same
// encryption, same transactions), not over HTTP: every call through the harness's entrypoint
// costs a little more than the one before it within a test file, and the route calls under test
// are what this file's budget is for.
export async function idsOf(t: Tenant): Promise<Record<Resource, string[]>> {
  const p = principal(t);
  return withDb(async (db) => ({
    secret: (await listSecrets(db, p)).map((s) => s.id),
    rule: (await listRules(db, p)).map((r) => r.id),
    host: (await listHosts(db, p)).map((h) => h.id),
    model: (await models.listModels(db, p)).map((m) => m.id),
  }));
}

export async function fullVault(role: "a" | "b"): Promise<Vault> {
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
  const image = await withDb((db) => plantSetupImage(db, t.environmentId, tag, { builtByRunId: run.id }));
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
    setupImage: image.key,
  };
}

export async function twoVaults(): Promise<Ctx> {
  return { a: await fullVault("a"), b: await fullVault("b") };
}

let freshCount = 0;
/** A new resource of A's own, for the positive control after a refused cross-tenant call. */
export async function fresh(v: Vault, resource: Resource): Promise<string> {
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
export async function rows(t: Tenant) {
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
export async function snapshot(t: Tenant) {
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

export async function version(t: Tenant): Promise<number> {
  return (await withDb((db) => getSettings(db, principal(t)))).version;
}

/** A tenant's API key rows (hashes and dates included). */
export async function keyRows(v: Vault) {
  return withDb((db) =>
    db.select().from(apiKeys).where(eq(apiKeys.environmentId, v.t.environmentId)).orderBy(apiKeys.id),
  );
}

// ---- the shape of a case: isolation-cases.ts holds one per operation of the document ----

export type Body = (ctx: Ctx) => unknown;
/** What a case with a check of its own does, given the route's method and path (as documented). */
export type Check = (ctx: Ctx, method: string, path: string) => Promise<void>;

export type Case =
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
      check: Check;
    }
  /**
   * Routes of webhooks, of notification URLs, of API keys: `id` says whether the route takes
   * the id of one.
   */
  | { kind: "webhook" | "notification" | "apiKey"; id: boolean; body?: Body; check: Check }
  /**
   * Routes of bundles and of setup images: `id` says whether the route takes a bundle's hash or
   * a setup image's key.
   */
  | { kind: "bundle" | "setupImage"; id: boolean; check: Check }
  /** Not tenant-scoped on purpose; `inDocument` false for routes the document does not list. */
  | { kind: "unscoped"; reason: string; inDocument: boolean };

// ---- checks the cases of several routes make ----

/**
 * A's key on B's run (its id in `{id}`) → 404 not_found naming nothing of B's; on A's own run →
 * 200, again naming nothing of B's. Returns the answer on A's run, for the route's own checks.
 */
export async function ownRunOnly({ a, b }: Ctx, method: string, path: string, what: string) {
  const res = expectProblem(await a.t.api(method, path.replace("{id}", b.runId)), 404, "not_found");
  expect(res.text).not.toContain(b.tag);
  const own = expectStatus(await a.t.api(method, path.replace("{id}", a.runId)), 200, what);
  expect(own.text).not.toContain(b.tag);
  return own;
}

/** A query parameter naming B's environment or run cannot widen a read of A's run either. */
export async function expectNoWidening({ a, b }: Ctx, method: string, path: string) {
  const q = `?environmentId=${b.t.environmentId}&runId=${b.runId}`;
  expectProblem(await a.t.api(method, `${path.replace("{id}", a.runId)}${q}`), 400, "unknown_field");
}
