import Anthropic from "@anthropic-ai/sdk";
import { describe, expect, it } from "vitest";
import {
  at,
  CHAT_COMPLETION,
  chatChunk,
  chatTextStream,
  chatToolStream,
  datas,
  fakeFetch,
  jsonResponse,
  pair,
  requests,
  run,
  sseResponse,
} from "./translate-fixtures";

// Anthropic Messages callers (the official SDK included) in front of an OpenAI-format provider.

const t = pair("anthropic-messages", "openai-chat");
const opts = { upstreamModel: "gpt-4o-mini", maxTokensDefault: 4096 };

const { ok, refusal } = requests(t, opts);

const hi = [{ role: "user", content: "hi" }];

function client(f: typeof fetch) {
  return new Anthropic({ apiKey: "placeholder", baseURL: "http://lane.invalid", fetch: f, maxRetries: 0 });
}

describe("Anthropic → chat request", () => {
  it("puts system first, keeps sampling and maps max_tokens, stops and the end user", () => {
    const r = ok({
      model: "declared",
      max_tokens: 512,
      system: [{ type: "text", text: "Be brief.", cache_control: { type: "ephemeral" } }],
      messages: hi,
      temperature: 0.3,
      top_p: 0.8,
      stop_sequences: ["###"],
      metadata: { user_id: "u-1" },
    });
    expect(r.body).toEqual({
      model: "gpt-4o-mini",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "user", content: "hi" },
      ],
      max_completion_tokens: 512,
      temperature: 0.3,
      top_p: 0.8,
      stop: ["###"],
      user: "u-1",
    });
  });

  it("asks for usage when streaming, so counts reach the caller and the budget", () => {
    const r = ok({ model: "m", max_tokens: 10, messages: hi, stream: true });
    expect(r.stream).toBe(true);
    expect(r.body).toMatchObject({ stream: true, stream_options: { include_usage: true } });
  });

  it("splits a user turn into tool messages and user content, in order", () => {
    const r = ok({
      model: "m",
      max_tokens: 10,
      messages: [
        { role: "user", content: "Weather?" },
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
            { type: "tool_result", tool_use_id: "toolu_1", content: [{ type: "text", text: "-3C" }] },
            { type: "text", text: "And this?" },
            { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
            { type: "image", source: { type: "url", url: "https://example.com/a.png" } },
          ],
        },
      ],
    });
    expect(r.body.messages).toEqual([
      { role: "user", content: "Weather?" },
      {
        role: "assistant",
        content: "Checking.",
        tool_calls: [
          {
            id: "toolu_1",
            type: "function",
            function: { name: "get_weather", arguments: '{"city":"Oslo"}' },
          },
        ],
      },
      { role: "tool", tool_call_id: "toolu_1", content: "-3C" },
      {
        role: "user",
        content: [
          { type: "text", text: "And this?" },
          { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } },
          { type: "image_url", image_url: { url: "https://example.com/a.png" } },
        ],
      },
    ]);
  });

  it("translates tools and each tool_choice", () => {
    const tools = [
      { name: "get_weather", description: "Weather", input_schema: { type: "object", properties: {} } },
    ];
    const base = { model: "m", max_tokens: 10, messages: hi, tools };
    expect(ok(base).body.tools).toEqual([
      {
        type: "function",
        function: {
          name: "get_weather",
          description: "Weather",
          parameters: { type: "object", properties: {} },
        },
      },
    ]);
    expect(ok({ ...base, tool_choice: { type: "auto" } }).body.tool_choice).toBe("auto");
    expect(ok({ ...base, tool_choice: { type: "any" } }).body.tool_choice).toBe("required");
    expect(ok({ ...base, tool_choice: { type: "none" } }).body.tool_choice).toBe("none");
    const named = ok({
      ...base,
      tool_choice: { type: "tool", name: "get_weather", disable_parallel_tool_use: true },
    });
    expect(named.body.tool_choice).toEqual({ type: "function", function: { name: "get_weather" } });
    expect(named.body.parallel_tool_calls).toBe(false);
  });

  it("reads API version 2026-10-21's system turns as system messages", () => {
    const r = ok({
      model: "m",
      max_tokens: 10,
      messages: [
        { role: "system", content: "Rules." },
        { role: "user", content: "hi" },
      ],
    });
    expect(r.body.messages).toEqual([
      { role: "system", content: "Rules." },
      { role: "user", content: "hi" },
    ]);
  });

  it.each([
    [{ top_k: 5 }, "top_k"],
    [{ thinking: { type: "enabled", budget_tokens: 2048 } }, "thinking"],
    [{ tools: [{ type: "web_search_20250305", name: "web_search" }] }, "tools[0]"],
    [{ stop_sequences: ["a", "b", "c", "d", "e"] }, "stop_sequences"],
    [{ output_config: { effort: "high" } }, "output_config"],
    [{ container: "c" }, "container"],
    [{ service_tier: "standard_only" }, "service_tier"],
    [{ max_tokens: undefined }, "max_tokens"],
  ])("refuses %j by naming %s", (extra, param) => {
    const r = refusal({ model: "m", max_tokens: 10, messages: hi, ...extra });
    expect(r.status).toBe(400);
    expect(r.param).toBe(param);
  });

  it.each([
    [
      {
        role: "user",
        content: [{ type: "document", source: { type: "text", media_type: "text/plain", data: "x" } }],
      },
      "messages[0].content[0]",
    ],
    [
      { role: "user", content: [{ type: "tool_result", tool_use_id: "t", content: "boom", is_error: true }] },
      "messages[0].content[0].is_error",
    ],
    [
      {
        role: "user",
        content: [
          {
            type: "tool_result",
            tool_use_id: "t",
            content: [{ type: "image", source: { type: "url", url: "https://x" } }],
          },
        ],
      },
      "messages[0].content[0].content[0]",
    ],
    [
      { role: "assistant", content: [{ type: "thinking", thinking: "hm", signature: "s" }] },
      "messages[0].content[0]",
    ],
    [
      { role: "user", content: [{ type: "image", source: { type: "file", file_id: "f" } }] },
      "messages[0].content[0].source.type",
    ],
  ])("refuses untranslatable blocks (%#)", (message, param) => {
    expect(refusal({ model: "m", max_tokens: 10, messages: [message] }).param).toBe(param);
  });

  it("accepts what the official SDK sends", async () => {
    const f = fakeFetch(() => jsonResponse(200, t.response(CHAT_COMPLETION, { model: "declared" }).body));
    await client(f.fetch).messages.create({
      model: "declared",
      max_tokens: 100,
      system: "Be brief.",
      messages: [{ role: "user", content: [{ type: "text", text: "hi" }] }],
      tools: [{ name: "get_weather", input_schema: { type: "object", properties: {} } }],
      tool_choice: { type: "auto" },
    });
    const r = t.request(f.bodies[0] as Record<string, unknown>, opts);
    expect(r.ok && r.body.messages).toEqual([
      { role: "system", content: "Be brief." },
      { role: "user", content: [{ type: "text", text: "hi" }] },
    ]);
  });
});

