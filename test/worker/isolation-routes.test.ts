import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { provisionApiKey } from "../../src/auth/provision";
import { generateApiKey } from "../../src/crypto/api-keys";
import { apiKeys, users } from "../../src/db/schema";
import { type ApiResponse, call, callPaced, expectProblem, withDb } from "./harness";
import { CASES, documentOperations, jsonBodyOperations, pathFor, sample, split } from "./isolation-cases";
import {
  COLLECTIONS,
  type Ctx,
  expectStatus,
  fresh,
  fullVault,
  idsOf,
  keyRows,
  type Resource,
  snapshot,
  twoVaults,
  version,
} from "./isolation-fixtures";
import { findNeedles, leakNeedles, newCanary, responseText } from "./leaks";

// The sweeps over every operation of the OpenAPI document (cases C1, C3, C4, K3), so that a new
// route cannot slip past: the meta-test fails, naming the route, when the document lists an
// operation the table in isolation-cases.ts has no case for; then no body may name another
// tenant (C3), no read may return a secret value (C4), and no bad or revoked key gets in (C1,
// K3). The per-route cases run in isolation-<family>.test.ts.

// case C1 (the meta-test: a new route without a case fails here)
describe("C1 meta: every route has an isolation case", { timeout: 120_000 }, () => {
  it("the table names every operation of the OpenAPI document, and nothing else", async () => {
    const ops = await documentOperations();
    expect(ops.length).toBeGreaterThanOrEqual(19);
    const missing = ops.filter((op) => !(op in CASES));
    expect(
      missing,
      `operations without an isolation case (add them to their family's table, merged into CASES in test/worker/isolation-cases.ts): ${missing.join(", ")}`,
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
        (c?.kind === "bundle" && c.id) ||
        (c?.kind === "setupImage" && c.id)
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
        const res = await callPaced(a.t.key, method, path, withField(body, field, value));
        if (res.status !== 400 || res.json?.code !== "unknown_field" || !res.json.detail.includes(field)) {
          failures.push(`${op} +${field}: ${res.status} ${res.text.slice(0, 200)}`);
        }
      }
      // Nested objects are strict too.
      const inject = (body as { inject?: object } | undefined)?.inject;
      if (inject) {
        const nested = { ...(body as object), inject: { ...inject, userId: b.t.userId } };
        const res = await callPaced(a.t.key, method, path, nested);
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
      const res = await callPaced(a.t.key, method, target, body ?? {});
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
        c?.kind === "by-id" ? a.ids[c.resource].map((id) => path.replace("{id}", id)) : [pathFor(op, a)];
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

/**
 * Each operation of the document, called as A's owner would (`sample`) but by each of `callers`:
 * the calls that did not answer 401 unauthorized, one line each.
 */
async function notRefused(
  ctx: Ctx,
  callers: Record<string, (method: string, path: string, body: unknown) => Promise<ApiResponse>>,
): Promise<string[]> {
  const failures: string[] = [];
  for (const op of await documentOperations()) {
    const { method, path, body } = sample(op, ctx, ctx.a);
    for (const [label, send] of Object.entries(callers)) {
      const res = await send(method, path, body);
      try {
        expectProblem(res, 401, "unauthorized");
      } catch (e) {
        failures.push(`${op} (${label}): ${(e as Error).message}`);
      }
    }
  }
  return failures;
}

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
    const failures = await notRefused(
      ctx,
      Object.fromEntries(
        Object.entries(credentials).map(([label, headers]) => [
          label,
          (method: string, path: string, body: unknown) => call(null, method, path, body, headers),
        ]),
      ),
    );
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
    const failures = await notRefused(ctx, {
      revoked: (method, path, body) => call(revoked.key, method, path, body),
      expired: (method, path, body) => call(expired.key, method, path, body),
    });
    expect(failures).toEqual([]);
    expect(await snapshot(t)).toEqual(before);
    // Not even a last-used stamp: a refused key leaves no trace of its own.
    expect(await refusedKeys()).toEqual(keysBefore);
  });
});
