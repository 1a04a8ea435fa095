// The translation's types, in a module of their own so that the per-pair modules and
// translate.ts can share them without importing each other. translate.ts re-exports them: import
// from there.

/** The three wire formats the lane serves and speaks. */
export type WireFormat = "openai-chat" | "openai-responses" | "anthropic-messages";

/** A request the lane answers itself (e.g. 400 unsupported_parameter), never sent upstream. */
export interface Refusal {
  status: number;
  type: string;
  message: string;
  param?: string;
}

/** The provider's own token counts; 0 when absent. `cached` is a part of `input`. */
export interface Usage {
  input: number;
  output: number;
  cached: number;
}

/** One server-sent event: `event:` line (if any) and the joined `data:` lines. */
export interface SseEvent {
  event?: string;
  data: string;
}

export interface StreamTranslator {
  /** One upstream SSE event in → zero or more events in the caller's format, right away (no buffering of the whole answer). */
  push(e: SseEvent): SseEvent[];
  /** Upstream ended → closing events (e.g. OpenAI's `data: [DONE]`). */
  end(): SseEvent[];
  /** Usage seen so far in the stream, in provider terms. */
  usage(): Usage;
}

export type RequestResult =
  | { ok: true; body: Record<string, unknown>; stream: boolean }
  | { ok: false; refusal: Refusal };

export interface RequestOptions {
  upstreamModel: string;
  maxTokensDefault: number;
}

export interface StreamOptions {
  model: string;
  includeUsage?: boolean;
}

export interface Translation {
  from: WireFormat;
  to: WireFormat;
  /** Caller's request body → body for the provider, with `model` set to upstreamModel; or a refusal (never drop a field silently). */
  request(body: Record<string, unknown>, opts: RequestOptions): RequestResult;
  /** Provider's whole JSON answer → caller's format; `model` shown as the declared name. */
  response(body: unknown, opts: { model: string }): { body: Record<string, unknown>; usage: Usage };
  /**
   * A translator for one streamed answer. `includeUsage` is the caller's
   * `stream_options.include_usage` (chat completions only: whether to send the final usage chunk).
   */
  stream(opts: StreamOptions): StreamTranslator;
  /** Provider's error (status, parsed body or null) → an error body in the caller's format. */
  error(status: number, body: unknown): Record<string, unknown>;
}
