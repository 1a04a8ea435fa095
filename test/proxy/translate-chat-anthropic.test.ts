import OpenAI from "openai";
import { describe, expect, it } from "vitest";
import {
  ANTHROPIC_MESSAGE,
  anthropicTextStream,
  anthropicToolStream,
  at,
  blockDelta,
  blockStart,
  blockStop,
  datas,
  ev,
  fakeFetch,
  jsonResponse,
  pair,
  requests,
  run,
  sseResponse,
} from "./translate-fixtures";

// OpenAI chat completions callers in front of an Anthropic provider.

const t = pair("openai-chat", "anthropic-messages");
const opts = { upstreamModel: "claude-sonnet-4-5", maxTokensDefault: 4096 };

const { ok, refusal } = requests(t, opts);

const hi = [{ role: "user", content: "hi" }];

describe("chat → Anthropic request", () => {
  it("moves system and developer messages to the top-level system, in order", () => {
    const r = ok({
      model: "declared",
      messages: [
        { role: "system", content: "Be brief." },
        { role: "developer", content: [{ type: "text", text: "Answer in French." }] },
        { role: "user", content: "hi" },
      ],
    });
    expect(r.body.model).toBe("claude-sonnet-4-5");
    expect(r.body.system).toEqual([
      { type: "text", text: "Be brief." },
      { type: "text", text: "Answer in French." },
    ]);
    expect(r.body.messages).toEqual([{ role: "user", content: [{ type: "text", text: "hi" }] }]);
    expect(r.stream).toBe(false);
  });

  it("uses the default max_tokens only when the caller gave none", () => {
    expect(ok({ model: "m", messages: hi }).body.max_tokens).toBe(4096);
    expect(ok({ model: "m", messages: hi, max_tokens: 77 }).body.max_tokens).toBe(77);
    expect(ok({ model: "m", messages: hi, max_completion_tokens: 55 }).body.max_tokens).toBe(55);
    expect(refusal({ model: "m", messages: hi, max_tokens: 5, max_completion_tokens: 6 }).param).toBe(
      "max_tokens",
    );
  });

  it("carries sampling, stops, the end user and streaming", () => {
    const r = ok({
      model: "m",
      messages: hi,
      temperature: 0.2,
      top_p: 0.9,
      stop: "END",
      user: "user-42",
      stream: true,
      stream_options: { include_usage: true },
    });
    expect(r.body).toMatchObject({
      temperature: 0.2,
      top_p: 0.9,
      stop_sequences: ["END"],
      metadata: { user_id: "user-42" },
      stream: true,
    });
    expect(r.stream).toBe(true);
    expect(ok({ model: "m", messages: hi, stop: ["a", "b"] }).body.stop_sequences).toEqual(["a", "b"]);
  });

  it("translates images as data URLs and as plain URLs", () => {
    const r = ok({
      model: "m",
      messages: [
        {
          role: "user",
          content: [
            { type: "text", text: "What is this?" },
            { type: "image_url", image_url: { url: "data:image/png;base64,iVBORw0KGgo=" } },
            { type: "image_url", image_url: { url: "https://example.com/cat.jpg", detail: "auto" } },
          ],
        },
      ],
    });
    expect(r.body.messages).toEqual([
      {
        role: "user",
        content: [
          { type: "text", text: "What is this?" },
          { type: "image", source: { type: "base64", media_type: "image/png", data: "iVBORw0KGgo=" } },
          { type: "image", source: { type: "url", url: "https://example.com/cat.jpg" } },
        ],
      },
    ]);
  });

  it("translates tools, tool_choice and parallel_tool_calls", () => {
    const tools = [
      {
        type: "function",
        function: {
          name: "get_weather",
          description: "Weather for a place",
          parameters: {
            type: "object",
            properties: { location: { type: "string" } },
            required: ["location"],
          },
          strict: true,
        },
      },
      { type: "function", function: { name: "now" } },
    ];
    const r = ok({ model: "m", messages: hi, tools, tool_choice: "required", parallel_tool_calls: false });
    expect(r.body.tools).toEqual([
      {
        name: "get_weather",
        description: "Weather for a place",
        input_schema: {
          type: "object",
          properties: { location: { type: "string" } },
          required: ["location"],
        },
        strict: true,
      },
      { name: "now", input_schema: { type: "object", properties: {} } },
    ]);
    expect(r.body.tool_choice).toEqual({ type: "any", disable_parallel_tool_use: true });
    const named = ok({
      model: "m",
      messages: hi,
      tools,
      tool_choice: { type: "function", function: { name: "now" } },
    });
    expect(named.body.tool_choice).toEqual({ type: "tool", name: "now" });
    expect(ok({ model: "m", messages: hi, tools, tool_choice: "none" }).body.tool_choice).toEqual({
      type: "none",
    });
    expect(ok({ model: "m", messages: hi, tools }).body.tool_choice).toBeUndefined();
    expect(ok({ model: "m", messages: hi, tool_choice: "none" }).body).not.toHaveProperty("tool_choice");
    expect(ok({ model: "m", messages: hi, tools, parallel_tool_calls: false }).body.tool_choice).toEqual({
      type: "auto",
      disable_parallel_tool_use: true,
    });
  });

  it("turns tool calls into tool_use and merges consecutive tool results into one user turn", () => {
    const r = ok({
      model: "m",
      messages: [
        { role: "user", content: "Weather in Paris and the time?" },
        {
          role: "assistant",
          content: "Let me check.",
          tool_calls: [
            {
              id: "call_1",
              type: "function",
              function: { name: "get_weather", arguments: '{"location":"Paris"}' },
            },
            { id: "call_2", type: "function", function: { name: "now", arguments: "{}" } },
          ],
        },
        { role: "tool", tool_call_id: "call_1", content: "18C" },
        { role: "tool", tool_call_id: "call_2", content: [{ type: "text", text: "12:00" }] },
        { role: "user", content: "Thanks" },
      ],
    });
    expect(r.body.messages).toEqual([
      { role: "user", content: [{ type: "text", text: "Weather in Paris and the time?" }] },
      {
        role: "assistant",
        content: [
          { type: "text", text: "Let me check." },
          { type: "tool_use", id: "call_1", name: "get_weather", input: { location: "Paris" } },
          { type: "tool_use", id: "call_2", name: "now", input: {} },
        ],
      },
      {
        role: "user",
        content: [
          { type: "tool_result", tool_use_id: "call_1", content: "18C" },
          { type: "tool_result", tool_use_id: "call_2", content: "12:00" },
          { type: "text", text: "Thanks" },
        ],
      },
    ]);
  });

  it("accepts fields at their defaults", () => {
    const r = ok({
      model: "m",
      messages: hi,
      n: 1,
      logprobs: false,
      frequency_penalty: 0,
      presence_penalty: 0,
      response_format: { type: "text" },
      store: false,
      metadata: {},
      modalities: ["text"],
    });
    expect(Object.keys(r.body).sort()).toEqual(["max_tokens", "messages", "model"]);
  });

  it.each([
    [{ n: 2 }, "n"],
    [{ logprobs: true }, "logprobs"],
    [{ top_logprobs: 3 }, "top_logprobs"],
    [{ audio: { voice: "alloy", format: "mp3" } }, "audio"],
    [{ modalities: ["text", "audio"] }, "modalities"],
    [{ response_format: { type: "json_schema", json_schema: { name: "x", schema: {} } } }, "response_format"],
    [{ response_format: { type: "json_object" } }, "response_format"],
    [{ seed: 7 }, "seed"],
    [{ frequency_penalty: 0.5 }, "frequency_penalty"],
    [{ logit_bias: { "50256": -100 } }, "logit_bias"],
    [{ reasoning_effort: "high" }, "reasoning_effort"],
    [{ temperature: 1.5 }, "temperature"],
    [{ metadata: { run: "1" } }, "metadata"],
    [{ store: true }, "store"],
    [{ some_new_field: true }, "some_new_field"],
    [{ parallel_tool_calls: false }, "parallel_tool_calls"],
    [{ stream_options: { include_usage: true } }, "stream_options"],
    [{ stream: true, stream_options: { include_obfuscation: true } }, "stream_options.include_obfuscation"],
    [{ user: "a", safety_identifier: "b" }, "safety_identifier"],
  ])("refuses %j by naming %s", (extra, param) => {
    const r = refusal({ model: "m", messages: hi, ...extra });
    expect(r.status).toBe(400);
    expect(["unsupported_parameter", "invalid_value"]).toContain(r.type);
    expect(r.param).toBe(param);
    expect(r.message).toContain(param);
  });

  it.each([
    [
      [
        { role: "user", content: "a" },
        { role: "system", content: "late" },
      ],
      "messages[1]",
    ],
    [[{ role: "user", content: "a", name: "bob" }], "messages[0].name"],
    [[{ role: "function", name: "f", content: "x" }], "messages[0].role"],
    [
      [
        {
          role: "user",
          content: [{ type: "image_url", image_url: { url: "https://x/y.png", detail: "high" } }],
        },
      ],
      "messages[0].content[0].image_url.detail",
    ],
    [
      [{ role: "user", content: [{ type: "image_url", image_url: { url: "data:image/bmp;base64,AAAA" } }] }],
      "messages[0].content[0].image_url.url",
    ],
    [
      [{ role: "user", content: [{ type: "input_audio", input_audio: { data: "", format: "wav" } }] }],
      "messages[0].content[0]",
    ],
    [
      [
        {
          role: "assistant",
          content: null,
          tool_calls: [{ id: "c", type: "function", function: { name: "f", arguments: "not json" } }],
        },
      ],
      "messages[0].tool_calls[0].function.arguments",
    ],
    [[{ role: "assistant", content: null, refusal: "no" }], "messages[0].refusal"],
  ])("refuses untranslatable messages (%#)", (messages, param) => {
    expect(refusal({ model: "m", messages }).param).toBe(param);
  });

  it("refuses tools other than functions and choices it cannot express", () => {
    expect(
      refusal({ model: "m", messages: hi, tools: [{ type: "custom", custom: { name: "x" } }] }).param,
    ).toBe("tools[0]");
    const tools = [{ type: "function", function: { name: "f" } }];
    const allowed = { type: "allowed_tools", allowed_tools: { mode: "auto", tools: [] } };
    expect(refusal({ model: "m", messages: hi, tools, tool_choice: allowed }).param).toBe("tool_choice");
  });
});

