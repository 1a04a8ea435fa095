import { execFile } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  MODEL_LANE_BASE_URL,
  MODEL_LANE_HOST,
  MODEL_LANE_PLACEHOLDER_KEY,
} from "../../src/contract/proxy-wire";
import { bundleModelSdkClient } from "../fixtures/model-sdk-bundle";

const https = (url: string) => url.replace(/^http:/, "https:");

import { CANARY, type LaneSetup, MODEL, startLane } from "./model-sdk";

// The SDKs as a benchmark ships them (one bundled file, plain node, no node_modules) and makes
// them (`new OpenAI()`, `new Anthropic()`: configured by the environment a run's commands get),
// in a process of their own, against the real proxy: the step before running the same bundle in
// a real sandbox. A sandbox reaches the lane's host through its hosts file; this process has
// node's own proxy support instead (NODE_USE_ENV_PROXY), which tunnels every request with
// CONNECT, and the proxy's explicit port tunnels to 443 only: so here the lane is reached over
// https (the run CA trusted, as in a sandbox), the base URLs otherwise those a run's commands get.

let bundle: string;
beforeAll(async () => {
  bundle = await bundleModelSdkClient();
}, 60_000);

function runClient(lane: LaneSetup): Promise<Record<string, unknown>> {
  const env = {
    PATH: process.env.PATH ?? "",
    OPENAI_BASE_URL: https(MODEL_LANE_BASE_URL),
    OPENAI_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    ANTHROPIC_BASE_URL: https(`http://${MODEL_LANE_HOST}`),
    ANTHROPIC_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    HTTPS_PROXY: `http://127.0.0.1:${lane.proxy.explicitPort}`,
    NODE_USE_ENV_PROXY: "1",
    NODE_EXTRA_CA_CERTS: lane.proxy.caFile,
  };
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [bundle, MODEL], { env, timeout: 30_000 }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`${error.message}\n${stderr}`));
      expect(`${stdout}${stderr}`).not.toContain(CANARY);
      resolve(JSON.parse(stdout.trim().split("\n").at(-1) as string));
    });
  });
}

for (const provider of ["openai", "anthropic"] as const) {
  describe(`a bundled benchmark's SDK calls, ${provider} provider`, () => {
    let lane: LaneSetup;
    beforeAll(async () => {
      lane = await startLane(provider);
    });
    afterAll(() => lane.close());

    it("new OpenAI() and new Anthropic() from the environment: plain, streamed, tools, another model refused", async () => {
      const out = await runClient(lane);
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
