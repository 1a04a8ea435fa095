import { eq, sql } from "drizzle-orm";
import { Webhook } from "standardwebhooks";
import { describe, expect, it } from "vitest";
import MIGRATION_0009 from "../../migrations/0009_model_providers.sql?raw";
import { runs, vaultModels } from "../../src/db/schema";
import { type ApiResponse, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { findNeedles, leakNeedles, newCanary, responseText } from "./leaks";

// Models a run may declare (/v1/vault/models, src/routes/vault-models.ts): CRUD, one per name,
// the base URL's rules, the secret named (never shown; a secret a model uses cannot be deleted),
// the vault version, the declared model in the policy preview, and the launch-time check
// (unknown_model) on every launch path. A canary secret value is the model's key throughout.

const MODEL_FIELDS = [
  "baseUrl",
  "createdAt",
  "id",
  "name",
  "provider",
  "secret",
  "updatedAt",
  "upstreamModel",
];

interface Fixture {
  t: Tenant;
  canary: string;
  /** Every response, for the leak scan. */
  responses: [string, ApiResponse][];
  api: (method: string, path: string, body?: unknown) => Promise<ApiResponse>;
}

async function fixture(): Promise<Fixture> {
  const t = await newTenant();
  const canary = newCanary("modelkey");
  const responses: [string, ApiResponse][] = [];
  const api = async (method: string, path: string, body?: unknown) => {
    const res = await t.api(method, path, body);
    responses.push([`${method} ${path}`, res]);
    return res;
  };
  expect((await api("POST", "/v1/vault/secrets", { name: "OPENAI_KEY", value: canary })).status).toBe(201);
  return { t, canary, responses, api };
}

const MODEL = {
  name: "gpt-4o-mini",
  provider: "openai",
  baseUrl: "https://api.openai.com/v1",
  secret: "OPENAI_KEY",
};

async function create(f: Fixture, body: Record<string, unknown> = MODEL) {
  const res = await f.api("POST", "/v1/vault/models", body);
  expect(res.status, res.text).toBe(201);
  return res.json;
}

async function version(f: Fixture): Promise<number> {
  return (await f.t.api("GET", "/v1/vault/settings")).json.version;
}

async function expectNoLeak(f: Fixture) {
  const needles = await leakNeedles(f.canary);
  const leaks = f.responses.flatMap(([where, res]) => findNeedles(where, responseText(res), needles));
  expect(leaks).toEqual([]);
}

describe("/v1/vault/models", { timeout: 60_000 }, () => {
  it("create, list, read, change, delete; the secret by name only; every change bumps the version", async () => {
    const f = await fixture();
    const v0 = await version(f);
    const made = await create(f);
    expect(Object.keys(made).sort()).toEqual(MODEL_FIELDS);
    expect(made).toMatchObject({ ...MODEL, upstreamModel: "gpt-4o-mini" });
    expect(made.id).toMatch(/^mdl_/);
    expect(await version(f)).toBe(v0 + 1);

    const other = await create(f, {
      name: "claude-via-router",
      provider: "openai-compatible",
      baseUrl: "https://OpenRouter.AI:443/api/v1/",
      upstreamModel: "anthropic/claude-3.5-sonnet",
      secret: "OPENAI_KEY",
    });
    // Canonical: lowercase host, the default port and the trailing slash dropped.
    expect(other.baseUrl).toBe("https://openrouter.ai/api/v1");
    expect(other.upstreamModel).toBe("anthropic/claude-3.5-sonnet");

    const list = await f.api("GET", "/v1/vault/models");
    expect(list.status).toBe(200);
    expect(list.json).toEqual({ models: [other, made] });
    expect((await f.api("GET", `/v1/vault/models/${made.id}`)).json).toEqual(made);

    const v1 = await version(f);
    const changed = await f.api("PATCH", `/v1/vault/models/${made.id}`, {
      name: "mini",
      baseUrl: "https://llm.example.com:8443/v1",
    });
    expect(changed.status, changed.text).toBe(200);
    expect(changed.json).toMatchObject({
      id: made.id,
      name: "mini",
      provider: "openai",
      baseUrl: "https://llm.example.com:8443/v1",
      // Set at creation (the old name), not re-derived from the new one.
      upstreamModel: "gpt-4o-mini",
      secret: "OPENAI_KEY",
      createdAt: made.createdAt,
    });
    expect(await version(f)).toBe(v1 + 1);

    const del = await f.api("DELETE", `/v1/vault/models/${made.id}`);
    expect(del.status).toBe(204);
    expect(await version(f)).toBe(v1 + 2);
    expectProblem(await f.api("GET", `/v1/vault/models/${made.id}`), 404, "not_found");
    expectProblem(
      await f.api("PATCH", `/v1/vault/models/${made.id}`, { provider: "anthropic" }),
      404,
      "not_found",
    );
    expectProblem(await f.api("DELETE", `/v1/vault/models/${made.id}`), 404, "not_found");
    expect((await f.api("GET", "/v1/vault/models")).json.models).toEqual([other]);
    await expectNoLeak(f);
  });

  it("one model per name: a duplicate create or rename → 409 model_exists, nothing written", async () => {
    const f = await fixture();
    const a = await create(f);
    const b = await create(f, { ...MODEL, name: "other" });
    const v = await version(f);
    expectProblem(await f.api("POST", "/v1/vault/models", MODEL), 409, "model_exists");
    expectProblem(
      await f.api("PATCH", `/v1/vault/models/${b.id}`, { name: MODEL.name }),
      409,
      "model_exists",
    );
    expect(await version(f)).toBe(v);
    expect((await f.api("GET", "/v1/vault/models")).json.models).toEqual([a, b]);
    // Renaming to its own name is no conflict.
    expect((await f.api("PATCH", `/v1/vault/models/${a.id}`, { name: MODEL.name })).status).toBe(200);
  });

  it("bad bodies → 400 with the exact code, nothing written; the URL is never quoted back", async () => {
    const f = await fixture();
    const v = await version(f);
    const userinfo = `https://user:${f.canary}@api.openai.com/v1`;
    const cases: [Record<string, unknown>, string][] = [
      [{ ...MODEL, secret: "NO_SUCH_KEY" }, "unknown_secret"],
      [{ ...MODEL, baseUrl: "http://api.openai.com/v1" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: userinfo }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "https://@api.openai.com/v1" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "https://api.openai.com/v1?key=1" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "https://api.openai.com/v1#x" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "https://api.openai.com/v1\n" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "https://api open.com/v1" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "https://" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "api.openai.com/v1" }, "invalid_base_url"],
      [{ ...MODEL, baseUrl: "" }, "invalid_request"],
      [{ ...MODEL, name: "" }, "invalid_request"],
      [{ ...MODEL, name: "has space" }, "invalid_request"],
      [{ ...MODEL, name: "x".repeat(129) }, "invalid_request"],
      [{ ...MODEL, provider: "" }, "invalid_request"],
      [{ ...MODEL, provider: "p".repeat(65) }, "invalid_request"],
      [{ ...MODEL, secret: "bad name!" }, "invalid_request"],
      [{ ...MODEL, provider: "openrouter" }, "invalid_request"],
      [{ ...MODEL, provider: "OpenAI" }, "invalid_request"],
      [{ name: "x", provider: "openai-compatible", secret: "OPENAI_KEY" }, "base_url_required"],
      [{ name: "x", provider: "openai" }, "invalid_request"],
    ];
    for (const [body, code] of cases) {
      const res = expectProblem(await f.api("POST", "/v1/vault/models", body), 400, code);
      const url = String(body.baseUrl ?? "");
      if (url.length > 12) expect(res.text).not.toContain(url.trim());
    }
    expectProblem(
      await f.api("POST", "/v1/vault/models", { ...MODEL, environmentId: "env_x" }),
      400,
      "unknown_field",
    );
    const made = await create(f);
    const after = await version(f);
    expect(after).toBe(v + 1);
    for (const [body, code] of [
      [{ baseUrl: "http://x.example/v1" }, "invalid_base_url"],
      [{ secret: "NO_SUCH_KEY" }, "unknown_secret"],
      [{ id: "mdl_other" }, "unknown_field"],
    ] as const) {
      expectProblem(await f.api("PATCH", `/v1/vault/models/${made.id}`, body), 400, code);
    }
    expect(await version(f)).toBe(after);
    expect((await f.api("GET", `/v1/vault/models/${made.id}`)).json).toEqual(made);
    await expectNoLeak(f);
  });

  it("providers: openai and anthropic default their base URL; openai-compatible must give one", async () => {
    const f = await fixture();
    const { baseUrl: _, ...noUrl } = MODEL;
    const openai = await create(f, noUrl);
    expect(openai).toMatchObject({ provider: "openai", baseUrl: "https://api.openai.com/v1" });
    const claude = await create(f, { ...noUrl, name: "claude-sonnet", provider: "anthropic" });
    expect(claude).toMatchObject({ provider: "anthropic", baseUrl: "https://api.anthropic.com/v1" });
    // An Anthropic-format gateway of one's own: the given URL wins.
    const gateway = await create(f, {
      ...noUrl,
      name: "claude-gw",
      provider: "anthropic",
      baseUrl: "https://gw.example.com/anthropic/v1",
    });
    expect(gateway.baseUrl).toBe("https://gw.example.com/anthropic/v1");
    const v = await version(f);
    const missing = expectProblem(
      await f.api("POST", "/v1/vault/models", { ...noUrl, name: "router", provider: "openai-compatible" }),
      400,
      "base_url_required",
    );
    expect(missing.json.detail).toContain("openai-compatible");
    expect(await version(f)).toBe(v);

    // A new provider without a base URL: a default URL follows the provider, a given one stays.
    const switched = await f.api("PATCH", `/v1/vault/models/${openai.id}`, { provider: "anthropic" });
    expect(switched.json).toMatchObject({ provider: "anthropic", baseUrl: "https://api.anthropic.com/v1" });
    expectProblem(
      await f.api("PATCH", `/v1/vault/models/${openai.id}`, { provider: "openai-compatible" }),
      400,
      "base_url_required",
    );
    const kept = await f.api("PATCH", `/v1/vault/models/${gateway.id}`, { provider: "openai" });
    expect(kept.json).toMatchObject({ provider: "openai", baseUrl: "https://gw.example.com/anthropic/v1" });
    const router = await f.api("PATCH", `/v1/vault/models/${claude.id}`, {
      provider: "openai-compatible",
      baseUrl: "https://openrouter.ai/api/v1",
    });
    expect(router.json).toMatchObject({
      provider: "openai-compatible",
      baseUrl: "https://openrouter.ai/api/v1",
    });
    expect((await f.api("GET", `/v1/vault/models/${openai.id}`)).json.provider).toBe("anthropic");
    await expectNoLeak(f);
  });

  it("the database holds only the closed providers; migration 0009 maps old labels to openai-compatible", async () => {
    const f = await fixture();
    const made = await create(f);
    const setProvider = (provider: string) =>
      withDb((db) => db.execute(sql`update vault_models set provider = ${provider} where id = ${made.id}`));
    // drizzle wraps the driver's error: the constraint's name is in its cause.
    const refused = await setProvider("openrouter").then(
      () => null,
      (e: Error) => String((e.cause as Error | undefined)?.message ?? e.message),
    );
    expect(refused).toMatch(/vault_models_provider/);
    // The migration's own statements, on a label written before the constraint existed (the
    // constraint dropped and restored inside a transaction that is rolled back).
    const statements = MIGRATION_0009.split("--> statement-breakpoint").map((q) => q.trim());
    const mapping = statements.find((q) => q.includes("UPDATE"));
    const constraint = statements.find((q) => q.includes("ADD CONSTRAINT"));
    expect(mapping && constraint).toBeTruthy();
    const rollback = new Error("rollback");
    const seen: string[] = [];
    await expect(
      withDb((db) =>
        db.transaction(async (tx) => {
          await tx.execute(sql`alter table vault_models drop constraint vault_models_provider`);
          for (const [label, id] of [
            ["vllm", made.id],
            ["openai", made.id],
          ] as const) {
            await tx.execute(sql`update vault_models set provider = ${label} where id = ${id}`);
            await tx.execute(sql.raw(mapping ?? ""));
            const rows = await tx
              .select({ p: vaultModels.provider })
              .from(vaultModels)
              .where(eq(vaultModels.id, id));
            seen.push(rows[0]?.p ?? "");
          }
          await tx.execute(sql.raw(constraint ?? ""));
          throw rollback;
        }),
      ),
    ).rejects.toBe(rollback);
    expect(seen).toEqual(["openai-compatible", "openai"]);
    expect((await f.api("GET", `/v1/vault/models/${made.id}`)).json.provider).toBe("openai");
  });

  it("a secret a model uses cannot be deleted (409 secret_in_use) until the model goes or changes", async () => {
    const f = await fixture();
    const made = await create(f);
    const secretId = (await f.api("GET", "/v1/vault/secrets")).json.secrets[0].id;
    const refused = expectProblem(
      await f.api("DELETE", `/v1/vault/secrets/${secretId}`),
      409,
      "secret_in_use",
    );
    expect(refused.json.detail).toContain(MODEL.name);
    expect(
      (await f.api("POST", "/v1/vault/secrets", { name: "SPARE", value: newCanary("spare") })).status,
    ).toBe(201);
    expect((await f.api("PATCH", `/v1/vault/models/${made.id}`, { secret: "SPARE" })).json.secret).toBe(
      "SPARE",
    );
    expect((await f.api("DELETE", `/v1/vault/secrets/${secretId}`)).status).toBe(204);
  });

  it("the preview with ?model= carries the model's lane (secret by name), enforced even for an empty vault", async () => {
    const f = await fixture();
    await create(f, { ...MODEL, upstreamModel: "gpt-4o-mini-2024-07-18" });
    const res = await f.api("GET", `/v1/vault/policy-preview?model=${MODEL.name}`);
    expect(res.status, res.text).toBe(200);
    expect(res.json.model).toEqual({
      name: MODEL.name,
      provider: "openai",
      baseUrl: "https://api.openai.com/v1",
      upstreamModel: "gpt-4o-mini-2024-07-18",
      secret: "OPENAI_KEY",
      // A preview is no run: no budget.
      budget: null,
    });
    expect(res.json).toMatchObject({ enforce: true, note: null, routing: { mode: "default", reasons: [] } });
    expect((await f.api("GET", "/v1/vault/policy-preview")).json).toMatchObject({
      model: null,
      enforce: false,
    });
    const unknown = expectProblem(
      await f.api("GET", "/v1/vault/policy-preview?model=nope"),
      400,
      "unknown_model",
    );
    expect(unknown.json.detail).toContain("nope");
    await expectNoLeak(f);
  });
});

