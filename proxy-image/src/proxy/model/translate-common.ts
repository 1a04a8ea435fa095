// Helpers shared by the per-pair translations: reading loosely typed JSON, refusing, mapping
// stop reasons, error types and usage. Pure: no I/O.
import type { Refusal, SseEvent, StreamTranslator, Usage } from "./translate-types";

export type Json = Record<string, unknown>;

export function isObj(v: unknown): v is Json {
  return typeof v === "object" && v !== null && !Array.isArray(v);
}

export function num(v: unknown): number {
  return typeof v === "number" && Number.isFinite(v) && v >= 0 ? v : 0;
}

export function str(v: unknown): string | undefined {
  return typeof v === "string" ? v : undefined;
}

/** Thrown inside a request translation, caught at its edge and turned into `{ ok: false }`. */
export class Refused extends Error {
  constructor(readonly refusal: Refusal) {
    super(refusal.message);
  }
}

/** A parameter the provider has no faithful equivalent for. */
export function unsupported(param: string, why: string): never {
  throw new Refused({
    status: 400,
    type: "unsupported_parameter",
    param,
    message: `${param}: ${why} (the model lane cannot translate it to the provider's format faithfully)`,
  });
}

/** A value the caller's own format would reject. */
export function invalid(param: string, why: string): never {
  throw new Refused({ status: 400, type: "invalid_value", param, message: `${param}: ${why}` });
}

export const ZERO: Usage = { input: 0, output: 0, cached: 0 };

/** Absent, null, or a value that means "the default" in the caller's format. */
export function isDefault(v: unknown, ...defaults: unknown[]): boolean {
  return v === undefined || v === null || defaults.includes(v);
}

/**
 * Every top-level field must be one this pair knows: an unknown field is refused, never dropped.
 * `known` lists the fields the translation reads; the caller checks their values.
 */
export function onlyKnown(body: Json, known: ReadonlySet<string>, prefix = ""): void {
  for (const key of Object.keys(body)) {
    if (!known.has(key)) unsupported(`${prefix}${key}`, "unknown or untranslatable field");
  }
}

// The image types Anthropic's base64 source accepts (Base64ImageSource.media_type).
const ANTHROPIC_IMAGE_TYPES = new Set(["image/jpeg", "image/png", "image/gif", "image/webp"]);

