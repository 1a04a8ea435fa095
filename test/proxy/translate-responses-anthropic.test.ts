import OpenAI from "openai";
import { describe, expect, it } from "vitest";
import {
  ANTHROPIC_MESSAGE,
  anthropicTextStream,
  anthropicToolStream,
  at,
  datas,
  ev,
  fakeFetch,
  jsonResponse,
  pair,
  requests,
  run,
  sseResponse,
} from "./translate-fixtures";

// OpenAI responses callers in front of an Anthropic provider.

const t = pair("openai-responses", "anthropic-messages");
const opts = { upstreamModel: "claude-sonnet-4-5", maxTokensDefault: 2048 };

const { ok, refusal } = requests(t, opts);

describe("responses → Anthropic request", () => {
  it("takes a string input, instructions and max_output_tokens", () => {
    const r = ok({
      model: "declared",
      input: "Tell me a joke",
      instructions: "Be funny.",
      max_output_tokens: 300,
    });
    expect(r.body).toEqual({
      model: "claude-sonnet-4-5",
      max_tokens: 300,
      system: [{ type: "text", text: "Be funny." }],
      messages: [{ role: "user", content: [{ type: "text", text: "Tell me a joke" }] }],
    });
    expect(ok({ model: "m", input: "x" }).body.max_tokens).toBe(2048);
  });

  it("translates items: messages, images, function calls and their outputs, merging turns", () => {
    const r = ok({
      model: "m",
      stream: true,
      temperature: 0.5,
      input: [
        { role: "developer", content: "Use tools." },
        {
          role: "user",
          content: [
            { type: "input_text", text: "Weather here?" },
            { type: "input_image", image_url: "data:image/jpeg;base64,/9j/4AAQ", detail: "auto" },
          ],
        },
        {
          type: "message",
          role: "assistant",
          id: "msg_1",
          status: "completed",
          content: [{ type: "output_text", text: "Checking.", annotations: [] }],
        },
        {
          type: "function_call",
          id: "fc_1",
          call_id: "call_1",
          name: "get_weather",
          arguments: '{"city":"Oslo"}',
        },
        { type: "function_call_output", call_id: "call_1", output: "-3C" },
        { role: "user", content: "And tomorrow?" },
      ],
    });
    expect(r.stream).toBe(true);
    expect(r.body.stream).toBe(true);
    expect(r.body.temperature).toBe(0.5);
    expect(r.body.system).toEqual([{ type: "text", text: "Use tools." }]);
    expect(r.body.messages).toEqual([
      {
        role: "user",
        content: [
          { type: "text", text: "Weather here?" },
          { type: "image", source: { type: "base64", media_type: "image/jpeg", data: "/9j/4AAQ" } },
        ],
      },
      {
        role: "assistant",
        content: [
          { type: "text", text: "Checking." },
          { type: "tool_use", id: "call_1", name: "get_weather", input: { city: "Oslo" } },
        ],
      },
      {
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "call_1", content: "-3C" },
          { type: "text", text: "And tomorrow?" },
        ],
      },
    ]);
  });

  it("translates flat function tools and tool_choice", () => {
    const r = ok({
      model: "m",
      input: "x",
      tools: [
        {
          type: "function",
          name: "get_weather",
          description: "Weather",
          parameters: { type: "object" },
          strict: true,
        },
      ],
      tool_choice: { type: "function", name: "get_weather" },
      parallel_tool_calls: false,
    });
    expect(r.body.tools).toEqual([
      { name: "get_weather", description: "Weather", input_schema: { type: "object" }, strict: true },
    ]);
    expect(r.body.tool_choice).toEqual({
      type: "tool",
      name: "get_weather",
      disable_parallel_tool_use: true,
    });
  });

  it.each([
    [{ previous_response_id: "resp_1" }, "previous_response_id"],
    [{ conversation: "conv_1" }, "conversation"],
    [{ reasoning: { effort: "high" } }, "reasoning"],
    [{ text: { format: { type: "json_schema", name: "x", schema: {} } } }, "text.format"],
    [{ text: { verbosity: "low" } }, "text.verbosity"],
    [{ background: true }, "background"],
    [{ truncation: "auto" }, "truncation"],
    [{ include: ["reasoning.encrypted_content"] }, "include"],
    [{ tools: [{ type: "web_search" }] }, "tools[0]"],
    [{ temperature: 2 }, "temperature"],
    [{ max_tool_calls: 3 }, "max_tool_calls"],
    [{ prompt: { id: "pmpt_1" } }, "prompt"],
  ])("refuses %j by naming %s", (extra, param) => {
    const r = refusal({ model: "m", input: "x", ...extra });
    expect(r.status).toBe(400);
    expect(r.param).toBe(param);
  });

  it.each([
    [[{ type: "reasoning", id: "rs_1", summary: [] }], "input[0]"],
    [[{ type: "item_reference", id: "msg_1" }], "input[0]"],
    [[{ role: "user", content: [{ type: "input_file", file_id: "file-1" }] }], "input[0].content[0]"],
    [
      [{ role: "user", content: [{ type: "input_image", file_id: "file-1", detail: "auto" }] }],
      "input[0].content[0].file_id",
    ],
    [
      [
        { role: "user", content: "a" },
        { role: "system", content: "late" },
      ],
      "input[1]",
    ],
  ])("refuses untranslatable items (%#)", (input, param) => {
    expect(refusal({ model: "m", input }).param).toBe(param);
  });
});