describe("Anthropic answer → chat completion", () => {
  it("maps text, tool calls, the stop reason and usage (cache reads included in prompt_tokens)", () => {
    const { body, usage } = t.response(ANTHROPIC_MESSAGE, { model: "declared" });
    expect(usage).toEqual({ input: 30 + 5 + 1000, output: 12, cached: 1000 });
    expect(body).toMatchObject({
      object: "chat.completion",
      model: "declared",
      choices: [
        {
          index: 0,
          finish_reason: "tool_calls",
          message: {
            role: "assistant",
            content: "I'll look it up.",
            tool_calls: [
              {
                id: "toolu_01A09q90qw90lq917835lq9",
                type: "function",
                function: { name: "get_weather", arguments: '{"location":"Paris"}' },
              },
            ],
          },
        },
      ],
      usage: {
        prompt_tokens: 1035,
        completion_tokens: 12,
        total_tokens: 1047,
        prompt_tokens_details: { cached_tokens: 1000 },
      },
    });
  });

  it.each([
    ["end_turn", "stop"],
    ["stop_sequence", "stop"],
    ["max_tokens", "length"],
    ["tool_use", "tool_calls"],
    ["refusal", "content_filter"],
  ])("maps stop_reason %s to finish_reason %s", (stop, finish) => {
    const msg = { ...ANTHROPIC_MESSAGE, content: [{ type: "text", text: "x" }], stop_reason: stop };
    const { body } = t.response(msg, { model: "m" });
    expect((body.choices as { finish_reason: string }[])[0]?.finish_reason).toBe(finish);
  });

  it("parses as a ChatCompletion in the official SDK", async () => {
    const { body } = t.response(ANTHROPIC_MESSAGE, { model: "declared" });
    const f = fakeFetch(() => jsonResponse(200, body));
    const client = new OpenAI({ apiKey: "placeholder", baseURL: "http://lane.invalid/v1", fetch: f.fetch });
    const got = await client.chat.completions.create({
      model: "declared",
      messages: [{ role: "user", content: "x" }],
    });
    expect(got.choices[0]?.message.tool_calls?.[0]).toMatchObject({ function: { name: "get_weather" } });
    // What the SDK sent is a request this pair accepts.
    expect(t.request(f.bodies[0] as Record<string, unknown>, opts).ok).toBe(true);
  });
});

