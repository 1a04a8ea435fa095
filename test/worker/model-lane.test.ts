import { env } from "cloudflare:workers";
import type { ModelCallRow } from "@benchwright/shared/contract/proxy-wire";
import { PolicyEnvelope } from "@benchwright/shared/contract/proxy-wire";
import { and, eq } from "drizzle-orm";
import { afterEach, describe, expect, it, vi } from "vitest";
import { loadConfig } from "../../src/config";
import { coordinatorStub } from "../../src/coordinator/client";
import { VAULT_ATTEMPTS } from "../../src/coordinator/machine";
import { modelCallLog, runs, sandboxes, vaultSecrets } from "../../src/db/schema";
import { unwrap } from "../../src/errors";
import { storeAuditBatch } from "../../src/runs/proxy-reports";
import * as models from "../../src/vault/models";
import { createRule } from "../../src/vault/rules";
import { createSecret } from "../../src/vault/secrets";
import { type ApiResponse, call, expectProblem, newTenant, principal, withDb } from "./harness";
import { captureLogs, findNeedles, leakNeedles, newCanary, responseText, scanDatabase } from "./leaks";
import { auditBatch, driveToEnd, newRun, paths, postBatch } from "./run-fixtures";

// The run's declared model, vault side: the policy envelope its proxy reads carries the model's
// lane and exactly its secret's value (all or nothing), a model gone from the vault stops the run
// before any code with the reason, the model lane's calls in audit batches are stored once, and
// GET /v1/runs/{id}/model-calls. The model's key is a canary throughout.

