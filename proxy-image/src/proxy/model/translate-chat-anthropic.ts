// OpenAI chat completions (the caller) → Anthropic Messages (the provider, 2023-06-01): the
// request, the whole answer and errors. The stream is in translate-chat-anthropic-stream.ts.
import {
  anthropicUsage,
  chatUsageBody,
  errorCode,
  errorMessage,
  finishReasonOf,
  invalid,
  isDefault,
  isObj,
  type Json,
  nowSeconds,
  num,
  onlyKnown,
  openaiError,
  str,
  textOf,
  unsupported,
} from "./translate-common";
import {
  anthropicRequest,
  anthropicTool,
  imageBlock,
  SHARED_FIELDS,
  Turns,
  toolInput,
} from "./translate-to-anthropic";
import type { RequestOptions, RequestResult, Usage } from "./translate-types";

// Fields read below; any other top-level field is refused by name.
const KNOWN = new Set([
  ...SHARED_FIELDS,
  "messages",
  "max_tokens",
  "max_completion_tokens",
  "stop",
  // Accepted only at their defaults (checked in defaults()).
  "n",
  "logprobs",
  "top_logprobs",
  "frequency_penalty",
  "presence_penalty",
  "logit_bias",
  "response_format",
  "modalities",
  "store",
]);

/** Fields whose default value changes nothing; any other value has no Anthropic equivalent. */
function defaults(body: Json): void {
  if (!isDefault(body.n, 1)) unsupported("n", "more than one choice");
  if (!isDefault(body.logprobs, false)) unsupported("logprobs", "log probabilities");
  if (!isDefault(body.top_logprobs, 0)) unsupported("top_logprobs", "log probabilities");
  if (!isDefault(body.frequency_penalty, 0)) unsupported("frequency_penalty", "frequency penalty");
  if (!isDefault(body.presence_penalty, 0)) unsupported("presence_penalty", "presence penalty");
  if (!isDefault(body.logit_bias) && !(isObj(body.logit_bias) && Object.keys(body.logit_bias).length === 0))
    unsupported("logit_bias", "token biases");
  const format = body.response_format;
  if (!isDefault(format) && !(isObj(format) && format.type === "text"))
    unsupported("response_format", `response_format ${isObj(format) ? String(format.type) : "given"}`);
  const m = body.modalities;
  if (!isDefault(m) && !(Array.isArray(m) && m.length === 1 && m[0] === "text"))
    unsupported("modalities", "output other than text");
  // Anthropic keeps no completions to list later; store: true would promise what cannot be kept.
  if (!isDefault(body.store, false)) unsupported("store", "stored completions");
}

const SYSTEM_PARTS = new Set(["text"]);
const MESSAGE_KEYS: Record<string, Set<string>> = {
  system: new Set(["role", "content"]),
  developer: new Set(["role", "content"]),
  user: new Set(["role", "content"]),
  assistant: new Set(["role", "content", "tool_calls", "refusal"]),
  tool: new Set(["role", "content", "tool_call_id"]),
};

export function chatToAnthropicRequest(body: Json, opts: RequestOptions): RequestResult {
  return anthropicRequest(body, opts, {
    known: KNOWN,
    defaults,
    conversation: (b) => messages(b.messages),
    maxTokensFields: ["max_completion_tokens", "max_tokens"],
    extra: (b, out) => stops(b.stop, out),
    tools: chatTools,
    choiceName: (c) => (c.type === "function" && isObj(c.function) ? str(c.function.name) : undefined),
  });
}

function stops(stop: unknown, out: Json): void {
  if (isDefault(stop)) return;
  const list = typeof stop === "string" ? [stop] : stop;
  if (!Array.isArray(list) || !list.every((s) => typeof s === "string")) invalid("stop", "string or strings");
  if (list.length > 0) out.stop_sequences = list;
}

function chatTools(tools: unknown): Json[] | undefined {
  if (isDefault(tools)) return undefined;
  if (!Array.isArray(tools)) return invalid("tools", "must be an array");
  if (tools.length === 0) return undefined;
  return tools.map((t, i) => {
    if (!isObj(t) || t.type !== "function" || !isObj(t.function))
      return unsupported(`tools[${i}]`, `tools of type ${isObj(t) ? String(t.type) : "?"}`);
    onlyKnown(t, TOOL_KEYS, `tools[${i}].`);
    return anthropicTool(t.function, `tools[${i}].function`);
  });
}
const TOOL_KEYS = new Set(["type", "function"]);

/** Chat messages → Anthropic's top-level system blocks and alternating turns. */
function messages(list: unknown): { system: Json[]; turns: Turns["list"] } {
  if (!Array.isArray(list) || list.length === 0) invalid("messages", "must be a non-empty array");
  const system: Json[] = [];
  const turns = new Turns();
  for (const [i, m] of list.entries()) {
    const p = `messages[${i}]`;
    if (!isObj(m)) invalid(p, "must be an object");
    const role = String(m.role);
    const keys = MESSAGE_KEYS[role];
    if (!keys) unsupported(`${p}.role`, `role ${role}`);
    onlyKnown(m, keys, `${p}.`);
    if (role === "system" || role === "developer") {
      // Anthropic takes instructions only before the conversation (top-level `system`).
      if (turns.list.length > 0) unsupported(p, "a system or developer message after the conversation began");
      system.push({ type: "text", text: textOf(m.content, `${p}.content`, SYSTEM_PARTS) });
    } else if (role === "user") turns.add("user", userBlocks(m.content, `${p}.content`));
    else if (role === "assistant") turns.add("assistant", assistantBlocks(m, p));
    else turns.add("user", [toolResult(m, p)]);
  }
  return { system, turns: turns.list };
}

