// Provider streams and answers for the translation tests, written the way the providers' API
// references show them: Anthropic Messages streaming (API version 2023-06-01, "Streaming
// Messages": named events, ping, input_json_delta fragments) and OpenAI chat completions
// streaming (chat.completion.chunk objects, tool_calls fragments by index, the usage chunk with
// empty choices under include_usage, `data: [DONE]`).
import type Anthropic from "@anthropic-ai/sdk";
import type OpenAI from "openai";
import { formatSse, SseParser } from "../../proxy-image/src/proxy/model/sse";
import {
  type Refusal,
  type RequestOptions,
  type SseEvent,
  type StreamTranslator,
  type Translation,
  translation,
  type WireFormat,
} from "../../proxy-image/src/proxy/model/translate";

export function ev(event: string, data: unknown): SseEvent {
  return { event, data: JSON.stringify(data) };
}

/** Anthropic's content block events, each named as its own `type`. */
export const blockStart = (index: number, block: Record<string, unknown>): SseEvent =>
  ev("content_block_start", { type: "content_block_start", index, content_block: block });
export const blockDelta = (index: number, delta: Record<string, unknown>): SseEvent =>
  ev("content_block_delta", { type: "content_block_delta", index, delta });
export const blockStop = (index: number): SseEvent =>
  ev("content_block_stop", { type: "content_block_stop", index });

/** Anthropic: text, then a tool call whose input arrives in fragments; cache counts included. */
export function anthropicToolStream(): SseEvent[] {
  return [
    ev("message_start", {
      type: "message_start",
      message: {
        id: "msg_014p7gG3wDgGV9EUtLvnow3U",
        type: "message",
        role: "assistant",
        model: "claude-sonnet-4-5",
        content: [],
        stop_reason: null,
        stop_sequence: null,
        usage: {
          input_tokens: 472,
          output_tokens: 2,
          cache_read_input_tokens: 100,
          cache_creation_input_tokens: 20,
        },
      },
    }),
    blockStart(0, { type: "text", text: "" }),
    ev("ping", { type: "ping" }),
    blockDelta(0, { type: "text_delta", text: "Okay, let's check" }),
    blockDelta(0, { type: "text_delta", text: " the weather." }),
    blockStop(0),
    blockStart(1, {
      type: "tool_use",
      id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
      name: "get_weather",
      input: {},
    }),
    blockDelta(1, { type: "input_json_delta", partial_json: "" }),
    ev("content_block_delta", {
      type: "content_block_delta",
      index: 1,
      delta: { type: "input_json_delta", partial_json: '{"location": "San Fra' },
    }),
    ev("content_block_delta", {
      type: "content_block_delta",
      index: 1,
      delta: { type: "input_json_delta", partial_json: 'ncisco, CA"}' },
    }),
    blockStop(1),
    ev("message_delta", {
      type: "message_delta",
      delta: { stop_reason: "tool_use", stop_sequence: null },
      usage: { output_tokens: 89 },
    }),
    ev("message_stop", { type: "message_stop" }),
  ];
}

/** Anthropic: plain text that hits max_tokens. */
export function anthropicTextStream(stopReason = "end_turn"): SseEvent[] {
  return [
    ev("message_start", {
      type: "message_start",
      message: {
        id: "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
        type: "message",
        role: "assistant",
        content: [],
        model: "claude-opus-4-6",
        stop_reason: null,
        stop_sequence: null,
        usage: { input_tokens: 25, output_tokens: 1 },
      },
    }),
    blockStart(0, { type: "text", text: "" }),
    ev("ping", { type: "ping" }),
    blockDelta(0, { type: "text_delta", text: "Hello" }),
    blockDelta(0, { type: "text_delta", text: "!" }),
    blockStop(0),
    ev("message_delta", {
      type: "message_delta",
      delta: { stop_reason: stopReason, stop_sequence: null },
      usage: { output_tokens: 15 },
    }),
    ev("message_stop", { type: "message_stop" }),
  ];
}

export const ANTHROPIC_MESSAGE = {
  id: "msg_01XFDUDYJgAACzvnptvVoYEL",
  type: "message",
  role: "assistant",
  model: "claude-sonnet-4-5",
  content: [
    { type: "text", text: "I'll look it up." },
    {
      type: "tool_use",
      id: "toolu_01A09q90qw90lq917835lq9",
      name: "get_weather",
      input: { location: "Paris" },
    },
  ],
  stop_reason: "tool_use",
  stop_sequence: null,
  usage: {
    input_tokens: 30,
    output_tokens: 12,
    cache_read_input_tokens: 1000,
    cache_creation_input_tokens: 5,
  },
} as const;

const chunkBase = {
  id: "chatcmpl-123",
  object: "chat.completion.chunk",
  created: 1694268190,
  model: "gpt-4o-mini",
} as const;
type Chunk = OpenAI.Chat.Completions.ChatCompletionChunk;
type Finish = OpenAI.Chat.Completions.ChatCompletionChunk.Choice["finish_reason"];

export function chatChunk(
  delta: OpenAI.Chat.Completions.ChatCompletionChunk.Choice.Delta,
  finish: Finish = null,
): SseEvent {
  const c: Chunk = {
    ...chunkBase,
    system_fingerprint: "fp_44709d6fcb",
    choices: [{ index: 0, delta, logprobs: null, finish_reason: finish }],
  };
  return { data: JSON.stringify(c) };
}