const ring = () => loadConfig(env).keyRing;
/** A vault with a rule (API_KEY for api.<tag>.example), a model (MODEL_KEY) and a spare secret. */
async function tenantWithModel() {
  const t = await newTenant();
  const tag = crypto.randomUUID().slice(0, 8);
  const ruleKey = newCanary("rulekey");
  const modelKey = newCanary("modelkey");
  const spare = newCanary("spare");
  await withDb(async (db) => {
    const p = principal(t);
    unwrap(await createSecret(db, ring(), p, { name: "API_KEY", value: ruleKey }));
    unwrap(await createSecret(db, ring(), p, { name: "MODEL_KEY", value: modelKey }));
    unwrap(await createSecret(db, ring(), p, { name: "SPARE_KEY", value: spare }));
    unwrap(
      await createRule(db, p, {
        host: `api.${tag}.example`,
        secret: "API_KEY",
        inject: { scheme: "bearer" },
      }),
    );
    unwrap(
      await models.createModel(db, p, {
        name: "eval-model",
        provider: "openai-compatible",
        baseUrl: "https://openrouter.ai/api/v1",
        upstreamModel: "meta-llama/llama-3-8b-instruct",
        secret: "MODEL_KEY",
      }),
    );
  });
  return { t, tag, ruleKey, modelKey, spare };
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe("the policy envelope of a run that declares a model", { timeout: 60_000 }, () => {
  it("carries the model's lane and exactly the values of its secret and the rules' (no other)", async () => {
    const { t, ruleKey, modelKey, spare } = await tenantWithModel();
    const run = await newRun(t, { spec: { commands: ["true"], model: "eval-model" } });
    const res = await run.proxy("GET", paths.policy(run));
    expect(res.status, res.text).toBe(200);
    const envelope = PolicyEnvelope.parse(res.json);
    expect(envelope.policy.model).toEqual({
      name: "eval-model",
      provider: "openai-compatible",
      baseUrl: "https://openrouter.ai/api/v1",
      upstreamModel: "meta-llama/llama-3-8b-instruct",
      secret: "MODEL_KEY",
      budget: null,
    });
    expect(envelope.secrets).toEqual({ API_KEY: ruleKey, MODEL_KEY: modelKey });
    expect(res.text).not.toContain(spare);
    // The same document the preview shows for that model (which never carries a value).
    const preview = await t.api("GET", "/v1/vault/policy-preview?model=eval-model");
    expect(envelope.policy).toEqual(preview.json);
    const needles = (await Promise.all([ruleKey, modelKey].map(leakNeedles))).flat();
    expect(findNeedles("preview", responseText(preview), needles)).toEqual([]);

    // A run that declares none gets no lane and not the model's secret.
    const plain = await newRun(t);
    const none = PolicyEnvelope.parse((await plain.proxy("GET", paths.policy(plain))).json);
    expect(none.policy.model).toBeNull();
    expect(none.secrets).toEqual({ API_KEY: ruleKey });
  });

  it("an empty vault but for the model: enforced (the lane lives in the proxy), its secret only", async () => {
    const t = await newTenant();
    const key = newCanary("solo");
    await withDb(async (db) => {
      unwrap(await createSecret(db, ring(), principal(t), { name: "K", value: key }));
      unwrap(
        await models.createModel(db, principal(t), {
          name: "m",
          provider: "openai-compatible",
          baseUrl: "https://llm.internal.example:8443/v1/",
          secret: "K",
        }),
      );
    });
    const run = await newRun(t, { spec: { commands: ["true"], model: "m" } });
    const envelope = PolicyEnvelope.parse((await run.proxy("GET", paths.policy(run))).json);
    expect(envelope.policy).toMatchObject({
      enforce: true,
      note: null,
      routing: { mode: "default", reasons: [] },
      model: { name: "m", upstreamModel: "m", baseUrl: "https://llm.internal.example:8443/v1", secret: "K" },
    });
    expect(envelope.secrets).toEqual({ K: key });
  });

  it("the model's secret that does not decrypt → 503 vault_unreadable, never a partial envelope", async () => {
    const { t, ruleKey, modelKey, spare } = await tenantWithModel();
    const run = await newRun(t, { spec: { commands: ["true"], model: "eval-model" } });
    // The spare's ciphertext moved into the model's secret row: bound to another id.
    await withDb(async (db) => {
      const [row] = await db
        .select({ c: vaultSecrets.ciphertext })
        .from(vaultSecrets)
        .where(and(eq(vaultSecrets.environmentId, t.environmentId), eq(vaultSecrets.name, "SPARE_KEY")));
      await db
        .update(vaultSecrets)
        .set({ ciphertext: row?.c ?? "" })
        .where(and(eq(vaultSecrets.environmentId, t.environmentId), eq(vaultSecrets.name, "MODEL_KEY")));
    });
    const logs = captureLogs();
    const res = expectProblem(await run.proxy("GET", paths.policy(run)), 503, "vault_unreadable");
    expect(res.json.detail).toContain("MODEL_KEY");
    const needles = (await Promise.all([ruleKey, modelKey, spare].map(leakNeedles))).flat();
    expect(findNeedles("response", responseText(res), needles)).toEqual([]);
    expect(findNeedles("logs", logs.join("\n"), needles)).toEqual([]);
    // A run without the model does not need that secret: its envelope is whole.
    const plain = await newRun(t);
    expect((await plain.proxy("GET", paths.policy(plain))).status).toBe(200);
  });

  it("the declared model deleted after launch → the envelope is refused, saying the model is missing", async () => {
    const { t } = await tenantWithModel();
    const run = await newRun(t, { spec: { commands: ["true"], model: "eval-model" } });
    expect((await run.proxy("GET", paths.policy(run))).status).toBe(200);
    const id = (await t.api("GET", "/v1/vault/models")).json.models[0].id;
    expect((await t.api("DELETE", `/v1/vault/models/${id}`)).status).toBe(204);
    const res = expectProblem(await run.proxy("GET", paths.policy(run)), 503, "vault_unreadable");
    expect(res.json.detail).toContain("eval-model");
    expect(res.json.detail).toContain("missing from the vault");
  });

  it("a run launched with a model that is then deleted stops before any sandbox, the reason naming the model", async () => {
    const { t, modelKey } = await tenantWithModel();
    // A launch with the model is accepted. The run followed here is recorded queued as a launch
    // records it, its coordinator started only after the deletion: a launch starts it at once,
    // and its first vault read could beat the delete.
    const accepted = await t.api("POST", "/v1/runs", { commands: ["echo never"], model: "eval-model" });
    expect(accepted.status, accepted.text).toBe(202);
    await t.api("POST", `/v1/runs/${accepted.json.id}/cancel`);
    const runId = (
      await newRun(t, { status: "queued", spec: { commands: ["echo never"], model: "eval-model" } })
    ).id;
    const id = (await t.api("GET", "/v1/vault/models")).json.models[0].id;
    expect((await t.api("DELETE", `/v1/vault/models/${id}`)).status).toBe(204);
    await coordinatorStub(env, runId).start(runId);
    const run = await driveToEnd(t, runId);
    expect(run.json).toMatchObject({ status: "stopped", reason: "vault_unreadable" });
    const attempts = run.json.trace.filter((e: { detail: { text?: string } | null }) =>
      e.detail?.text?.startsWith("Vault read attempt"),
    );
    expect(attempts).toHaveLength(VAULT_ATTEMPTS);
    expect(attempts[0].detail.text).toContain("model");
    expect(attempts[0].detail.text).toContain("missing from the vault");
    const made = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.runId, runId)));
    expect(made).toEqual([]);
    expect(findNeedles("run", run.text, await leakNeedles(modelKey))).toEqual([]);
  });
});

