import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { connect } from "node:net";
import Anthropic from "@anthropic-ai/sdk";
import type { ModelBudget, ModelLaneSpec, ModelProvider } from "@benchwright/shared/contract/policy";
import {
  MODEL_LANE_BASE_URL,
  MODEL_LANE_HOST,
  MODEL_LANE_PLACEHOLDER_KEY,
} from "@benchwright/shared/contract/proxy-wire";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import OpenAI from "openai";
import { Agent, fetch as undiciFetch } from "undici";
import { modelLane } from "../../proxy-image/src/proxy/model/lane";
import { createUpstream } from "../../proxy-image/src/proxy/upstream";
import { startAnthropicContractServer } from "../fixtures/anthropic-contract-server";
import type { ContractServer, ContractServerOptions } from "../fixtures/contract-server";
import { startOpenAiContractServer } from "../fixtures/openai-contract-server";
import { createTestCa, type RunningProxy, startProxy, type TestCa, vault } from "./harness";

// The model lane as a work sandbox meets it: the real proxy (its plain-HTTP listener, routed by
// Host like a hosts-file redirect of model.benchwright.invalid), the official SDKs with the
// placeholder key and the base URLs a run's commands get, and the two providers' contract
// servers on real TLS behind it. The key is a canary: it must reach the contract server and
// nothing an SDK hands back.

export const CANARY = `sk-canary-${randomUUID()}`;
export const MODEL = "bench-model";
const HOSTS: Record<ModelProvider, string> = {
  openai: "api.openai.test",
  "openai-compatible": "api.compatible.test",
  anthropic: "api.anthropic.test",
};

export interface LaneSetup {
  proxy: RunningProxy;
  server: ContractServer;
  spec: ModelLaneSpec;
  openai: OpenAI;
  anthropic: Anthropic;
  close(): Promise<void>;
}

let ca: TestCa | null = null;
let cert: { certPem: string; keyPem: string } | null = null;

/** One run's proxy with a declared model of `provider`, in front of that provider's contract server. */
export async function startLane(
  provider: ModelProvider,
  options: { budget?: ModelBudget; server?: Partial<ContractServerOptions>; maxRetries?: number } = {},
): Promise<LaneSetup> {
  ca ??= await createTestCa();
  cert ??= await ca.issue(Object.values(HOSTS));
  const serverOptions = { cert, expectedKey: CANARY, ...options.server };
  const server =
    provider === "anthropic"
      ? await startAnthropicContractServer(serverOptions)
      : await startOpenAiContractServer(serverOptions);
  const host = HOSTS[provider];
  const spec: ModelLaneSpec = {
    name: MODEL,
    provider,
    baseUrl: `https://${host}/v1`,
    upstreamModel: provider === "anthropic" ? "claude-contract-1" : "gpt-contract-1",
    secret: "MODEL_KEY",
    budget: options.budget ?? null,
  };
  const laneUpstream = createUpstream({
    addressPolicy: createAddressPolicy({ allowCidrs: ["127.0.0.1/32"] }),
    extraCaPem: ca.certPem,
    testRoutes: new Map([[host, { address: "127.0.0.1", port: server.port }]]),
  });
  const proxy = await startProxy({
    vault: vault({}),
    secrets: { MODEL_KEY: CANARY },
    model: spec,
    modelLane: modelLane({ upstream: laneUpstream, log: () => {} }),
  });
  const { openai, anthropic, close } = sdkClients(proxy, options.maxRetries ?? 2);
  return {
    proxy,
    server,
    spec,
    openai,
    anthropic,
    close: async () => {
      await close();
      await proxy.close();
      await laneUpstream.closeAll();
      await server.stop();
    },
  };
}

/** The provider's usage as the lane records it (input includes cached; Anthropic's cache writes too). */
export { ANTHROPIC_USAGE } from "../fixtures/anthropic-contract-server";
export { OPENAI_USAGE } from "../fixtures/openai-contract-server";

export const WEATHER_TOOL = {
  name: "get_weather",
  description: "The weather in a city.",
  parameters: {
    type: "object" as const,
    properties: { location: { type: "string" }, unit: { type: "string", enum: ["celsius", "fahrenheit"] } },
    required: ["location"],
  },
};
export const TOOL_RESULT = "18 degrees and sunny";

/** The two SDKs as a run's commands would make them, dialling the proxy for the lane's host. */
export function sdkClients(proxy: RunningProxy, maxRetries = 2) {
  // The sandbox's hosts file sends model.benchwright.invalid to the proxy: so does this dialer.
  const dispatcher = new Agent({
    connect: (_opts, callback) => {
      const socket = connect(proxy.httpPort, "127.0.0.1");
      socket.once("connect", () => callback(null, socket));
      socket.once("error", (e) => callback(e, null));
    },
  });
  const sdkFetch = ((url: string, init?: RequestInit) =>
    undiciFetch(url, { ...(init as object), dispatcher })) as unknown as typeof fetch;
  // What a run's commands get: OPENAI_BASE_URL / ANTHROPIC_BASE_URL and the placeholder keys.
  const openai = new OpenAI({
    baseURL: MODEL_LANE_BASE_URL,
    apiKey: MODEL_LANE_PLACEHOLDER_KEY,
    fetch: sdkFetch,
    maxRetries,
  });
  const anthropic = new Anthropic({
    baseURL: `http://${MODEL_LANE_HOST}`,
    apiKey: MODEL_LANE_PLACEHOLDER_KEY,
    fetch: sdkFetch,
    maxRetries,
  });
  return { openai, anthropic, close: () => dispatcher.close() };
}

/**
 * Runs the bundled SDK client (model-sdk-bundle.ts) as plain node and returns the JSON line it
 * printed, which must not hold the key. A sandbox reaches the lane's host through its hosts
 * file; this process has node's own proxy support instead (NODE_USE_ENV_PROXY), which tunnels
 * every request with CONNECT, and the proxy's explicit port tunnels to 443 only: so here the
 * lane is reached over https (the run CA trusted, as in a sandbox), the base URLs otherwise
 * those a run's commands get.
 */
export function runSdkClient(bundle: string, proxy: RunningProxy): Promise<Record<string, unknown>> {
  const https = (url: string) => url.replace(/^http:/, "https:");
  const env = {
    PATH: process.env.PATH ?? "",
    OPENAI_BASE_URL: https(MODEL_LANE_BASE_URL),
    OPENAI_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    ANTHROPIC_BASE_URL: https(`http://${MODEL_LANE_HOST}`),
    ANTHROPIC_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    HTTPS_PROXY: `http://127.0.0.1:${proxy.explicitPort}`,
    NODE_USE_ENV_PROXY: "1",
    NODE_EXTRA_CA_CERTS: proxy.caFile,
  };
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [bundle, MODEL], { env, timeout: 30_000 }, (error, stdout, stderr) => {
      if (error) return reject(new Error(`${error.message}\n${stderr}`));
      if (`${stdout}${stderr}`.includes(CANARY)) return reject(new Error("the SDK client saw the key"));
      resolve(JSON.parse(stdout.trim().split("\n").at(-1) as string));
    });
  });
}
