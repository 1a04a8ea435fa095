import type Anthropic from "@anthropic-ai/sdk";
import type { ModelProvider } from "@benchwright/shared/contract/policy";
import type { ModelCallRow } from "@benchwright/shared/contract/proxy-wire";
import type OpenAI from "openai";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { TEXT_DELTAS, TOOL_ARGS, TOOL_RESULT_PREFIX } from "../fixtures/contract-server";
import {
  ANTHROPIC_USAGE,
  CANARY,
  type LaneSetup,
  MODEL,
  OPENAI_USAGE,
  startLane,
  TOOL_RESULT,
  WEATHER_TOOL,
} from "./model-sdk";

// The official SDKs (openai, @anthropic-ai/sdk), unmodified but for the base URL and the
// placeholder key a run's commands get, against the real proxy's model lane, in all four
// combinations of caller format and provider (and the responses API to Anthropic): a plain
// answer, a stream, tool use (a tool call, the result sent back, the final text), and tool use
// streamed. The contract servers refuse what the real APIs refuse, so a translation that sends
// something the provider would reject fails here. Every row's tokens are the provider's usage.

const HELLO = TEXT_DELTAS.join("");
const FINAL = `${TOOL_RESULT_PREFIX}${TOOL_RESULT}`;
const anthropicUsage = {
  inputTokens:
    ANTHROPIC_USAGE.input_tokens +
    ANTHROPIC_USAGE.cache_read_input_tokens +
    ANTHROPIC_USAGE.cache_creation_input_tokens,
  outputTokens: ANTHROPIC_USAGE.output_tokens,
  cachedInputTokens: ANTHROPIC_USAGE.cache_read_input_tokens,
};
const usageOf = (provider: ModelProvider, endpoint: "chat.completions" | "responses") =>
  provider === "anthropic"
    ? anthropicUsage
    : {
        inputTokens: OPENAI_USAGE[endpoint].input,
        outputTokens: OPENAI_USAGE[endpoint].output,
        cachedInputTokens: OPENAI_USAGE[endpoint].cached,
      };

/** Everything an SDK handed back to the test, to be searched for the key. */
const sdkSaw: string[] = [];
const saw = <T>(value: T): T => {
  sdkSaw.push(JSON.stringify(value));
  return value;
};

afterEach(() => {
  for (const text of sdkSaw.splice(0)) expect(text).not.toContain(CANARY);
});

/** Checks the calls since `from`: each reached the provider with the vault key and none of the placeholder. */
function expectCalls(lane: LaneSetup, from: number, endpoint: string, count: number): ModelCallRow[] {
  const sent = lane.server.calls.slice(from);
  expect(sent).toHaveLength(count);
  for (const c of sent) {
    expect(c).toMatchObject({
      keyPresent: true,
      keyMatches: true,
      placeholderSent: false,
      model: lane.spec.upstreamModel,
    });
    expect(c.status, JSON.stringify(c.body)).toBe(200);
  }
  const rows = lane.proxy.audit.modelCalls.slice(from);
  expect(rows).toHaveLength(count);
  for (const r of rows)
    expect(r).toMatchObject({
      model: MODEL,
      provider: lane.spec.provider,
      endpoint,
      refused: null,
      status: 200,
    });
  return rows;
}

const openaiTools: OpenAI.Chat.ChatCompletionTool[] = [{ type: "function", function: { ...WEATHER_TOOL } }];
const anthropicTools: Anthropic.Tool[] = [
  { name: WEATHER_TOOL.name, description: WEATHER_TOOL.description, input_schema: WEATHER_TOOL.parameters },
];
const ask = "What is the weather in Paris?";

