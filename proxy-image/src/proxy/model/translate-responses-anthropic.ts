// OpenAI responses (the caller) → Anthropic Messages (the provider, 2023-06-01): the request,
// the whole answer as a Response object. The lane is stateless, so everything that needs
// OpenAI's stored state (previous_response_id, conversation, store, background) is refused.
import {
  anthropicUsage,
  invalid,
  isDefault,
  isObj,
  type Json,
  nowSeconds,
  num,
  onlyKnown,
  responsesUsageBody,
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

const KNOWN = new Set([
  ...SHARED_FIELDS,
  "input",
  "instructions",
  "max_output_tokens",
  // Accepted only at their defaults (checked in defaults()).
  "store",
  "text",
  "truncation",
  "include",
  "top_logprobs",
  "background",
]);

function defaults(body: Json): void {
  // store defaults to true in OpenAI's API, but nothing is stored here: the answer is the same
  // and only the later retrieval is impossible, which previous_response_id (refused) would need.
  if (!isDefault(body.background, false)) unsupported("background", "background responses");
  if (!isDefault(body.truncation, "disabled")) unsupported("truncation", "automatic truncation");
  if (!isDefault(body.top_logprobs, 0)) unsupported("top_logprobs", "log probabilities");
  if (!isDefault(body.include) && !(Array.isArray(body.include) && body.include.length === 0))
    unsupported("include", "extra output data");
  const text = body.text;
  if (!isDefault(text)) {
    if (!isObj(text)) invalid("text", "must be an object");
    onlyKnown(text, TEXT_KEYS, "text.");
    if (!isDefault(text.format) && !(isObj(text.format) && text.format.type === "text"))
      unsupported("text.format", `format ${isObj(text.format) ? String(text.format.type) : "given"}`);
    if (!isDefault(text.verbosity, "medium")) unsupported("text.verbosity", "verbosity");
  }
}
const TEXT_KEYS = new Set(["format", "verbosity"]);

export function responsesToAnthropicRequest(body: Json, opts: RequestOptions): RequestResult {
  return anthropicRequest(body, opts, {
    known: KNOWN,
    defaults,
    conversation: (b) => {
      const system: Json[] = [];
      if (!isDefault(b.instructions, "")) {
        if (typeof b.instructions !== "string") invalid("instructions", "must be a string");
        system.push({ type: "text", text: b.instructions });
      }
      return { system, turns: input(b.input, system) };
    },
    maxTokensFields: ["max_output_tokens"],
    tools: responsesTools,
    choiceName: (c) => (c.type === "function" ? str(c.name) : undefined),
  });
}

function responsesTools(tools: unknown): Json[] | undefined {
  if (isDefault(tools)) return undefined;
  if (!Array.isArray(tools)) return invalid("tools", "must be an array");
  if (tools.length === 0) return undefined;
  return tools.map((t, i) => {
    // Built-in tools (web_search, file_search, computer, mcp...) run at OpenAI; Anthropic cannot.
    if (!isObj(t) || t.type !== "function")
      return unsupported(`tools[${i}]`, `tools of type ${isObj(t) ? String(t.type) : "?"}`);
    const { type: _type, ...fn } = t;
    return anthropicTool(fn, `tools[${i}]`);
  });
}

const MESSAGE_KEYS = new Set(["type", "role", "content", "id", "status"]);
const CALL_KEYS = new Set(["type", "id", "call_id", "name", "arguments", "status"]);
const OUTPUT_KEYS = new Set(["type", "id", "call_id", "output", "status"]);
const TEXT_PARTS = new Set(["input_text", "output_text"]);

/** `input` (a string or items) → alternating turns; system/developer items go to `system`. */
function input(list: unknown, system: Json[]): Turns["list"] {
  const turns = new Turns();
  if (typeof list === "string") {
    turns.add("user", [{ type: "text", text: list }]);
    return turns.list;
  }
  if (!Array.isArray(list) || list.length === 0)
    return invalid("input", "must be a string or a non-empty array");
  for (const [i, item] of list.entries()) {
    const p = `input[${i}]`;
    if (!isObj(item)) invalid(p, "must be an object");
    const type = item.type ?? "message";
    if (type === "message") {
      onlyKnown(item, MESSAGE_KEYS, `${p}.`);
      const role = String(item.role);
      if (role === "system" || role === "developer") {
        if (turns.list.length > 0)
          unsupported(p, "a system or developer message after the conversation began");
        system.push({ type: "text", text: textOf(item.content, `${p}.content`, TEXT_PARTS) });
      } else if (role === "user") turns.add("user", userBlocks(item.content, `${p}.content`));
      else if (role === "assistant") {
        const text = assistantText(item.content, `${p}.content`);
        if (text !== "") turns.add("assistant", [{ type: "text", text }]);
      } else unsupported(`${p}.role`, `role ${role}`);
    } else if (type === "function_call") {
      onlyKnown(item, CALL_KEYS, `${p}.`);
      const id = str(item.call_id);
      const name = str(item.name);
      if (!id || !name) invalid(p, "needs call_id and name");
      turns.add("assistant", [
        { type: "tool_use", id, name, input: toolInput(item.arguments, `${p}.arguments`) },
      ]);
    } else if (type === "function_call_output") {
      onlyKnown(item, OUTPUT_KEYS, `${p}.`);
      const id = str(item.call_id);
      if (!id) invalid(`${p}.call_id`, "must be a string");
      turns.add("user", [
        { type: "tool_result", tool_use_id: id, content: toolOutput(item.output, `${p}.output`) },
      ]);
    } else unsupported(p, `input items of type ${String(type)}`);
  }
  return turns.list;
}

function userBlocks(content: unknown, p: string): Json[] {
  if (typeof content === "string") return [{ type: "text", text: content }];
  if (!Array.isArray(content)) return invalid(p, "must be a string or an array of parts");
  return content.map((part, i) => {
    const pp = `${p}[${i}]`;
    if (!isObj(part)) return invalid(pp, "must be an object");
    if (part.type === "input_text") {
      onlyKnown(part, INPUT_TEXT_KEYS, `${pp}.`);
      if (typeof part.text !== "string") return invalid(`${pp}.text`, "must be a string");
      return { type: "text", text: part.text };
    }
    if (part.type === "input_image") {
      onlyKnown(part, INPUT_IMAGE_KEYS, `${pp}.`);
      if (!isDefault(part.file_id)) return unsupported(`${pp}.file_id`, "OpenAI file ids");
      return imageBlock(part.image_url, part.detail, pp);
    }
    return unsupported(pp, `content parts of type ${String(part.type)}`);
  });
}
const INPUT_TEXT_KEYS = new Set(["type", "text"]);
const INPUT_IMAGE_KEYS = new Set(["type", "image_url", "detail", "file_id"]);

/** An earlier answer sent back: a string or output_text parts (annotations/logprobs are output-only). */
function assistantText(content: unknown, p: string): string {
  if (typeof content === "string") return content;
  if (!Array.isArray(content)) return invalid(p, "must be a string or an array of parts");
  return content
    .map((part, i) => {
      if (!isObj(part) || !TEXT_PARTS.has(String(part.type)) || typeof part.text !== "string")
        return unsupported(`${p}[${i}]`, "only text parts can be translated here");
      if (Array.isArray(part.annotations) && part.annotations.length > 0)
        unsupported(`${p}[${i}].annotations`, "annotations");
      return part.text;
    })
    .join("");
}

function toolOutput(output: unknown, p: string): string | Json[] {
  if (typeof output === "string") return output;
  if (!Array.isArray(output)) return invalid(p, "must be a string or an array of parts");
  return userBlocks(output, p);
}

/** Ids derived from the provider's message id, so one answer's ids are stable and distinct. */
export function responseIds(upstream: unknown): { response: string; item: (i: number) => string } {
  const base = typeof upstream === "string" && upstream !== "" ? upstream.replace(/^msg_/, "") : "lane";
  return { response: `resp_${base}`, item: (i) => `item_${base}_${i}` };
}

/** status and incomplete_details of a response, from Anthropic's stop_reason. */
export function responseStatus(stopReason: unknown): { status: string; incomplete_details: Json | null } {
  if (stopReason === "max_tokens" || stopReason === "model_context_window_exceeded")
    return { status: "incomplete", incomplete_details: { reason: "max_output_tokens" } };
  if (stopReason === "refusal")
    return { status: "incomplete", incomplete_details: { reason: "content_filter" } };
  return { status: "completed", incomplete_details: null };
}

/** The Response object around `output`, with the fields OpenAI always sends. */
export function responseObject(
  id: string,
  model: string,
  createdAt: number,
  output: Json[],
  status: { status: string; incomplete_details: Json | null },
  usage: Json | null,
): Json {
  return {
    id,
    object: "response",
    created_at: createdAt,
    status: status.status,
    error: null,
    incomplete_details: status.incomplete_details,
    instructions: null,
    max_output_tokens: null,
    model,
    output,
    parallel_tool_calls: true,
    previous_response_id: null,
    reasoning: { effort: null, summary: null },
    store: false,
    temperature: null,
    text: { format: { type: "text" } },
    tool_choice: "auto",
    tools: [],
    top_p: null,
    truncation: "disabled",
    usage,
    metadata: {},
  };
}

export function messageItem(id: string, text: string, status: string): Json {
  return {
    type: "message",
    id,
    status,
    role: "assistant",
    content: [{ type: "output_text", text, annotations: [], logprobs: [] }],
  };
}

export function functionCallItem(
  id: string,
  callId: string,
  name: string,
  args: string,
  status: string,
): Json {
  return { type: "function_call", id, call_id: callId, name, arguments: args, status };
}

/** Anthropic's whole message → a Response. */
export function anthropicToResponsesResponse(body: unknown, model: string): { body: Json; usage: Usage } {
  const msg = isObj(body) ? body : {};
  const usage = anthropicUsage(msg.usage);
  const ids = responseIds(msg.id);
  const output: Json[] = [];
  const content = Array.isArray(msg.content) ? msg.content : [];
  for (const [i, block] of content.entries()) {
    if (!isObj(block)) continue;
    if (block.type === "text" && typeof block.text === "string")
      output.push(messageItem(ids.item(i), block.text, "completed"));
    else if (block.type === "tool_use")
      output.push(
        functionCallItem(
          ids.item(i),
          str(block.id) ?? "",
          str(block.name) ?? "",
          JSON.stringify(block.input ?? {}),
          "completed",
        ),
      );
  }
  const cacheWrite = isObj(msg.usage) ? num(msg.usage.cache_creation_input_tokens) : 0;
  return {
    usage,
    body: responseObject(
      ids.response,
      model,
      nowSeconds(),
      output,
      responseStatus(msg.stop_reason),
      responsesUsageBody(usage, cacheWrite),
    ),
  };
}
