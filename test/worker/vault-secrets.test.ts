import { exports } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { vaultSecrets } from "../../src/db/schema";
import { BASE, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";

// Secrets over the API: write-only values, names, the bad-input matrix. Every test has its own
// tenant. Bad input asserts the exact problem code.

const FINGERPRINT = /^fp_[A-Za-z0-9_-]{1,32}_[0-9a-f]{16}$/;
const SECRET_FIELDS = ["createdAt", "fingerprint", "id", "name", "updatedAt"];

async function createSecret(t: Tenant, name: string, value: string) {
  const res = await t.api("POST", "/v1/vault/secrets", { name, value });
  expect(res.status, res.text).toBe(201);
  return res.json;
}

/** Moves the secret's updatedAt `ms` into the past; returns it as it reads now. */
async function backdated<S extends { id: string; updatedAt: string }>(secret: S, ms: number): Promise<S> {
  const updatedAt = new Date(Date.parse(secret.updatedAt) - ms);
  await withDb((db) => db.update(vaultSecrets).set({ updatedAt }).where(eq(vaultSecrets.id, secret.id)));
  return { ...secret, updatedAt: updatedAt.toISOString() };
}

describe("secrets: create, read, replace, delete", () => {
  it("creates a secret: 201, fp_ fingerprint, no value anywhere in the response (case C4)", async () => {
    const t = await newTenant();
    const value = "sk-live-create-canary-7f3a";
    const res = await t.api("POST", "/v1/vault/secrets", { name: "OPENAI_API_KEY", value });
    expect(res.status).toBe(201);
    expect(res.headers.get("content-type")).toMatch(/^application\/json/);
    expect(Object.keys(res.json).sort()).toEqual(SECRET_FIELDS);
    expect(res.json.id).toMatch(/^sec_/);
    expect(res.json.name).toBe("OPENAI_API_KEY");
    expect(res.json.fingerprint).toMatch(FINGERPRINT);
    expect(new Date(res.json.createdAt).toISOString()).toBe(res.json.createdAt);
    expect(res.text).not.toContain(value);
    expect(res.text).not.toMatch(/"value"/);
    expect(res.text).not.toMatch(/ciphertext/i);
  });

  it("refuses a second secret with the same name: 409 secret_exists, the first is unchanged", async () => {
    const t = await newTenant();
    const first = await createSecret(t, "DUP", "first-value");
    const res = expectProblem(
      await t.api("POST", "/v1/vault/secrets", { name: "DUP", value: "second-value" }),
      409,
      "secret_exists",
    );
    expect(res.text).not.toContain("second-value");
    const list = await t.api("GET", "/v1/vault/secrets");
    expect(list.json.secrets).toEqual([first]);
  });

  it("names are case-sensitive: DUP and dup are two secrets", async () => {
    const t = await newTenant();
    await createSecret(t, "DUP", "a-value");
    await createSecret(t, "dup", "b-value");
    const list = await t.api("GET", "/v1/vault/secrets");
    expect(list.json.secrets.map((s: { name: string }) => s.name).sort()).toEqual(["DUP", "dup"]);
  });

  it("lists by name and reads one; neither carries a value (case C4)", async () => {
    const t = await newTenant();
    const empty = await t.api("GET", "/v1/vault/secrets");
    expect(empty.status).toBe(200);
    expect(empty.json).toEqual({ secrets: [] });

    const b = await createSecret(t, "B_KEY", "value-bbbb-canary");
    const a = await createSecret(t, "A_KEY", "value-aaaa-canary");
    const list = await t.api("GET", "/v1/vault/secrets");
    expect(list.status).toBe(200);
    expect(list.json).toEqual({ secrets: [a, b] });
    expect(list.text).not.toContain("canary");

    const one = await t.api("GET", `/v1/vault/secrets/${b.id}`);
    expect(one.status).toBe(200);
    expect(one.json).toEqual(b);
    expect(Object.keys(one.json).sort()).toEqual(SECRET_FIELDS);
    expect(one.text).not.toContain("canary");
  });

  it("same value, same fingerprint; another value, another fingerprint", async () => {
    const t = await newTenant();
    const a = await createSecret(t, "A", "shared-value");
    const b = await createSecret(t, "B", "shared-value");
    const c = await createSecret(t, "C", "other-value");
    expect(a.fingerprint).toBe(b.fingerprint);
    expect(c.fingerprint).not.toBe(a.fingerprint);
  });

  it("an unknown or malformed id reads as 404 not_found", async () => {
    const t = await newTenant();
    expectProblem(await t.api("GET", "/v1/vault/secrets/sec_0123456789abcdef"), 404, "not_found");
    expectProblem(await t.api("GET", "/v1/vault/secrets/nonsense"), 404, "not_found");
    expectProblem(
      await t.api("PUT", "/v1/vault/secrets/sec_0123456789abcdef", { value: "x" }),
      404,
      "not_found",
    );
    expectProblem(await t.api("DELETE", "/v1/vault/secrets/sec_0123456789abcdef"), 404, "not_found");
  });

  it("an id longer than 64 characters → 400 invalid_request", async () => {
    const t = await newTenant();
    expectProblem(await t.api("GET", `/v1/vault/secrets/sec_${"a".repeat(70)}`), 400, "invalid_request");
  });

  it("replaces a value: fingerprint changes, updatedAt moves, id/name/createdAt stay", async () => {
    const t = await newTenant();
    // Its last change a minute back (the row's clock moved, not the test's).
    const before = await backdated(await createSecret(t, "ROTATE_ME", "old-value-canary"), 60_000);
    const res = await t.api("PUT", `/v1/vault/secrets/${before.id}`, { value: "new-value-canary" });
    expect(res.status).toBe(200);
    expect(Object.keys(res.json).sort()).toEqual(SECRET_FIELDS);
    expect(res.text).not.toContain("canary");
    expect(res.json.id).toBe(before.id);
    expect(res.json.name).toBe(before.name);
    expect(res.json.createdAt).toBe(before.createdAt);
    expect(res.json.fingerprint).toMatch(FINGERPRINT);
    expect(res.json.fingerprint).not.toBe(before.fingerprint);
    expect(Date.parse(res.json.updatedAt)).toBeGreaterThan(Date.parse(before.updatedAt));

    const read = await t.api("GET", `/v1/vault/secrets/${before.id}`);
    expect(read.json).toEqual(res.json);
  });

  it("deletes: 204 with no body, then 404 on read, replace and delete", async () => {
    const t = await newTenant();
    const s = await createSecret(t, "GONE", "gone-value");
    const del = await t.api("DELETE", `/v1/vault/secrets/${s.id}`);
    expect(del.status).toBe(204);
    expect(del.text).toBe("");
    expectProblem(await t.api("GET", `/v1/vault/secrets/${s.id}`), 404, "not_found");
    expectProblem(await t.api("PUT", `/v1/vault/secrets/${s.id}`, { value: "again" }), 404, "not_found");
    expectProblem(await t.api("DELETE", `/v1/vault/secrets/${s.id}`), 404, "not_found");
    expect((await t.api("GET", "/v1/vault/secrets")).json).toEqual({ secrets: [] });
    // The name is free again.
    await createSecret(t, "GONE", "gone-value-2");
  });

  it("refuses to delete a secret a rule uses: 409 secret_in_use naming the rule; works once the rule is gone", async () => {
    const t = await newTenant();
    const s = await createSecret(t, "IN_USE", "in-use-value");
    const rule = await t.api("POST", "/v1/vault/rules", {
      host: "api.example.com",
      secret: "IN_USE",
      inject: { scheme: "bearer" },
    });
    expect(rule.status).toBe(201);
    const res = expectProblem(await t.api("DELETE", `/v1/vault/secrets/${s.id}`), 409, "secret_in_use");
    expect(res.json.detail).toContain(rule.json.id);
    expect((await t.api("GET", `/v1/vault/secrets/${s.id}`)).status).toBe(200);

    expect((await t.api("DELETE", `/v1/vault/rules/${rule.json.id}`)).status).toBe(204);
    expect((await t.api("DELETE", `/v1/vault/secrets/${s.id}`)).status).toBe(204);
  });
});

describe("secrets: bad input", () => {
  it.each([
    ["empty", ""],
    ["leading digit", "1KEY"],
    ["leading dot", ".KEY"],
    ["leading hyphen", "-KEY"],
    ["space", "MY KEY"],
    ["slash", "a/b"],
    ["dollar", "KEY$"],
    ["non-ASCII", "KÉY"],
    ["NUL", "KEY\u0000"],
    ["newline", "KEY\n"],
    ["65 characters", `K${"x".repeat(64)}`],
  ])("refuses a name with %s: 400 invalid_request", async (_label, name) => {
    const t = await newTenant();
    const res = expectProblem(
      await t.api("POST", "/v1/vault/secrets", { name, value: "v" }),
      400,
      "invalid_request",
    );
    expect(res.json.detail).toMatch(/^name: /);
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);
  });

  it.each([
    ["underscore start", "_KEY"],
    ["dots and hyphens", "a.b-c_D9"],
    ["64 characters", `K${"x".repeat(63)}`],
  ])("accepts a name with %s", async (_label, name) => {
    const t = await newTenant();
    expect((await t.api("POST", "/v1/vault/secrets", { name, value: "v" })).status).toBe(201);
  });

  it.each([
    ["empty", ""],
    ["over 16 KiB", "x".repeat(16_385)],
    ["CR LF", "sk-abc\r\nX-Injected: 1"],
    ["LF", "sk-abc\nmore"],
    ["CR", "sk-abc\rmore"],
    ["NUL", "sk-abc\u0000more"],
    ["tab", "sk-abc\tmore"],
    ["DEL", "sk-abc\u007fmore"],
    ["lone surrogate", "sk-abc\ud800more"],
  ])("refuses a value that is %s: 400 invalid_request, on create and on replace", async (_label, value) => {
    const t = await newTenant();
    const created = expectProblem(
      await t.api("POST", "/v1/vault/secrets", { name: "BAD_VALUE", value }),
      400,
      "invalid_request",
    );
    // The problem never quotes the value back (case B5).
    if (value.length > 0) expect(created.text).not.toContain("sk-abc");
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);

    const s = await createSecret(t, "GOOD_VALUE", "good-value");
    const replaced = expectProblem(
      await t.api("PUT", `/v1/vault/secrets/${s.id}`, { value }),
      400,
      "invalid_request",
    );
    if (value.length > 0) expect(replaced.text).not.toContain("sk-abc");
    expect((await t.api("GET", `/v1/vault/secrets/${s.id}`)).json.fingerprint).toBe(s.fingerprint);
  });

  it("accepts a value of exactly 16 KiB", async () => {
    const t = await newTenant();
    expect(
      (await t.api("POST", "/v1/vault/secrets", { name: "BIG", value: "x".repeat(16_384) })).status,
    ).toBe(201);
  });

  it("a missing field → 400 invalid_request", async () => {
    const t = await newTenant();
    expectProblem(await t.api("POST", "/v1/vault/secrets", { name: "ONLY_NAME" }), 400, "invalid_request");
    expectProblem(await t.api("POST", "/v1/vault/secrets", { value: "only-value" }), 400, "invalid_request");
    expectProblem(
      await t.api("POST", "/v1/vault/secrets", { name: "N", value: 12345 }),
      400,
      "invalid_request",
    );
    const s = await createSecret(t, "S", "v");
    expectProblem(await t.api("PUT", `/v1/vault/secrets/${s.id}`, {}), 400, "invalid_request");
  });

  it.each([
    ["an array", []],
    ["a string", "just a string"],
    ["null", null],
    ["a number", 42],
  ])("a JSON body that is %s → 400 invalid_request", async (_label, body) => {
    const t = await newTenant();
    expectProblem(
      await call(t.key, "POST", "/v1/vault/secrets", JSON.stringify(body)),
      400,
      "invalid_request",
    );
  });

  it("an unknown field → 400 unknown_field, nothing stored (case C3)", async () => {
    const t = await newTenant();
    const res = expectProblem(
      await t.api("POST", "/v1/vault/secrets", { name: "K", value: "v", userId: "usr_someone_else" }),
      400,
      "unknown_field",
    );
    expect(res.json.detail).toContain("userId");
    expectProblem(
      await t.api("POST", "/v1/vault/secrets", { name: "K", value: "v", environmentId: "env_x" }),
      400,
      "unknown_field",
    );
    const s = await createSecret(t, "K", "v");
    expectProblem(
      await t.api("PUT", `/v1/vault/secrets/${s.id}`, { value: "v2", name: "RENAMED" }),
      400,
      "unknown_field",
    );
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([s]);
  });

  it.each([
    ["truncated", '{"name":"K","value":"v"'],
    ["trailing comma", '{"name":"K","value":"v",}'],
    ["single quotes", "{'name':'K','value':'v'}"],
    ["not JSON at all", "name=K&value=v"],
    ["empty", ""],
  ])("a malformed JSON body (%s) → 400 invalid_json", async (_label, raw) => {
    const t = await newTenant();
    const res = await call(t.key, "POST", "/v1/vault/secrets", raw, { "content-type": "application/json" });
    expectProblem(res, 400, "invalid_json");
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);
  });

  it.each([
    ["no content-type", null],
    ["text/plain", "text/plain"],
    ["form encoding", "application/x-www-form-urlencoded"],
  ])("a JSON body sent with %s → 400 invalid_json, nothing stored", async (_label, type) => {
    const t = await newTenant();
    const headers: Record<string, string> = { authorization: `Bearer ${t.key}` };
    if (type) headers["content-type"] = type;
    const res = await fetchRaw(
      "POST",
      "/v1/vault/secrets",
      headers,
      JSON.stringify({ name: "K", value: "v" }),
    );
    expectProblem(res, 400, "invalid_json");
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);
  });

  it("accepts application/json with a charset parameter", async () => {
    const t = await newTenant();
    const res = await call(t.key, "POST", "/v1/vault/secrets", JSON.stringify({ name: "K", value: "v" }), {
      "content-type": "application/json; charset=utf-8",
    });
    expect(res.status).toBe(201);
  });

  it("a body over 64 KiB → 413 payload_too_large, nothing stored", async () => {
    const t = await newTenant();
    const res = await t.api("POST", "/v1/vault/secrets", { name: "HUGE", value: "x".repeat(70 * 1024) });
    expectProblem(res, 413, "payload_too_large");
    expect((await t.api("GET", "/v1/vault/secrets")).json.secrets).toEqual([]);
  });

  it("a body over 64 KiB without Content-Length (streamed) → 413 payload_too_large", async () => {
    // The Worker stops reading at the limit, so workerd logs "Network connection lost" for the
    // unread rest of this test's request stream; that line is expected.
    const t = await newTenant();
    const bytes = new TextEncoder().encode(JSON.stringify({ name: "HUGE", value: "x".repeat(70 * 1024) }));
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (let at = 0; at < bytes.length; at += 8 * 1024)
          controller.enqueue(bytes.slice(at, at + 8 * 1024));
        controller.close();
      },
    });
    const res = await fetchRaw(
      "POST",
      "/v1/vault/secrets",
      { authorization: `Bearer ${t.key}`, "content-type": "application/json" },
      body,
    );
    expectProblem(res, 413, "payload_too_large");
  });
});