describe("chat completion → Anthropic message", () => {
  it("maps tool calls, the stop reason and usage (input_tokens without cache reads)", () => {
    const { body, usage } = t.response(CHAT_COMPLETION, { model: "declared" });
    expect(usage).toEqual({ input: 1117, output: 46, cached: 1024 });
    expect(body).toMatchObject({
      type: "message",
      role: "assistant",
      model: "declared",
      stop_reason: "tool_use",
      content: [{ type: "tool_use", id: "call_abc", name: "get_weather", input: { location: "Paris" } }],
      usage: {
        input_tokens: 93,
        output_tokens: 46,
        cache_read_input_tokens: 1024,
        cache_creation_input_tokens: 0,
      },
    });
  });

  it.each([
    ["stop", "end_turn"],
    ["length", "max_tokens"],
    ["tool_calls", "tool_use"],
    ["content_filter", "refusal"],
  ])("maps finish_reason %s to stop_reason %s", (finish, stop) => {
    const c = { ...CHAT_COMPLETION, choices: [{ ...CHAT_COMPLETION.choices[0], finish_reason: finish }] };
    expect(t.response(c, { model: "m" }).body.stop_reason).toBe(stop);
  });

  it("keeps arguments that are not JSON rather than losing them", () => {
    const choice = at(CHAT_COMPLETION.choices, 0);
    const c = {
      ...CHAT_COMPLETION,
      choices: [
        {
          ...choice,
          message: {
            ...choice.message,
            tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "{broken" } }],
          },
        },
      ],
    };
    expect(t.response(c, { model: "m" }).body.content).toEqual([
      { type: "tool_use", id: "c", name: "f", input: "{broken" },
    ]);
  });

  it("parses as a Message in the official SDK", async () => {
    const f = fakeFetch(() => jsonResponse(200, t.response(CHAT_COMPLETION, { model: "declared" }).body));
    const msg = await client(f.fetch).messages.create({
      model: "declared",
      max_tokens: 10,
      messages: [{ role: "user", content: "x" }],
    });
    expect(msg.content[0]).toMatchObject({
      type: "tool_use",
      name: "get_weather",
      input: { location: "Paris" },
    });
    expect(msg.usage.cache_read_input_tokens).toBe(1024);
  });
});

