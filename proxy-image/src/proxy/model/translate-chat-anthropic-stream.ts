// Anthropic's event stream (message_start, content_block_*, message_delta, message_stop, ping,
// error) → OpenAI chat completion chunks, event by event. State is a few counters and the
// current block's kind: nothing of the answer is kept.

import { chatId } from "./translate-chat-anthropic";
import {
  AnthropicStream,
  anthropicErrorType,
  chatUsageBody,
  finishReasonOf,
  isObj,
  type Json,
  nowSeconds,
  num,
  openaiErrorType,
  str,
} from "./translate-common";
import type { SseEvent, StreamTranslator } from "./translate-types";

export function anthropicToChatStream(opts: { model: string; includeUsage?: boolean }): StreamTranslator {
  let id = chatId(undefined);
  const created = nowSeconds();
  const s = new AnthropicStream();
  // Anthropic's content-block index → chat's tool_calls index (only tool_use blocks have one).
  const toolIndex = new Map<number, number>();
  let finishReason: string | null = null;

  const chunk = (delta: Json, finish: string | null = null): SseEvent => ({
    data: JSON.stringify({
      id,
      object: "chat.completion.chunk",
      created,
      model: opts.model,
      choices: [{ index: 0, delta, finish_reason: finish, logprobs: null }],
    }),
  });

  const error = (type: string, message: string, status: number): SseEvent => {
    s.failed = true;
    return {
      data: JSON.stringify({ error: { message, type: openaiErrorType(status), param: null, code: type } }),
    };
  };

  return s.translator({
    start(msg) {
      id = chatId(msg.id);
      return [chunk({ role: "assistant", content: "" })];
    },
    event(ev) {
      switch (ev.type) {
        case "content_block_start": {
          const block = isObj(ev.content_block) ? ev.content_block : {};
          // A text block normally starts empty; text it starts with is the answer's too.
          if (block.type === "text" && typeof block.text === "string" && block.text !== "")
            return [chunk({ content: block.text })];
          if (block.type !== "tool_use") return [];
          const index = toolIndex.size;
          toolIndex.set(num(ev.index), index);
          return [
            chunk({
              tool_calls: [
                {
                  index,
                  id: str(block.id) ?? "",
                  type: "function",
                  function: { name: str(block.name) ?? "", arguments: "" },
                },
              ],
            }),
          ];
        }
        case "content_block_delta": {
          const delta = isObj(ev.delta) ? ev.delta : {};
          if (delta.type === "text_delta" && typeof delta.text === "string")
            return [chunk({ content: delta.text })];
          if (delta.type === "input_json_delta" && typeof delta.partial_json === "string") {
            const index = toolIndex.get(num(ev.index));
            if (index === undefined || delta.partial_json === "") return [];
            return [chunk({ tool_calls: [{ index, function: { arguments: delta.partial_json } }] })];
          }
          // thinking_delta / signature_delta: private reasoning, not part of a chat answer.
          return [];
        }
        case "message_delta": {
          s.readUsage(ev.usage);
          const delta = isObj(ev.delta) ? ev.delta : {};
          if (delta.stop_reason == null) return [];
          finishReason = finishReasonOf(delta.stop_reason);
          return [chunk({}, finishReason)];
        }
        case "message_stop": {
          s.finished = true;
          const out: SseEvent[] = [];
          if (finishReason === null) out.push(chunk({}, "stop"));
          if (opts.includeUsage)
            out.push({
              data: JSON.stringify({
                id,
                object: "chat.completion.chunk",
                created,
                model: opts.model,
                choices: [],
                usage: chatUsageBody(s.usage, s.cacheWrite),
              }),
            });
          return out;
        }
        case "error": {
          const err = isObj(ev.error) ? ev.error : {};
          const type = str(err.type) ?? "api_error";
          const status = type === "overloaded_error" ? 529 : type === "rate_limit_error" ? 429 : 500;
          return [error(type, str(err.message) ?? "the provider's stream failed", status)];
        }
        default:
          // ping, content_block_stop, and event types added later: nothing to say in chat.
          return [];
      }
    },
    // A stream cut short must not look complete: OpenAI's SDK raises on an error chunk.
    cut: (why) => [error(anthropicErrorType(502), `the provider's stream ${why}`, 502)],
    done: () => [{ data: "[DONE]" }],
  });
}