describe("secrets: routes", () => {
  it("an unknown route under /v1 → 404 route_not_found", async () => {
    const t = await newTenant();
    expectProblem(await t.api("GET", "/v1/vault/secret"), 404, "route_not_found");
    expectProblem(await t.api("GET", "/v1/vault/secrets/sec_x/value"), 404, "route_not_found");
    expectProblem(await t.api("POST", "/v1/nope", { a: 1 }), 404, "route_not_found");
  });

  it("a route outside /v1 → 404 route_not_found, without a key; / is the pages' front door", async () => {
    expectProblem(await call(null, "GET", "/nope"), 404, "route_not_found");
    const front = await call(null, "GET", "/");
    expect(front.status).toBe(303);
    expect(front.headers.get("location")).toBe("/manage/vault");
  });

  it("an unknown route under /v1 without a key → 401 unauthorized (routes are not revealed)", async () => {
    expectProblem(await call(null, "GET", "/v1/vault/nope"), 401, "unauthorized");
  });

  it("a known path with a method it does not have → 404 route_not_found", async () => {
    // A wrong method on a known path is simply not a route (no 405 in the closed code set).
    const t = await newTenant();
    expectProblem(await t.api("DELETE", "/v1/vault/secrets"), 404, "route_not_found");
    expectProblem(await t.api("PATCH", "/v1/vault/secrets/sec_x", { value: "v" }), 404, "route_not_found");
  });

  it("every secrets route needs a key: 401 unauthorized", async () => {
    for (const [method, path] of [
      ["GET", "/v1/vault/secrets"],
      ["POST", "/v1/vault/secrets"],
      ["GET", "/v1/vault/secrets/sec_x"],
      ["PUT", "/v1/vault/secrets/sec_x"],
      ["DELETE", "/v1/vault/secrets/sec_x"],
    ] as const) {
      const body = method === "POST" || method === "PUT" ? { name: "K", value: "v" } : undefined;
      expectProblem(await call(null, method, path, body), 401, "unauthorized");
    }
  });
});

/** A request with exactly these headers (call() would add a JSON content-type). */
async function fetchRaw(
  method: string,
  path: string,
  headers: Record<string, string>,
  body: BodyInit,
): Promise<Awaited<ReturnType<typeof call>>> {
  const init: RequestInit & { duplex?: string } = { method, headers, body };
  if (body instanceof ReadableStream) init.duplex = "half";
  const req = new Request(`${BASE}${path}`, init);
  // A string body makes the runtime add text/plain; drop it when the test wants none.
  if (!("content-type" in headers)) req.headers.delete("content-type");
  const res = await exports.default.fetch(req);
  const text = await res.text();
  let json: unknown = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {}
  return { status: res.status, headers: res.headers, text, json };
}