describe("chat chunks → Anthropic stream", () => {
  it("opens and closes blocks around text and each tool call", () => {
    const out = run(t.stream({ model: "declared" }), chatToolStream());
    const events = datas(out);
    expect(out.every((e, i) => e.event === events[i]?.type)).toBe(true);
    expect(events.map((e) => e.type)).toEqual([
      "message_start",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_delta",
      "content_block_stop",
      "content_block_start",
      "content_block_delta",
      "content_block_stop",
      "message_delta",
      "message_stop",
    ]);
    expect(events[5]).toEqual({
      type: "content_block_start",
      index: 1,
      content_block: { type: "tool_use", id: "call_abc", name: "get_weather", input: {} },
    });
    expect(events[12]).toEqual({
      type: "message_delta",
      delta: { stop_reason: "tool_use", stop_sequence: null },
      usage: {
        input_tokens: 18,
        output_tokens: 17,
        cache_creation_input_tokens: 0,
        cache_read_input_tokens: 64,
      },
    });
  });

  it("is read by the official SDK's stream helper into the same message", async () => {
    const out = run(t.stream({ model: "declared" }), chatToolStream());
    const f = fakeFetch(() => sseResponse(out));
    const texts: string[] = [];
    const stream = client(f.fetch).messages.stream({
      model: "declared",
      max_tokens: 100,
      messages: [{ role: "user", content: "x" }],
    });
    stream.on("text", (x) => texts.push(x));
    const msg = await stream.finalMessage();
    expect(texts.join("")).toBe("Checking both.");
    expect(msg.stop_reason).toBe("tool_use");
    expect(msg.content.slice(1)).toMatchObject([
      { type: "tool_use", id: "call_abc", name: "get_weather", input: { location: "Paris" } },
      { type: "tool_use", id: "call_def", name: "get_time", input: { tz: "CET" } },
    ]);
    expect(msg.usage).toMatchObject({ input_tokens: 18, output_tokens: 17, cache_read_input_tokens: 64 });
  });

  it("waits for the usage chunk, but closes at [DONE] without one", () => {
    const s = t.stream({ model: "m" });
    const events = chatTextStream("length");
    const afterFinish =
      s.push(at(events, 0)).length + s.push(at(events, 1)).length + s.push(at(events, 2)).length;
    expect(afterFinish).toBe(4); // message_start, block start, two deltas
    expect(s.push(at(events, 3))).toEqual([]); // finish_reason: held for the counts
    const closing = datas(s.push(at(events, 4))).map((e) => e.type);
    expect(closing).toEqual(["content_block_stop", "message_delta", "message_stop"]);
    expect(s.usage()).toEqual({ input: 9, output: 2, cached: 0 });
    const noUsage = run(t.stream({ model: "m" }), [
      chatChunk({ content: "x" }),
      chatChunk({}, "stop"),
      { data: "[DONE]" },
    ]);
    expect(datas(noUsage).at(-2)).toMatchObject({
      type: "message_delta",
      delta: { stop_reason: "end_turn" },
    });
  });

  it("turns an error chunk and a cut-off stream into Anthropic error events", async () => {
    const errored = run(t.stream({ model: "m" }), [
      chatChunk({ content: "x" }),
      {
        data: JSON.stringify({
          error: { message: "The server had an error", type: "server_error", param: null, code: null },
        }),
      },
    ]);
    expect(datas(errored).at(-1)).toEqual({
      type: "error",
      error: { type: "api_error", message: "The server had an error" },
    });
    const f = fakeFetch(() => sseResponse(errored));
    const stream = client(f.fetch).messages.stream({
      model: "m",
      max_tokens: 10,
      messages: [{ role: "user", content: "x" }],
    });
    await expect(stream.finalMessage()).rejects.toThrow(/server had an error/);
    const cut = run(t.stream({ model: "m" }), [chatChunk({ content: "x" })]);
    expect(datas(cut).at(-1)).toMatchObject({ type: "error", error: { type: "api_error" } });
    expect(datas(cut).some((e) => e.type === "message_stop")).toBe(false);
  });
});

