// The parts of an Anthropic Messages request (API version 2023-06-01) that OpenAI's chat
// completions and responses share: tools, tool_choice, sampling and the turn list, whose
// consecutive same-role turns are merged because Anthropic wants user and assistant alternating.
import {
  imageSource,
  invalid,
  isDefault,
  isObj,
  type Json,
  onlyKnown,
  Refused,
  str,
  unsupported,
} from "./translate-common";
import type { RequestOptions, RequestResult } from "./translate-types";

/** Anthropic turns being built: consecutive blocks of the same role land in one turn. */
export class Turns {
  readonly list: { role: "user" | "assistant"; content: Json[] }[] = [];

  add(role: "user" | "assistant", blocks: Json[]): void {
    if (blocks.length === 0) return;
    const last = this.list.at(-1);
    if (last && last.role === role) last.content.push(...blocks);
    else this.list.push({ role, content: [...blocks] });
  }
}

const FUNCTION_KEYS = new Set(["name", "description", "parameters", "strict"]);

/** One function definition (chat's `function` object or a responses flat tool) → Anthropic tool. */
export function anthropicTool(fn: Json, param: string): Json {
  onlyKnown(fn, FUNCTION_KEYS, `${param}.`);
  const name = str(fn.name);
  if (!name) invalid(`${param}.name`, "a function needs a name");
  const tool: Json = {
    name,
    // Anthropic requires an object schema; OpenAI's `parameters` may be omitted for "no arguments".
    input_schema: isObj(fn.parameters) ? fn.parameters : { type: "object", properties: {} },
  };
  if (typeof fn.description === "string" && fn.description !== "") tool.description = fn.description;
  // strict (schema-constrained arguments) exists on both sides; false/null is both defaults.
  if (fn.strict === true) tool.strict = true;
  return tool;
}

/**
 * tool_choice (chat's or responses') and parallel_tool_calls → Anthropic's tool_choice. `named`
 * reads the function name out of the caller's named choice.
 */
export function anthropicToolChoice(
  choice: unknown,
  parallel: unknown,
  hasTools: boolean,
  named: (c: Json) => string | undefined,
): Json | undefined {
  if (!isDefault(parallel, true) && parallel !== false) invalid("parallel_tool_calls", "must be a boolean");
  const noParallel = parallel === false;
  if (noParallel && !hasTools) invalid("parallel_tool_calls", "is only allowed when tools are given");
  let out: Json | undefined;
  if (isDefault(choice)) out = noParallel ? { type: "auto" } : undefined;
  else if (choice === "auto") out = { type: "auto" };
  else if (choice === "required") out = { type: "any" };
  // Without tools, "none" is what happens anyway; Anthropic takes no tool_choice without tools.
  else if (choice === "none") return hasTools ? { type: "none" } : undefined;
  else if (isObj(choice)) {
    const name = named(choice);
    if (!name) unsupported("tool_choice", `tool_choice of type ${String(choice.type)}`);
    out = { type: "tool", name };
  } else invalid("tool_choice", "must be none, auto, required or a named function");
  if (out && !hasTools) invalid("tool_choice", "is only allowed when tools are given");
  if (out && noParallel) out.disable_parallel_tool_use = true;
  return out;
}

/** temperature and top_p: the same meaning on both sides, but Anthropic's temperature is 0..1. */
export function sampling(body: Json, out: Json): void {
  if (!isDefault(body.temperature)) {
    const t = body.temperature;
    if (typeof t !== "number") invalid("temperature", "must be a number");
    if (t > 1) unsupported("temperature", "above 1 (Anthropic's range is 0 to 1)");
    out.temperature = t;
  }
  if (!isDefault(body.top_p)) {
    if (typeof body.top_p !== "number") invalid("top_p", "must be a number");
    out.top_p = body.top_p;
  }
}

/** OpenAI's end-user identifier (user, safety_identifier) → Anthropic's metadata.user_id. */
export function endUser(body: Json, out: Json): void {
  const ids = [body.user, body.safety_identifier].filter((v) => !isDefault(v, ""));
  for (const v of ids) if (typeof v !== "string") invalid("user", "must be a string");
  if (ids.length === 2 && ids[0] !== ids[1])
    unsupported("safety_identifier", "differs from user; Anthropic has one end-user id (metadata.user_id)");
  if (ids.length > 0) out.metadata = { user_id: ids[0] };
}

/** OpenAI's `metadata` (stored-completion tags) has no Anthropic counterpart; only {} passes. */
export function noMetadata(v: unknown): void {
  if (isDefault(v)) return;
  if (isObj(v) && Object.keys(v).length === 0) return;
  unsupported("metadata", "OpenAI's metadata tags (Anthropic's metadata holds only user_id)");
}

