import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { createApp } from "../../src/app";
import { BASE, newTenant } from "./harness";

// case E7: a database that cannot be reached is a bounded 503 database_unavailable, never a hang
// and never a 500. And a Worker whose configuration is broken says which variable is wrong (503
// config_invalid) without ever echoing a value.

const BOUND_MS = 8_000; // the driver's connect timeout is 5 s; a refused connection is far quicker

interface Answer {
  status: number;
  ms: number;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: tests read arbitrary JSON
  json: any;
  contentType: string | null;
}

/** One request through a fresh app with the given bindings (the real env, overridden). */
async function ask(
  overrides: Record<string, string | undefined>,
  key: string | null,
  method = "GET",
  path = "/v1/vault/secrets",
  body?: unknown,
): Promise<Answer> {
  const headers: Record<string, string> = {};
  if (key) headers.authorization = `Bearer ${key}`;
  if (body !== undefined) headers["content-type"] = "application/json";
  const request = new Request(`${BASE}${path}`, {
    method,
    headers,
    ...(body === undefined ? {} : { body: JSON.stringify(body) }),
  });
  const ctx = createExecutionContext();
  const started = Date.now();
  const res = await createApp().fetch(request, { ...env, ...overrides } as Env, ctx);
  const text = await res.text();
  const ms = Date.now() - started;
  await waitOnExecutionContext(ctx);
  let json: unknown = null;
  try {
    json = JSON.parse(text);
  } catch {}
  return { status: res.status, ms, text, json, contentType: res.headers.get("content-type") };
}

function expectCode(a: Answer, status: number, code: string) {
  expect(`${a.status} ${a.json?.code}`, a.text).toBe(`${status} ${code}`);
  expect(a.contentType).toMatch(/^application\/problem\+json/);
}

describe("database unreachable (case E7)", () => {
  it("a dead database port → 503 database_unavailable, quickly", async () => {
    const t = await newTenant();
    const a = await ask({ DATABASE_WS_PROXY: "127.0.0.1:1" }, t.key);
    expectCode(a, 503, "database_unavailable");
    expect(a.ms).toBeLessThan(BOUND_MS);
    expect(a.json.detail).toMatch(/retry/i);
    // Nothing about the connection leaks: no URL, no credentials, no driver message.
    expect(a.text).not.toContain(env.DATABASE_URL);
    expect(a.text).not.toMatch(/postgres|127\.0\.0\.1|ECONNREFUSED|WebSocket/i);
  });

  it("every kind of route gets the same 503: reads, writes, the preview", async () => {
    const t = await newTenant();
    const dead = { DATABASE_WS_PROXY: "127.0.0.1:1" };
    for (const [method, path, body] of [
      ["GET", "/v1/me", undefined],
      ["POST", "/v1/vault/secrets", { name: "K", value: "canary-value-e7" }],
      ["PUT", "/v1/vault/settings", { default: "block" }],
      ["GET", "/v1/vault/policy-preview", undefined],
    ] as const) {
      const a = await ask(dead, t.key, method, path, body);
      expectCode(a, 503, "database_unavailable");
      expect(a.ms, `${method} ${path}`).toBeLessThan(BOUND_MS);
      expect(a.text).not.toContain("canary-value-e7");
    }
    // The vault is untouched by the failed writes, and the app recovers on the next request.
    const secrets = await t.api("GET", "/v1/vault/secrets");
    expect(secrets.status).toBe(200);
    expect(secrets.json.secrets).toEqual([]);
    expect((await t.api("GET", "/v1/vault/settings")).json).toEqual({ default: "allow", version: 0 });
  });

  it("a database endpoint that accepts and never answers → 503 database_unavailable at the connect timeout, not a hang", async () => {
    // A loopback listener that test/setup/database.ts holds open and never writes to.
    const silent = (inject as (key: string) => unknown)("silentAddress") as string;
    expect(silent).toMatch(/^127\.0\.0\.1:\d+$/);
    const t = await newTenant();
    const a = await ask({ DATABASE_WS_PROXY: silent }, t.key);
    expectCode(a, 503, "database_unavailable");
    expect(a.ms).toBeGreaterThanOrEqual(4_000); // it was the timeout that answered
    expect(a.ms).toBeLessThan(BOUND_MS);
  }, 20_000);

  it("the driver signs in with SCRAM-SHA-256, as on Neon (a role the test cluster allows no other way)", async () => {
    // The suite's own role sends its password in clear over loopback (test/setup/database.ts).
    const scramUrl = (inject as (key: string) => unknown)("databaseScramUrl") as string | null;
    if (!scramUrl) return; // PGlite: no roles, no sign-in
    const t = await newTenant();
    const a = await ask({ DATABASE_URL: scramUrl }, t.key, "GET", "/v1/me");
    expect(a.status, a.text).toBe(200);
    expect(a.json.userId).toBe(t.userId);
    const wrong = await ask(
      { DATABASE_URL: scramUrl.replace(/:[^:@]+@/, ":not-the-password@") },
      t.key,
      "GET",
      "/v1/me",
    );
    expect(wrong.status).toBeGreaterThanOrEqual(500);
    expect(wrong.text).not.toContain("not-the-password");
  });

  it("a request without a key is refused before the database is asked: 401, not 503", async () => {
    const a = await ask({ DATABASE_WS_PROXY: "127.0.0.1:1" }, null);
    expectCode(a, 401, "unauthorized");
  });

  it("the OpenAPI document needs no database", async () => {
    const a = await ask({ DATABASE_WS_PROXY: "127.0.0.1:1" }, null, "GET", "/v1/openapi.json");
    expect(a.status).toBe(200);
  });
});

