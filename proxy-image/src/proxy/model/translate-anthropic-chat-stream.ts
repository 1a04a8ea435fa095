// OpenAI chat completion chunks → Anthropic's event stream, chunk by chunk. A text delta opens
// a text block, each new tool call (a new tool_calls index) a tool_use block; the open block is
// closed when another kind begins. The request asked for include_usage, so the final counts
// arrive in a chunk of their own after finish_reason: message_delta waits for it (or for the
// stream's end), since Anthropic reports the stop reason and the usage in one event.
import { anthropicUsageBody, cacheWriteOf, messageId } from "./translate-anthropic-chat";
import {
  anthropicErrorType,
  chatUsage,
  errorMessage,
  eventJson,
  isObj,
  type Json,
  num,
  sse,
  stopReasonOf,
  str,
} from "./translate-common";
import type { SseEvent, StreamTranslator, Usage } from "./translate-types";

export function chatToAnthropicStream(opts: { model: string }): StreamTranslator {
  let usage: Usage = { input: 0, output: 0, cached: 0 };
  let cacheWrite = 0;
  let started = false;
  let stopReason: string | null = null;
  let stopped = false;
  let failed = false;
  let sawUsage = false;
  let finishSeen = false;
  let refused = false;
  // The open Anthropic block: its index and, for a tool call, chat's tool_calls index.
  let block: { index: number; tool: number | null } | null = null;
  let nextIndex = 0;
  // chat tool_calls index → Anthropic block index, for argument fragments of an earlier call.
  const toolBlocks = new Map<number, number>();

  const start = (id: unknown): SseEvent[] => {
    started = true;
    const message = {
      id: messageId(id),
      type: "message",
      role: "assistant",
      model: opts.model,
      content: [],
      stop_reason: null,
      stop_sequence: null,
      stop_details: null,
      container: null,
      // The counts come with the last chunk; message_delta carries them (input_tokens included).
      usage: anthropicUsageBody(usage, 0),
    };
    return [sse("message_start", { type: "message_start", message })];
  };

  const close = (): SseEvent[] => {
    if (!block) return [];
    const index = block.index;
    block = null;
    return [sse("content_block_stop", { type: "content_block_stop", index })];
  };

  const open = (contentBlock: Json, tool: number | null): SseEvent[] => {
    const out = close();
    const index = nextIndex++;
    block = { index, tool };
    if (tool !== null) toolBlocks.set(tool, index);
    out.push(sse("content_block_start", { type: "content_block_start", index, content_block: contentBlock }));
    return out;
  };

  const text = (t: string): SseEvent[] => {
    if (t === "") return [];
    const out = block && block.tool === null ? [] : open({ type: "text", text: "", citations: null }, null);
    const index = block?.index ?? 0;
    out.push(
      sse("content_block_delta", {
        type: "content_block_delta",
        index,
        delta: { type: "text_delta", text: t },
      }),
    );
    return out;
  };

  const toolCall = (c: Json): SseEvent[] => {
    const tool = num(c.index);
    const fn = isObj(c.function) ? c.function : {};
    const out: SseEvent[] = [];
    let index = toolBlocks.get(tool);
    if (index === undefined) {
      out.push(...open({ type: "tool_use", id: str(c.id) ?? "", name: str(fn.name) ?? "", input: {} }, tool));
      index = toolBlocks.get(tool) ?? 0;
    } else if (block?.index !== index) {
      // Fragments of a call whose block was closed: Anthropic cannot reopen a block.
      return fail(502, "the provider interleaved tool calls, which Anthropic's stream cannot express");
    }
    const args = str(fn.arguments);
    if (args)
      out.push(
        sse("content_block_delta", {
          type: "content_block_delta",
          index,
          delta: { type: "input_json_delta", partial_json: args },
        }),
      );
    return out;
  };

  const finish = (): SseEvent[] => {
    stopped = true;
    const out = close();
    out.push(
      sse("message_delta", {
        type: "message_delta",
        delta: { stop_reason: stopReason ?? "end_turn", stop_sequence: null },
        usage: anthropicUsageBody(usage, cacheWrite),
      }),
      sse("message_stop", { type: "message_stop" }),
    );
    return out;
  };

  const fail = (status: number, message: string): SseEvent[] => {
    failed = true;
    return [sse("error", { type: "error", error: { type: anthropicErrorType(status), message } })];
  };

  return {
    usage: () => ({ ...usage }),
    push(e: SseEvent): SseEvent[] {
      if (failed || stopped) return [];
      if (e.data === "[DONE]") return finishSeen ? finish() : [];
      const chunk = eventJson(e);
      if (!chunk) return [];
      if (isObj(chunk.error)) {
        // Only the kind is read, to pick Anthropic's error type; the message is all that is copied.
        const limited = chunk.error.code === "rate_limit_exceeded" || chunk.error.type === "rate_limit_error";
        const status = limited ? 429 : 500;
        return fail(status, errorMessage(chunk, status));
      }
      const out = started ? [] : start(chunk.id);
      const choice = Array.isArray(chunk.choices) && isObj(chunk.choices[0]) ? chunk.choices[0] : null;
      if (choice) {
        const delta = isObj(choice.delta) ? choice.delta : {};
        if (typeof delta.content === "string") out.push(...text(delta.content));
        if (typeof delta.refusal === "string") {
          // A refusal is text to an Anthropic client, with stop_reason "refusal".
          refused = true;
          out.push(...text(delta.refusal));
        }
        if (Array.isArray(delta.tool_calls))
          for (const c of delta.tool_calls) if (isObj(c) && !failed) out.push(...toolCall(c));
        if (failed) return out;
        if (choice.finish_reason != null) {
          finishSeen = true;
          stopReason = refused ? "refusal" : stopReasonOf(choice.finish_reason);
        }
      }
      if (isObj(chunk.usage)) {
        usage = chatUsage(chunk.usage);
        cacheWrite = cacheWriteOf(chunk.usage);
        // Some OpenAI-compatible servers send running counts on every chunk: only counts at or
        // after finish_reason are final.
        if (finishSeen) sawUsage = true;
      }
      if (finishSeen && sawUsage) out.push(...finish());
      return out;
    },
    end(): SseEvent[] {
      if (failed || stopped) return [];
      // Finished without a usage chunk (a provider that ignores include_usage): close anyway.
      if (finishSeen) return finish();
      return fail(
        502,
        started
          ? "the provider's stream ended before the answer was complete"
          : "the provider's stream was empty",
      );
    },
  };
}