/** An OpenAI image URL (data: or http(s):) → Anthropic's image source. */
export function imageSource(url: string, param: string): Json {
  if (url.startsWith("data:")) {
    const m = /^data:([^;,]+);base64,(.*)$/s.exec(url);
    if (!m) invalid(param, "a data URL must be base64 (data:<type>;base64,<data>)");
    const mediaType = (m[1] ?? "").toLowerCase();
    if (!ANTHROPIC_IMAGE_TYPES.has(mediaType)) unsupported(param, `image type ${mediaType}`);
    return { type: "base64", media_type: mediaType, data: m[2] ?? "" };
  }
  if (/^https?:\/\//i.test(url)) return { type: "url", url };
  return invalid(param, "an image URL must be a data: or http(s): URL");
}

/** Anthropic's image source → an OpenAI image URL. */
export function imageUrl(source: unknown, param: string): string {
  if (!isObj(source)) return invalid(param, "missing source");
  if (source.type === "base64") {
    const mediaType = str(source.media_type);
    const data = str(source.data);
    if (!mediaType || data === undefined) return invalid(param, "base64 source needs media_type and data");
    return `data:${mediaType};base64,${data}`;
  }
  if (source.type === "url" && typeof source.url === "string") return source.url;
  return unsupported(`${param}.type`, `image source ${String(source.type)}`);
}

/** Anthropic stop_reason → chat finish_reason. */
export function finishReasonOf(stopReason: unknown): string {
  switch (stopReason) {
    case "max_tokens":
    case "model_context_window_exceeded":
      return "length";
    case "tool_use":
      return "tool_calls";
    case "refusal":
      return "content_filter";
    default:
      // end_turn, stop_sequence, pause_turn (server tools only, never requested), null.
      return "stop";
  }
}

/** Chat finish_reason → Anthropic stop_reason. */
export function stopReasonOf(finishReason: unknown): string {
  switch (finishReason) {
    case "length":
      return "max_tokens";
    case "tool_calls":
    case "function_call":
      return "tool_use";
    case "content_filter":
      return "refusal";
    default:
      return "end_turn";
  }
}

/**
 * Anthropic's usage → ours. Anthropic's `input_tokens` counts only the input after the last cache
 * breakpoint: tokens read from the cache (`cache_read_input_tokens`) and tokens written to it
 * (`cache_creation_input_tokens`) are counted apart. OpenAI's `prompt_tokens` counts the whole
 * input with `cached_tokens` a part of it, and so does our `input`: input = input_tokens +
 * cache_creation_input_tokens + cache_read_input_tokens, cached = cache_read_input_tokens.
 */
export function anthropicUsage(u: unknown): Usage {
  if (!isObj(u)) return { ...ZERO };
  const cached = num(u.cache_read_input_tokens);
  return {
    input: num(u.input_tokens) + num(u.cache_creation_input_tokens) + cached,
    output: num(u.output_tokens),
    cached,
  };
}

/**
 * Folds one usage object of an Anthropic stream (message_start's, or message_delta's cumulative
 * totals) into `usage`: a field message_delta leaves out keeps its earlier value. Returns the
 * cache writes it reported, or `cacheWrite` unchanged when it reported no input counts.
 */
export function foldAnthropicUsage(usage: Usage, u: unknown, cacheWrite = 0): number {
  if (!isObj(u)) return cacheWrite;
  const next = anthropicUsage(u);
  if (u.output_tokens != null) usage.output = next.output;
  if (u.input_tokens == null && u.cache_read_input_tokens == null && u.cache_creation_input_tokens == null)
    return cacheWrite;
  usage.input = next.input;
  usage.cached = next.cached;
  return num(u.cache_creation_input_tokens);
}

/** Chat completions' usage (prompt_tokens includes cached_tokens) → ours. */
export function chatUsage(u: unknown): Usage {
  if (!isObj(u)) return { ...ZERO };
  const details = isObj(u.prompt_tokens_details) ? u.prompt_tokens_details : {};
  return {
    input: num(u.prompt_tokens),
    output: num(u.completion_tokens),
    cached: num(details.cached_tokens),
  };
}

/** Responses' usage (input_tokens includes cached_tokens) → ours. */
export function responsesUsage(u: unknown): Usage {
  if (!isObj(u)) return { ...ZERO };
  const details = isObj(u.input_tokens_details) ? u.input_tokens_details : {};
  return { input: num(u.input_tokens), output: num(u.output_tokens), cached: num(details.cached_tokens) };
}

/** Our usage → chat's usage object. */
export function chatUsageBody(u: Usage, cacheWrite = 0): Json {
  return {
    prompt_tokens: u.input,
    completion_tokens: u.output,
    total_tokens: u.input + u.output,
    prompt_tokens_details: { cached_tokens: u.cached, cache_write_tokens: cacheWrite },
  };
}

/** Our usage → responses' usage object. */
export function responsesUsageBody(u: Usage, cacheWrite = 0): Json {
  return {
    input_tokens: u.input,
    input_tokens_details: { cached_tokens: u.cached, cache_write_tokens: cacheWrite },
    output_tokens: u.output,
    output_tokens_details: { reasoning_tokens: 0 },
    total_tokens: u.input + u.output,
  };
}

/** The error types Anthropic documents, by HTTP status (errors page). */
export function anthropicErrorType(status: number): string {
  switch (status) {
    case 400:
    case 409:
    case 422:
      return "invalid_request_error";
    case 401:
      return "authentication_error";
    case 402:
      return "billing_error";
    case 403:
      return "permission_error";
    case 404:
      return "not_found_error";
    case 413:
      return "request_too_large";
    case 429:
      return "rate_limit_error";
    case 504:
      return "timeout_error";
    case 529:
      return "overloaded_error";
    default:
      return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

/** OpenAI's error `type` by status (its SDK maps errors by status; the type is a category). */
export function openaiErrorType(status: number): string {
  if (status === 401) return "authentication_error";
  if (status === 403) return "permission_error";
  if (status === 404) return "not_found_error";
  if (status === 429) return "rate_limit_error";
  if (status >= 500) return "server_error";
  return "invalid_request_error";
}

// What of an upstream error survives: its message (bounded) and its type when it looks like one.
// Nothing else (headers, request echoes, ids) is copied, so nothing the provider reflected back
// can reach the sandbox through this path.
const MAX_ERROR_MESSAGE = 4096;
const CODE = /^[a-z][a-z0-9_]{0,63}$/;

export function errorMessage(body: unknown, status: number): string {
  const err = isObj(body) && isObj(body.error) ? body.error : null;
  const message = err ? str(err.message) : undefined;
  if (message === undefined || message === "") return `the provider answered HTTP ${status}`;
  return message.length > MAX_ERROR_MESSAGE ? `${message.slice(0, MAX_ERROR_MESSAGE)}…` : message;
}

/** The upstream's error type, when it is a plain identifier (nothing else of the body is read). */
export function errorCode(body: unknown): string | null {
  const err = isObj(body) && isObj(body.error) ? body.error : null;
  return err && typeof err.type === "string" && CODE.test(err.type) ? err.type : null;
}

export function openaiError(status: number, message: string, code: string | null, param?: string): Json {
  return { error: { message, type: openaiErrorType(status), param: param ?? null, code } };
}

export function anthropicError(status: number, message: string): Json {
  return { type: "error", error: { type: anthropicErrorType(status), message }, request_id: null };
}

/** Parse one SSE event's JSON data; null for `[DONE]` or anything that is not a JSON object. */
export function eventJson(e: SseEvent): Json | null {
  if (e.data === "[DONE]") return null;
  try {
    const v: unknown = JSON.parse(e.data);
    return isObj(v) ? v : null;
  } catch {
    return null;
  }
}

export function sse(event: string | undefined, data: unknown): SseEvent {
  const json = JSON.stringify(data);
  return event === undefined ? { data: json } : { event, data: json };
}

/** Text of OpenAI content given as a string or an array of text parts. */
export function textOf(content: unknown, param: string, partTypes: ReadonlySet<string>): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return invalid(param, "must be a string or an array of text parts");
  return content
    .map((p, i) => {
      if (!isObj(p) || !partTypes.has(String(p.type)) || typeof p.text !== "string")
        return unsupported(`${param}[${i}]`, "only text parts can be translated here");
      onlyKnown(p, TEXT_PART_KEYS, `${param}[${i}].`);
      return p.text;
    })
    .join("");
}
const TEXT_PART_KEYS = new Set(["type", "text"]);

/** Parse tool-call arguments: an object when they are JSON, else the raw text (never lost). */
export function parseArguments(args: unknown): unknown {
  if (typeof args !== "string") return {};
  if (args.trim() === "") return {};
  try {
    return JSON.parse(args);
  } catch {
    return args;
  }
}

export function nowSeconds(): number {
  return Math.floor(Date.now() / 1000);
}

/** What a translation of an Anthropic stream says at each turn that is its own. */
export interface AnthropicStreamHandlers {
  /** message_start's message (its usage read already). */
  start(msg: Json): SseEvent[];
  /** Every later event, while the stream has neither finished nor failed. */
  event(ev: Json): SseEvent[];
  /** The stream ended after message_stop. */
  done(): SseEvent[];
  /** The stream ended short; `why` says where. */
  cut(why: string): SseEvent[];
}

/**
 * The part of translating an Anthropic stream that every caller format shares: the usage (folded
 * from message_start and message_delta), whether the stream started, finished or failed, and that
 * nothing is read after it finished or failed.
 */
export class AnthropicStream {
  readonly usage: Usage = { input: 0, output: 0, cached: 0 };
  cacheWrite = 0;
  started = false;
  finished = false;
  failed = false;

  readUsage(u: unknown): void {
    this.cacheWrite = foldAnthropicUsage(this.usage, u, this.cacheWrite);
  }

  translator(h: AnthropicStreamHandlers): StreamTranslator {
    return {
      usage: () => ({ ...this.usage }),
      push: (e) => {
        const ev = eventJson(e);
        if (!ev || this.failed || this.finished) return [];
        if (ev.type !== "message_start") return h.event(ev);
        const msg = isObj(ev.message) ? ev.message : {};
        this.readUsage(msg.usage);
        this.started = true;
        return h.start(msg);
      },
      end: () => {
        if (this.failed) return [];
        if (this.finished) return h.done();
        return h.cut(this.started ? "ended before the message was complete" : "ended before it started");
      },
    };
  }
}