describe("configuration (config_invalid)", () => {
  const KEK_VALUE = env.VAULT_KEK;
  const URL_VALUE = env.DATABASE_URL;

  it.each([
    ["VAULT_KEK missing", { VAULT_KEK: undefined }, /VAULT_KEK is not set/],
    ["VAULT_KEK empty", { VAULT_KEK: "" }, /VAULT_KEK is empty/],
    ["DATABASE_URL missing", { DATABASE_URL: undefined }, /DATABASE_URL is not set/],
    [
      "DATABASE_URL not postgres",
      { DATABASE_URL: "mysql://admin:hunter2-pass@db.internal/app" },
      /DATABASE_URL must be a postgres/,
    ],
    [
      "DATABASE_WS_PROXY malformed",
      { DATABASE_WS_PROXY: "ws://user:hunter2-pass@proxy" },
      /DATABASE_WS_PROXY must be host:port/,
    ],
    [
      "VAULT_READ_TIMEOUT_SECONDS not a number",
      { VAULT_READ_TIMEOUT_SECONDS: "ten" },
      /VAULT_READ_TIMEOUT_SECONDS must be a whole number/,
    ],
  ])("%s → 503 config_invalid naming the variable, never a value", async (_label, overrides, message) => {
    const t = await newTenant();
    const a = await ask(overrides, t.key);
    expectCode(a, 503, "config_invalid");
    expect(a.json.detail).toMatch(message);
    expect(a.text).not.toContain("hunter2");
    expect(a.text).not.toContain(KEK_VALUE);
    expect(a.text).not.toContain(URL_VALUE);
    for (const part of KEK_VALUE.split(/[,:]/)) if (part.length > 8) expect(a.text).not.toContain(part);
  });

  it("both missing → one problem naming both", async () => {
    const a = await ask({ VAULT_KEK: undefined, DATABASE_URL: undefined }, null);
    expectCode(a, 503, "config_invalid");
    expect(a.json.detail).toContain("DATABASE_URL");
    expect(a.json.detail).toContain("VAULT_KEK");
  });

  const key32 = btoa(String.fromCharCode(...new Uint8Array(32).fill(7)));
  const key16 = btoa(String.fromCharCode(...new Uint8Array(16).fill(9)));
  const secretLooking = "c2VjcmV0LWtleS1tYXRlcmlhbC1kby1ub3QtbGVhaw";
  it.each([
    [
      "a key that is not base64",
      "k1:not*base64*at*all",
      /VAULT_KEK entry 1 of 1 \(key id "k1"\) is not valid base64/,
    ],
    ["a 16-byte key", `k1:${key16}`, /decodes to 16 bytes; expected 32/],
    ["an entry without a key id", secretLooking, /VAULT_KEK entry 1 of 1 is malformed/],
    ["a bad key id", `bad id!:${key32}`, /invalid key id/],
    ["a repeated key id", `k1:${key32},k1:${key32}`, /repeats key id "k1"/],
    ["an empty second entry", `k1:${key32},`, /VAULT_KEK entry 2 of 2 is empty/],
  ])(
    "a VAULT_KEK with %s → 503 config_invalid, no key material in the answer",
    async (_label, kek, message) => {
      const t = await newTenant();
      const a = await ask({ VAULT_KEK: kek }, t.key);
      expectCode(a, 503, "config_invalid");
      expect(a.json.detail).toMatch(/^VAULT_KEK: /);
      expect(a.json.detail).toMatch(message);
      expect(a.text).not.toContain(key32);
      expect(a.text).not.toContain(key16);
      expect(a.text).not.toContain(secretLooking);
      expect(a.text).not.toContain("not*base64");
    },
  );

  it("a broken configuration is refused before the key is checked (no database needed)", async () => {
    const a = await ask({ VAULT_KEK: undefined, DATABASE_WS_PROXY: "127.0.0.1:1" }, null);
    expectCode(a, 503, "config_invalid");
  });
});
