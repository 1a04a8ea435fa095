import { describe, expect, it } from "vitest";
import { newTenant } from "./harness";

// The acceptance walk-through, end to end over the API.
describe("vault flow", () => {
  it("secret, rule, block entry, block default → catch-all; back to allow → default with hosts file", async () => {
    const t = await newTenant();
    const secret = await t.api("POST", "/v1/vault/secrets", {
      name: "OPENROUTER_API_KEY",
      value: "sk-or-canary",
    });
    expect(secret.status).toBe(201);
    const rule = await t.api("POST", "/v1/vault/rules", {
      host: "api.openrouter.ai",
      secret: "OPENROUTER_API_KEY",
      inject: { scheme: "bearer" },
    });
    expect(rule.status).toBe(201);
    expect(rule.json.inject).toEqual({ scheme: "bearer", name: "authorization" });
    const block = await t.api("POST", "/v1/vault/hosts", { pattern: "evil.example", action: "block" });
    expect(block.status).toBe(200);
    expect((await t.api("PUT", "/v1/vault/settings", { default: "block" })).json.default).toBe("block");

    const catchAll = await t.api("GET", "/v1/vault/policy-preview");
    expect(catchAll.status).toBe(200);
    expect(catchAll.json.routing).toEqual({ mode: "catch-all", reasons: ["block_default"] });

    await t.api("PUT", "/v1/vault/settings", { default: "allow" });
    const normal = await t.api("GET", "/v1/vault/policy-preview");
    expect(normal.json.routing).toEqual({ mode: "default", reasons: [] });
    expect(normal.json.hostsFile).toEqual(["api.openrouter.ai", "evil.example"]);
    expect(normal.json.rules).toEqual([
      {
        index: 0,
        host: "api.openrouter.ai",
        secret: "OPENROUTER_API_KEY",
        inject: { scheme: "bearer", name: "authorization" },
        // The secret's name is the placeholder variable by default; no limits.
        placeholderEnv: "OPENROUTER_API_KEY",
        placeholderIn: [],
        methods: null,
        paths: null,
      },
    ]);
    expect(normal.text).not.toContain("sk-or-canary");
  });
});
