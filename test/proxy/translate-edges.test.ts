import { randomUUID } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { formatSse, SseParser } from "../../proxy-image/src/proxy/model/sse";
import {
  errorBody,
  readUsage,
  type SseEvent,
  translation,
  usageMeter,
  type WireFormat,
} from "../../proxy-image/src/proxy/model/translate";
import { anthropicToolStream, at, chatToolStream, ev, pair, run } from "./translate-fixtures";

// What every pair shares: passthrough, the lane's own errors, usage reading, the SSE codec, and
// that nothing from an upstream error but its message and type reaches the caller.

const FORMATS: WireFormat[] = ["openai-chat", "openai-responses", "anthropic-messages"];
const PAIRS = [
  ["openai-chat", "anthropic-messages"],
  ["openai-responses", "anthropic-messages"],
  ["anthropic-messages", "openai-chat"],
] as const;

describe("translation()", () => {
  it("is null for a same-format pair and built for the three the providers need", () => {
    for (const f of FORMATS) expect(translation(f, f)).toBeNull();
    for (const [from, to] of PAIRS) expect(translation(from, to)).toMatchObject({ from, to });
  });

  it("passes the two OpenAI formats through, and refuses to pretend for a pair not built", () => {
    expect(translation("openai-responses", "openai-chat")).toBeNull();
    expect(translation("openai-chat", "openai-responses")).toBeNull();
    expect(() => translation("anthropic-messages", "openai-responses")).toThrow(/no translation/);
  });
});

describe("the module stays pure and small", () => {
  const dir = new URL("../../proxy-image/src/proxy/model/", import.meta.url);
  const files = readdirSync(dir).filter((f) => f.startsWith("translate") || f === "sse.ts");

  it.each(files)("%s imports neither Node nor an SDK, and is under 600 lines", (f) => {
    const text = readFileSync(new URL(f, dir), "utf8");
    const imports = [...text.matchAll(/from "([^"]+)"/g)].map((m) => m[1]);
    expect(imports.every((i) => i?.startsWith("./"))).toBe(true);
    expect(text.split("\n").length).toBeLessThan(600);
  });
});

describe("errorBody", () => {
  it("writes the lane's own refusals in each caller's format", () => {
    const r = { status: 429, type: "over_budget", message: "the run's model budget is spent (calls)" };
    expect(errorBody("anthropic-messages", r)).toEqual({
      type: "error",
      error: { type: "rate_limit_error", message: r.message },
      request_id: null,
    });
    for (const f of ["openai-chat", "openai-responses"] as const)
      expect(errorBody(f, { ...r, status: 400, type: "unsupported_parameter", param: "n" })).toEqual({
        error: {
          message: r.message,
          type: "invalid_request_error",
          param: "n",
          code: "unsupported_parameter",
        },
      });
  });
});

describe("upstream errors carry only message and type", () => {
  const canary = `sk-canary-${randomUUID()}`;
  const bodies = [
    {
      type: "error",
      error: { type: "authentication_error", message: "invalid x-api-key", headers: { "x-api-key": canary } },
      request: { headers: { "x-api-key": canary, authorization: `Bearer ${canary}` } },
    },
    {
      error: {
        message: "Incorrect API key provided",
        type: "invalid_request_error",
        param: canary,
        code: canary,
      },
      headers: { authorization: `Bearer ${canary}` },
    },
    { error: { message: 42, type: { nested: canary } }, echo: canary },
  ];

  it.each(PAIRS)("%s ← %s", (from, to) => {
    const t = pair(from, to);
    for (const status of [400, 401, 403, 429, 500, 529])
      for (const body of bodies) {
        const out = JSON.stringify(t.error(status, body));
        expect(out).not.toContain(canary);
        expect(out.length).toBeLessThan(400);
      }
  });

  it("in a stream's error event too", () => {
    const anthropicError = ev("error", {
      type: "error",
      error: { type: "api_error", message: "boom", headers: { "x-api-key": canary } },
    });
    const chatError: SseEvent = {
      data: JSON.stringify({
        error: { message: "boom", type: "server_error", param: canary, headers: { k: canary } },
      }),
    };
    for (const [from, to] of PAIRS) {
      const upstream =
        to === "anthropic-messages" ? [at(anthropicToolStream(), 0), anthropicError] : [chatError];
      const out = run(pair(from, to).stream({ model: "m", includeUsage: true }), upstream);
      expect(JSON.stringify(out)).not.toContain(canary);
      expect(JSON.stringify(out)).toContain("boom");
    }
  });
});