function userBlocks(content: unknown, p: string): Json[] {
  if (typeof content === "string") return [{ type: "text", text: content }];
  if (!Array.isArray(content)) return invalid(p, "must be a string or an array of parts");
  return content.map((part, i) => {
    const pp = `${p}[${i}]`;
    if (!isObj(part)) return invalid(pp, "must be an object");
    if (part.type === "text") {
      onlyKnown(part, TEXT_KEYS, `${pp}.`);
      if (typeof part.text !== "string") return invalid(`${pp}.text`, "must be a string");
      return { type: "text", text: part.text };
    }
    if (part.type === "image_url" && isObj(part.image_url)) {
      onlyKnown(part, IMAGE_KEYS, `${pp}.`);
      onlyKnown(part.image_url, IMAGE_URL_KEYS, `${pp}.image_url.`);
      return imageBlock(part.image_url.url, part.image_url.detail, `${pp}.image_url`);
    }
    return unsupported(pp, `content parts of type ${String(part.type)}`);
  });
}
const TEXT_KEYS = new Set(["type", "text"]);
const IMAGE_KEYS = new Set(["type", "image_url"]);
const IMAGE_URL_KEYS = new Set(["url", "detail"]);

function assistantBlocks(m: Json, p: string): Json[] {
  if (!isDefault(m.refusal)) unsupported(`${p}.refusal`, "an earlier refusal");
  const blocks: Json[] = [];
  if (!isDefault(m.content)) {
    const text = textOf(m.content, `${p}.content`, SYSTEM_PARTS);
    if (text !== "") blocks.push({ type: "text", text });
  }
  if (!isDefault(m.tool_calls)) {
    if (!Array.isArray(m.tool_calls)) return invalid(`${p}.tool_calls`, "must be an array");
    for (const [j, c] of m.tool_calls.entries()) {
      const cp = `${p}.tool_calls[${j}]`;
      if (!isObj(c) || c.type !== "function" || !isObj(c.function))
        unsupported(cp, "tool calls other than functions");
      const id = str(c.id);
      const name = str(c.function.name);
      if (!id || !name) invalid(cp, "needs id and function.name");
      blocks.push({
        type: "tool_use",
        id,
        name,
        input: toolInput(c.function.arguments, `${cp}.function.arguments`),
      });
    }
  }
  // An assistant turn with nothing in it is an empty string in chat; Anthropic refuses empty text.
  if (blocks.length === 0) unsupported(p, "an assistant message with no content and no tool calls");
  return blocks;
}

function toolResult(m: Json, p: string): Json {
  const id = str(m.tool_call_id);
  if (!id) return invalid(`${p}.tool_call_id`, "must be a string");
  return { type: "tool_result", tool_use_id: id, content: textOf(m.content, `${p}.content`, SYSTEM_PARTS) };
}

/** Anthropic's whole message → a chat completion. */
export function anthropicToChatResponse(body: unknown, model: string): { body: Json; usage: Usage } {
  const msg = isObj(body) ? body : {};
  const usage = anthropicUsage(msg.usage);
  let text = "";
  const toolCalls: Json[] = [];
  for (const block of Array.isArray(msg.content) ? msg.content : []) {
    if (!isObj(block)) continue;
    if (block.type === "text" && typeof block.text === "string") text += block.text;
    else if (block.type === "tool_use")
      toolCalls.push({
        id: str(block.id) ?? "",
        type: "function",
        function: { name: str(block.name) ?? "", arguments: JSON.stringify(block.input ?? {}) },
      });
    // thinking / redacted_thinking: private reasoning chat has no field for (see the limits table).
  }
  const refused = msg.stop_reason === "refusal";
  const message: Json = {
    role: "assistant",
    content: refused || (text === "" && toolCalls.length > 0) ? null : text,
    refusal: refused ? text || "refused" : null,
  };
  if (toolCalls.length > 0) message.tool_calls = toolCalls;
  const cacheWrite = isObj(msg.usage) ? num(msg.usage.cache_creation_input_tokens) : 0;
  return {
    usage,
    body: {
      id: chatId(msg.id),
      object: "chat.completion",
      created: nowSeconds(),
      model,
      choices: [{ index: 0, message, finish_reason: finishReasonOf(msg.stop_reason), logprobs: null }],
      usage: chatUsageBody(usage, cacheWrite),
    },
  };
}

export function chatId(upstream: unknown): string {
  return `chatcmpl-${typeof upstream === "string" && upstream !== "" ? upstream : "lane"}`;
}

/** Anthropic's error → OpenAI's (chat completions and responses share the envelope). */
export function anthropicToOpenaiError(status: number, body: unknown): Json {
  return openaiError(status, errorMessage(body, status), errorCode(body));
}
