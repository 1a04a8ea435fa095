import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { LAST_USED_GRANULARITY_MS } from "../../src/auth/middleware";
import { loadConfig } from "../../src/config";
import { hashApiKey } from "../../src/crypto/api-keys";
import { apiKeys, idempotencyKeys, sessions } from "../../src/db/schema";
import { storedAnswer } from "../../src/idempotency/store";
import { loggedIn, newBrowser } from "./browser";
import { type ApiResponse, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { leakNeedles, scanDatabase } from "./leaks";

// Self-served API keys (POST/GET/DELETE /v1/api-keys, the keys page), through the real Worker
// and Postgres. Case K3: a revoked or expired key is refused at once, on the API and the pages;
// the every-route sweep is in isolation-routes.test.ts, driven by the OpenAPI document.

const KEYS = "/manage/keys";

async function makeKey(t: Tenant, body: Record<string, unknown>): Promise<ApiResponse> {
  const res = await t.api("POST", "/v1/api-keys", body);
  expect(res.status, res.text).toBe(201);
  return res;
}

/**
 * Where the database holds the key in any encoding, but for its SHA-256: that one is stored on
 * purpose (api_keys.hash) and leakNeedles counts it.
 */
async function keyInDatabase(key: string) {
  const hash = await hashApiKey(key);
  const needles = (await leakNeedles(key)).filter((n) => !hash.startsWith(n));
  return (await scanDatabase(needles)).hits;
}

const keyRow = (id: string) =>
  withDb(async (db) => (await db.select().from(apiKeys).where(eq(apiKeys.id, id)))[0]);

/** Moves a key's expiry into the past, as the clock would (no sleeping). */
const expire = (id: string) =>
  withDb((db) =>
    db
      .update(apiKeys)
      .set({ expiresAt: new Date(Date.now() - 1000) })
      .where(eq(apiKeys.id, id)),
  );

describe("API keys: make, list, revoke", { timeout: 60_000 }, () => {
  it("POST shows the key once; only its hash is stored; the list never has it", async () => {
    const t = await newTenant();
    const made = await makeKey(t, { name: "ci" });
    const key: string = made.json.key;
    expect(key).toMatch(/^bw_[A-Za-z0-9_-]{43}$/);
    expect(made.json).toMatchObject({ name: "ci", scope: "full", expiresAt: null, state: "active" });
    expect(key.startsWith(made.json.prefix)).toBe(true);
    expect((await call(key, "GET", "/v1/me")).json.keyId).toBe(made.json.id);

    const row = await keyRow(made.json.id);
    expect(JSON.stringify(row)).not.toContain(key);
    // Nor anywhere else in the database, in any encoding.
    expect(await keyInDatabase(key)).toEqual([]);
    expect(row?.hash).toMatch(/^[0-9a-f]{64}$/);

    const list = await t.api("GET", "/v1/api-keys");
    expect(list.status).toBe(200);
    expect(list.text).not.toContain(key);
    expect(list.text).not.toContain(row?.hash);
    const ids = list.json.apiKeys.map((k: { id: string }) => k.id);
    expect(ids).toEqual([made.json.id, t.keyId]);
    const mine = list.json.apiKeys.find((k: { id: string }) => k.id === t.keyId);
    expect(mine).toMatchObject({ current: true, scope: "full", state: "active" });
    expect(Object.keys(mine).sort()).toEqual(
      [
        "createdAt",
        "current",
        "expiresAt",
        "id",
        "lastUsedAt",
        "name",
        "prefix",
        "revokedAt",
        "scope",
        "state",
      ].sort(),
    );
  });

  it("expiry: expiresAt or expiresIn; in the past, both, or badly formed → 400 with a stable code", async () => {
    const t = await newTenant();
    const inDays = await makeKey(t, { name: "90d", expiresIn: "90d" });
    const at = Date.parse(inDays.json.expiresAt);
    expect(Math.abs(at - (Date.now() + 90 * 86_400_000))).toBeLessThan(60_000);
    const when = new Date(Date.now() + 3_600_000).toISOString();
    expect((await makeKey(t, { name: "at", expiresAt: when })).json.expiresAt).toBe(when);
    const past = new Date(Date.now() - 60_000).toISOString();
    expectProblem(await t.api("POST", "/v1/api-keys", { name: "x", expiresAt: past }), 400, "invalid_expiry");
    expectProblem(
      await t.api("POST", "/v1/api-keys", { name: "x", expiresAt: when, expiresIn: "1d" }),
      400,
      "invalid_expiry",
    );
    expectProblem(
      await t.api("POST", "/v1/api-keys", { name: "x", expiresIn: "3y" }),
      400,
      "invalid_request",
    );
    expectProblem(
      await t.api("POST", "/v1/api-keys", { name: "x", expiresIn: "9999d" }),
      400,
      "invalid_expiry",
    );
    expectProblem(await t.api("POST", "/v1/api-keys", { name: "x", scope: "admin" }), 400, "invalid_request");
    expectProblem(await t.api("POST", "/v1/api-keys", { name: "" }), 400, "invalid_request");
  });

  it("a read key may GET and HEAD only: every other method → 403 read_only_key, nothing done", async () => {
    const t = await newTenant();
    const read = (await makeKey(t, { name: "watcher", scope: "read" })).json;
    expect(read.scope).toBe("read");
    expect((await call(read.key, "GET", "/v1/vault/secrets")).status).toBe(200);
    expect((await call(read.key, "HEAD", "/v1/vault/secrets")).status).toBe(200);
    expectProblem(
      await call(read.key, "POST", "/v1/vault/secrets", { name: "X", value: "v" }),
      403,
      "read_only_key",
    );
    // Not even a read key: it cannot make keys at all, so none wider than its own.
    for (const scope of ["read", "full"]) {
      expectProblem(await call(read.key, "POST", "/v1/api-keys", { name: "w", scope }), 403, "read_only_key");
    }
    expectProblem(await call(read.key, "DELETE", `/v1/api-keys/${t.keyId}`), 403, "read_only_key");
    expectProblem(await call(read.key, "DELETE", `/v1/api-keys/${read.id}`), 403, "read_only_key");
    const list = await t.api("GET", "/v1/api-keys");
    expect(list.json.apiKeys).toHaveLength(2);
    expect(list.json.apiKeys.every((k: { state: string }) => k.state === "active")).toBe(true);
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);
  });

  it("last used is written at most once a minute per key", async () => {
    const t = await newTenant();
    const made = (await makeKey(t, { name: "busy" })).json;
    expect((await keyRow(made.id))?.lastUsedAt).toBeNull();
    await call(made.key, "GET", "/v1/me");
    const first = (await keyRow(made.id))?.lastUsedAt;
    expect(first).toBeInstanceOf(Date);
    for (let i = 0; i < 3; i++) await call(made.key, "GET", "/v1/me");
    expect((await keyRow(made.id))?.lastUsedAt).toEqual(first);
    // Push the last use back past the window, as the clock would: the next request records one.
    const old = new Date(Date.now() - LAST_USED_GRANULARITY_MS - 1000);
    await withDb((db) => db.update(apiKeys).set({ lastUsedAt: old }).where(eq(apiKeys.id, made.id)));
    await call(made.key, "GET", "/v1/me");
    const later = (await keyRow(made.id))?.lastUsedAt ?? old;
    expect(later.getTime()).toBeGreaterThan(old.getTime() + 1000);
  });

  it("a key may revoke itself: 204, then 401; revoking again is 204; another tenant's id is 404", async () => {
    const t = await newTenant();
    const other = await newTenant();
    const made = (await makeKey(t, { name: "self" })).json;
    expectProblem(await call(made.key, "DELETE", `/v1/api-keys/${other.keyId}`), 404, "not_found");
    expect((await other.api("GET", "/v1/me")).status).toBe(200);
    expect((await call(made.key, "DELETE", `/v1/api-keys/${made.id}`)).status).toBe(204);
    expectProblem(await call(made.key, "GET", "/v1/me"), 401, "unauthorized");
    expect((await t.api("DELETE", `/v1/api-keys/${made.id}`)).status).toBe(204);
    const listed = (await t.api("GET", "/v1/api-keys")).json.apiKeys.find(
      (k: { id: string }) => k.id === made.id,
    );
    expect(listed.state).toBe("revoked");
    expectProblem(await t.api("DELETE", "/v1/api-keys/key_nope"), 404, "not_found");
  });

  it("an Idempotency-Key retry of a creation makes one key and replays its answer without the key", async () => {
    const t = await newTenant();
    const headers = { authorization: `Bearer ${t.key}`, "idempotency-key": crypto.randomUUID() };
    const first = await call(null, "POST", "/v1/api-keys", { name: "once" }, headers);
    expect(first.status).toBe(201);
    expect(first.json.key).toMatch(/^bw_/);
    const again = await call(null, "POST", "/v1/api-keys", { name: "once" }, headers);
    expect(again.status).toBe(201);
    expect(again.headers.get("idempotent-replayed")).toBe("true");
    expect(again.json.id).toBe(first.json.id);
    expect(again.json.key).toBeUndefined();
    expect(again.text).not.toContain(first.json.key);
    const keys = (await t.api("GET", "/v1/api-keys")).json.apiKeys;
    expect(keys.filter((k: { name: string }) => k.name === "once")).toHaveLength(1);
    // What the store keeps is sealed, and was sealed without the key: opened, it has none.
    const rows = await withDb((db) =>
      db.select().from(idempotencyKeys).where(eq(idempotencyKeys.environmentId, t.environmentId)),
    );
    expect(rows).toHaveLength(1);
    const p = { userId: t.userId, environmentId: t.environmentId, keyId: t.keyId };
    const kept = await storedAnswer(loadConfig(env).keyRing, p, rows[0] as (typeof rows)[number]);
    expect(kept?.status).toBe(201);
    expect(JSON.parse(kept?.body ?? "{}")).toEqual(again.json);
    expect(kept?.body).not.toContain(first.json.key);
    expect(await keyInDatabase(first.json.key)).toEqual([]);
  });
});

