// proxy-image/src/proxy/model/translate.ts — pure: no Node I/O, no network.
//
// The model lane's translation between OpenAI's wire formats (chat completions, responses) and
// Anthropic's Messages API. Shapes follow the official references and the official SDKs' type
// definitions (openai 7.59.0, @anthropic-ai/sdk 1.15.0). Requests to Anthropic are written for
// API version 2023-06-01 (top-level `system`, temperature and top_p): the provider table must
// send `anthropic-version: 2023-06-01`, because 2026-10-21 (what the SDK sends by default)
// refuses temperature and top_p. Anthropic-format callers may speak either version.
//
// TRANSLATION LIMITS (docs/model-translation.md repeats this table for users)
// A field is translated, accepted at its default only, or refused with 400
// `unsupported_parameter` naming it. Nothing is dropped silently; the few fields accepted and not
// forwarded are listed as such.
//
// OpenAI chat completions / responses → Anthropic
// | field                                   | outcome                                                 |
// |-----------------------------------------|---------------------------------------------------------|
// | system/developer messages, instructions | top-level `system` blocks; one after the first user or  |
// |                                         | assistant turn is refused (Anthropic has no such turn)  |
// | user/assistant/tool turns               | merged so that roles alternate; tool results become     |
// |                                         | user `tool_result` blocks                               |
// | text, image_url / input_image           | text, image with base64 (data: URL) or url source;      |
// |                                         | detail other than auto, other image types, file ids,    |
// |                                         | audio and file parts are refused                        |
// | tools (function), tool_choice           | tools with input_schema; auto/none/required(any)/named; |
// |                                         | custom and built-in tools, allowed_tools refused        |
// | parallel_tool_calls: false              | tool_choice.disable_parallel_tool_use                   |
// | assistant tool_calls / function_call    | tool_use blocks (arguments must be a JSON object)       |
// | max_tokens, max_completion_tokens,      | max_tokens (the lane's default when absent, since       |
// | max_output_tokens                       | Anthropic requires it)                                  |
// | temperature, top_p                      | same; temperature above 1 refused (Anthropic: 0..1)     |
// | stop                                    | stop_sequences                                          |
// | stream, stream_options.include_usage    | stream; the usage chunk is made from Anthropic's counts |
// | user, safety_identifier                 | metadata.user_id (both given and different: refused)    |
// | n>1, logprobs, top_logprobs, penalties, | refused                                                 |
// | logit_bias, seed, audio, modalities,    |                                                         |
// | prediction, response_format other than  |                                                         |
// | text (json_object, json_schema),        |                                                         |
// | text.format/verbosity, reasoning(_effort)|                                                        |
// | metadata (non-empty), service_tier,     | refused                                                 |
// | prompt_cache_*, store: true (chat),     |                                                         |
// | previous_response_id, conversation,     |                                                         |
// | background, include, truncation: auto,  |                                                         |
// | any field not named here                |                                                         |
// | store (responses)                       | accepted, nothing is stored (its default is true)       |
// | assistant refusal, mid-conversation     | refused                                                 |
// | system message, message `name`          |                                                         |
//
// Anthropic → OpenAI chat completions
// | field                                   | outcome                                                 |
// |-----------------------------------------|---------------------------------------------------------|
// | system (top-level or 2026-10-21 turns)  | system messages                                         |
// | text, image (base64 / url)              | text parts, image_url (data: URL / URL)                 |
// | tool_use / tool_result blocks           | assistant tool_calls / `role: "tool"` messages, in order|
// | tools (custom), tool_choice             | function tools; auto/none/any(required)/tool(named)     |
// | disable_parallel_tool_use               | parallel_tool_calls: false                              |
// | max_tokens                              | max_completion_tokens (required, as Anthropic requires) |
// | temperature, top_p, stop_sequences      | same; more than 4 stop sequences refused                |
// | metadata.user_id                        | user                                                    |
// | stream                                  | stream with include_usage (for the counts)              |
// | cache_control                           | accepted, not forwarded: a cache hint that never changes|
// |                                         | the answer; OpenAI caches prompts by itself             |
// | top_k, thinking, server tools,          | refused                                                 |
// | document/thinking/search blocks,        |                                                         |
// | citations, tool_result is_error or      |                                                         |
// | images, service_tier, output_config,    |                                                         |
// | container, mcp_servers, any other field |                                                         |
//
// Answers
// - Stop reasons: end_turn/stop_sequence → stop, max_tokens → length, tool_use → tool_calls,
//   refusal → content_filter; back: stop → end_turn (chat does not say which stop sequence
//   matched, so stop_sequence is never reported), length → max_tokens, tool_calls → tool_use,
//   content_filter → refusal. Responses: max_tokens → status incomplete (max_output_tokens).
// - Thinking blocks in an Anthropic answer are not shown to OpenAI callers (neither format has
//   a place for Anthropic's signed reasoning); their tokens are in the output count.
// - Usage: see anthropicUsage() in translate-common.ts for how Anthropic's input_tokens relate
//   to cached tokens. Our Usage.input always includes Usage.cached.
// - Errors keep only the provider's message (bounded) and its error type as OpenAI's `code`;
//   the HTTP status is the provider's, and the type is mapped from it.
import {
  anthropicToChatRequest,
  chatToAnthropicResponse,
  openaiToAnthropicError,
} from "./translate-anthropic-chat";
import { chatToAnthropicStream } from "./translate-anthropic-chat-stream";
import {
  anthropicToChatResponse,
  anthropicToOpenaiError,
  chatToAnthropicRequest,
} from "./translate-chat-anthropic";
import { anthropicToChatStream } from "./translate-chat-anthropic-stream";
import {
  anthropicError,
  anthropicUsage,
  chatUsage,
  eventJson,
  foldAnthropicUsage,
  isObj,
  openaiError,
  responsesUsage,
} from "./translate-common";
import { anthropicToResponsesResponse, responsesToAnthropicRequest } from "./translate-responses-anthropic";
import { anthropicToResponsesStream } from "./translate-responses-anthropic-stream";
import type { Refusal, SseEvent, Translation, Usage, WireFormat } from "./translate-types";