describe("readUsage and usageMeter", () => {
  it("reads each format's whole answer", () => {
    expect(
      readUsage("openai-chat", {
        usage: { prompt_tokens: 10, completion_tokens: 3, prompt_tokens_details: { cached_tokens: 4 } },
      }),
    ).toEqual({ input: 10, output: 3, cached: 4 });
    expect(
      readUsage("openai-responses", {
        usage: { input_tokens: 8, output_tokens: 2, input_tokens_details: { cached_tokens: 1 } },
      }),
    ).toEqual({ input: 8, output: 2, cached: 1 });
    expect(
      readUsage("anthropic-messages", {
        usage: {
          input_tokens: 5,
          output_tokens: 7,
          cache_read_input_tokens: 100,
          cache_creation_input_tokens: 10,
        },
      }),
    ).toEqual({ input: 115, output: 7, cached: 100 });
    expect(readUsage("openai-chat", null)).toEqual({ input: 0, output: 0, cached: 0 });
    expect(readUsage("anthropic-messages", { usage: { input_tokens: -5, output_tokens: "7" } })).toEqual({
      input: 0,
      output: 0,
      cached: 0,
    });
  });

  it("follows a passthrough stream in each format", () => {
    const a = usageMeter("anthropic-messages");
    for (const e of anthropicToolStream()) a.push(e);
    expect(a.usage()).toEqual({ input: 592, output: 89, cached: 100 });
    const c = usageMeter("openai-chat");
    for (const e of chatToolStream()) c.push(e);
    expect(c.usage()).toEqual({ input: 82, output: 17, cached: 64 });
    const r = usageMeter("openai-responses");
    const responses = run(
      pair("openai-responses", "anthropic-messages").stream({ model: "m" }),
      anthropicToolStream(),
    );
    for (const e of responses) r.push(e);
    expect(r.usage()).toEqual({ input: 592, output: 89, cached: 100 });
  });

  it("agrees with the stream translators' own counts", () => {
    for (const [from, to] of PAIRS) {
      const s = pair(from, to).stream({ model: "m", includeUsage: true });
      run(s, to === "anthropic-messages" ? anthropicToolStream() : chatToolStream());
      const m = usageMeter(to);
      for (const e of to === "anthropic-messages" ? anthropicToolStream() : chatToolStream()) m.push(e);
      expect(s.usage()).toEqual(m.usage());
    }
  });
});

describe("SSE codec", () => {
  const event = fc.record(
    {
      event: fc.constantFrom("message_start", "content_block_delta", "response.output_text.delta"),
      data: fc.string({ maxLength: 40 }).map((s) => s.replace(/\r/g, "")),
    },
    { requiredKeys: ["data"] },
  );

  it("parses what it formats, however the text is cut", () => {
    fc.assert(
      fc.property(
        fc.array(event, { maxLength: 8 }),
        fc.array(fc.nat(), { maxLength: 10 }),
        (events, cuts) => {
          const text = events.map(formatSse).join("");
          const points = [...new Set(cuts.map((c) => c % (text.length + 1)))].sort((x, y) => x - y);
          const p = new SseParser();
          const got: SseEvent[] = [];
          let last = 0;
          for (const c of [...points, text.length]) {
            got.push(...p.feed(text.slice(last, c)));
            last = c;
          }
          expect(got).toEqual(events);
        },
      ),
    );
  });

  it("reads \\r\\n line ends, comments, multi-line data and fields without a space", () => {
    const p = new SseParser();
    const got = [
      ...p.feed(": keep-alive\r\nevent:ping\r\ndata:{}\r"),
      ...p.feed("\n\r\ndata: a\ndata: b\n\ndata: [DONE]\n\n"),
    ];
    expect(got).toEqual([{ event: "ping", data: "{}" }, { data: "a\nb" }, { data: "[DONE]" }]);
  });

  it("bounds one event", () => {
    const p = new SseParser(100);
    expect(() => p.feed(`data: ${"x".repeat(200)}`)).toThrow(/too large/);
  });
});
