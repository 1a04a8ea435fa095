import { env } from "cloudflare:workers";
import { and, count, eq, sql } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { idempotencyKeys, runs } from "../../src/db/schema";
import { IDEMPOTENT_POSTS, NOT_CREATING_POSTS } from "../../src/idempotency/routes";
import { KEY_TTL_MS } from "../../src/idempotency/store";
import { reconcile } from "../../src/reaper/reconcile";
import { file, tarGz } from "./archives";
import { type ApiResponse, call, callWith, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { leakNeedles, scanDatabase } from "./leaks";
import { newRun } from "./run-fixtures";

// Idempotency-Key on the creating POSTs (case K2), against the real Worker and Postgres: a retry
// with the same key and body is the first answer again and nothing is made twice; another body
// is 409; a retry while the first still runs is 409 too; keys last a day and are per environment.

const newKey = () => `k-${crypto.randomUUID()}`;

const post = (t: Tenant, path: string, body: unknown, key: string, headers: Record<string, string> = {}) =>
  call(t.key, "POST", path, body, { "idempotency-key": key, ...headers });

const runCount = (t: Tenant) =>
  withDb(async (db) => {
    const [row] = await db.select({ n: count() }).from(runs).where(eq(runs.environmentId, t.environmentId));
    return row?.n ?? 0;
  });

const keyRow = (t: Tenant, key: string) =>
  withDb(async (db) => {
    const [row] = await db
      .select()
      .from(idempotencyKeys)
      .where(and(eq(idempotencyKeys.environmentId, t.environmentId), eq(idempotencyKeys.key, key)));
    return row ?? null;
  });

const ageKey = (t: Tenant, key: string, ms: number) =>
  withDb((db) =>
    db
      .update(idempotencyKeys)
      .set({ createdAt: new Date(Date.now() - ms) })
      .where(and(eq(idempotencyKeys.environmentId, t.environmentId), eq(idempotencyKeys.key, key))),
  );

const replayed = (res: ApiResponse) => res.headers.get("idempotent-replayed") === "true";

describe("Idempotency-Key", () => {
  it("case K2: the same key and body again → the first answer, replayed, and exactly one run", async () => {
    const t = await newTenant();
    const key = newKey();
    const spec = { commands: ["echo once"] };
    const first = await post(t, "/v1/runs", spec, key);
    expect(first.status, first.text).toBe(202);
    expect(replayed(first)).toBe(false);
    const again = await post(t, "/v1/runs", spec, key);
    expect(again.status).toBe(202);
    expect(replayed(again)).toBe(true);
    expect(again.text).toBe(first.text);
    expect(again.headers.get("content-type")).toBe(first.headers.get("content-type"));
    // The replay is its own request: its own request id.
    expect(again.headers.get("x-request-id")).not.toBe(first.headers.get("x-request-id"));
    expect(await runCount(t)).toBe(1);
    // Without a key, a launch is a launch.
    expect((await t.api("POST", "/v1/runs", spec)).status).toBe(202);
    expect(await runCount(t)).toBe(2);
  });

  it("case K2: the same key with another body or path → 409 idempotency_key_reused, nothing made", async () => {
    const t = await newTenant();
    const key = newKey();
    expect((await post(t, "/v1/runs", { commands: ["echo a"] }, key)).status).toBe(202);
    expectProblem(await post(t, "/v1/runs", { commands: ["echo b"] }, key), 409, "idempotency_key_reused");
    // The same bytes to another route is another request.
    expectProblem(
      await post(t, "/v1/vault/secrets", { name: "K", value: "v-1234567890" }, key),
      409,
      "idempotency_key_reused",
    );
    expect(await runCount(t)).toBe(1);
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);
    // The first answer is still the key's.
    const again = await post(t, "/v1/runs", { commands: ["echo a"] }, key);
    expect(replayed(again)).toBe(true);
  });

  it("case K2: requests with one key at once → one run; the others are in_use (Retry-After) or its replay", async () => {
    const t = await newTenant();
    const key = newKey();
    const spec = { commands: ["echo at-once"] };
    const all = await Promise.all(Array.from({ length: 6 }, () => post(t, "/v1/runs", spec, key)));
    const fresh = all.filter((r) => r.status === 202 && !replayed(r));
    expect(fresh).toHaveLength(1);
    const id = fresh[0]?.json.id;
    for (const r of all) {
      if (r === fresh[0]) continue;
      if (r.status === 409) {
        expectProblem(r, 409, "idempotency_key_in_use");
        expect(r.headers.get("retry-after")).toBe("1");
      } else {
        expect(r.status).toBe(202);
        expect(replayed(r)).toBe(true);
        expect(r.json.id).toBe(id);
      }
    }
    expect(await runCount(t)).toBe(1);
    const after = await post(t, "/v1/runs", spec, key);
    expect(replayed(after)).toBe(true);
    expect(after.json.id).toBe(id);
  });

  it("case K2: a key lasts 24 h: past it the key is free again, and the reaper forgets it", async () => {
    const t = await newTenant();
    const key = newKey();
    const first = await post(t, "/v1/runs", { commands: ["echo day-one"] }, key);
    expect(first.status).toBe(202);
    await ageKey(t, key, KEY_TTL_MS + 60_000);
    // Before the reaper comes by, an expired key is taken over: another body is not a reuse.
    const next = await post(t, "/v1/runs", { commands: ["echo day-two"] }, key);
    expect(next.status, next.text).toBe(202);
    expect(replayed(next)).toBe(false);
    expect(next.json.id).not.toBe(first.json.id);
    expect(await runCount(t)).toBe(2);

    // The reaper deletes keys past their day and keeps the rest. Swept as of 400 days ago (rows
    // aged to match), so this sweep sees nothing of the other files sharing the database.
    const old = newKey();
    expect((await post(t, "/v1/vault/secrets", { name: "OLD", value: "v-0987654321" }, old)).status).toBe(
      201,
    );
    const DAY = 24 * 60 * 60_000;
    await ageKey(t, old, 400 * DAY + KEY_TTL_MS + 60_000);
    const report = await reconcile(env, Date.now() - 400 * DAY);
    expect(report.expiredKeys).toBeGreaterThanOrEqual(1);
    expect(await keyRow(t, old)).toBeNull();
    expect(await keyRow(t, key)).not.toBeNull();
  });

  it("case K2: keys are per environment: the same key in two environments makes a run in each", async () => {
    const a = await newTenant();
    const b = await newTenant();
    const key = newKey();
    const spec = { commands: ["echo mine"] };
    const ra = await post(a, "/v1/runs", spec, key);
    const rb = await post(b, "/v1/runs", spec, key);
    expect([ra.status, rb.status]).toEqual([202, 202]);
    expect(replayed(rb)).toBe(false);
    expect(rb.json.id).not.toBe(ra.json.id);
    expect([await runCount(a), await runCount(b)]).toEqual([1, 1]);
    // And another body in b is not a reuse of a's key.
    const other = newKey();
    expect((await post(a, "/v1/runs", spec, other)).status).toBe(202);
    expect((await post(b, "/v1/runs", { commands: ["echo other"] }, other)).status).toBe(202);
  });

  it("case K2: a 4xx answer is kept and replayed; a 5xx is not", async () => {
    const t = await newTenant();
    const key = newKey();
    const rule = { host: "api.example.com", secret: "LATER", inject: { scheme: "bearer" } };
    expectProblem(await post(t, "/v1/vault/rules", rule, key), 400, "unknown_secret");
    expect((await t.api("POST", "/v1/vault/secrets", { name: "LATER", value: "v-1122334455" })).status).toBe(
      201,
    );
    // Stripe's rule: the same request with the same key is the same answer, even now that it
    // would succeed; a new key is a new request.
    const again = expectProblem(await post(t, "/v1/vault/rules", rule, key), 400, "unknown_secret");
    expect(replayed(again)).toBe(true);
    expect((await post(t, "/v1/vault/rules", rule, newKey())).status).toBe(201);

    // A 5xx gives the key up, so a retry runs again: here the egress tunnel's relay is away
    // after the token was made (a retry makes a new token, which replaces it: no harm).
    const run = await newRun(t, { status: "running" });
    const down = newKey();
    const relayAway = {
      ...env,
      TUNNEL_RELAY: {
        idFromName: (name: string) => env.TUNNEL_RELAY.idFromName(name),
        get: () => ({ dropAgent: () => Promise.reject(new Error("relay away")) }),
      },
    } as unknown as Env;
    const path = `/v1/runs/${run.id}/egress-agent-token`;
    const failed = await callWith(relayAway, t.key, "POST", path, undefined, { "idempotency-key": down });
    expectProblem(failed, 500, "internal_error");
    expect(await keyRow(t, down)).toBeNull();
    const retried = await post(t, path, undefined, down);
    expect(retried.status, retried.text).toBe(201);
    expect(replayed(retried)).toBe(false);
    expect(replayed(await post(t, path, undefined, down))).toBe(true);
  });

  it("case K2: a launch whose coordinator cannot be reached still answers 202 once, and its replay", async () => {
    const t = await newTenant();
    const key = newKey();
    const unreachable = {
      ...env,
      RUN_COORDINATOR: {
        idFromName: (name: string) => env.RUN_COORDINATOR.idFromName(name),
        get: () => ({
          start: () => Promise.reject(new Error("coordinator away")),
        }),
      },
    } as unknown as Env;
    const spec = { commands: ["echo later"] };
    const first = await callWith(unreachable, t.key, "POST", "/v1/runs", spec, { "idempotency-key": key });
    expect(first.status, first.text).toBe(202);
    expect(first.json.status).toBe("queued");
    const again = await post(t, "/v1/runs", spec, key);
    expect(replayed(again)).toBe(true);
    expect(again.json.id).toBe(first.json.id);
    expect(await runCount(t)).toBe(1);
  });

  it("case K2: a bundle upload with a key: the same bytes replay 201, other bytes are a reuse", async () => {
    const t = await newTenant();
    const key = newKey();
    const bytes = await tarGz([file("bench/task_impl.py", "print('k2')\n")]);
    const send = (body: Uint8Array) =>
      call(t.key, "POST", "/v1/bundles", body, {
        "content-type": "application/gzip",
        "idempotency-key": key,
      });
    const first = await send(bytes);
    expect(first.status, first.text).toBe(201);
    const again = await send(bytes);
    expect(again.status).toBe(201);
    expect(replayed(again)).toBe(true);
    expect(again.json).toEqual(first.json);
    const other = await tarGz([file("bench/task_impl.py", "print('other')\n")]);
    expectProblem(await send(other), 409, "idempotency_key_reused");
  });

  it("case K2: a kept answer is sealed, and the secret it showed once is not in it (L5)", async () => {
    const t = await newTenant();
    const key = newKey();
    const body = { name: "sealed", run: { commands: ["echo hook"] } };
    const first = await post(t, "/v1/webhooks", body, key);
    expect(first.status, first.text).toBe(201);
    const again = await post(t, "/v1/webhooks", body, key);
    expect(replayed(again)).toBe(true);
    expect(again.json.id).toBe(first.json.id);
    expect(again.json).not.toHaveProperty("secret");
    expect((await t.api("GET", "/v1/webhooks")).json.webhooks).toHaveLength(1);
    // What was kept is sealed: even the webhook's id is in no column of the row in clear.
    const row = await withDb(async (db) =>
      JSON.stringify(
        (
          await db.execute(
            sql`select r::text from idempotency_keys r where environment_id = ${t.environmentId} and key = ${key}`,
          )
        ).rows,
      ),
    );
    expect(row).toContain("v1.");
    expect(row).not.toContain(first.json.id);
    const scan = await scanDatabase(await leakNeedles(first.json.secret));
    expect(scan.columns).toContain("public.idempotency_keys.response_ciphertext");
    expect(scan.hits).toEqual([]);
  });

  it("refuses a malformed key with 400 invalid_idempotency_key, before anything runs", async () => {
    const t = await newTenant();
    for (const bad of ["", "x".repeat(256), "del\x7f", "tab\there"]) {
      expectProblem(await post(t, "/v1/runs", { commands: ["true"] }, bad), 400, "invalid_idempotency_key");
    }
    expect(await runCount(t)).toBe(0);
    // 255 printable characters, spaces inside included, are a key.
    const long = `a ${"~".repeat(252)}z`;
    expect((await post(t, "/v1/runs", { commands: ["true"] }, long)).status).toBe(202);
  });

  it("ignores the header on a POST that creates nothing", async () => {
    const t = await newTenant();
    const run = (await t.api("POST", "/v1/runs", { commands: ["true"] })).json.id;
    const key = newKey();
    const first = await post(t, `/v1/runs/${run}/cancel`, undefined, key);
    expect(first.status).toBe(202);
    expect(replayed(await post(t, `/v1/runs/${run}/cancel`, undefined, key))).toBe(false);
    expect(await keyRow(t, key)).toBeNull();
  });

  it("every POST of the document is either covered or says why a retry is already safe", async () => {
    const doc = (await call(null, "GET", "/v1/openapi.json")).json;
    const posts = Object.entries(doc.paths as Record<string, Record<string, unknown>>)
      .filter(([, ops]) => "post" in ops)
      .map(([path]) => path);
    const covered = new Set<string>(IDEMPOTENT_POSTS);
    expect(posts.filter((p) => !covered.has(p) && !(p in NOT_CREATING_POSTS))).toEqual([]);
    expect([...covered, ...Object.keys(NOT_CREATING_POSTS)].filter((p) => !posts.includes(p))).toEqual([]);
    for (const path of IDEMPOTENT_POSTS) {
      // biome-ignore lint/suspicious/noExplicitAny: the document's JSON
      const params = (doc.paths[path].post.parameters ?? []) as any[];
      expect(
        params.map((p) => `${p.in}:${p.name}`),
        path,
      ).toContain("header:idempotency-key");
      expect(Object.keys(doc.paths[path].post.responses), path).toContain("409");
    }
    for (const path of Object.keys(NOT_CREATING_POSTS)) {
      // biome-ignore lint/suspicious/noExplicitAny: the document's JSON
      const params = (doc.paths[path].post.parameters ?? []) as any[];
      expect(params.map((p) => p.name)).not.toContain("idempotency-key");
    }
  });

  it("stores no plaintext of the request: only a keyed digest", async () => {
    const t = await newTenant();
    const key = newKey();
    const value = "hunter2-weak";
    expect((await post(t, "/v1/vault/secrets", { name: "WEAK", value }, key)).status).toBe(201);
    const row = await keyRow(t, key);
    expect(row?.requestDigest).toMatch(/^[A-Za-z0-9_-]+\.[0-9a-f]{64}$/);
    const text = await withDb(async (db) =>
      JSON.stringify(
        (await db.execute(sql`select * from idempotency_keys where environment_id = ${t.environmentId}`))
          .rows,
      ),
    );
    expect(text).not.toContain(value);
  });
});