describe("case K3: a revoked or expired key is refused at once", { timeout: 60_000 }, () => {
  it("case K3: revoked through the API → 401 on its next request; the revoker's key still works", async () => {
    const t = await newTenant();
    const made = (await makeKey(t, { name: "leaked" })).json;
    expect((await call(made.key, "GET", "/v1/vault/secrets")).status).toBe(200);
    expect((await t.api("DELETE", `/v1/api-keys/${made.id}`)).status).toBe(204);
    for (const [method, path] of [
      ["GET", "/v1/me"],
      ["GET", "/v1/api-keys"],
      ["POST", "/v1/api-keys"],
    ] as const) {
      const res = await call(made.key, method, path, method === "POST" ? { name: "again" } : undefined);
      expect(expectProblem(res, 401, "unauthorized").json.detail).toContain("revoked or expired");
    }
    expect((await t.api("GET", "/v1/me")).status).toBe(200);
  });

  it("case K3: expired → 401 at once, on the API and the login form", async () => {
    const t = await newTenant();
    const made = (await makeKey(t, { name: "short", expiresIn: "30m" })).json;
    expect((await call(made.key, "GET", "/v1/me")).status).toBe(200);
    await expire(made.id);
    expectProblem(await call(made.key, "GET", "/v1/me"), 401, "unauthorized");
    expectProblem(
      await call(made.key, "POST", "/v1/vault/secrets", { name: "X", value: "v" }),
      401,
      "unauthorized",
    );
    const listed = (await t.api("GET", "/v1/api-keys")).json.apiKeys.find(
      (k: { id: string }) => k.id === made.id,
    );
    expect(listed.state).toBe("expired");
    const b = newBrowser();
    const res = await b.post("/login", { key: made.key, next: KEYS });
    expect(res.status).toBe(401);
    expect(b.cookie).toBeNull();
  });

  it("case K3: a session opened with a key ends when the key is revoked or expires", async () => {
    const t = await newTenant();
    for (const end of ["revoke", "expire"] as const) {
      const made = (await makeKey(t, { name: `page-${end}` })).json;
      const b = await loggedIn({ ...t, key: made.key }, KEYS);
      expect((await b.get(KEYS)).status).toBe(200);
      if (end === "revoke") expect((await t.api("DELETE", `/v1/api-keys/${made.id}`)).status).toBe(204);
      else await expire(made.id);
      const page = await b.get(KEYS);
      expect(page.status, end).toBe(303);
      expect(page.location).toBe(`/login?next=${encodeURIComponent(KEYS)}`);
      expect((await b.get("/runs")).status).toBe(303);
      const post = await b.post(`${KEYS}`, { name: "from a dead session" });
      expect(post.status, end).toBe(401);
    }
    // Revoking ended the session rows too, not only their reads.
    const [revoked] = (await t.api("GET", "/v1/api-keys")).json.apiKeys.filter(
      (k: { name: string }) => k.name === "page-revoke",
    );
    const rows = await withDb((db) => db.select().from(sessions).where(eq(sessions.apiKeyId, revoked.id)));
    expect(rows.length).toBeGreaterThan(0);
    expect(rows.every((r) => r.endedAt !== null)).toBe(true);
    const names = (await t.api("GET", "/v1/api-keys")).json.apiKeys.map((k: { name: string }) => k.name);
    expect(names).not.toContain("from a dead session");
  });
});

