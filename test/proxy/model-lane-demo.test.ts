import type { ModelProvider } from "@benchwright/shared/contract/policy";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { modelLane } from "../../proxy-image/src/proxy/model/lane";
import { createUpstream } from "../../proxy-image/src/proxy/upstream";
import { startLoopbackUpstream } from "../../scripts/lib/demo-upstream";
import { bundleModelSdkClient } from "../fixtures/model-sdk-bundle";
import { type RunningProxy, startProxy, vault } from "./harness";
import { CANARY, MODEL, runSdkClient, sdkClients, WEATHER_TOOL } from "./model-sdk";

// The demo's and the end-to-end suite's upstream (scripts/demo/upstream-server.mjs, plain node)
// answers the SDKs through the lane for both providers, tools included, so a run in a real
// sandbox can use either SDK against it. The contract servers check requests; this one only
// answers them alike.

const HOSTS: Record<string, string> = { openai: "api.demo.test", anthropic: "api.anthropic.demo.test" };
let upstream: Awaited<ReturnType<typeof startLoopbackUpstream>>;

beforeAll(async () => {
  upstream = await startLoopbackUpstream({ hosts: Object.values(HOSTS), expectedKey: CANARY });
});
afterAll(() => upstream.stop());

for (const provider of ["openai", "anthropic"] as const satisfies ModelProvider[]) {
  describe(`the demo upstream as the ${provider} provider`, () => {
    let proxy: RunningProxy;
    let sdk: ReturnType<typeof sdkClients>;
    const laneUpstream = () =>
      createUpstream({
        addressPolicy: createAddressPolicy({ allowCidrs: ["127.0.0.1/32"] }),
        extraCaPem: upstream.caPem,
        testRoutes: new Map([
          [HOSTS[provider] as string, { address: "127.0.0.1", port: upstream.httpsPort }],
        ]),
      });
    beforeAll(async () => {
      proxy = await startProxy({
        vault: vault({}),
        secrets: { MODEL_KEY: CANARY },
        model: {
          name: MODEL,
          provider,
          baseUrl: `https://${HOSTS[provider]}/v1`,
          upstreamModel: "demo-1",
          secret: "MODEL_KEY",
          budget: null,
        },
        modelLane: modelLane({ upstream: laneUpstream(), log: () => {} }),
      });
      sdk = sdkClients(proxy);
    });
    afterAll(async () => {
      await sdk.close();
      await proxy.close();
    });

    it("both SDKs: plain, streamed, and a tool round trip", async () => {
      const from = upstream.seen.length;
      const hello = [{ role: "user" as const, content: "Say hello." }];
      const chat = await sdk.openai.chat.completions.create({ model: MODEL, messages: hello });
      expect(chat.choices[0]?.message.content).toBe("Hello world");
      const streamed = await sdk.openai.chat.completions
        .stream({ model: MODEL, messages: hello })
        .finalChatCompletion();
      expect(streamed.choices[0]?.message.content).toBe("Hello world");
      const msg = await sdk.anthropic.messages
        .stream({ model: MODEL, max_tokens: 64, messages: hello })
        .finalMessage();
      expect(msg.content).toEqual([expect.objectContaining({ type: "text", text: "Hello world" })]);
      const tools = [{ name: WEATHER_TOOL.name, input_schema: WEATHER_TOOL.parameters }];
      const ask = [{ role: "user" as const, content: "Weather?" }];
      const use = await sdk.anthropic.messages.create({ model: MODEL, max_tokens: 64, messages: ask, tools });
      const block = use.content.find((b) => b.type === "tool_use");
      if (block?.type !== "tool_use") throw new Error("no tool_use");
      const final = await sdk.anthropic.messages.create({
        model: MODEL,
        max_tokens: 64,
        tools,
        messages: [
          ...ask,
          { role: "assistant", content: use.content },
          { role: "user", content: [{ type: "tool_result", tool_use_id: block.id, content: "sunny" }] },
        ],
      });
      expect(final.content).toEqual([expect.objectContaining({ text: "The tool said: sunny" })]);
      const calls = upstream.seen.slice(from).filter((s) => s.endpoint !== undefined);
      expect(calls).toHaveLength(5);
      expect(calls.every((c) => c.keyMatches === true && c.model === "demo-1")).toBe(true);
      expect(JSON.stringify([chat, streamed, msg, use, final])).not.toContain(CANARY);
    });

    it("the bundled SDK client a run would ship: every call answered", async () => {
      const out = await runSdkClient(await bundleModelSdkClient(), proxy);
      const toolCall = { name: "get_weather", arguments: { location: "Paris", unit: "celsius" } };
      const answers = {
        plain: "Hello world",
        streamed: "Hello world",
        toolCall,
        final: "The tool said: sunny",
      };
      expect(out.openai).toEqual({
        ...answers,
        responses: "Hello world",
        other: { class: "BadRequestError", status: 400, code: "model_not_declared" },
      });
      expect(out.anthropic).toEqual({
        ...answers,
        other: { class: "BadRequestError", status: 400, type: "invalid_request_error" },
      });
    }, 60_000);
  });
}
