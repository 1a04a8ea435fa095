import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { bundleModelSdkClient } from "../fixtures/model-sdk-bundle";
import { type LaneSetup, runSdkClient, startLane } from "./model-sdk";

// The SDKs as a benchmark ships them (one bundled file, plain node, no node_modules) and makes
// them (`new OpenAI()`, `new Anthropic()`: configured by the environment a run's commands get),
// in a process of their own, against the real proxy and the contract servers: the step before
// running the same bundle in a real sandbox (runSdkClient says how the process reaches the lane).

let bundle: string;
beforeAll(async () => {
  bundle = await bundleModelSdkClient();
}, 60_000);

for (const provider of ["openai", "anthropic"] as const) {
  describe(`a bundled benchmark's SDK calls, ${provider} provider`, () => {
    let lane: LaneSetup;
    beforeAll(async () => {
      lane = await startLane(provider);
    });
    afterAll(() => lane.close());

    it("new OpenAI() and new Anthropic() from the environment: plain, streamed, tools, another model refused", async () => {
      const out = await runSdkClient(bundle, lane.proxy);
      const toolCall = { name: "get_weather", arguments: { location: "Paris", unit: "celsius" } };
      expect(out.openai).toEqual({
        plain: "Hello world",
        streamed: "Hello world",
        toolCall,
        final: "The tool said: sunny",
        responses: "Hello world",
        other: { class: "BadRequestError", status: 400, code: "model_not_declared" },
      });
      expect(out.anthropic).toEqual({
        plain: "Hello world",
        streamed: "Hello world",
        toolCall,
        final: "The tool said: sunny",
        other: { class: "BadRequestError", status: 400, type: "invalid_request_error" },
      });
      expect(lane.server.calls.every((c) => c.keyMatches && !c.placeholderSent)).toBe(true);
      expect(lane.server.calls).toHaveLength(9);
    });
  });
}