describe("Anthropic answer → Response", () => {
  it("makes one output item per block and counts usage the responses way", () => {
    const { body, usage } = t.response(ANTHROPIC_MESSAGE, { model: "declared" });
    expect(usage).toEqual({ input: 1035, output: 12, cached: 1000 });
    expect(body).toMatchObject({
      object: "response",
      status: "completed",
      model: "declared",
      usage: {
        input_tokens: 1035,
        output_tokens: 12,
        total_tokens: 1047,
        input_tokens_details: { cached_tokens: 1000 },
      },
    });
    const output = body.output as Record<string, unknown>[];
    expect(output.map((o) => o.type)).toEqual(["message", "function_call"]);
    expect(output[0]).toMatchObject({
      role: "assistant",
      content: [{ type: "output_text", text: "I'll look it up." }],
    });
    expect(output[1]).toMatchObject({
      call_id: "toolu_01A09q90qw90lq917835lq9",
      name: "get_weather",
      arguments: '{"location":"Paris"}',
    });
    expect(new Set(output.map((o) => o.id)).size).toBe(2);
  });

  it("marks a max_tokens stop as incomplete", () => {
    const { body } = t.response({ ...ANTHROPIC_MESSAGE, stop_reason: "max_tokens" }, { model: "m" });
    expect(body.status).toBe("incomplete");
    expect(body.incomplete_details).toEqual({ reason: "max_output_tokens" });
  });

  it("parses in the official SDK, output_text included", async () => {
    const { body } = t.response(
      { ...ANTHROPIC_MESSAGE, content: [ANTHROPIC_MESSAGE.content[0]] },
      { model: "m" },
    );
    const f = fakeFetch(() => jsonResponse(200, body));
    const client = new OpenAI({ apiKey: "placeholder", baseURL: "http://lane.invalid/v1", fetch: f.fetch });
    const got = await client.responses.create({ model: "m", input: "x" });
    expect(got.output_text).toBe("I'll look it up.");
    expect(t.request(f.bodies[0] as Record<string, unknown>, opts).ok).toBe(true);
  });
});

describe("Anthropic stream → responses events", () => {
  it("sends the documented event sequence with rising sequence numbers", () => {
    const out = run(t.stream({ model: "declared" }), anthropicToolStream());
    const events = datas(out);
    expect(out.every((e, i) => e.event === events[i]?.type)).toBe(true);
    expect(events.map((e) => e.type)).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.output_item.added",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.delta",
      "response.function_call_arguments.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect(events.map((e) => e.sequence_number)).toEqual(events.map((_, i) => i));
    const completed = events.at(-1) as { response: Record<string, unknown> };
    expect(completed.response).toMatchObject({
      status: "completed",
      model: "declared",
      usage: { input_tokens: 592, output_tokens: 89, input_tokens_details: { cached_tokens: 100 } },
    });
    const output = completed.response.output as Record<string, unknown>[];
    expect(output[1]).toMatchObject({
      type: "function_call",
      arguments: '{"location": "San Francisco, CA"}',
    });
  });

  it("is read by the official SDK's stream helper into the same response", async () => {
    const out = run(t.stream({ model: "declared" }), anthropicToolStream());
    const f = fakeFetch(() => sseResponse(out));
    const client = new OpenAI({ apiKey: "placeholder", baseURL: "http://lane.invalid/v1", fetch: f.fetch });
    const deltas: string[] = [];
    const stream = client.responses.stream({ model: "declared", input: "weather?" });
    stream.on("response.output_text.delta", (e) => deltas.push(e.delta));
    const final = await stream.finalResponse();
    expect(deltas.join("")).toBe("Okay, let's check the weather.");
    expect(final.output_text).toBe("Okay, let's check the weather.");
    const call = final.output.find((o) => o.type === "function_call");
    expect(call && call.type === "function_call" && JSON.parse(call.arguments)).toEqual({
      location: "San Francisco, CA",
    });
    expect(final.usage?.output_tokens).toBe(89);
    expect(t.request(f.bodies[0] as Record<string, unknown>, opts)).toMatchObject({ ok: true, stream: true });
  });

  it("ends with response.incomplete on max_tokens and counts usage", () => {
    const s = t.stream({ model: "m" });
    const events = datas(run(s, anthropicTextStream("max_tokens")));
    expect(events.at(-1)).toMatchObject({ type: "response.incomplete", response: { status: "incomplete" } });
    expect(s.usage()).toEqual({ input: 25, output: 15, cached: 0 });
  });

  it("turns errors and a cut-off stream into an error event", () => {
    const errored = datas(
      run(t.stream({ model: "m" }), [
        at(anthropicTextStream(), 0),
        ev("error", { type: "error", error: { type: "api_error", message: "Internal server error" } }),
      ]),
    );
    expect(errored.at(-1)).toMatchObject({
      type: "error",
      code: "api_error",
      message: "Internal server error",
    });
    const cut = datas(run(t.stream({ model: "m" }), anthropicTextStream().slice(0, 5)));
    expect(cut.at(-1)).toMatchObject({ type: "error", code: "api_error" });
    expect(cut.some((e) => e.type === "response.completed")).toBe(false);
  });
});
