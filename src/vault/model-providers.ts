import type { ModelProvider } from "../contract/policy";

// The control plane's side of each model provider (the proxy's side, how a call authenticates
// and which format it speaks, is proxy-image/src/proxy/model/providers.ts): where its API is when the
// vault model names no base URL, and how to say to a person what the lane does with the key.
// One row per provider, so a new provider is a row here and one there.

export interface ProviderFacts {
  /** The API base used when the model gives none; null: the model must give one. */
  defaultBaseUrl: string | null;
  /** How the lane sends the model's secret, for people (the vault page, the docs). */
  auth: string;
}

export const PROVIDERS: Readonly<Record<ModelProvider, ProviderFacts>> = {
  openai: { defaultBaseUrl: "https://api.openai.com/v1", auth: "Authorization: Bearer" },
  // OpenRouter, vLLM, a gateway...: nothing to default to.
  "openai-compatible": { defaultBaseUrl: null, auth: "Authorization: Bearer" },
  anthropic: {
    defaultBaseUrl: "https://api.anthropic.com/v1",
    auth: "x-api-key, with anthropic-version",
  },
};