describe("modelBudget on a run", { timeout: 60_000 }, () => {
  it("reaches the lane as the policy's model.budget (camelCase, unset limits null)", async () => {
    const { t } = await tenantWithModel();
    const run = await newRun(t, {
      spec: { commands: ["true"], model: "eval-model", modelBudget: { calls: 5, outputTokens: 1000 } },
    });
    const envelope = PolicyEnvelope.parse((await run.proxy("GET", paths.policy(run))).json);
    expect(envelope.policy.model?.budget).toEqual({ calls: 5, inputTokens: null, outputTokens: 1000 });
    // Stored with the run as asked.
    const [row] = await withDb((db) => db.select({ spec: runs.spec }).from(runs).where(eq(runs.id, run.id)));
    expect(row?.spec.modelBudget).toEqual({ calls: 5, outputTokens: 1000 });
    // The preview is no run: no budget.
    expect((await t.api("GET", "/v1/vault/policy-preview?model=eval-model")).json.model.budget).toBeNull();
  });

  it("a run stored before the camelCase names (model_budget, input_tokens...) reads under them", async () => {
    const { t } = await tenantWithModel();
    const run = await newRun(t, { spec: { commands: ["true"], model: "eval-model" } });
    const old = {
      commands: ["true"],
      model: "eval-model",
      egress: "direct",
      on_proxy_failure: "continue",
      linger_seconds: 60,
      resources: { memory_mb: 1024 },
      model_budget: { calls: 5, output_tokens: 1000 },
    };
    await withDb((db) =>
      db
        .update(runs)
        .set({ spec: old as never })
        .where(eq(runs.id, run.id)),
    );
    const envelope = PolicyEnvelope.parse((await run.proxy("GET", paths.policy(run))).json);
    expect(envelope.policy.model?.budget).toEqual({ calls: 5, inputTokens: null, outputTokens: 1000 });
    const shown = await t.api("GET", `/v1/runs/${run.id}`);
    expect(shown.status, shown.text).toBe(200);
    expect(shown.json.spec).toEqual({
      commands: ["true"],
      model: "eval-model",
      egress: "direct",
      onProxyFailure: "continue",
      lingerSeconds: 60,
      resources: { memoryMb: 1024 },
      modelBudget: { calls: 5, outputTokens: 1000 },
    });
  });

  it("a launch: without a model → 400 model_budget_without_model; bad limits → 400; no run either way", async () => {
    const { t } = await tenantWithModel();
    const count = async () =>
      withDb(
        async (db) => (await db.select().from(runs).where(eq(runs.environmentId, t.environmentId))).length,
      );
    const alone = expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["true"], modelBudget: { calls: 5 } }),
      400,
      "model_budget_without_model",
    );
    expect(alone.json.detail).toContain("model");
    for (const [budget, code] of [
      [{ calls: 0 }, "invalid_request"],
      [{ calls: -1 }, "invalid_request"],
      [{ inputTokens: 1.5 }, "invalid_request"],
      [{ outputTokens: "100" }, "invalid_request"],
      [{ calls: 2 ** 41 }, "invalid_request"],
      [{ input_tokens: 100 }, "unknown_field"], // the name from before camelCase
      [5, "invalid_request"],
    ] as const) {
      expectProblem(
        await t.api("POST", "/v1/runs", { commands: ["true"], model: "eval-model", modelBudget: budget }),
        400,
        code,
      );
    }
    // A webhook's template is a launch too.
    expectProblem(
      await t.api("POST", "/v1/webhooks", {
        name: "ci",
        run: { commands: ["true"], modelBudget: { calls: 1 } },
      }),
      400,
      "model_budget_without_model",
    );
    expect(await count()).toBe(0);
    const ok = await t.api("POST", "/v1/runs", {
      commands: ["true"],
      model: "eval-model",
      modelBudget: { calls: 100, inputTokens: 20_000, outputTokens: 5000 },
    });
    expect(ok.status, ok.text).toBe(202);
    expect(await count()).toBe(1);
    // The launch row says what the run may spend.
    const launched = (await t.api("GET", `/v1/runs/${ok.json.id}`)).json.trace.find(
      (e: { reason: string }) => e.reason === "launched",
    );
    expect(launched.detail.text).toBe(
      "Declares the model eval-model (openai-compatible, openrouter.ai), with a budget of at most 100 calls, 20,000 input tokens, 5,000 output tokens.",
    );
  });

  it("GET /v1/runs/{id}/model-calls: spend against the budget; refused calls spend nothing", async () => {
    const { t } = await tenantWithModel();
    const run = await newRun(t, {
      status: "running",
      spec: { commands: ["true"], model: "eval-model", modelBudget: { calls: 3, inputTokens: 250 } },
    });
    const calls = [
      modelCall(1, { inputTokens: 100, outputTokens: 5, cachedInputTokens: 60, ms: 100 }),
      modelCall(2, { inputTokens: 160, outputTokens: 7, ms: 400 }),
      // Past the input limit (a call in flight overshot it), the lane refuses in the caller's format.
      modelCall(3, { inputTokens: 0, outputTokens: 0, status: 429, refused: "over_budget", ms: 0 }),
      modelCall(4, { inputTokens: 0, outputTokens: 0, status: 429, refused: "over_budget", ms: 1 }),
    ];
    expect((await postBatch(run, auditBatch(run.id, { modelCalls: calls }))).status).toBe(204);
    const res = await t.api("GET", `/v1/runs/${run.id}/model-calls`);
    expect(res.status, res.text).toBe(200);
    expect(res.json.totals).toEqual({
      calls: 4,
      inputTokens: 260,
      outputTokens: 12,
      cachedInputTokens: 60,
      refused: 2,
      errors: 0,
      latencyMs: { p50: 100, p95: 400 },
    });
    expect(res.json.budget).toEqual({
      calls: { used: 2, limit: 3 },
      inputTokens: { used: 260, limit: 250 },
      outputTokens: { used: 12, limit: null },
    });
    expect(res.json.calls[0]).toMatchObject({ refused: "over_budget", status: 429 });
    expect(res.json.calls[3]).toMatchObject({ refused: null, cachedInputTokens: 60 });
  });
});

