// Anthropic Messages (the caller) → OpenAI chat completions (the provider): the request, the
// whole answer and errors. The caller may speak API version 2023-06-01 (top-level `system`,
// temperature, top_p) or 2026-10-21, which the current SDKs send (system-role turns in
// `messages`, no sampling parameters): both read the same here.
import {
  anthropicError,
  chatUsage,
  errorMessage,
  imageUrl,
  invalid,
  isDefault,
  isObj,
  type Json,
  num,
  onlyKnown,
  parseArguments,
  Refused,
  stopReasonOf,
  str,
  unsupported,
} from "./translate-common";
import type { RequestOptions, RequestResult, Usage } from "./translate-types";

const KNOWN = new Set([
  "model",
  "messages",
  "system",
  "max_tokens",
  "temperature",
  "top_p",
  "top_k",
  "stop_sequences",
  "stream",
  "tools",
  "tool_choice",
  "metadata",
  // Accepted only at their defaults or as hints (checked below).
  "thinking",
  "cache_control",
  "service_tier",
]);

// OpenAI takes at most four stop sequences.
const MAX_STOPS = 4;

export function anthropicToChatRequest(body: Json, opts: RequestOptions): RequestResult {
  try {
    onlyKnown(body, KNOWN);
    if (!isDefault(body.thinking) && !(isObj(body.thinking) && body.thinking.type === "disabled"))
      unsupported("thinking", "extended thinking");
    if (!isDefault(body.service_tier, "auto"))
      unsupported("service_tier", `service_tier ${String(body.service_tier)}`);
    const out: Json = { model: opts.upstreamModel };
    const mt = body.max_tokens;
    // Anthropic requires max_tokens; absent, the documented API would refuse, and so does the lane.
    if (mt === undefined) invalid("max_tokens", "is required");
    if (typeof mt !== "number" || !Number.isInteger(mt) || mt < 1)
      invalid("max_tokens", "must be a positive integer");
    out.messages = [...systemMessages(body.system, "system"), ...messages(body.messages)];
    // max_completion_tokens, not the deprecated max_tokens that OpenAI's reasoning models refuse.
    out.max_completion_tokens = mt;
    for (const k of ["temperature", "top_p"] as const) {
      if (isDefault(body[k])) continue;
      if (typeof body[k] !== "number") invalid(k, "must be a number");
      out[k] = body[k];
    }
    if (!isDefault(body.top_k)) unsupported("top_k", "top-k sampling");
    if (!isDefault(body.stop_sequences)) {
      const s = body.stop_sequences;
      if (!Array.isArray(s) || !s.every((x) => typeof x === "string")) invalid("stop_sequences", "strings");
      if (s.length > MAX_STOPS) unsupported("stop_sequences", `more than ${MAX_STOPS} stop sequences`);
      if (s.length > 0) out.stop = s;
    }
    if (!isDefault(body.stream, false, true)) invalid("stream", "must be a boolean");
    const stream = body.stream === true;
    // Usage is always asked for: the Anthropic stream reports it, and the lane's budget needs it.
    if (stream) Object.assign(out, { stream: true, stream_options: { include_usage: true } });
    const tools = anthropicTools(body.tools);
    if (tools) out.tools = tools;
    toolChoice(body.tool_choice, !!tools, out);
    if (!isDefault(body.metadata)) {
      if (!isObj(body.metadata)) invalid("metadata", "must be an object");
      onlyKnown(body.metadata, METADATA_KEYS, "metadata.");
      if (!isDefault(body.metadata.user_id)) {
        if (typeof body.metadata.user_id !== "string") invalid("metadata.user_id", "must be a string");
        out.user = body.metadata.user_id;
      }
    }
    return { ok: true, body: out, stream };
  } catch (e) {
    if (e instanceof Refused) return { ok: false, refusal: e.refusal };
    throw e;
  }
}
const METADATA_KEYS = new Set(["user_id"]);

// cache_control marks a prompt-cache breakpoint: a cost hint that never changes the answer, and
// OpenAI caches prompts by itself, so it is accepted and not forwarded (see the limits table).
const TEXT_BLOCK_KEYS = new Set(["type", "text", "cache_control", "citations"]);

function textBlock(b: Json, p: string): string {
  onlyKnown(b, TEXT_BLOCK_KEYS, `${p}.`);
  if (typeof b.text !== "string") return invalid(`${p}.text`, "must be a string");
  if (!isDefault(b.citations) && !(Array.isArray(b.citations) && b.citations.length === 0))
    unsupported(`${p}.citations`, "citations");
  return b.text;
}

