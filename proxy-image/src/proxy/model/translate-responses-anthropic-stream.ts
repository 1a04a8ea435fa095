// Anthropic's event stream → OpenAI responses streaming events, event by event: each Anthropic
// content block becomes one output item (text → a message item with one output_text part,
// tool_use → a function_call item). Every event is sent the moment its upstream event arrives.
// The format's `.done` events and response.completed repeat the finished items in full, so the
// text of each block is kept until its block ends, and finished items until the answer ends:
// memory is bounded by the answer (itself bounded by max_output_tokens), never by the stream.
import {
  AnthropicStream,
  isObj,
  type Json,
  nowSeconds,
  num,
  responsesUsageBody,
  str,
} from "./translate-common";
import {
  functionCallItem,
  messageItem,
  responseIds,
  responseObject,
  responseStatus,
} from "./translate-responses-anthropic";
import type { SseEvent, StreamTranslator } from "./translate-types";

interface Open {
  kind: "text" | "tool";
  outputIndex: number;
  itemId: string;
  callId: string;
  name: string;
  buf: string;
}

export function anthropicToResponsesStream(opts: { model: string }): StreamTranslator {
  let ids = responseIds(undefined);
  const createdAt = nowSeconds();
  const s = new AnthropicStream();
  let seq = 0;
  let stopReason: unknown = null;
  const open = new Map<number, Open>();
  const done: Json[] = [];

  const emit = (type: string, fields: Json): SseEvent => ({
    event: type,
    data: JSON.stringify({ type, sequence_number: seq++, ...fields }),
  });

  const fail = (code: string, message: string): SseEvent[] => {
    s.failed = true;
    return [emit("error", { code, message, param: null })];
  };

  return s.translator({
    start(msg) {
      ids = responseIds(msg.id);
      const response = responseObject(ids.response, opts.model, createdAt, [], inProgress, null);
      return [emit("response.created", { response }), emit("response.in_progress", { response })];
    },
    event(ev) {
      switch (ev.type) {
        case "content_block_start": {
          const block = isObj(ev.content_block) ? ev.content_block : {};
          const index = num(ev.index);
          const outputIndex = done.length + open.size;
          const itemId = ids.item(index);
          if (block.type === "text") {
            const initial = str(block.text) ?? "";
            open.set(index, { kind: "text", outputIndex, itemId, callId: "", name: "", buf: initial });
            const first =
              initial === ""
                ? []
                : [
                    emit("response.output_text.delta", {
                      item_id: itemId,
                      output_index: outputIndex,
                      content_index: 0,
                      delta: initial,
                      logprobs: [],
                    }),
                  ];
            return [
              emit("response.output_item.added", {
                output_index: outputIndex,
                item: { ...messageItem(itemId, "", "in_progress"), content: [] },
              }),
              emit("response.content_part.added", {
                item_id: itemId,
                output_index: outputIndex,
                content_index: 0,
                part: { type: "output_text", text: "", annotations: [], logprobs: [] },
              }),
              ...first,
            ];
          }
          if (block.type === "tool_use") {
            const callId = str(block.id) ?? "";
            const name = str(block.name) ?? "";
            open.set(index, { kind: "tool", outputIndex, itemId, callId, name, buf: "" });
            return [
              emit("response.output_item.added", {
                output_index: outputIndex,
                item: functionCallItem(itemId, callId, name, "", "in_progress"),
              }),
            ];
          }
          // thinking / redacted_thinking: private reasoning; not surfaced (see the limits table).
          return [];
        }
        case "content_block_delta": {
          const o = open.get(num(ev.index));
          const delta = isObj(ev.delta) ? ev.delta : {};
          if (!o) return [];
          if (o.kind === "text" && delta.type === "text_delta" && typeof delta.text === "string") {
            o.buf += delta.text;
            return [
              emit("response.output_text.delta", {
                item_id: o.itemId,
                output_index: o.outputIndex,
                content_index: 0,
                delta: delta.text,
                logprobs: [],
              }),
            ];
          }
          if (
            o.kind === "tool" &&
            delta.type === "input_json_delta" &&
            typeof delta.partial_json === "string"
          ) {
            if (delta.partial_json === "") return [];
            o.buf += delta.partial_json;
            return [
              emit("response.function_call_arguments.delta", {
                item_id: o.itemId,
                output_index: o.outputIndex,
                delta: delta.partial_json,
              }),
            ];
          }
          return [];
        }
        case "content_block_stop": {
          const index = num(ev.index);
          const o = open.get(index);
          if (!o) return [];
          open.delete(index);
          const base = { item_id: o.itemId, output_index: o.outputIndex };
          if (o.kind === "text") {
            const item = messageItem(o.itemId, o.buf, "completed");
            done.push(item);
            const part = { type: "output_text", text: o.buf, annotations: [], logprobs: [] };
            return [
              emit("response.output_text.done", { ...base, content_index: 0, text: o.buf, logprobs: [] }),
              emit("response.content_part.done", { ...base, content_index: 0, part }),
              emit("response.output_item.done", { output_index: o.outputIndex, item }),
            ];
          }
          // Anthropic sends no input_json_delta for a call without arguments: its input is {}.
          const args = o.buf === "" ? "{}" : o.buf;
          const item = functionCallItem(o.itemId, o.callId, o.name, args, "completed");
          done.push(item);
          return [
            emit("response.function_call_arguments.done", { ...base, arguments: args }),
            emit("response.output_item.done", { output_index: o.outputIndex, item }),
          ];
        }
        case "message_delta": {
          s.readUsage(ev.usage);
          const delta = isObj(ev.delta) ? ev.delta : {};
          if (delta.stop_reason != null) stopReason = delta.stop_reason;
          return [];
        }
        case "message_stop": {
          s.finished = true;
          const status = responseStatus(stopReason);
          const response = responseObject(
            ids.response,
            opts.model,
            createdAt,
            done,
            status,
            responsesUsageBody(s.usage, s.cacheWrite),
          );
          const type = status.status === "completed" ? "response.completed" : "response.incomplete";
          return [emit(type, { response })];
        }
        case "error": {
          const err = isObj(ev.error) ? ev.error : {};
          return fail(str(err.type) ?? "api_error", str(err.message) ?? "the provider's stream failed");
        }
        default:
          return [];
      }
    },
    cut: (why) => fail("api_error", `the provider's stream ${why}`),
    done: () => [],
  });
}

const inProgress = { status: "in_progress", incomplete_details: null };
