import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MODEL_LANE_PLACEHOLDER_KEY } from "@benchwright/shared/contract/proxy-wire";
import { build } from "esbuild";
import { expect, it } from "vitest";
import { until } from "../until";
import { describeE2e, type E2eOptions, lastJson, newUser, stdoutOf, waitForEnd } from "./harness";

// The declared model's translating lane with the official SDKs, inside real local sandboxes:
// model-sdk-client.ts (the `openai` and `@anthropic-ai/sdk` packages, bundled into one file by
// esbuild) is the run's bundle; its command constructs `new OpenAI()` and `new Anthropic()` with
// no arguments. One run declares a model whose provider is `openai`, another one whose provider
// is `anthropic`, so each SDK meets each provider: the four combinations, with streaming and tool
// use. The provider is the demo upstream (scripts/demo/upstream-server.mjs), which speaks both
// formats and expects the vault's canary as its key.

// What the demo upstream answers (scripts/demo/upstream-server.mjs): its text, tool arguments,
// the prefix it quotes a tool result with, and its usage per format it speaks.
const TEXT = "Hello world";
const TOOL_ARGS = { location: "Paris", unit: "celsius" };
const TOOL_RESULT = "The tool said: sunny, 21 C";
const UPSTREAM_USAGE: Record<string, { input: number; output: number }> = {
  "chat.completions": { input: 12, output: 5 },
  responses: { input: 9, output: 4 },
  messages: { input: 10, output: 6 },
};
// The client's upstream calls before it spends the budget: 6 through the OpenAI SDK (plain,
// stream, tool call, tool answer, streamed tool call, responses) and 5 through Anthropic's.
const CALLS_BEFORE_BUDGET = 11;
const BUDGET_CALLS = 14;

let dir: string;
let bundle: Buffer;

async function start(): Promise<E2eOptions> {
  dir = mkdtempSync(join(tmpdir(), "bw-model-sdks-"));
  // One file with both SDKs in it: the sandbox has node but no npm registry to install from.
  await build({
    entryPoints: [join(import.meta.dirname, "model-sdk-client.ts")],
    bundle: true,
    platform: "node",
    target: "node20",
    format: "cjs",
    outfile: join(dir, "bundle", "model-sdk-client.cjs"),
    logLevel: "warning",
  });
  execFileSync("tar", ["-czf", join(dir, "bundle.tar.gz"), "-C", join(dir, "bundle"), "."]);
  bundle = readFileSync(join(dir, "bundle.tar.gz"));
  return { name: "bwt-e2m", index: 85 };
}

const after = () => rmSync(dir, { recursive: true, force: true });