describe("launching a run that declares a model", { timeout: 60_000 }, () => {
  it("POST /v1/runs: an unknown model → 400 unknown_model and no run; a vault model → 202, recorded at launch", async () => {
    const f = await fixture();
    const count = async () =>
      withDb(
        async (db) => (await db.select().from(runs).where(eq(runs.environmentId, f.t.environmentId))).length,
      );
    expectProblem(
      await f.api("POST", "/v1/runs", { commands: ["true"], model: MODEL.name }),
      400,
      "unknown_model",
    );
    expect(await count()).toBe(0);
    await create(f);
    const launched = await f.api("POST", "/v1/runs", { commands: ["true"], model: MODEL.name });
    expect(launched.status, launched.text).toBe(202);
    expect(await count()).toBe(1);
    const run = await f.api("GET", `/v1/runs/${launched.json.id}`);
    const queued = run.json.trace.find((e: { reason: string }) => e.reason === "launched");
    expect(queued.detail.model).toEqual({ name: MODEL.name, provider: "openai", baseHost: "api.openai.com" });
    const calls = await f.api("GET", `/v1/runs/${launched.json.id}/model-calls`);
    expect(calls.status, calls.text).toBe(200);
    expect(calls.json).toMatchObject({
      model: { name: MODEL.name, provider: "openai", baseHost: "api.openai.com" },
      calls: [],
      totals: { calls: 0, inputTokens: 0, outputTokens: 0, refused: 0, errors: 0 },
      budget: null,
      nextCursor: null,
    });
    await expectNoLeak(f);
  });

  it("a webhook delivery whose template names an unknown model → 400 unknown_model, no run; once it exists → 202", async () => {
    const f = await fixture();
    const hook = await f.api("POST", "/v1/webhooks", {
      name: "ci",
      run: { commands: ["true"], model: MODEL.name },
    });
    expect(hook.status, hook.text).toBe(201);
    const deliver = (id: string) => {
      const at = new Date();
      const body = JSON.stringify({ event: "push" });
      return call(null, "POST", `/hooks/${hook.json.id}`, body, {
        "content-type": "application/json",
        "webhook-id": id,
        "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
        "webhook-signature": new Webhook(hook.json.secret).sign(id, at, body),
      });
    };
    expectProblem(await deliver("msg_model_1"), 400, "unknown_model");
    const count = await withDb(
      async (db) => (await db.select().from(runs).where(eq(runs.environmentId, f.t.environmentId))).length,
    );
    expect(count).toBe(0);
    await create(f);
    // The refused delivery was not recorded: the same id now starts the run.
    const started = await deliver("msg_model_1");
    expect(started.status, started.text).toBe(202);
    expect(started.json.runId).toMatch(/^run_/);
  });
});
