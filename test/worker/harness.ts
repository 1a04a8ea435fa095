import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { provisionApiKey } from "../../src/auth/provision";
import { loadConfig } from "../../src/config";
import { randomId } from "../../src/crypto/api-keys";
import { openDb } from "../../src/db/client";
import { vaultSecrets } from "../../src/db/schema";
import worker from "../../src/index";

// One harness for every route test: each test makes its own tenant (user, environment, key)
// and talks to the real Worker entrypoint, which talks to the real Postgres via the Neon driver.

export const BASE = "http://boundary.test";

export interface ApiResponse {
  status: number;
  headers: Headers;
  text: string;
  // biome-ignore lint/suspicious/noExplicitAny: tests read arbitrary JSON
  json: any;
}

export function call(
  key: string | null,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<ApiResponse> {
  return callWith(env, key, method, path, body, headers);
}

/**
 * `call` for a sweep that sends more requests with one key than the per-key rate limit admits in
 * a period (wrangler.toml [[ratelimits]]: 300 in 10 s): a 429 did nothing, so it waits the
 * Retry-After the answer names and asks again. The limit itself has its own test (case K4).
 */
export async function callPaced(
  key: string,
  method: string,
  path: string,
  body?: unknown,
): Promise<ApiResponse> {
  for (;;) {
    const res = await call(key, method, path, body);
    if (res.status !== 429 || res.json?.code !== "rate_limited") return res;
    const seconds = Number(res.headers.get("retry-after")) || 1;
    await new Promise((resolve) => setTimeout(resolve, seconds * 1000));
  }
}

/** `call` with other bindings (a test that configures something the test env lacks). */
export async function callWith(
  bindings: Env,
  key: string | null,
  method: string,
  path: string,
  body?: unknown,
  headers: Record<string, string> = {},
): Promise<ApiResponse> {
  const init: RequestInit = { method, headers: { ...headers } };
  if (key) (init.headers as Record<string, string>).authorization = `Bearer ${key}`;
  if (body instanceof Uint8Array || body instanceof ReadableStream) {
    // Bytes go as they are (an upload); the caller names their content-type.
    init.body = body;
  } else if (body !== undefined) {
    init.body = typeof body === "string" ? body : JSON.stringify(body);
    (init.headers as Record<string, string>)["content-type"] ??= "application/json";
  }
  // The Worker's own default export with the test bindings. Not `exports.default.fetch`: that
  // loopback path slows down with every call in a file (7 ms → 80 ms per request after ~600).
  const ctx = createExecutionContext();
  const res = await worker.fetch(new Request(`${BASE}${path}`, init), bindings, ctx);
  const text = await res.text();
  await waitOnExecutionContext(ctx);
  let json: unknown = null;
  try {
    json = text ? JSON.parse(text) : null;
  } catch {}
  return { status: res.status, headers: res.headers, text, json };
}

export interface Tenant {
  key: string;
  /** The key's id (api_keys.id): what DELETE /v1/api-keys/{id} names. */
  keyId: string;
  userId: string;
  environmentId: string;
  api: (method: string, path: string, body?: unknown) => Promise<ApiResponse>;
}

/** The tenant as a service function's caller, the way an API key of theirs would make it. */
export const principal = (t: Tenant) => ({
  userId: t.userId,
  environmentId: t.environmentId,
  keyId: "key_fixture",
});

export function withDb<T>(fn: (db: ReturnType<typeof openDb>["db"]) => Promise<T>): Promise<T> {
  const { db, close } = openDb(loadConfig(env));
  return fn(db).finally(close);
}

export async function newTenant(): Promise<Tenant> {
  const made = await withDb((db) => provisionApiKey(db, { email: `${randomId("t_")}@tenants.test` }));
  return {
    key: made.key,
    keyId: made.keyId,
    userId: made.userId,
    environmentId: made.environmentId,
    api: (method, path, body) => call(made.key, method, path, body),
  };
}

/** Asserts a problem+json response with the exact code; returns it for further checks. */
export function expectProblem(res: ApiResponse, status: number, code: string): ApiResponse {
  if (res.status !== status || res.json?.code !== code) {
    throw new Error(`expected ${status} ${code}, got ${res.status} ${res.text}`);
  }
  if (!res.headers.get("content-type")?.startsWith("application/problem+json")) {
    throw new Error(`expected application/problem+json, got ${res.headers.get("content-type")}`);
  }
  return res;
}

/**
 * A tenant whose only secret (used by a rule) no longer decrypts: its runs retry, then stop (E1).
 * `missing_key`: sealed under a key id the ring does not have (a key retired too early);
 * `tampered`: the real ciphertext with one byte of it changed (GCM's tag no longer matches).
 */
export async function tenantWithUnreadableVault(
  value: string,
  how: "missing_key" | "tampered" = "missing_key",
): Promise<Tenant> {
  const t = await newTenant();
  await t.api("POST", "/v1/vault/secrets", { name: "KEY", value });
  await t.api("POST", "/v1/vault/rules", {
    host: "api.example.com",
    secret: "KEY",
    inject: { scheme: "bearer" },
  });
  await withDb(async (db) => {
    const [row] = await db.select().from(vaultSecrets).where(eq(vaultSecrets.environmentId, t.environmentId));
    if (!row) throw new Error("no secret row");
    let ciphertext = "v1.gone.AAAA.AAAA.AAAA.AAAA";
    if (how === "tampered") {
      const parts = row.ciphertext.split(".");
      const i = parts.length - 1; // the sealed value (v1.keyId.wrapIv.wrappedKey.iv.ciphertext)
      const field = parts[i] as string;
      const at = Math.floor(field.length / 2);
      parts[i] = field.slice(0, at) + (field[at] === "A" ? "B" : "A") + field.slice(at + 1);
      ciphertext = parts.join(".");
      if (ciphertext === row.ciphertext) throw new Error("tampering changed nothing");
    }
    await db.update(vaultSecrets).set({ ciphertext }).where(eq(vaultSecrets.environmentId, t.environmentId));
  });
  return t;
}