for (const provider of ["openai", "anthropic"] as const) {
  describe(`OpenAI SDK, chat completions → ${provider} provider`, () => {
    let lane: LaneSetup;
    beforeAll(async () => {
      lane = await startLane(provider);
    });
    afterAll(() => lane.close());
    const usage = () => usageOf(provider, "chat.completions");

    it("plain: the answer, the provider's usage in the row and in the answer", async () => {
      const from = lane.server.calls.length;
      const answer = saw(
        await lane.openai.chat.completions.create({
          model: MODEL,
          messages: [{ role: "user", content: "Say hello." }],
        }),
      );
      expect(answer.choices[0]?.message.content).toBe(HELLO);
      expect(answer.choices[0]?.finish_reason).toBe("stop");
      expect(answer.usage).toMatchObject({
        prompt_tokens: usage().inputTokens,
        completion_tokens: usage().outputTokens,
      });
      expect(answer.usage?.prompt_tokens_details?.cached_tokens).toBe(usage().cachedInputTokens);
      const [row] = expectCalls(lane, from, "chat.completions", 1);
      expect(row).toMatchObject({ stream: false, ...usage() });
    });

    it("streaming: deltas as they come, the usage counted", async () => {
      const from = lane.server.calls.length;
      const stream = await lane.openai.chat.completions.create({
        model: MODEL,
        messages: [
          { role: "system", content: "Be brief." },
          { role: "user", content: "Say hello." },
        ],
        stream: true,
        stream_options: { include_usage: true },
      });
      const deltas: string[] = [];
      let finish: string | null = null;
      let reported: OpenAI.CompletionUsage | null | undefined = null;
      for await (const chunk of stream) {
        saw(chunk);
        const c = chunk.choices[0];
        if (c?.delta.content) deltas.push(c.delta.content);
        if (c?.finish_reason) finish = c.finish_reason;
        if (chunk.usage) reported = chunk.usage;
      }
      expect(deltas.join("")).toBe(HELLO);
      expect(deltas.length).toBeGreaterThan(1);
      expect(finish).toBe("stop");
      expect(reported).toMatchObject({
        prompt_tokens: usage().inputTokens,
        completion_tokens: usage().outputTokens,
      });
      const [row] = expectCalls(lane, from, "chat.completions", 1);
      expect(row).toMatchObject({ stream: true, ...usage() });
    });

    it("tool use: a tool call, the result sent back, the final text", async () => {
      const from = lane.server.calls.length;
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: ask }];
      const first = saw(
        await lane.openai.chat.completions.create({ model: MODEL, messages, tools: openaiTools }),
      );
      const call = first.choices[0]?.message.tool_calls?.[0];
      expect(first.choices[0]?.finish_reason).toBe("tool_calls");
      expect(call?.type === "function" && call.function.name).toBe(WEATHER_TOOL.name);
      if (call?.type !== "function") throw new Error("no function call");
      expect(JSON.parse(call.function.arguments)).toEqual(TOOL_ARGS);
      messages.push(first.choices[0]?.message as OpenAI.Chat.ChatCompletionMessageParam, {
        role: "tool",
        tool_call_id: call.id,
        content: TOOL_RESULT,
      });
      const second = saw(
        await lane.openai.chat.completions.create({ model: MODEL, messages, tools: openaiTools }),
      );
      expect(second.choices[0]?.message.content).toBe(FINAL);
      expectCalls(lane, from, "chat.completions", 2);
    });

    it("streaming tool use: the call assembled from deltas, then the final text streamed", async () => {
      const from = lane.server.calls.length;
      const messages: OpenAI.Chat.ChatCompletionMessageParam[] = [{ role: "user", content: ask }];
      const runner = lane.openai.chat.completions.stream({ model: MODEL, messages, tools: openaiTools });
      runner.on("chunk", (c) => void saw(c));
      const first = saw(await runner.finalChatCompletion());
      const call = first.choices[0]?.message.tool_calls?.[0];
      if (call?.type !== "function") throw new Error("no function call");
      expect(call.function.name).toBe(WEATHER_TOOL.name);
      expect(JSON.parse(call.function.arguments)).toEqual(TOOL_ARGS);
      // The assistant turn as the API defines it (the helper's message adds its own `parsed`).
      messages.push(
        { role: "assistant", content: null, tool_calls: [call] },
        {
          role: "tool",
          tool_call_id: call.id,
          content: TOOL_RESULT,
        },
      );
      const again = lane.openai.chat.completions.stream({ model: MODEL, messages, tools: openaiTools });
      const deltas: string[] = [];
      again.on("content", (d) => void deltas.push(d));
      saw(await again.finalChatCompletion());
      expect(deltas.join("")).toBe(FINAL);
      expectCalls(lane, from, "chat.completions", 2);
    });

    it("GET /v1/models lists the declared model only", async () => {
      const ids: string[] = [];
      for await (const m of lane.openai.models.list()) ids.push(saw(m).id);
      expect(ids).toEqual([MODEL]);
    });
  });

  describe(`OpenAI SDK, responses → ${provider} provider`, () => {
    let lane: LaneSetup;
    beforeAll(async () => {
      lane = await startLane(provider);
    });
    afterAll(() => lane.close());
    const usage = () => usageOf(provider, "responses");
    const responsesTools: OpenAI.Responses.FunctionTool[] = [
      {
        type: "function",
        name: WEATHER_TOOL.name,
        description: WEATHER_TOOL.description,
        parameters: { ...WEATHER_TOOL.parameters },
        strict: false,
      },
    ];

    it("plain and streaming", async () => {
      const from = lane.server.calls.length;
      const answer = saw(
        await lane.openai.responses.create({ model: MODEL, instructions: "Be brief.", input: "Say hello." }),
      );
      expect(answer.output_text).toBe(HELLO);
      expect(answer.usage).toMatchObject({
        input_tokens: usage().inputTokens,
        output_tokens: usage().outputTokens,
      });
      const stream = await lane.openai.responses.create({ model: MODEL, input: "Say hello.", stream: true });
      const deltas: string[] = [];
      let completed = false;
      for await (const event of stream) {
        saw(event);
        if (event.type === "response.output_text.delta") deltas.push(event.delta);
        if (event.type === "response.completed") completed = true;
      }
      expect(deltas.join("")).toBe(HELLO);
      expect(completed).toBe(true);
      const rows = expectCalls(lane, from, "responses", 2);
      for (const r of rows) expect(r).toMatchObject(usage());
    });

    it("tool use, plain then streamed", async () => {
      const from = lane.server.calls.length;
      const input: OpenAI.Responses.ResponseInput = [{ role: "user", content: ask }];
      const first = saw(await lane.openai.responses.create({ model: MODEL, input, tools: responsesTools }));
      const call = first.output.find((o) => o.type === "function_call");
      if (call?.type !== "function_call") throw new Error("no function call");
      expect(call.name).toBe(WEATHER_TOOL.name);
      expect(JSON.parse(call.arguments)).toEqual(TOOL_ARGS);
      input.push(
        { type: "function_call", call_id: call.call_id, name: call.name, arguments: call.arguments },
        { type: "function_call_output", call_id: call.call_id, output: TOOL_RESULT },
      );
      const second = saw(await lane.openai.responses.create({ model: MODEL, input, tools: responsesTools }));
      expect(second.output_text).toBe(FINAL);
      // The same two turns, streamed.
      const s1 = lane.openai.responses.stream({
        model: MODEL,
        input: [{ role: "user", content: ask }],
        tools: responsesTools,
      });
      s1.on("event", (e) => void saw(e));
      const streamed = saw(await s1.finalResponse());
      const streamedCall = streamed.output.find((o) => o.type === "function_call");
      if (streamedCall?.type !== "function_call") throw new Error("no streamed function call");
      expect(JSON.parse(streamedCall.arguments)).toEqual(TOOL_ARGS);
      const s2 = lane.openai.responses.stream({
        model: MODEL,
        input: [
          { role: "user", content: ask },
          {
            type: "function_call",
            call_id: streamedCall.call_id,
            name: streamedCall.name,
            arguments: streamedCall.arguments,
          },
          { type: "function_call_output", call_id: streamedCall.call_id, output: TOOL_RESULT },
        ],
        tools: responsesTools,
      });
      const deltas: string[] = [];
      s2.on("response.output_text.delta", (e) => void deltas.push(e.delta));
      saw(await s2.finalResponse());
      expect(deltas.join("")).toBe(FINAL);
      expectCalls(lane, from, "responses", 4);
    });
  });

  describe(`Anthropic SDK, messages → ${provider} provider`, () => {
    let lane: LaneSetup;
    beforeAll(async () => {
      lane = await startLane(provider);
    });
    afterAll(() => lane.close());
    const usage = () => usageOf(provider, "chat.completions");
    const reported = () =>
      provider === "anthropic"
        ? { input_tokens: ANTHROPIC_USAGE.input_tokens, output_tokens: ANTHROPIC_USAGE.output_tokens }
        : { output_tokens: usage().outputTokens };

    it("plain: the answer, the provider's usage in the row", async () => {
      const from = lane.server.calls.length;
      const answer = saw(
        await lane.anthropic.messages.create({
          model: MODEL,
          max_tokens: 256,
          system: "Be brief.",
          messages: [{ role: "user", content: "Say hello." }],
        }),
      );
      expect(answer.content).toEqual([expect.objectContaining({ type: "text", text: HELLO })]);
      expect(answer.stop_reason).toBe("end_turn");
      expect(answer.usage).toMatchObject(reported());
      const [row] = expectCalls(lane, from, "messages", 1);
      expect(row).toMatchObject({ stream: false, ...usage() });
    });

    it("streaming: text deltas as they come, the usage counted", async () => {
      const from = lane.server.calls.length;
      const stream = lane.anthropic.messages.stream({
        model: MODEL,
        max_tokens: 256,
        messages: [{ role: "user", content: "Say hello." }],
      });
      const deltas: string[] = [];
      stream.on("streamEvent", (e) => void saw(e));
      stream.on("text", (d) => void deltas.push(d));
      const final = saw(await stream.finalMessage());
      expect(deltas.join("")).toBe(HELLO);
      expect(deltas.length).toBeGreaterThan(1);
      expect(final.stop_reason).toBe("end_turn");
      expect(final.usage.output_tokens).toBe(usage().outputTokens);
      const [row] = expectCalls(lane, from, "messages", 1);
      expect(row).toMatchObject({ stream: true, ...usage() });
    });

    it("tool use: a tool_use block, the tool_result sent back, the final text", async () => {
      const from = lane.server.calls.length;
      const messages: Anthropic.MessageParam[] = [{ role: "user", content: ask }];
      const first = saw(
        await lane.anthropic.messages.create({
          model: MODEL,
          max_tokens: 256,
          messages,
          tools: anthropicTools,
        }),
      );
      expect(first.stop_reason).toBe("tool_use");
      const use = first.content.find((b) => b.type === "tool_use");
      if (use?.type !== "tool_use") throw new Error("no tool_use");
      expect(use).toMatchObject({ name: WEATHER_TOOL.name, input: TOOL_ARGS });
      messages.push(
        { role: "assistant", content: first.content },
        { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: TOOL_RESULT }] },
      );
      const second = saw(
        await lane.anthropic.messages.create({
          model: MODEL,
          max_tokens: 256,
          messages,
          tools: anthropicTools,
        }),
      );
      expect(second.content).toEqual([expect.objectContaining({ type: "text", text: FINAL })]);
      expectCalls(lane, from, "messages", 2);
    });

    it("streaming tool use: the input assembled from JSON deltas, then the final text streamed", async () => {
      const from = lane.server.calls.length;
      const messages: Anthropic.MessageParam[] = [{ role: "user", content: ask }];
      const s1 = lane.anthropic.messages.stream({
        model: MODEL,
        max_tokens: 256,
        messages,
        tools: anthropicTools,
      });
      s1.on("streamEvent", (e) => void saw(e));
      const first = saw(await s1.finalMessage());
      const use = first.content.find((b) => b.type === "tool_use");
      if (use?.type !== "tool_use") throw new Error("no tool_use");
      expect(use).toMatchObject({ name: WEATHER_TOOL.name, input: TOOL_ARGS });
      messages.push(
        { role: "assistant", content: first.content },
        {
          role: "user",
          content: [
            { type: "tool_result", tool_use_id: use.id, content: [{ type: "text", text: TOOL_RESULT }] },
          ],
        },
      );
      const s2 = lane.anthropic.messages.stream({
        model: MODEL,
        max_tokens: 256,
        messages,
        tools: anthropicTools,
      });
      const deltas: string[] = [];
      s2.on("text", (d) => void deltas.push(d));
      saw(await s2.finalMessage());
      expect(deltas.join("")).toBe(FINAL);
      expectCalls(lane, from, "messages", 2);
    });

    it("GET /v1/models lists the declared model only, in Anthropic's format", async () => {
      const ids: string[] = [];
      for await (const m of lane.anthropic.models.list()) ids.push(saw(m).id);
      expect(ids).toEqual([MODEL]);
    });
  });
}