/** System text (a string or text blocks) → system messages, one per block as chat allows. */
function systemMessages(content: unknown, p: string): Json[] {
  if (isDefault(content, "")) return [];
  if (typeof content === "string") return [{ role: "system", content }];
  if (!Array.isArray(content)) return invalid(p, "must be a string or an array of text blocks");
  return content.map((b, i) => {
    if (!isObj(b) || b.type !== "text") return unsupported(`${p}[${i}]`, "system blocks other than text");
    return { role: "system", content: textBlock(b, `${p}[${i}]`) };
  });
}

const TURN_KEYS = new Set(["role", "content"]);

function messages(list: unknown): Json[] {
  if (!Array.isArray(list) || list.length === 0) return invalid("messages", "must be a non-empty array");
  const out: Json[] = [];
  for (const [i, m] of list.entries()) {
    const p = `messages[${i}]`;
    if (!isObj(m)) invalid(p, "must be an object");
    onlyKnown(m, TURN_KEYS, `${p}.`);
    if (m.role === "system") out.push(...systemMessages(m.content, `${p}.content`));
    else if (m.role === "user") out.push(...userMessages(m.content, `${p}.content`));
    else if (m.role === "assistant") out.push(assistantMessage(m.content, `${p}.content`));
    else unsupported(`${p}.role`, `role ${String(m.role)}`);
  }
  return out;
}

/**
 * One Anthropic user turn → chat messages in the same order: each tool_result becomes a
 * `role: "tool"` message, and each run of text and images one user message.
 */
function userMessages(content: unknown, p: string): Json[] {
  if (typeof content === "string") return [{ role: "user", content }];
  if (!Array.isArray(content)) return invalid(p, "must be a string or an array of blocks");
  const out: Json[] = [];
  let parts: Json[] | null = null;
  for (const [i, b] of content.entries()) {
    const bp = `${p}[${i}]`;
    if (!isObj(b)) invalid(bp, "must be an object");
    if (b.type === "tool_result") {
      parts = null;
      out.push(toolMessage(b, bp));
      continue;
    }
    let part: Json;
    if (b.type === "text") part = { type: "text", text: textBlock(b, bp) };
    else if (b.type === "image") {
      onlyKnown(b, IMAGE_KEYS, `${bp}.`);
      part = { type: "image_url", image_url: { url: imageUrl(b.source, `${bp}.source`) } };
    } else unsupported(bp, `blocks of type ${String(b.type)}`);
    if (!parts) {
      parts = [];
      out.push({ role: "user", content: parts });
    }
    parts.push(part);
  }
  return out;
}
const IMAGE_KEYS = new Set(["type", "source", "cache_control"]);
const TOOL_RESULT_KEYS = new Set(["type", "tool_use_id", "content", "is_error", "cache_control"]);

function toolMessage(b: Json, p: string): Json {
  onlyKnown(b, TOOL_RESULT_KEYS, `${p}.`);
  const id = str(b.tool_use_id);
  if (!id) return invalid(`${p}.tool_use_id`, "must be a string");
  // OpenAI's tool messages have no error flag; folding it into the text would change the text.
  if (!isDefault(b.is_error, false)) unsupported(`${p}.is_error`, "an error flag on a tool result");
  let content: string;
  if (isDefault(b.content)) content = "";
  else if (typeof b.content === "string") content = b.content;
  else if (Array.isArray(b.content))
    content = b.content
      .map((c, j) => {
        if (!isObj(c) || c.type !== "text")
          return unsupported(
            `${p}.content[${j}]`,
            "tool results other than text (chat's tool messages are text)",
          );
        return textBlock(c, `${p}.content[${j}]`);
      })
      .join("");
  else return invalid(`${p}.content`, "must be a string or an array of blocks");
  return { role: "tool", tool_call_id: id, content };
}

const TOOL_USE_KEYS = new Set(["type", "id", "name", "input", "cache_control"]);

function assistantMessage(content: unknown, p: string): Json {
  if (typeof content === "string") return { role: "assistant", content };
  if (!Array.isArray(content)) return invalid(p, "must be a string or an array of blocks");
  let text = "";
  const calls: Json[] = [];
  for (const [i, b] of content.entries()) {
    const bp = `${p}[${i}]`;
    if (!isObj(b)) invalid(bp, "must be an object");
    if (b.type === "text") text += textBlock(b, bp);
    else if (b.type === "tool_use") {
      onlyKnown(b, TOOL_USE_KEYS, `${bp}.`);
      const id = str(b.id);
      const name = str(b.name);
      if (!id || !name) invalid(bp, "needs id and name");
      calls.push({ id, type: "function", function: { name, arguments: JSON.stringify(b.input ?? {}) } });
    } else unsupported(bp, `blocks of type ${String(b.type)}`);
  }
  const m: Json = { role: "assistant", content: text === "" && calls.length > 0 ? null : text };
  if (calls.length > 0) m.tool_calls = calls;
  return m;
}

