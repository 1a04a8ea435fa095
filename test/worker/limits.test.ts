import { env } from "cloudflare:workers";
import { and, count, eq } from "drizzle-orm";
import { Webhook } from "standardwebhooks";
import { describe, expect, it } from "vitest";
import { idempotencyKeys, runs, sandboxes, webhookDeliveries } from "../../src/db/schema";
import { RATE_LIMIT_HEADERS, RATE_LIMIT_PERIOD_SECONDS } from "../../src/limits/rate-limit-policy";
import { type ApiResponse, callWith, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { newRun, setRunStatus } from "./run-fixtures";

// The API's limits (case K4), against the real Worker and Postgres: the per-API-key request
// rate of the Workers rate-limiting binding (wrangler.toml [[ratelimits]], counted by the test
// pool's local limiter) and the runs an environment may have at once. Each refusal is a 429
// problem+json with Retry-After, and leaves nothing behind.

const runCount = (t: Tenant) =>
  withDb(async (db) => {
    const [row] = await db.select({ n: count() }).from(runs).where(eq(runs.environmentId, t.environmentId));
    return row?.n ?? 0;
  });

const sandboxCount = (t: Tenant) =>
  withDb(async (db) => {
    const [row] = await db
      .select({ n: count() })
      .from(sandboxes)
      .innerJoin(runs, eq(runs.id, sandboxes.runId))
      .where(eq(runs.environmentId, t.environmentId));
    return row?.n ?? 0;
  });

/**
 * The Worker with the flood's binding in API_RATE_LIMIT's place: the same local limiter at 20
 * requests per 10 s (vitest.config.ts), so that a busy machine sends more than the bound inside
 * one window; wrangler.toml's 300 is only a number in that binding's config.
 */
const flooded = {
  ...env,
  API_RATE_LIMIT: (env as unknown as Record<string, unknown>).API_RATE_LIMIT_FLOOD,
} as Env;
const floodCall = (
  key: string,
  method: string,
  path: string,
  body?: unknown,
  headers?: Record<string, string>,
) => callWith(flooded, key, method, path, body, headers);

/** At most this many requests in flight at once: each opens its own database connection. */
const BATCH = 10;
/** Well past the flood binding's limit (20 per 10 s), in case a window turns over mid-flood. */
const FLOOD_AT_MOST = 100;

/** Sends GET /v1/me with the tenant's key until one is refused; that refusal, or null. */
async function flood(t: Tenant): Promise<ApiResponse | null> {
  for (let sent = 0; sent < FLOOD_AT_MOST; sent += BATCH) {
    const batch = await Promise.all(Array.from({ length: BATCH }, () => floodCall(t.key, "GET", "/v1/me")));
    const refused = batch.find((r) => r.status !== 200);
    if (refused) return refused;
  }
  return null;
}

describe("limits", () => {
  it("case K4: past its request rate an API key gets 429 rate_limited with Retry-After; nothing half-done", async () => {
    // The binding counts in windows of the wall clock; a window that turns over between the
    // flood's refusal and the requests after it lets those through, so then the check is redone
    // with a fresh key (by what happened, not by waiting).
    for (let attempt = 0; attempt < 3; attempt++) {
      const t = await newTenant();
      const other = await newTenant();
      const refused = await flood(t);
      if (!refused) throw new Error(`no refusal in ${FLOOD_AT_MOST} requests`);
      expectProblem(refused, 429, "rate_limited");
      expect(refused.headers.get("retry-after")).toBe(String(RATE_LIMIT_PERIOD_SECONDS));
      // The draft-ietf-httpapi-ratelimit-headers fields: the policy, and none left for a window.
      expect(refused.headers.get("ratelimit-policy")).toBe(RATE_LIMIT_HEADERS["ratelimit-policy"]);
      expect(refused.headers.get("ratelimit-policy")).toMatch(/^"per-key";q=\d+;w=10$/);
      expect(refused.headers.get("ratelimit")).toBe('"per-key";r=0;t=10');
      const key = `k-${crypto.randomUUID()}`;
      const [launch, secret, others] = await Promise.all([
        floodCall(t.key, "POST", "/v1/runs", { commands: ["echo flood"] }, { "idempotency-key": key }),
        floodCall(t.key, "POST", "/v1/vault/secrets", { name: "FLOOD", value: "v-5566778899" }),
        floodCall(other.key, "GET", "/v1/me"),
      ]);
      // Per key: another key's allowance is its own.
      expect(others.status).toBe(200);
      if (launch.status !== 429 || secret.status !== 429) continue;
      expectProblem(launch, 429, "rate_limited");
      expectProblem(secret, 429, "rate_limited");
      expect(await runCount(t)).toBe(0);
      expect(await sandboxCount(t)).toBe(0);
      expect((await floodCall(other.key, "GET", "/v1/vault/secrets")).status).toBe(200);
      // Refused before the Idempotency-Key was claimed: a retry after Retry-After runs.
      const claimed = await withDb((db) =>
        db
          .select()
          .from(idempotencyKeys)
          .where(and(eq(idempotencyKeys.environmentId, t.environmentId), eq(idempotencyKeys.key, key))),
      );
      expect(claimed).toEqual([]);
      return;
    }
    throw new Error("every attempt's window turned over mid-check");
  });

  it("case K4: an environment at its runs at once gets 429 too_many_runs with Retry-After; nothing made", async () => {
    const lowered = { ...env, RUNS_MAX_ACTIVE_PER_ENVIRONMENT: "2" } as Env;
    const t = await newTenant();
    const running = await newRun(t, { status: "running" });
    // A lingering run holds its proxy sandbox: it counts. An ended one does not.
    await newRun(t, { status: "lingering" });
    await newRun(t, { status: "finished" });
    const key = `k-${crypto.randomUUID()}`;
    const spec = { commands: ["echo one-too-many"] };
    const refused = await callWith(lowered, t.key, "POST", "/v1/runs", spec, { "idempotency-key": key });
    expectProblem(refused, 429, "too_many_runs");
    expect(refused.headers.get("retry-after")).toBe("30");
    expect(refused.json.detail).toContain("2");
    expect(await runCount(t)).toBe(3);
    expect(await sandboxCount(t)).toBe(0);

    // A 429 is not an answer kept for the key: once a run ends, the same retry launches.
    await setRunStatus(running.id, "finished");
    const retried = await callWith(lowered, t.key, "POST", "/v1/runs", spec, { "idempotency-key": key });
    expect(retried.status, retried.text).toBe(202);
    expect(retried.headers.get("idempotent-replayed")).toBeNull();
    expect(await runCount(t)).toBe(4);
  });

  it("case K4: launches at once cannot overshoot the bound: one room, one run", async () => {
    const lowered = { ...env, RUNS_MAX_ACTIVE_PER_ENVIRONMENT: "2" } as Env;
    const t = await newTenant();
    await newRun(t, { status: "running" });
    const all = await Promise.all(
      Array.from({ length: 4 }, (_, i) =>
        callWith(lowered, t.key, "POST", "/v1/runs", { commands: [`echo ${i}`] }),
      ),
    );
    expect(all.map((r) => r.status).sort()).toEqual([202, 429, 429, 429]);
    for (const r of all.filter((r) => r.status === 429)) expectProblem(r, 429, "too_many_runs");
    expect(await runCount(t)).toBe(2);
  });

  it("case K4: a webhook delivery over the bound is refused 429 and recorded nowhere, so the sender's retry launches", async () => {
    const lowered = { ...env, RUNS_MAX_ACTIVE_PER_ENVIRONMENT: "1" } as Env;
    const t = await newTenant();
    const hook = await t.api("POST", "/v1/webhooks", { name: "ci", run: { commands: ["echo hook"] } });
    expect(hook.status, hook.text).toBe(201);
    const running = await newRun(t, { status: "running" });
    const id = `msg_${crypto.randomUUID().replaceAll("-", "")}`;
    const at = new Date();
    const body = JSON.stringify({ event: "push" });
    const headers = {
      "content-type": "application/json",
      "webhook-id": id,
      "webhook-timestamp": String(Math.floor(at.getTime() / 1000)),
      "webhook-signature": new Webhook(hook.json.secret).sign(id, at, body),
    };
    const refused = await callWith(lowered, null, "POST", `/hooks/${hook.json.id}`, body, headers);
    expectProblem(refused, 429, "too_many_runs");
    expect(refused.headers.get("retry-after")).toBe("30");
    const recorded = await withDb((db) =>
      db.select().from(webhookDeliveries).where(eq(webhookDeliveries.webhookId, hook.json.id)),
    );
    expect(recorded).toEqual([]);
    expect(await runCount(t)).toBe(1);
    await setRunStatus(running.id, "finished");
    const retried = await callWith(lowered, null, "POST", `/hooks/${hook.json.id}`, body, headers);
    expect(retried.status, retried.text).toBe(202);
    expect(await runCount(t)).toBe(2);
  });
});