export function chatUsageChunk(prompt: number, completion: number, cached: number): SseEvent {
  const c: Chunk = {
    ...chunkBase,
    choices: [],
    usage: {
      prompt_tokens: prompt,
      completion_tokens: completion,
      total_tokens: prompt + completion,
      prompt_tokens_details: { cached_tokens: cached },
    },
  };
  return { data: JSON.stringify(c) };
}

/** OpenAI chat: text, then two tool calls whose arguments arrive in fragments, then usage. */
export function chatToolStream(): SseEvent[] {
  return [
    chatChunk({ role: "assistant", content: "", refusal: null }),
    chatChunk({ content: "Checking" }),
    chatChunk({ content: " both." }),
    chatChunk({
      tool_calls: [
        { index: 0, id: "call_abc", type: "function", function: { name: "get_weather", arguments: "" } },
      ],
    }),
    chatChunk({ tool_calls: [{ index: 0, function: { arguments: '{"location":' } }] }),
    chatChunk({ tool_calls: [{ index: 0, function: { arguments: ' "Paris"}' } }] }),
    chatChunk({
      tool_calls: [
        { index: 1, id: "call_def", type: "function", function: { name: "get_time", arguments: "" } },
      ],
    }),
    chatChunk({ tool_calls: [{ index: 1, function: { arguments: '{"tz":"CET"}' } }] }),
    chatChunk({}, "tool_calls"),
    chatUsageChunk(82, 17, 64),
    { data: "[DONE]" },
  ];
}

export function chatTextStream(finish: Finish = "stop"): SseEvent[] {
  return [
    chatChunk({ role: "assistant", content: "" }),
    chatChunk({ content: "Hello" }),
    chatChunk({ content: " there" }),
    chatChunk({}, finish),
    chatUsageChunk(9, 2, 0),
    { data: "[DONE]" },
  ];
}

export const CHAT_COMPLETION = {
  id: "chatcmpl-B9MHDbslfkBeAs8l4bebGdFOJ6PeG",
  object: "chat.completion",
  created: 1741570283,
  model: "gpt-4o-2024-08-06",
  choices: [
    {
      index: 0,
      message: {
        role: "assistant",
        content: null,
        refusal: null,
        tool_calls: [
          {
            id: "call_abc",
            type: "function",
            function: { name: "get_weather", arguments: '{"location":"Paris"}' },
          },
        ],
      },
      logprobs: null,
      finish_reason: "tool_calls",
    },
  ],
  usage: {
    prompt_tokens: 1117,
    completion_tokens: 46,
    total_tokens: 1163,
    prompt_tokens_details: { cached_tokens: 1024, audio_tokens: 0 },
    completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 0 },
  },
} satisfies OpenAI.Chat.Completions.ChatCompletion;

/** Run a whole upstream stream through a translator. */
export function run(t: StreamTranslator, events: SseEvent[]): SseEvent[] {
  return [...events.flatMap((e) => t.push(e)), ...t.end()];
}

export function datas(events: SseEvent[]): Record<string, unknown>[] {
  return events.filter((e) => e.data !== "[DONE]").map((e) => JSON.parse(e.data) as Record<string, unknown>);
}

/** Events as the text of an SSE body (what the lane writes to the sandbox). */
export function sseText(events: SseEvent[]): string {
  return events.map(formatSse).join("");
}

/** Parse SSE text back into events (the lane's reading side). */
export function parseSse(text: string): SseEvent[] {
  return new SseParser().feed(text);
}

/**
 * A fetch for an official SDK that answers every call with `answer` and records what the SDK
 * sent: the SDKs then parse our translated output with their own code, no network involved.
 */
export function fakeFetch(answer: () => Response): { fetch: typeof fetch; bodies: unknown[] } {
  const bodies: unknown[] = [];
  const f = async (_url: string | URL | Request, init?: RequestInit): Promise<Response> => {
    bodies.push(typeof init?.body === "string" ? JSON.parse(init.body) : null);
    return answer();
  };
  return { fetch: f as typeof fetch, bodies };
}

export function sseResponse(events: SseEvent[]): Response {
  return new Response(sseText(events), { status: 200, headers: { "content-type": "text/event-stream" } });
}

export function jsonResponse(status: number, body: unknown): Response {
  return new Response(JSON.stringify(body), { status, headers: { "content-type": "application/json" } });
}

export type AnthropicMessage = Anthropic.Messages.Message;

/** The translation for a pair that must exist. */
export function pair(from: WireFormat, to: WireFormat): Translation {
  const t = translation(from, to);
  if (!t) throw new Error(`${from} → ${to} must translate`);
  return t;
}

/** A pair's request translation with fixed options: `ok` must translate, `refusal` must refuse. */
export function requests(t: Translation, opts: RequestOptions) {
  return {
    ok(body: Record<string, unknown>) {
      const r = t.request(body, opts);
      if (!r.ok) throw new Error(`refused: ${r.refusal.message}`);
      return r;
    },
    refusal(body: Record<string, unknown>): Refusal {
      const r = t.request(body, opts);
      if (r.ok) throw new Error(`not refused: ${JSON.stringify(r.body)}`);
      return r.refusal;
    },
  };
}

/** list[i], which the test knows is there. */
export function at<T>(list: readonly T[], i: number): T {
  const v = list.at(i);
  if (v === undefined) throw new Error(`no element ${i}`);
  return v;
}
