import { copyFileSync, mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packFolder } from "../../cli/src/pack";
import { bundleModelSdkClient } from "../fixtures/model-sdk-bundle";
import { type E2e, lastJson, newUser, SKIP_REASON, startE2e, waitForEnd } from "./harness";

// Issue 22 end to end: the official SDKs inside a real local sandbox, unmodified, configured
// only by the environment a run's commands get (OPENAI_BASE_URL / ANTHROPIC_BASE_URL and the
// placeholder keys), against the declared model for either provider: the benchmark ships them
// as one bundled file (test/fixtures/model-sdk-client.ts, packed with both SDKs) in its bundle,
// and runs it with the sandbox's node. The suite's upstream (scripts/demo/upstream-server.mjs)
// answers both formats; the proxy translates where the caller's format is not the provider's.
// The vault key is the canary: it reaches the upstream and nothing of the run.

describe.skipIf(SKIP_REASON !== null)("the official SDKs in a real sandbox, both providers", () => {
  let e: E2e;
  let bundleDir: string;
  beforeAll(async () => {
    bundleDir = mkdtempSync(join(tmpdir(), "bw-e2e-model-sdk-"));
    copyFileSync(await bundleModelSdkClient(), join(bundleDir, "model-sdk-client.cjs"));
    e = await startE2e({ name: "bwt-e2m", index: 83 });
  }, 120_000);
  afterAll(async () => {
    await e?.stop();
  });

  for (const provider of ["openai", "anthropic"] as const) {
    it(`new OpenAI() and new Anthropic() reach the ${provider} provider: plain, streamed, tools, another model refused`, async () => {
      const api = await newUser(e.stack.apiUrl);
      const from = e.upstream.seen.length;
      const secret = await api.call("POST", "/v1/vault/secrets", { name: "MODEL_KEY", value: e.canary });
      expect(secret.status, secret.text).toBe(201);
      const model = await api.call("POST", "/v1/vault/models", {
        name: "eval-model",
        provider,
        base_url: "https://api.demo.test/v1",
        secret: "MODEL_KEY",
        upstream_model: "demo-1",
      });
      expect(model.status, model.text).toBeLessThan(300);
      const packed = await packFolder(bundleDir);
      const upload = await fetch(`${e.stack.apiUrl}/v1/bundles`, {
        method: "POST",
        headers: { authorization: `Bearer ${api.key}`, "content-type": "application/gzip" },
        body: packed.archive,
      });
      expect(upload.status, await upload.clone().text()).toBeLessThan(300);
      const launched = await api.call("POST", "/v1/runs", {
        model: "eval-model",
        model_budget: { calls: 20 },
        bundle: packed.sha256,
        commands: ["node model-sdk-client.cjs eval-model"],
      });
      expect(launched.status, launched.text).toBe(202);
      const run = await waitForEnd(api, launched.json.id);
      expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
        status: "finished",
        reason: "completed",
      });

      const out = lastJson(run);
      expect(out.openaiBase).toBe("http://model.benchwright.invalid/v1");
      expect(out.anthropicBase).toBe("http://model.benchwright.invalid");
      const toolCall = { name: "get_weather", arguments: { location: "Paris", unit: "celsius" } };
      const answers = {
        plain: "Hello world",
        streamed: "Hello world",
        toolCall,
        final: "The tool said: sunny",
      };
      expect(out.openai, JSON.stringify(out)).toEqual({
        ...answers,
        responses: "Hello world",
        other: { class: "BadRequestError", status: 400, code: "model_not_declared" },
      });
      expect(out.anthropic, JSON.stringify(out)).toEqual({
        ...answers,
        other: { class: "BadRequestError", status: 400, type: "invalid_request_error" },
      });
      // The provider got the vault key from the proxy, in its own way; the sandbox never had it.
      const calls = e.upstream.seen
        .slice(from)
        .filter((s) => s.endpoint !== undefined && s.model === "demo-1");
      // Two refused calls (another model) never left the proxy: 11 made, 9 reached the provider.
      expect(calls).toHaveLength(9);
      expect(calls.every((c) => c.keyMatches === true)).toBe(true);
      if (provider === "anthropic") expect(calls.every((c) => c.endpoint === "messages")).toBe(true);
      expect(JSON.stringify(run)).not.toContain(e.canary);
      // Every call is a row, the refused ones too (J1), and the spend is within the budget.
      const rows = await api.call("GET", `/v1/runs/${launched.json.id}/model-calls`);
      expect(rows.status, rows.text).toBe(200);
      expect(rows.text).not.toContain(e.canary);
    }, 180_000);
  }
});
