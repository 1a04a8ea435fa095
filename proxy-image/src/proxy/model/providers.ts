import type { ModelProvider } from "@benchwright/shared/contract/policy";
import type { ModelEndpoint } from "@benchwright/shared/contract/proxy-wire";
import type { WireFormat } from "./translate";

// One row per provider the model lane can call: everything that differs between them is data
// here, so the lane has no provider branches of its own and a new provider is a new row. The
// wire formats themselves (and the translation between them) live in translate.ts.

/** The format each endpoint the lane serves speaks (the caller's side). */
export const CALLER_FORMAT: Record<ModelEndpoint, WireFormat> = {
  "chat.completions": "openai-chat",
  responses: "openai-responses",
  messages: "anthropic-messages",
};

export interface ProviderEntry {
  /**
   * The formats the provider serves natively, first the one a caller in another format is
   * translated to. A caller speaking one of these is passed through untouched.
   */
  formats: readonly [WireFormat, ...WireFormat[]];
  /** The path under the base URL (which ends in /v1) for each format it serves. */
  paths: Partial<Record<WireFormat, string>>;
  /** Headers that authenticate with the vault key (name, value), in the provider's documented way. */
  auth(secret: string): Array<[string, string]>;
  /** The key as it appears on the wire, for the scrubber (case I9: every form of it is masked). */
  injected(secret: string): string;
  /**
   * Headers every request carries: the API version a translated body is written for. A
   * passed-through body is in the caller's own version, so a caller's header of the same name
   * (listed in `forwarded`) replaces the default then.
   */
  fixed: ReadonlyArray<readonly [string, string]>;
  /**
   * The sandbox's request headers that go along: feature flags only, never one that could pick
   * another account or project under the user's key (openai-organization, openai-project) or
   * carry a credential. Passed only to a provider of the caller's own format: a flag of one
   * API means nothing to the other.
   */
  forwarded: readonly string[];
  /** Response headers the sandbox never sees: the user's account details, cookies. */
  droppedResponse: ReadonlySet<string>;
  /**
   * The request field that bounds output tokens, per format: set or lowered to the remaining
   * output budget. For chat, a caller's own `max_tokens` is lowered where it is given; when
   * none is given this one is set.
   */
  outputLimit: Partial<Record<WireFormat, string>>;
  /** The smallest output bound the provider accepts, per format (1 where not given). */
  leastOutput: Partial<Record<WireFormat, number>>;
}

const bearer = (secret: string): Array<[string, string]> => [["authorization", `Bearer ${secret}`]];

const OPENAI_DROPPED = new Set(["set-cookie", "openai-organization", "openai-project"]);

/** OpenAI's API (https://platform.openai.com/docs/api-reference), and any API speaking it. */
const OPENAI: ProviderEntry = {
  formats: ["openai-chat", "openai-responses"],
  paths: { "openai-chat": "/chat/completions", "openai-responses": "/responses" },
  auth: bearer,
  injected: (secret) => `Bearer ${secret}`,
  fixed: [],
  forwarded: ["openai-beta"],
  droppedResponse: OPENAI_DROPPED,
  // max_tokens is deprecated (and refused by reasoning models) in favour of this one.
  outputLimit: { "openai-chat": "max_completion_tokens", "openai-responses": "max_output_tokens" },
  leastOutput: { "openai-responses": 16 },
};

export const PROVIDERS: Record<ModelProvider, ProviderEntry> = {
  openai: OPENAI,
  // OpenRouter, vLLM, ...: the same format and key; many serve only chat completions, but a
  // caller of /responses is passed through as before (the provider answers 404 if it has none).
  // Their older servers know max_tokens, not max_completion_tokens.
  "openai-compatible": {
    ...OPENAI,
    outputLimit: { ...OPENAI.outputLimit, "openai-chat": "max_tokens" },
  },
  // Anthropic's Messages API (https://docs.anthropic.com/en/api/messages). Translated bodies are
  // written for version 2023-06-01 (it has temperature and top_p, which 2026-10-21 refuses); a
  // caller speaking Anthropic's format keeps its own version (the SDKs since 1.0 send
  // 2026-10-21, whose system-role turns 2023-06-01 refuses). x-api-key, which the API prefers
  // when a Bearer token comes too, works in both.
  anthropic: {
    formats: ["anthropic-messages"],
    paths: { "anthropic-messages": "/messages" },
    auth: (secret) => [["x-api-key", secret]],
    injected: (secret) => secret,
    fixed: [["anthropic-version", "2023-06-01"]],
    forwarded: ["anthropic-beta", "anthropic-version"],
    droppedResponse: new Set(["set-cookie", "anthropic-organization-id"]),
    outputLimit: { "anthropic-messages": "max_tokens" },
    leastOutput: {},
  },
};

export interface Route {
  provider: ProviderEntry;
  /** The format sent upstream. */
  upstream: WireFormat;
  /** Whether the caller's format is the provider's (no translation). */
  passthrough: boolean;
}

/** How a call in `caller`'s format reaches `provider`. */
export function routeFor(provider: ModelProvider, caller: WireFormat): Route {
  const entry = PROVIDERS[provider];
  const passthrough = entry.formats.includes(caller);
  return { provider: entry, upstream: passthrough ? caller : entry.formats[0], passthrough };
}
