import { describe, expect, it } from "vitest";
import { loggedIn } from "./browser";
import { newTenant } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { actionIds, recording, VAULT } from "./pages-fixtures";

// The vault page's models section (src/pages/vault/models.tsx) through the real Worker and
// Postgres: models of each provider added and deleted, the service's refusals, another tenant's
// model out of reach (C1), and the model's key in no page (B5).

describe("vault page: models", { timeout: 60_000 }, () => {
  it("adds models of each provider (defaults shown, openai-compatible needs its URL), deletes; never the key", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const empty = await b.get(VAULT);
    expect(empty.html).toContain("No models yet.");
    expect(empty.html).toContain("key as a secret first.");
    const canary = newCanary("pagemodel");
    await b.submit(`${VAULT}/secrets`, { name: "MODEL_KEY", value: canary });

    const claude = await b.submit(`${VAULT}/models`, {
      name: "claude-eval",
      provider: "anthropic",
      baseUrl: "",
      upstreamModel: "",
      secret: "MODEL_KEY",
    });
    expect(claude.error).toBeNull();
    expect(claude.ok).toBe("Added the model claude-eval (anthropic, https://api.anthropic.com/v1).");
    expect(claude.page.html).toContain("key as x-api-key, with anthropic-version");

    // openai-compatible without a base URL: the service's code, its words; the form kept (no URL).
    const noUrl = await b.submit(`${VAULT}/models`, {
      name: "router",
      provider: "openai-compatible",
      baseUrl: "",
      secret: "MODEL_KEY",
    });
    expect(noUrl.ok).toBeNull();
    expect(noUrl.error).toContain("needs its API");
    expect(noUrl.page.html).toContain('value="router"');
    expect(noUrl.page.html).toMatch(/<option value="openai-compatible" selected/);
    const router = await b.submit(`${VAULT}/models`, {
      name: "router",
      provider: "openai-compatible",
      baseUrl: "https://OpenRouter.ai/api/v1/",
      upstreamModel: "meta-llama/llama-3-8b-instruct",
      secret: "MODEL_KEY",
    });
    expect(router.ok).toBe("Added the model router (openai-compatible, https://openrouter.ai/api/v1).");
    for (const [fields, error] of [
      [{ name: "has space", provider: "openai", secret: "MODEL_KEY" }, "Give the model a name"],
      [{ name: "x", provider: "openrouter", secret: "MODEL_KEY" }, "Pick a provider"],
      [{ name: "x", provider: "openai", secret: "NOPE" }, "No secret named NOPE"],
      [{ name: "router", provider: "openai", secret: "MODEL_KEY" }, "A model named router exists"],
    ] as const) {
      expect((await b.submit(`${VAULT}/models`, fields)).error).toContain(error);
    }
    const models = (await t.api("GET", "/v1/vault/models")).json.models;
    expect(models.map((m: { name: string; provider: string }) => [m.name, m.provider])).toEqual([
      ["claude-eval", "anthropic"],
      ["router", "openai-compatible"],
    ]);

    const [first] = actionIds(router.page.html, "models");
    const gone = await b.submit(`${VAULT}/models/${first}/delete`, {});
    expect(gone.ok).toBe("Deleted the model claude-eval.");
    expect((await t.api("GET", "/v1/vault/models")).json.models).toHaveLength(1);
    expect((await b.submit(`${VAULT}/models/mdl_doesnotexist/delete`, {})).error).toContain(
      "mdl_doesnotexist",
    );

    // C1: another tenant's model id is no model of this session's.
    const other = await newTenant();
    expect(
      (await other.api("POST", "/v1/vault/secrets", { name: "K", value: newCanary("other") })).status,
    ).toBe(201);
    const theirs = await other.api("POST", "/v1/vault/models", {
      name: "m",
      provider: "openai",
      secret: "K",
    });
    expect((await b.submit(`${VAULT}/models/${theirs.json.id}/delete`, {})).error).toBeTruthy();
    expect((await other.api("GET", `/v1/vault/models/${theirs.json.id}`)).status).toBe(200);

    expect(findNeedles("pages", b.log.join("\n"), await leakNeedles(canary))).toEqual([]);
  });
});
