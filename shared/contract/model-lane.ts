// The model lane's closed sets, as plain lists: the one spelling of them. contract/policy.ts and
// contract/proxy-wire.ts make their zod enums (ModelProvider, ModelEndpoint) of them, and the
// database schema its column enums, without loading zod there (a zod schema made before
// @hono/zod-openapi is loaded has no .openapi, as for contract/routing.ts).

/** Who the lane calls: each has one wire format and one way to authenticate. */
export const MODEL_PROVIDERS = ["openai", "openai-compatible", "anthropic"] as const;

/** The endpoint the caller spoke: OpenAI's chat completions and responses, Anthropic's messages. */
export const MODEL_ENDPOINTS = ["chat.completions", "responses", "messages"] as const;