describeE2e(
  "the official SDKs in a real sandbox, through the translating lane",
  { start, after, timeout: 120_000 },
  (e) => {
    for (const provider of ["openai", "anthropic"] as const) {
      // case J2
      it(`case J2: both SDKs against a ${provider} provider, plain, streamed, with tools; the key stays in the proxy`, async () => {
        const api = await newUser(e.stack.apiUrl);
        expect(
          (await api.call("POST", "/v1/vault/secrets", { name: "MODEL_KEY", value: e.canary })).status,
        ).toBe(201);
        const model = await api.call("POST", "/v1/vault/models", {
          name: "eval-model",
          provider,
          baseUrl: "https://api.demo.test/v1",
          upstreamModel: "demo-1",
          secret: "MODEL_KEY",
        });
        expect(model.status, model.text).toBe(201);
        const uploaded = await fetch(`${e.stack.apiUrl}/v1/bundles`, {
          method: "POST",
          headers: { authorization: `Bearer ${api.key}`, "content-type": "application/gzip" },
          body: new Uint8Array(bundle),
        });
        const sha = ((await uploaded.json()) as { sha256: string }).sha256;
        expect(uploaded.status).toBeLessThan(300);

        const launched = await api.call("POST", "/v1/runs", {
          model: "eval-model",
          modelBudget: { calls: BUDGET_CALLS },
          bundle: sha,
          commands: ["node model-sdk-client.cjs eval-model"],
        });
        expect(launched.status, launched.text).toBe(202);
        const run = await waitForEnd(api, launched.json.id, 120_000);
        expect(run, JSON.stringify(run.trace, null, 1).slice(0, 6000)).toMatchObject({
          status: "finished",
          reason: "completed",
        });
        const out = lastJson(run);
        expect(out.failed).toBeUndefined();

        // Placeholders only: the SDKs found the lane through the environment alone.
        expect(out.env).toEqual({
          openaiBase: "http://model.benchwright.invalid/v1",
          anthropicBase: "http://model.benchwright.invalid",
          openaiKey: MODEL_LANE_PLACEHOLDER_KEY,
          anthropicKey: MODEL_LANE_PLACEHOLDER_KEY,
        });

        // The OpenAI SDK, whatever the provider speaks.
        expect(out.openai.plain).toMatchObject({ text: TEXT, finish: "stop" });
        expect(out.openai.stream.text).toBe(TEXT);
        expect(out.openai.stream.usage?.prompt_tokens).toBeGreaterThan(0);
        expect(out.openai.tool).toMatchObject({ finish: "tool_calls", name: "get_weather", args: TOOL_ARGS });
        expect(out.openai.tool.answer).toContain(TOOL_RESULT);
        expect(out.openai.streamTool).toEqual({ name: "get_weather", args: TOOL_ARGS });
        expect(out.openai.responses).toMatchObject({ text: TEXT, status: "completed" });
        // case J1: another model name is refused in the caller's format, before any upstream call.
        expect(out.openai.other).toEqual({ status: 400, error: "BadRequestError" });

        // Anthropic's SDK, whatever the provider speaks.
        expect(out.anthropic.plain).toMatchObject({ text: TEXT, stop: "end_turn" });
        expect(out.anthropic.stream).toMatchObject({ text: TEXT, stop: "end_turn" });
        expect(out.anthropic.stream.usage.output_tokens).toBeGreaterThan(0);
        expect(out.anthropic.tool).toMatchObject({ stop: "tool_use", name: "get_weather", args: TOOL_ARGS });
        expect(out.anthropic.tool.answer).toContain(TOOL_RESULT);
        expect(out.anthropic.streamTool).toEqual({ name: "get_weather", args: TOOL_ARGS });
        expect(out.anthropic.other).toEqual({ status: 400, error: "BadRequestError" });

        // case J3: refused at the budget, in the caller's format, not retried by the SDK.
        expect(out.budget).toEqual({
          after: BUDGET_CALLS - CALLS_BEFORE_BUDGET,
          status: 429,
          error: "RateLimitError",
        });

        // Every call reached the provider in the provider's own format, with the vault's key.
        const spoken = provider === "openai" ? ["chat.completions", "responses"] : ["messages"];
        // This run's calls are the last ones the upstream saw (the runs go one after the other).
        const mine = e.upstream.seen.filter((s) => s.model === "demo-1").slice(-BUDGET_CALLS);
        expect(mine.every((s) => spoken.includes(s.endpoint as string) && s.keyMatches === true)).toBe(true);

        // The spend recorded is what the provider reported, call by call (J3).
        const use = await until(
          "the model calls' audit rows",
          async () => {
            const res = await api.call("GET", `/v1/runs/${run.id}/model-calls?limit=100`);
            return res.json?.totals?.calls >= BUDGET_CALLS + 3 ? res.json : null;
          },
          20_000,
        );
        const sent = use.calls.filter((c: { refused: string | null }) => c.refused === null);
        expect(sent).toHaveLength(BUDGET_CALLS);
        const refused = use.calls.map((c: { refused: string | null }) => c.refused).filter(Boolean);
        expect(refused.sort()).toEqual(["model_not_declared", "model_not_declared", "over_budget"]);
        const upstreamEndpoint = (callerEndpoint: string) =>
          provider === "anthropic"
            ? "messages"
            : callerEndpoint === "messages"
              ? "chat.completions"
              : callerEndpoint;
        for (const c of sent) {
          const reported = UPSTREAM_USAGE[upstreamEndpoint(c.endpoint)];
          expect({ input: c.inputTokens, output: c.outputTokens }, JSON.stringify(c)).toEqual(reported);
        }
        expect(use.budget.calls).toEqual({ used: BUDGET_CALLS, limit: BUDGET_CALLS });
        expect(use.totals.inputTokens).toBe(
          sent.reduce((n: number, c: { inputTokens: number }) => n + c.inputTokens, 0),
        );

        // case J2: the canary (the provider key) never reached the sandbox's output.
        expect(stdoutOf(run)).not.toContain(e.canary);
        expect(JSON.stringify(run)).not.toContain(e.canary);
      }, 180_000);
    }
  },
);