const ANTHROPIC_TOOL_KEYS = new Set([
  "type",
  "name",
  "description",
  "input_schema",
  "strict",
  "cache_control",
]);

function anthropicTools(tools: unknown): Json[] | undefined {
  if (isDefault(tools)) return undefined;
  if (!Array.isArray(tools)) return invalid("tools", "must be an array");
  if (tools.length === 0) return undefined;
  return tools.map((t, i) => {
    const p = `tools[${i}]`;
    // Server tools (web_search_..., bash_..., text_editor_...) run at Anthropic; OpenAI cannot.
    if (!isObj(t) || !isDefault(t.type, "custom"))
      return unsupported(p, `tools of type ${String(isObj(t) && t.type)}`);
    onlyKnown(t, ANTHROPIC_TOOL_KEYS, `${p}.`);
    const name = str(t.name);
    if (!name) return invalid(`${p}.name`, "must be a string");
    if (!isObj(t.input_schema)) return invalid(`${p}.input_schema`, "must be an object");
    const fn: Json = { name, parameters: t.input_schema };
    if (typeof t.description === "string") fn.description = t.description;
    if (t.strict === true) fn.strict = true;
    return { type: "function", function: fn };
  });
}

const CHOICE_KEYS = new Set(["type", "name", "disable_parallel_tool_use"]);

function toolChoice(choice: unknown, hasTools: boolean, out: Json): void {
  if (isDefault(choice)) return;
  if (!isObj(choice)) invalid("tool_choice", "must be an object");
  onlyKnown(choice, CHOICE_KEYS, "tool_choice.");
  if (choice.type === "none") out.tool_choice = "none";
  else if (choice.type === "auto") out.tool_choice = "auto";
  else if (choice.type === "any") out.tool_choice = "required";
  else if (choice.type === "tool" && typeof choice.name === "string")
    out.tool_choice = { type: "function", function: { name: choice.name } };
  else invalid("tool_choice", `tool_choice of type ${String(choice.type)}`);
  if (!hasTools && choice.type !== "none") invalid("tool_choice", "is only allowed when tools are given");
  if (choice.disable_parallel_tool_use === true && hasTools) out.parallel_tool_calls = false;
}

/** Chat's usage → Anthropic's (input_tokens excludes what was read from or written to the cache). */
export function anthropicUsageBody(u: Usage, cacheWrite: number): Json {
  return {
    input_tokens: Math.max(0, u.input - u.cached - cacheWrite),
    output_tokens: u.output,
    cache_creation_input_tokens: cacheWrite,
    cache_read_input_tokens: u.cached,
  };
}

export function cacheWriteOf(u: unknown): number {
  return isObj(u) && isObj(u.prompt_tokens_details) ? num(u.prompt_tokens_details.cache_write_tokens) : 0;
}

export function messageId(upstream: unknown): string {
  return `msg_${typeof upstream === "string" && upstream !== "" ? upstream.replace(/^chatcmpl-/, "") : "lane"}`;
}

/** A chat completion → Anthropic's whole message. */
export function chatToAnthropicResponse(body: unknown, model: string): { body: Json; usage: Usage } {
  const b = isObj(body) ? body : {};
  const usage = chatUsage(b.usage);
  const choice = Array.isArray(b.choices) && isObj(b.choices[0]) ? b.choices[0] : {};
  const message = isObj(choice.message) ? choice.message : {};
  const content: Json[] = [];
  const refusal = str(message.refusal);
  const text = refusal ?? str(message.content) ?? "";
  if (text !== "") content.push({ type: "text", text, citations: null });
  for (const c of Array.isArray(message.tool_calls) ? message.tool_calls : []) {
    if (!isObj(c) || !isObj(c.function)) continue;
    content.push({
      type: "tool_use",
      id: str(c.id) ?? "",
      name: str(c.function.name) ?? "",
      input: parseArguments(c.function.arguments),
    });
  }
  const stopReason = refusal !== undefined ? "refusal" : stopReasonOf(choice.finish_reason);
  return {
    usage,
    body: {
      id: messageId(b.id),
      type: "message",
      role: "assistant",
      model,
      content,
      stop_reason: stopReason,
      stop_sequence: null,
      stop_details: null,
      container: null,
      usage: anthropicUsageBody(usage, cacheWriteOf(b.usage)),
    },
  };
}

/** OpenAI's error → Anthropic's. */
export function openaiToAnthropicError(status: number, body: unknown): Json {
  return anthropicError(status, errorMessage(body, status));
}