const minute = (n: number) => new Date(Date.UTC(2026, 2, 1, 9, n)).toISOString();

function modelCall(i: number, fields: Partial<ModelCallRow> = {}): ModelCallRow {
  return {
    callId: `call_${String(i).padStart(4, "0")}_${crypto.randomUUID().slice(0, 8)}`,
    at: minute(i),
    model: "eval-model",
    provider: "openrouter",
    endpoint: "chat.completions",
    stream: i % 2 === 0,
    status: 200,
    inputTokens: 100 + i,
    outputTokens: 10 + i,
    cachedInputTokens: 0,
    refused: null,
    ms: 250,
    ...fields,
  };
}

describe("model calls in audit batches, and GET /v1/runs/{id}/model-calls", { timeout: 60_000 }, () => {
  it("a batch's calls are stored once: the batch replayed (409) or a call re-sent in a later batch", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const calls = [modelCall(1), modelCall(2)];
    const batch = auditBatch(run.id, { modelCalls: calls });
    expect((await postBatch(run, batch)).status).toBe(204);
    expectProblem(await postBatch(run, batch), 409, "already_stored");
    // The proxy crashed after sending and re-sent the calls with a new one in a new batch.
    const again = auditBatch(run.id, { modelCalls: [...calls, modelCall(3)] });
    expect((await postBatch(run, again)).status).toBe(204);
    const rows = await withDb((db) =>
      db.select().from(modelCallLog).where(eq(modelCallLog.runId, run.id)).orderBy(modelCallLog.at),
    );
    expect(rows.map((r) => r.callId)).toEqual([
      calls[0]?.callId,
      calls[1]?.callId,
      again.modelCalls[2]?.callId,
    ]);
    expect(rows[0]).toMatchObject({ environmentId: t.environmentId, inputTokens: 101, outputTokens: 11 });
    // A call row with a field the contract lacks (a prompt) is refused as a whole batch.
    const withPrompt = auditBatch(run.id, {
      modelCalls: [{ ...modelCall(9), prompt: "hi" } as ModelCallRow],
    });
    expectProblem(await postBatch(run, withPrompt), 400, "invalid_request");
    expect(
      await withDb((db) => db.select().from(modelCallLog).where(eq(modelCallLog.runId, run.id))),
    ).toHaveLength(3);
  });

  it("the run's model, its calls newest first (paged by cursor, each once) and the totals", async () => {
    const { t } = await tenantWithModel();
    const launched = await t.api("POST", "/v1/runs", { commands: ["true"], model: "eval-model" });
    expect(launched.status, launched.text).toBe(202);
    const runId = launched.json.id;
    // Calls stored through the route's own store (the run's proxy never started here).
    const ownerRun = { id: runId, userId: t.userId, environmentId: t.environmentId };
    const calls = [0, 1, 2, 3, 3, 4].map((n, i) =>
      modelCall(n, { inputTokens: 10 * (i + 1), outputTokens: i }),
    );
    await withDb((db) => storeAuditBatch(db, ownerRun, auditBatch(runId, { modelCalls: calls })));

    const all = await t.api("GET", `/v1/runs/${runId}/model-calls`);
    expect(all.status, all.text).toBe(200);
    expect(all.json.model).toEqual({ name: "eval-model", provider: "openrouter", baseHost: "openrouter.ai" });
    expect(all.json.totals).toEqual({
      calls: 6,
      inputTokens: 210,
      outputTokens: 15,
      cachedInputTokens: 0,
      refused: 0,
      errors: 0,
      latencyMs: { p50: 250, p95: 250 },
    });
    // No modelBudget: no spend to show. Every minute from the first call's to the newest's.
    expect(all.json.budget).toBeNull();
    expect(all.json.tokensPerMinute).toEqual([
      { minute: minute(0), inputTokens: 10, outputTokens: 0 },
      { minute: minute(1), inputTokens: 20, outputTokens: 1 },
      { minute: minute(2), inputTokens: 30, outputTokens: 2 },
      { minute: minute(3), inputTokens: 90, outputTokens: 7 },
      { minute: minute(4), inputTokens: 60, outputTokens: 5 },
    ]);
    expect(Date.parse(all.json.lastReportedAt)).toBeGreaterThan(Date.now() - 60_000);
    expect(all.json.nextCursor).toBeNull();
    const byTime = [...calls].sort((a, b) =>
      a.at === b.at ? (a.callId < b.callId ? -1 : 1) : a.at < b.at ? 1 : -1,
    );
    expect(all.json.calls).toEqual(byTime);
    for (const limit of [1, 2, 4]) {
      const pages: unknown[][] = [];
      let cursor: string | null = null;
      do {
        const q: string = cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
        const res: ApiResponse = await t.api("GET", `/v1/runs/${runId}/model-calls?limit=${limit}${q}`);
        expect(res.status, res.text).toBe(200);
        expect(res.json.totals.calls).toBe(6);
        pages.push(res.json.calls);
        cursor = res.json.nextCursor;
      } while (cursor && pages.length < 20);
      expect(pages.flat()).toEqual(all.json.calls);
    }
    expectProblem(await t.api("GET", `/v1/runs/${runId}/model-calls?cursor=garbage`), 400, "invalid_cursor");
    expectProblem(await t.api("GET", `/v1/runs/${runId}/model-calls?limit=0`), 400, "invalid_request");
    expectProblem(await t.api("GET", `/v1/runs/${runId}/model-calls?prompt=1`), 400, "unknown_field");

    // A run that declared no model and made no calls: null and zeros.
    const quiet = await newRun(t);
    expect((await t.api("GET", `/v1/runs/${quiet.id}/model-calls`)).json).toEqual({
      model: null,
      calls: [],
      totals: {
        calls: 0,
        inputTokens: 0,
        outputTokens: 0,
        cachedInputTokens: 0,
        refused: 0,
        errors: 0,
        latencyMs: { p50: null, p95: null },
      },
      budget: null,
      tokensPerMinute: [],
      lastReportedAt: null,
      nextCursor: null,
    });
  });

  it("another tenant's run → 404 not_found (as no run at all); no key → 401", async () => {
    const a = await newTenant();
    const b = await newTenant();
    const theirs = await newRun(b, { spec: { commands: ["true"], model: "secret-project-model" } });
    expect((await postBatch(theirs, auditBatch(theirs.id, { modelCalls: [modelCall(1)] }))).status).toBe(204);
    const res = expectProblem(await a.api("GET", `/v1/runs/${theirs.id}/model-calls`), 404, "not_found");
    expect(res.text).not.toContain("secret-project-model");
    expect(res.text).not.toContain("openrouter");
    expectProblem(await a.api("GET", "/v1/runs/run_doesnotexist/model-calls"), 404, "not_found");
    expectProblem(await call(null, "GET", `/v1/runs/${theirs.id}/model-calls`), 401, "unauthorized");
    expectProblem(
      await call(theirs.proxyToken, "GET", `/v1/runs/${theirs.id}/model-calls`),
      401,
      "unauthorized",
    );
    const own = await b.api("GET", `/v1/runs/${theirs.id}/model-calls`);
    expect(own.json).toMatchObject({
      model: { name: "secret-project-model", provider: "openrouter", baseHost: null },
    });
    expect(own.json.totals.calls).toBe(1);
  });
});