describe("pages: the keys page", { timeout: 60_000 }, () => {
  it("lists keys (never a key), makes one shown once, revokes; a foreign form is refused", async () => {
    const t = await newTenant();
    const b = await loggedIn(t, KEYS);
    const page = await b.get(KEYS);
    expect(page.status).toBe(200);
    expect(page.html).toContain('href="/manage/keys"');
    expect(page.html).toContain(t.key.slice(0, 10));
    expect(page.html).not.toContain(t.key);

    const made = await b.post(KEYS, { name: "from-page", scope: "read", expiresIn: "30d" });
    expect(made.status).toBe(201);
    const key = /<pre class="mono">(bw_[A-Za-z0-9_-]{43})<\/pre>/.exec(made.html)?.[1];
    expect(key, "the new key on the answer").toBeTruthy();
    const listed = (await t.api("GET", "/v1/api-keys")).json.apiKeys.find(
      (k: { name: string }) => k.name === "from-page",
    );
    expect(listed).toMatchObject({ scope: "read", state: "active" });
    expect(listed.expiresAt).not.toBeNull();
    // Shown once: not on the next visit.
    expect((await b.get(KEYS)).html).not.toContain(key);

    // A form from another site, or without the CSRF token, makes nothing.
    expect((await b.post(KEYS, { name: "evil" }, { origin: "https://evil.example" })).status).toBe(403);
    expect((await b.post(KEYS, { name: "evil", _csrf: "0".repeat(64) })).status).toBe(403);
    const names = (await t.api("GET", "/v1/api-keys")).json.apiKeys.map((k: { name: string }) => k.name);
    expect(names).not.toContain("evil");

    await b.get(KEYS);
    const revoke = await b.post(`${KEYS}/${listed.id}/revoke`, {});
    expect(revoke.status).toBe(303);
    expect(revoke.location).toMatch(/^\/manage\/keys\?ok=/);
    expectProblem(await call(key ?? "", "GET", "/v1/me"), 401, "unauthorized");
  });

  it("pages by the list's cursor; a page link it did not give shows the first page, and says so", async () => {
    const t = await newTenant();
    const older = (await makeKey(t, { name: "older-key" })).json;
    await makeKey(t, { name: "newest-key" });
    const b = await loggedIn(t, KEYS);
    expect((await b.get(KEYS)).html).toContain("newest-key");
    // The API's cursor after the newest key is a position on the page too (one list).
    const cursor = (await t.api("GET", "/v1/api-keys?limit=1")).json.nextCursor;
    const second = await b.get(`${KEYS}?cursor=${encodeURIComponent(cursor)}`);
    expect(second.status).toBe(200);
    expect(second.html).not.toContain("newest-key");
    expect(second.html).toContain(older.prefix);
    expect(second.html).toContain(`href="${KEYS}#keys"`);
    // case O3: a changed cursor is not read as a position.
    const bad = await b.get(`${KEYS}?cursor=${encodeURIComponent(`${cursor}x`)}`);
    expect(bad.status).toBe(200);
    expect(bad.html).toContain("newest-key");
    expect(bad.html).toContain("not one this site gave");
  });

  it("a read key's session can look but not post (403 read_only_key), and can still log out", async () => {
    const t = await newTenant();
    const read = (await makeKey(t, { name: "reader", scope: "read" })).json;
    const b = await loggedIn({ ...t, key: read.key }, KEYS);
    const page = await b.get(KEYS);
    expect(page.status).toBe(200);
    expect(page.html).not.toContain(`action="${KEYS}"`);
    const refused = await b.post(KEYS, { name: "wider" });
    expect(refused.status).toBe(403);
    expect(refused.html).toContain("read_only_key");
    await b.get("/manage/vault");
    const secret = await b.post("/manage/vault/secrets", { name: "X", value: "v" });
    expect(secret.status).toBe(403);
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);
    await b.get(KEYS);
    expect((await b.post("/logout", {})).status).toBe(303);
  });

  it("revoking the session's own key from the page ends the session", async () => {
    const t = await newTenant();
    const b = await loggedIn(t, KEYS);
    const res = await b.post(`${KEYS}/${t.keyId}/revoke`, {});
    expect(res.status).toBe(303);
    expect(res.location).toBe("/login");
    expect((await b.get(KEYS)).status).toBe(303);
    expectProblem(await t.api("GET", "/v1/me"), 401, "unauthorized");
  });
});