describe("Anthropic stream → chat chunks", () => {
  it("streams text and tool-call fragments with indexes, then the finish and usage chunks", () => {
    const out = run(t.stream({ model: "declared", includeUsage: true }), anthropicToolStream());
    expect(out.at(-1)).toEqual({ data: "[DONE]" });
    const chunks = datas(out);
    expect(chunks.every((c) => c.object === "chat.completion.chunk" && c.model === "declared")).toBe(true);
    const deltas = chunks.flatMap((c) =>
      (c.choices as { delta: Record<string, unknown> }[]).map((x) => x.delta),
    );
    expect(deltas[0]).toEqual({ role: "assistant", content: "" });
    const text = deltas.map((d) => d.content ?? "").join("");
    expect(text).toBe("Okay, let's check the weather.");
    const calls = deltas.flatMap((d) => (d.tool_calls as Record<string, unknown>[] | undefined) ?? []);
    expect(calls[0]).toEqual({
      index: 0,
      id: "toolu_01T1x1fJ34qAmk2tNTrN7Up6",
      type: "function",
      function: { name: "get_weather", arguments: "" },
    });
    const args = calls.map((c) => (c.function as { arguments?: string }).arguments ?? "").join("");
    expect(JSON.parse(args)).toEqual({ location: "San Francisco, CA" });
    const finishes = chunks.flatMap((c) =>
      (c.choices as { finish_reason: unknown }[]).map((x) => x.finish_reason),
    );
    expect(finishes.filter((f) => f !== null)).toEqual(["tool_calls"]);
    expect(chunks.at(-1)).toMatchObject({
      choices: [],
      usage: { prompt_tokens: 592, completion_tokens: 89, prompt_tokens_details: { cached_tokens: 100 } },
    });
  });

  it("sends no usage chunk unless asked, but counts usage either way", () => {
    const s = t.stream({ model: "m" });
    const out = run(s, anthropicTextStream());
    expect(datas(out).some((c) => "usage" in c)).toBe(false);
    expect(s.usage()).toEqual({ input: 25, output: 15, cached: 0 });
  });

  it("emits each chunk as its event arrives", () => {
    const s = t.stream({ model: "m" });
    const events = anthropicTextStream();
    const counts = events.map((e) => s.push(e).length);
    // message_start, two text deltas, message_delta: one chunk each; ping and block events none.
    expect(counts).toEqual([1, 0, 0, 1, 1, 0, 1, 0]);
  });

  it("is read by the official SDK's stream helper into the same completion", async () => {
    const out = run(t.stream({ model: "declared", includeUsage: true }), anthropicToolStream());
    const f = fakeFetch(() => sseResponse(out));
    const client = new OpenAI({ apiKey: "placeholder", baseURL: "http://lane.invalid/v1", fetch: f.fetch });
    const stream = client.chat.completions.stream({
      model: "declared",
      messages: [{ role: "user", content: "weather?" }],
      stream_options: { include_usage: true },
    });
    const final = await stream.finalChatCompletion();
    expect(final.choices[0]?.message.content).toBe("Okay, let's check the weather.");
    expect(final.choices[0]?.message.tool_calls?.[0]).toMatchObject({
      function: { name: "get_weather", arguments: '{"location": "San Francisco, CA"}' },
    });
    expect(final.choices[0]?.finish_reason).toBe("tool_calls");
    expect(final.usage?.completion_tokens).toBe(89);
    expect(t.request(f.bodies[0] as Record<string, unknown>, opts)).toMatchObject({ ok: true, stream: true });
  });

  it("shows neither thinking nor its deltas, and keeps text a block starts with", () => {
    const events = anthropicTextStream();
    const start = at(events, 0);
    const rest = events.slice(1);
    const thinking = [
      blockStart(0, { type: "thinking", thinking: "", signature: "" }),
      blockDelta(0, { type: "thinking_delta", thinking: "secret plan" }),
      blockDelta(0, { type: "signature_delta", signature: "sig" }),
      blockStop(0),
    ];
    const shifted = rest.map((e) => ({
      ...e,
      data: e.data.replace('"index":0', '"index":1').replace('"text":""', '"text":"Oh. "'),
    }));
    const out = run(t.stream({ model: "m" }), [start, ...thinking, ...shifted]);
    expect(JSON.stringify(out)).not.toContain("secret plan");
    const text = datas(out)
      .flatMap((c) => (c.choices as { delta: { content?: string } }[]).map((x) => x.delta.content ?? ""))
      .join("");
    expect(text).toBe("Oh. Hello!");
  });

  it("turns an Anthropic error event into an error chunk the SDK raises", async () => {
    const events = [
      at(anthropicTextStream(), 0),
      ev("error", { type: "error", error: { type: "overloaded_error", message: "Overloaded" } }),
    ];
    const out = run(t.stream({ model: "m" }), events);
    expect(datas(out).at(-1)).toEqual({
      error: { message: "Overloaded", type: "server_error", param: null, code: "overloaded_error" },
    });
    expect(out.some((e) => e.data === "[DONE]")).toBe(false);
    const f = fakeFetch(() => sseResponse(out));
    const client = new OpenAI({
      apiKey: "placeholder",
      baseURL: "http://lane.invalid/v1",
      fetch: f.fetch,
      maxRetries: 0,
    });
    const stream = await client.chat.completions.create({
      model: "m",
      messages: [{ role: "user", content: "x" }],
      stream: true,
    });
    await expect(async () => {
      for await (const _ of stream);
    }).rejects.toThrow(/Overloaded/);
  });

  it("does not end a cut-off stream as if it were complete", () => {
    const out = run(t.stream({ model: "m" }), anthropicTextStream().slice(0, 4));
    expect(out.some((e) => e.data === "[DONE]")).toBe(false);
    expect(datas(out).at(-1)).toHaveProperty("error.type", "server_error");
  });
});

describe("errors", () => {
  it("turns Anthropic's error into OpenAI's, keeping the status category and the type as code", () => {
    const body = {
      type: "error",
      error: {
        type: "rate_limit_error",
        message: "Number of request tokens has exceeded your per-minute rate limit",
      },
    };
    expect(t.error(429, body)).toEqual({
      error: {
        message: "Number of request tokens has exceeded your per-minute rate limit",
        type: "rate_limit_error",
        param: null,
        code: "rate_limit_error",
      },
    });
    expect(t.error(529, body)).toHaveProperty("error.type", "server_error");
    expect(t.error(502, null)).toEqual({
      error: { message: "the provider answered HTTP 502", type: "server_error", param: null, code: null },
    });
  });
});