describe("B5 the model's key reaches only its run's proxy", { timeout: 120_000 }, () => {
  it("no canary in any model route, preview, run read, model-calls, log or database plaintext", async () => {
    const logs = captureLogs();
    const { t, modelKey, ruleKey } = await tenantWithModel();
    const responses: [string, ApiResponse][] = [];
    const get = async (path: string) => responses.push([path, await t.api("GET", path)]);
    const model = (await t.api("GET", "/v1/vault/models")).json.models[0];
    await get("/v1/vault/models");
    await get(`/v1/vault/models/${model.id}`);
    responses.push(["PATCH", await t.api("PATCH", `/v1/vault/models/${model.id}`, { provider: "openai" })]);
    await get("/v1/vault/policy-preview?model=eval-model");
    const launched = await t.api("POST", "/v1/runs", { commands: ["true"], model: "eval-model" });
    responses.push(["launch", launched]);
    await get(`/v1/runs/${launched.json.id}`);
    await get(`/v1/runs/${launched.json.id}/model-calls`);
    const secretId = (await t.api("GET", "/v1/vault/secrets")).json.secrets.find(
      (s: { name: string }) => s.name === "MODEL_KEY",
    ).id;
    responses.push(["refused delete", await t.api("DELETE", `/v1/vault/secrets/${secretId}`)]);
    expect(responses.every(([, r]) => r.status < 500)).toBe(true);
    const needles = (await Promise.all([modelKey, ruleKey].map(leakNeedles))).flat();
    const leaks = responses.flatMap(([where, res]) => findNeedles(where, responseText(res), needles));
    expect(leaks).toEqual([]);
    expect(findNeedles("logs", logs.join("\n"), needles)).toEqual([]);
    const scan = await scanDatabase(needles);
    expect(scan.columns).toContain("public.vault_models.base_url");
    expect(scan.hits).toEqual([]);
  });
});