/** An image given as an OpenAI URL → Anthropic image block. */
export function imageBlock(url: unknown, detail: unknown, param: string): Json {
  if (typeof url !== "string") invalid(`${param}.url`, "must be a string");
  // "auto" is OpenAI's default; low/high change what the model sees and Anthropic has no such knob.
  if (!isDefault(detail, "auto")) unsupported(`${param}.detail`, `detail ${String(detail)}`);
  return { type: "image", source: imageSource(url, `${param}.url`) };
}

/** Tool-call arguments the caller sent back (JSON text) → Anthropic tool_use input (an object). */
export function toolInput(args: unknown, param: string): Json {
  if (args === undefined || args === "") return {};
  if (typeof args !== "string") invalid(param, "must be a JSON string");
  try {
    const v: unknown = JSON.parse(args);
    if (isObj(v)) return v;
  } catch {
    // fall through
  }
  return invalid(param, "must be a JSON object (Anthropic's tool input is an object)");
}

/** Caller's max-token fields (any of `names`, all equal when several) → Anthropic's max_tokens. */
export function maxTokens(body: Json, names: string[], fallback: number): number {
  let value: number | undefined;
  for (const name of names) {
    const v = body[name];
    if (isDefault(v)) continue;
    if (typeof v !== "number" || !Number.isInteger(v) || v < 1) invalid(name, "must be a positive integer");
    if (value !== undefined && value !== v) unsupported(name, `differs from ${names[0]}`);
    value = v;
  }
  return value ?? fallback;
}

/** The top-level fields both OpenAI formats read the same way. */
export const SHARED_FIELDS = [
  "model",
  "temperature",
  "top_p",
  "stream",
  "stream_options",
  "tools",
  "tool_choice",
  "parallel_tool_calls",
  "user",
  "safety_identifier",
  "metadata",
] as const;

/** What differs between chat completions and responses in building an Anthropic request. */
export interface RequestShape {
  known: ReadonlySet<string>;
  /** Fields accepted only at values that change nothing. */
  defaults(body: Json): void;
  /** The caller's conversation → Anthropic's top-level system blocks and turns. */
  conversation(body: Json): { system: Json[]; turns: Turns["list"] };
  /** The caller's names for the output bound, first found wins. */
  maxTokensFields: string[];
  /** Fields of one format only, after sampling (chat's stop sequences). */
  extra?(body: Json, out: Json): void;
  tools(tools: unknown): Json[] | undefined;
  /** The function a named tool_choice names. */
  choiceName(choice: Json): string | undefined;
}

/** A request in either OpenAI format → Anthropic's, or the refusal of what it cannot carry. */
export function anthropicRequest(body: Json, opts: RequestOptions, shape: RequestShape): RequestResult {
  try {
    onlyKnown(body, shape.known);
    shape.defaults(body);
    noMetadata(body.metadata);
    const out: Json = { model: opts.upstreamModel };
    const { system, turns } = shape.conversation(body);
    out.max_tokens = maxTokens(body, shape.maxTokensFields, opts.maxTokensDefault);
    if (system.length > 0) out.system = system;
    out.messages = turns;
    sampling(body, out);
    shape.extra?.(body, out);
    const stream = streamFlags(body);
    if (stream) out.stream = true;
    const tools = shape.tools(body.tools);
    if (tools) out.tools = tools;
    const choice = anthropicToolChoice(body.tool_choice, body.parallel_tool_calls, !!tools, shape.choiceName);
    if (choice) out.tool_choice = choice;
    endUser(body, out);
    return { ok: true, body: out, stream };
  } catch (e) {
    if (e instanceof Refused) return { ok: false, refusal: e.refusal };
    throw e;
  }
}

/** `stream` and `stream_options`; include_usage is honoured by the stream translator. */
export function streamFlags(body: Json): boolean {
  if (!isDefault(body.stream, false, true)) invalid("stream", "must be a boolean");
  const stream = body.stream === true;
  const so = body.stream_options;
  if (!isDefault(so)) {
    if (!isObj(so)) return invalid("stream_options", "must be an object");
    if (!stream) invalid("stream_options", "is only allowed when stream is true");
    onlyKnown(so, STREAM_OPTION_KEYS, "stream_options.");
    // Obfuscation pads deltas against a side channel of OpenAI's own; asking for it and not
    // getting it must not pass unnoticed.
    if (!isDefault(so.include_obfuscation, false))
      unsupported("stream_options.include_obfuscation", "padding");
  }
  return stream;
}
const STREAM_OPTION_KEYS = new Set(["include_usage", "include_obfuscation"]);
