import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { call, expectProblem, newTenant } from "./harness";

describe("smoke", () => {
  it("serves the OpenAPI document without a key", async () => {
    const res = await call(null, "GET", "/v1/openapi.json");
    expect(res.status).toBe(200);
    expect(res.json.openapi).toBe("3.1.0");
  });
  it("refuses a missing key", async () => {
    expectProblem(await call(null, "GET", "/v1/me"), 401, "unauthorized");
  });
  // nodejs_compat (for the e2b SDK) would copy every var and secret into process.env, where any
  // dependency could read or log them: wrangler.toml turns that off, and this pins it.
  it("keeps vars and secrets out of process.env", () => {
    expect(typeof env.VAULT_KEK).toBe("string");
    // The Worker's types have no Node globals; nodejs_compat provides `process` all the same.
    const proc = (globalThis as { process?: { env: Record<string, string | undefined> } }).process;
    expect(proc?.env).toBeDefined();
    for (const name of ["VAULT_KEK", "DATABASE_URL", "COMPUTE_BACKEND_SECRET", "COMPUTE_BACKEND"]) {
      expect(proc?.env[name], name).toBeUndefined();
    }
  });
  it("knows who a key belongs to", async () => {
    const t = await newTenant();
    const res = await t.api("GET", "/v1/me");
    expect(res.status).toBe(200);
    expect(res.json).toMatchObject({ userId: t.userId, environmentId: t.environmentId });
  });
});
