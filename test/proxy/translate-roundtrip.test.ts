import Anthropic from "@anthropic-ai/sdk";
import { describe, expect, it } from "vitest";
import {
  ANTHROPIC_MESSAGE,
  anthropicToolStream,
  chatToolStream,
  datas,
  fakeFetch,
  pair,
  run,
  sseResponse,
} from "./translate-fixtures";

// Where a translation and its reverse exist (chat ⇄ Anthropic), going there and back must
// give the original meaning back: same turns, tools, choices, answers and counts.

const toAnthropic = pair("openai-chat", "anthropic-messages");
const toChat = pair("anthropic-messages", "openai-chat");
const opts = (upstreamModel: string) => ({ upstreamModel, maxTokensDefault: 1000 });

function req(t: typeof toChat, body: Record<string, unknown>, model: string) {
  const r = t.request(body, opts(model));
  if (!r.ok) throw new Error(r.refusal.message);
  return r.body;
}

describe("round trips", () => {
  it("an Anthropic request through chat and back keeps its meaning", () => {
    const original = {
      model: "claude",
      max_tokens: 300,
      system: [{ type: "text", text: "Be brief." }],
      temperature: 0.4,
      stop_sequences: ["END"],
      metadata: { user_id: "u-9" },
      tools: [
        {
          name: "get_weather",
          description: "Weather",
          input_schema: { type: "object", properties: { city: { type: "string" } } },
        },
      ],
      tool_choice: { type: "any", disable_parallel_tool_use: true },
      messages: [
        { role: "user", content: [{ type: "text", text: "Weather in Oslo?" }] },
        {
          role: "assistant",
          content: [
            { type: "text", text: "Checking." },
            { type: "tool_use", id: "toolu_1", name: "get_weather", input: { city: "Oslo" } },
          ],
        },
        {
          role: "user",
          content: [
            { type: "tool_result", tool_use_id: "toolu_1", content: "-3C" },
            { type: "text", text: "Thanks" },
            { type: "image", source: { type: "base64", media_type: "image/gif", data: "R0lGOD" } },
          ],
        },
      ],
    };
    const back = req(toAnthropic, req(toChat, original, "gpt"), "claude");
    expect(back).toEqual(original);
  });

  it("a chat request through Anthropic and back keeps its meaning", () => {
    const original = {
      model: "gpt",
      max_completion_tokens: 200,
      top_p: 0.5,
      stop: ["x"],
      user: "u-1",
      tools: [
        { type: "function", function: { name: "f", description: "F", parameters: { type: "object" } } },
      ],
      tool_choice: { type: "function", function: { name: "f" } },
      messages: [
        { role: "system", content: "Rules." },
        { role: "user", content: "go" },
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c1", type: "function", function: { name: "f", arguments: '{"a":1}' } }],
        },
        { role: "tool", tool_call_id: "c1", content: "done" },
      ],
    };
    const back = req(toChat, req(toAnthropic, original, "claude"), "gpt");
    expect(back).toEqual({
      ...original,
      messages: [
        original.messages[0],
        // Anthropic content is always blocks: the user's string comes back as one text part.
        { role: "user", content: [{ type: "text", text: "go" }] },
        original.messages[2],
        original.messages[3],
      ],
    });
  });

  it("an Anthropic answer through chat and back is the same message", () => {
    const chat = toAnthropic.response(ANTHROPIC_MESSAGE, { model: "claude-sonnet-4-5" });
    const back = toChat.response(chat.body, { model: "claude-sonnet-4-5" });
    expect(back.usage).toEqual(chat.usage);
    expect(back.body).toMatchObject({
      role: "assistant",
      model: ANTHROPIC_MESSAGE.model,
      content: [
        { type: "text", text: "I'll look it up." },
        {
          type: "tool_use",
          id: ANTHROPIC_MESSAGE.content[1].id,
          name: "get_weather",
          input: { location: "Paris" },
        },
      ],
      stop_reason: "tool_use",
      // Cache writes travel in cache_write_tokens and come back; reads are exact.
      usage: {
        input_tokens: 30,
        output_tokens: 12,
        cache_read_input_tokens: 1000,
        cache_creation_input_tokens: 5,
      },
    });
  });

  it("an Anthropic stream through chat chunks and back accumulates to the same message", async () => {
    const chunks = run(toAnthropic.stream({ model: "claude", includeUsage: true }), anthropicToolStream());
    const back = run(toChat.stream({ model: "claude" }), chunks);
    const f = fakeFetch(() => sseResponse(back));
    const client = new Anthropic({ apiKey: "placeholder", baseURL: "http://lane.invalid", fetch: f.fetch });
    const msg = await client.messages
      .stream({ model: "claude", max_tokens: 10, messages: [{ role: "user", content: "x" }] })
      .finalMessage();
    expect(msg.content).toMatchObject([
      { type: "text", text: "Okay, let's check the weather." },
      {
        type: "tool_use",
        id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
        name: "get_weather",
        input: { location: "San Francisco, CA" },
      },
    ]);
    expect(msg.stop_reason).toBe("tool_use");
    expect(msg.usage).toMatchObject({ input_tokens: 472, output_tokens: 89, cache_read_input_tokens: 100 });
  });

  it("a chat stream through Anthropic events and back has the same deltas", () => {
    const events = run(toChat.stream({ model: "gpt" }), chatToolStream());
    const back = datas(run(toAnthropic.stream({ model: "gpt", includeUsage: true }), events));
    const original = datas(chatToolStream());
    const text = (cs: Record<string, unknown>[]) =>
      cs
        .flatMap((c) => (c.choices as { delta: { content?: string } }[]).map((x) => x.delta.content ?? ""))
        .join("");
    const args = (cs: Record<string, unknown>[]) =>
      cs
        .flatMap(
          (c) =>
            c.choices as { delta: { tool_calls?: { index: number; function?: { arguments?: string } }[] } }[],
        )
        .flatMap((x) => x.delta.tool_calls ?? [])
        .map((tc) => `${tc.index}:${tc.function?.arguments ?? ""}`)
        .join("|");
    expect(text(back)).toBe(text(original));
    expect(args(back)).toBe(args(original));
    expect(back.at(-1)?.usage).toMatchObject({
      prompt_tokens: 82,
      completion_tokens: 17,
      prompt_tokens_details: { cached_tokens: 64 },
    });
  });
});