describe("chat chunks → Anthropic stream, provider quirks", () => {
  it("takes the counts at or after finish_reason from a server that sends running counts", () => {
    const withUsage = (e: ReturnType<typeof chatChunk>, prompt: number, completion: number) => {
      const c = JSON.parse(e.data) as Record<string, unknown>;
      return {
        data: JSON.stringify({
          ...c,
          usage: { prompt_tokens: prompt, completion_tokens: completion, total_tokens: prompt + completion },
        }),
      };
    };
    const s = t.stream({ model: "m" });
    const out = run(s, [
      withUsage(chatChunk({ content: "a" }), 9, 1),
      withUsage(chatChunk({ content: "b" }), 9, 2),
      chatChunk({}, "stop"),
      withUsage(chatChunk({}), 9, 3),
      { data: "[DONE]" },
    ]);
    expect(s.usage()).toEqual({ input: 9, output: 3, cached: 0 });
    expect(datas(out).find((e) => e.type === "message_delta")).toHaveProperty("usage.output_tokens", 3);
  });

  it("refuses to reorder a tool call that resumes after another began", () => {
    const out = run(t.stream({ model: "m" }), [
      chatChunk({
        tool_calls: [{ index: 0, id: "a", type: "function", function: { name: "f", arguments: "{" } }],
      }),
      chatChunk({
        tool_calls: [{ index: 1, id: "b", type: "function", function: { name: "g", arguments: "{}" } }],
      }),
      chatChunk({ tool_calls: [{ index: 0, function: { arguments: "}" } }] }),
      chatChunk({}, "tool_calls"),
      { data: "[DONE]" },
    ]);
    expect(datas(out).at(-1)).toMatchObject({ type: "error", error: { type: "api_error" } });
    expect(datas(out).some((e) => e.type === "message_stop")).toBe(false);
  });

  it("sends each system block as a system message of its own", () => {
    const r = ok({
      model: "m",
      max_tokens: 10,
      system: [
        { type: "text", text: "A." },
        { type: "text", text: "B." },
      ],
      messages: hi,
    });
    expect(r.body.messages).toEqual([
      { role: "system", content: "A." },
      { role: "system", content: "B." },
      { role: "user", content: "hi" },
    ]);
  });
});

describe("errors", () => {
  it("turns OpenAI's error into Anthropic's, by status", () => {
    const body = {
      error: {
        message: "Incorrect API key provided",
        type: "invalid_request_error",
        param: null,
        code: "invalid_api_key",
      },
    };
    expect(t.error(401, body)).toEqual({
      type: "error",
      error: { type: "authentication_error", message: "Incorrect API key provided" },
      request_id: null,
    });
    expect(t.error(429, body)).toHaveProperty("error.type", "rate_limit_error");
    expect(t.error(503, "not json")).toEqual({
      type: "error",
      error: { type: "api_error", message: "the provider answered HTTP 503" },
      request_id: null,
    });
  });

  it("is raised by the official SDK as the matching error class", async () => {
    const body = t.error(404, {
      error: { message: "The model `x` does not exist", type: "invalid_request_error" },
    });
    const f = fakeFetch(() => jsonResponse(404, body));
    const err = await client(f.fetch)
      .messages.create({ model: "x", max_tokens: 10, messages: [{ role: "user", content: "x" }] })
      .catch((e: unknown) => e);
    expect(err).toBeInstanceOf(Anthropic.NotFoundError);
    expect((err as Error).message).toContain("does not exist");
  });
});