export { formatSse, SseParser } from "./sse";
export type {
  Refusal,
  RequestOptions,
  RequestResult,
  SseEvent,
  StreamOptions,
  StreamTranslator,
  Translation,
  Usage,
  WireFormat,
} from "./translate-types";

const PAIRS: Translation[] = [
  {
    from: "openai-chat",
    to: "anthropic-messages",
    request: chatToAnthropicRequest,
    response: (body, { model }) => anthropicToChatResponse(body, model),
    stream: anthropicToChatStream,
    error: anthropicToOpenaiError,
  },
  {
    from: "openai-responses",
    to: "anthropic-messages",
    request: responsesToAnthropicRequest,
    response: (body, { model }) => anthropicToResponsesResponse(body, model),
    stream: anthropicToResponsesStream,
    error: anthropicToOpenaiError,
  },
  {
    from: "anthropic-messages",
    to: "openai-chat",
    request: anthropicToChatRequest,
    response: (body, { model }) => chatToAnthropicResponse(body, model),
    stream: chatToAnthropicStream,
    error: openaiToAnthropicError,
  },
];

const OPENAI: ReadonlySet<WireFormat> = new Set(["openai-chat", "openai-responses"]);

/**
 * The translation for a caller speaking `from` to a provider speaking `to`; null for
 * passthrough: the same format, or the two OpenAI formats, which an OpenAI provider serves side
 * by side (the call goes to the caller's own endpoint). Throws for anthropic-messages →
 * openai-responses, which is not built: the provider table sends Anthropic callers to chat
 * completions, and a silent passthrough would be wrong.
 */
export function translation(from: WireFormat, to: WireFormat): Translation | null {
  if (from === to || (OPENAI.has(from) && OPENAI.has(to))) return null;
  const pair = PAIRS.find((p) => p.from === from && p.to === to);
  if (!pair) throw new Error(`no translation from ${from} to ${to}`);
  return pair;
}

/** An error the lane itself raises (model_not_declared, over_budget...), in the caller's format. */
export function errorBody(format: WireFormat, r: Refusal): Record<string, unknown> {
  if (format === "anthropic-messages") return anthropicError(r.status, r.message);
  // OpenAI's shape: the category in `type`, the specific reason in `code`.
  return openaiError(r.status, r.message, r.type, r.param);
}

/**
 * Usage from a provider answer in its own format: a whole body, or one stream event's parsed
 * data (a chat chunk with `usage`, a responses `response.completed`/`response.incomplete`, an
 * Anthropic `message_start` or `message_delta`). Anthropic's stream counts are cumulative and
 * split across two events: use usageMeter() to follow a stream.
 */
export function readUsage(format: WireFormat, body: unknown): Usage {
  if (!isObj(body)) return { input: 0, output: 0, cached: 0 };
  if (format === "openai-chat") return chatUsage(body.usage);
  if (format === "openai-responses")
    return responsesUsage(isObj(body.response) ? body.response.usage : body.usage);
  if (body.type === "message_start" && isObj(body.message)) return anthropicUsage(body.message.usage);
  return anthropicUsage(body.usage);
}

/**
 * The usage a whole answer in the provider's format reports, or null when it reports none (an
 * answer without a usage object: the lane then charges what the call held, budget.ts).
 */
export function reportedUsage(format: WireFormat, body: unknown): Usage | null {
  if (!isObj(body)) return null;
  const u = format === "openai-responses" && isObj(body.response) ? body.response.usage : body.usage;
  return isObj(u) ? readUsage(format, body) : null;
}

/**
 * Follows the usage of a stream in the provider's format, event by event. `reported()`: the
 * final count came (chat's usage chunk, a responses event whose response carries usage,
 * Anthropic's message_delta); before it, `usage()` is only what was seen so far.
 */
export function usageMeter(format: WireFormat): {
  push(e: SseEvent): void;
  usage(): Usage;
  reported(): boolean;
} {
  let usage: Usage = { input: 0, output: 0, cached: 0 };
  let reported = false;
  return {
    usage: () => ({ ...usage }),
    reported: () => reported,
    push(e: SseEvent): void {
      const ev = eventJson(e);
      if (!ev) return;
      if (format !== "anthropic-messages") {
        const hasUsage =
          format === "openai-chat" ? isObj(ev.usage) : isObj(ev.response) && isObj(ev.response.usage);
        if (hasUsage) {
          usage = readUsage(format, ev);
          reported = true;
        }
        return;
      }
      // message_start has the input, message_delta the cumulative output (and, lately, the
      // input again): a field message_delta leaves out keeps its earlier value.
      const u = ev.type === "message_start" && isObj(ev.message) ? ev.message.usage : ev.usage;
      if (!isObj(u) || (ev.type !== "message_start" && ev.type !== "message_delta")) return;
      foldAnthropicUsage(usage, u);
      if (ev.type === "message_delta") reported = true;
    },
  };
}
