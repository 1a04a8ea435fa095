import Anthropic from "@anthropic-ai/sdk";
import type { ModelProvider } from "@benchwright/shared/contract/policy";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import { TEXT_DELTAS } from "../fixtures/contract-server";
import { ANTHROPIC_USAGE, CANARY, type LaneSetup, MODEL, OPENAI_USAGE, startLane } from "./model-sdk";

// Cases J1-J3 through the official SDKs and the real proxy: only the declared model (J1), the
// key in nothing the sandbox gets back, translated or not, streamed or not, errors included
// (J2), and the run's budget refused past its end in the caller's format, with the spend
// recorded equal to what the provider reported (J3).

const lanes: LaneSetup[] = [];
afterEach(async () => {
  await Promise.all(lanes.splice(0).map((l) => l.close()));
});
async function lane(
  provider: ModelProvider,
  options: Parameters<typeof startLane>[1] = {},
): Promise<LaneSetup> {
  const l = await startLane(provider, options);
  lanes.push(l);
  return l;
}

const hello = [{ role: "user" as const, content: "Say hello." }];
const chat = (l: LaneSetup, more: Partial<OpenAI.Chat.ChatCompletionCreateParamsNonStreaming> = {}) =>
  l.openai.chat.completions.create({ model: MODEL, messages: hello, ...more });
const messages = (l: LaneSetup, more: Partial<Anthropic.MessageCreateParamsNonStreaming> = {}) =>
  l.anthropic.messages.create({ model: MODEL, max_tokens: 256, messages: hello, ...more });

/** The error a call threw (it must throw). */
async function thrown(call: Promise<unknown>): Promise<Error> {
  try {
    await call;
  } catch (e) {
    return e as Error;
  }
  throw new Error("the call did not fail");
}

/** All an SDK error exposes: message, body, headers. */
const errorText = (e: unknown) => {
  const err = e as { message: string; error?: unknown; headers?: Headers };
  return `${err.message}\n${JSON.stringify(err.error)}\n${JSON.stringify([...(err.headers ?? new Headers())])}`;
};

describe("case J1: only the declared model", () => {
  for (const provider of ["openai", "anthropic"] as const) {
    it(`case J1: another model through either SDK (${provider} provider): refused in the caller's format, nothing sent`, async () => {
      const l = await lane(provider);
      const o = await thrown(chat(l, { model: "gpt-4o" }));
      expect(o).toBeInstanceOf(OpenAI.BadRequestError);
      expect((o as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("model_not_declared");
      const r = await thrown(l.openai.responses.create({ model: "gpt-4o", input: "hi" }));
      expect((r as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("model_not_declared");
      const a = await thrown(messages(l, { model: "claude-sonnet-4-5" }));
      expect(a).toBeInstanceOf(Anthropic.BadRequestError);
      expect((a as InstanceType<typeof Anthropic.BadRequestError>).error).toMatchObject({
        type: "error",
        error: { type: "invalid_request_error" },
      });
      expect(l.server.connections).toBe(0);
      expect(l.server.calls).toHaveLength(0);
      expect(
        l.proxy.audit.modelCalls.map((c) => [c.endpoint, c.refused, c.status, c.inputTokens, c.outputTokens]),
      ).toEqual([
        ["chat.completions", "model_not_declared", 400, 0, 0],
        ["responses", "model_not_declared", 400, 0, 0],
        ["messages", "model_not_declared", 400, 0, 0],
      ]);
    });
  }
});

describe("case J2: the key never reaches the sandbox", () => {
  // The contract servers put the key they received into a header, the text, every stream and
  // every error: all of it must come back masked, whichever way it was translated.
  const masked = `[${"*".repeat(CANARY.length)}]`;
  for (const provider of ["openai", "anthropic"] as const) {
    it(`case J2: translated and passed-through answers, streams and errors carry no key (${provider} provider)`, async () => {
      const l = await lane(provider, { server: { echoKey: true } });
      const seen: string[] = [];
      const plain = await chat(l).withResponse();
      seen.push(JSON.stringify(plain.data), JSON.stringify([...plain.response.headers]));
      expect(plain.data.choices[0]?.message.content).toBe(`${TEXT_DELTAS.join("")} ${masked}`);
      const stream = await l.openai.chat.completions.create({ model: MODEL, messages: hello, stream: true });
      for await (const chunk of stream) seen.push(JSON.stringify(chunk));
      const m = await messages(l);
      seen.push(JSON.stringify(m));
      const ms = l.anthropic.messages.stream({ model: MODEL, max_tokens: 256, messages: hello });
      ms.on("streamEvent", (e) => void seen.push(JSON.stringify(e)));
      await ms.finalMessage();
      const rs = await l.openai.responses.create({ model: MODEL, input: "Say hello.", stream: true });
      for await (const event of rs) seen.push(JSON.stringify(event));
      const all = seen.join("\n");
      expect(all).not.toContain(CANARY);
      // The echo went through every path: five answers, each with the masked key in its text.
      expect(all.split(masked).length - 1).toBeGreaterThanOrEqual(5);
      expect(l.server.calls.every((c) => c.keyMatches)).toBe(true);
    });

    it(`case J2: the provider's errors, translated or not, carry no key (${provider} provider)`, async () => {
      const l = await lane(provider, {
        server: { echoKey: true, failWith: { status: 400, message: "bad thing" } },
      });
      const o = await thrown(chat(l));
      expect(o).toBeInstanceOf(OpenAI.BadRequestError);
      expect(o.message).toContain("bad thing");
      const a = await thrown(messages(l));
      expect(a).toBeInstanceOf(Anthropic.BadRequestError);
      expect(a.message).toContain("bad thing");
      const r = await thrown(l.openai.responses.create({ model: MODEL, input: "hi", stream: true }));
      expect(r).toBeInstanceOf(OpenAI.BadRequestError);
      for (const e of [o, a, r]) {
        expect(errorText(e)).not.toContain(CANARY);
        expect(errorText(e)).toContain(masked);
      }
      // The provider answered: calls, not refusals.
      expect(l.proxy.audit.modelCalls.map((c) => [c.status, c.refused])).toEqual([
        [400, null],
        [400, null],
        [400, null],
      ]);
    });
  }

  it("case J2: a provider error the SDK retries (429) reaches the caller in its format", async () => {
    const l = await lane("anthropic", {
      maxRetries: 0,
      server: { failWith: { status: 429, message: "slow down" } },
    });
    const o = await thrown(chat(l));
    expect(o).toBeInstanceOf(OpenAI.RateLimitError);
    expect(o.message).toContain("slow down");
  });
});

describe("case J3: the run's model budget", () => {
  it("case J3: a calls budget: refused past it in each caller's format, with x-should-retry: false, never retried", async () => {
    const l = await lane("anthropic", { budget: { calls: 2, inputTokens: null, outputTokens: null } });
    await chat(l);
    await messages(l);
    // Both SDKs would retry a 429 twice by default: they must not, here.
    const o = await thrown(chat(l));
    expect(o).toBeInstanceOf(OpenAI.RateLimitError);
    expect((o as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("over_budget");
    expect((o as InstanceType<typeof OpenAI.RateLimitError>).headers.get("x-should-retry")).toBe("false");
    const a = await thrown(messages(l));
    expect(a).toBeInstanceOf(Anthropic.RateLimitError);
    expect((a as InstanceType<typeof Anthropic.RateLimitError>).error).toMatchObject({
      type: "error",
      error: { type: "rate_limit_error" },
    });
    const s = await thrown(l.openai.responses.create({ model: MODEL, input: "hi", stream: true }));
    expect(s).toBeInstanceOf(OpenAI.RateLimitError);
    expect(l.server.calls).toHaveLength(2);
    const rows = l.proxy.audit.modelCalls;
    expect(rows.map((r) => r.refused)).toEqual([null, null, "over_budget", "over_budget", "over_budget"]);
    expect(rows.slice(2).every((r) => r.status === 429 && r.inputTokens === 0 && r.outputTokens === 0)).toBe(
      true,
    );
  });

  it("case J3: an output budget: each call's max_tokens lowered to what is left, never passed, the spend as reported", async () => {
    const l = await lane("anthropic", { budget: { calls: null, inputTokens: null, outputTokens: 8 } });
    const first = await messages(l);
    const stream = l.anthropic.messages.stream({ model: MODEL, max_tokens: 256, messages: hello });
    const second = await stream.finalMessage();
    expect(await thrown(messages(l))).toBeInstanceOf(Anthropic.RateLimitError);
    // The provider was asked for at most what was left, and answered within it.
    expect(l.server.calls.map((c) => c.body.max_tokens)).toEqual([8, 8 - ANTHROPIC_USAGE.output_tokens]);
    expect([first.usage.output_tokens, second.usage.output_tokens]).toEqual([6, 2]);
    const rows = l.proxy.audit.modelCalls;
    expect(rows.map((r) => [r.outputTokens, r.refused])).toEqual([
      [6, null],
      [2, null],
      [0, "over_budget"],
    ]);
    const inputs =
      ANTHROPIC_USAGE.input_tokens +
      ANTHROPIC_USAGE.cache_read_input_tokens +
      ANTHROPIC_USAGE.cache_creation_input_tokens;
    expect(rows.slice(0, 2).map((r) => [r.inputTokens, r.cachedInputTokens])).toEqual([
      [inputs, ANTHROPIC_USAGE.cache_read_input_tokens],
      [inputs, ANTHROPIC_USAGE.cache_read_input_tokens],
    ]);
  });

  it("case J3: an output budget, OpenAI format with no max given: the lane sets max_completion_tokens", async () => {
    const l = await lane("openai", { budget: { calls: null, inputTokens: null, outputTokens: 8 } });
    const first = await chat(l);
    const second = await chat(l, { max_tokens: 100 });
    expect(await thrown(chat(l))).toBeInstanceOf(OpenAI.RateLimitError);
    expect(l.server.calls.map((c) => [c.body.max_completion_tokens, c.body.max_tokens])).toEqual([
      [8, undefined],
      [undefined, 8 - OPENAI_USAGE["chat.completions"].output],
    ]);
    expect(first.usage?.completion_tokens).toBe(OPENAI_USAGE["chat.completions"].output);
    expect(second.usage?.completion_tokens).toBe(3);
    expect(l.proxy.audit.modelCalls.map((r) => r.outputTokens)).toEqual([5, 3, 0]);
  });

  it("case J3: an input budget: the call that passes it is the last (it can pass by its own input), the spend as reported", async () => {
    const l = await lane("openai", { budget: { calls: null, inputTokens: 20, outputTokens: null } });
    const a = await messages(l);
    const b = l.openai.chat.completions.stream({ model: MODEL, messages: hello });
    await b.finalChatCompletion();
    const c = await thrown(messages(l));
    expect(c).toBeInstanceOf(Anthropic.RateLimitError);
    expect(c.message).toContain("input tokens");
    const rows = l.proxy.audit.modelCalls;
    const u = OPENAI_USAGE["chat.completions"];
    expect(
      rows.map((r) => [r.endpoint, r.inputTokens, r.outputTokens, r.cachedInputTokens, r.refused]),
    ).toEqual([
      ["messages", u.input, u.output, u.cached, null],
      ["chat.completions", u.input, u.output, u.cached, null],
      ["messages", 0, 0, 0, "over_budget"],
    ]);
    expect(a.usage.output_tokens).toBe(u.output);
  });

  it("case J3: concurrent calls cannot pass a calls budget: counted when they start", async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const l = await lane("anthropic", {
      budget: { calls: 1, inputTokens: null, outputTokens: null },
      server: { midStream: () => gate },
    });
    const first = l.anthropic.messages.stream({ model: MODEL, max_tokens: 256, messages: hello });
    // The first call is in flight (its stream has begun) when the second arrives.
    await new Promise<void>((resolve) => first.on("streamEvent", () => resolve()));
    const second = await thrown(messages(l));
    expect(second).toBeInstanceOf(Anthropic.RateLimitError);
    release();
    expect((await first.finalMessage()).stop_reason).toBe("end_turn");
    expect(l.server.calls).toHaveLength(1);
  });

  it("case J3: an output budget held by a call in flight: retryable 429 budget_in_flight, then served", async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const l = await lane("openai", {
      maxRetries: 0,
      budget: { calls: null, inputTokens: null, outputTokens: 50 },
      server: { midStream: () => gate },
    });
    // No max given: the first call may use all that is left, so all of it is held while it runs.
    const first = l.openai.chat.completions.stream({ model: MODEL, messages: hello });
    await new Promise<void>((resolve) => first.on("content", () => resolve()));
    const held = (await thrown(chat(l))) as InstanceType<typeof OpenAI.RateLimitError>;
    expect(held).toBeInstanceOf(OpenAI.RateLimitError);
    expect(held.code).toBe("budget_in_flight");
    expect(held.headers.get("retry-after")).toBe("1");
    release();
    await first.finalChatCompletion();
    expect((await chat(l)).choices[0]?.message.content).toBe(TEXT_DELTAS.join(""));
    // The refusal is recorded first: the held call's row comes when it ends.
    expect(l.proxy.audit.modelCalls.map((r) => r.refused)).toEqual(["budget_in_flight", null, null]);
  });
});

describe("headers on the way out", () => {
  for (const provider of ["openai", "anthropic"] as const) {
    it(`only the provider's auth and feature flags of its own format go along (${provider} provider)`, async () => {
      const l = await lane(provider);
      await messages(l, {}).withResponse();
      await l.anthropic.messages.create(
        { model: MODEL, max_tokens: 16, messages: hello },
        { headers: { "anthropic-beta": "some-beta-2025-01-01" } },
      );
      await l.openai.chat.completions.create(
        { model: MODEL, messages: hello },
        {
          headers: {
            "openai-beta": "assistants=v2",
            "openai-organization": "org-other",
            "openai-project": "proj-other",
          },
        },
      );
      const [, beta, openaiCall] = l.server.calls;
      const names = l.server.calls.flatMap((c) => c.headerNames);
      for (const name of ["openai-organization", "openai-project", "x-stainless-lang", "cookie"])
        expect(names).not.toContain(name);
      expect(l.server.calls.every((c) => c.keyMatches && !c.placeholderSent)).toBe(true);
      if (provider === "anthropic") {
        expect(beta?.headerNames).toContain("anthropic-beta");
        expect(openaiCall?.headerNames).not.toContain("openai-beta");
        expect(names).not.toContain("authorization");
        // A body as the caller wrote it keeps the caller's API version; a translated one is 2023-06-01.
        expect(l.server.calls.map((c) => c.version)).toEqual(["2026-10-21", "2026-10-21", "2023-06-01"]);
      } else {
        expect(beta?.headerNames).not.toContain("anthropic-beta");
        expect(openaiCall?.headerNames).toContain("openai-beta");
        expect(names).not.toContain("x-api-key");
        expect(names).not.toContain("anthropic-version");
      }
    });
  }
});

describe("Anthropic's API versions", () => {
  for (const provider of ["openai", "anthropic"] as const) {
    it(`a 2026-10-21 system turn among the messages, and an OpenAI caller's temperature (${provider} provider)`, async () => {
      const l = await lane(provider);
      const answer = await messages(l, {
        messages: [
          { role: "system", content: "Be brief." },
          { role: "user", content: "Say hello." },
        ],
      });
      expect(answer.content).toEqual([expect.objectContaining({ type: "text", text: TEXT_DELTAS.join("") })]);
      // Sampling parameters exist in 2023-06-01 only: a translation to Anthropic writes that version.
      const chatAnswer = await chat(l, { temperature: 0.5, top_p: 0.9 });
      expect(chatAnswer.choices[0]?.message.content).toBe(TEXT_DELTAS.join(""));
      expect(l.server.calls.map((c) => c.status)).toEqual([200, 200]);
    });
  }
});

describe("translated streams are not buffered", () => {
  const held = () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    return { gate, release };
  };

  it("the Anthropic SDK has its first translated text before OpenAI's provider has finished", async () => {
    const { gate, release } = held();
    const l = await lane("openai", { server: { midStream: () => gate } });
    const stream = l.anthropic.messages.stream({ model: MODEL, max_tokens: 64, messages: hello });
    // OpenAI's contract server holds after its first text delta.
    await new Promise<void>((resolve) => stream.on("text", () => resolve()));
    expect(l.proxy.audit.modelCalls).toHaveLength(0);
    release();
    expect((await stream.finalMessage()).content).toEqual([
      expect.objectContaining({ text: TEXT_DELTAS.join("") }),
    ]);
  });

  it("the OpenAI SDK has its first translated chunk before Anthropic's provider has finished", async () => {
    const { gate, release } = held();
    const l = await lane("anthropic", { server: { midStream: () => gate } });
    const stream = l.openai.chat.completions.stream({ model: MODEL, messages: hello });
    // Anthropic's contract server holds after message_start and ping.
    await new Promise<void>((resolve) => stream.on("chunk", () => resolve()));
    expect(l.proxy.audit.modelCalls).toHaveLength(0);
    release();
    expect((await stream.finalChatCompletion()).choices[0]?.message.content).toBe(TEXT_DELTAS.join(""));
  });
});

describe("what cannot be translated", () => {
  it("is refused in the caller's format, never dropped: nothing sent, a refused row", async () => {
    const l = await lane("anthropic");
    const e = (await thrown(chat(l, { n: 2 }))) as InstanceType<typeof OpenAI.BadRequestError>;
    expect(e).toBeInstanceOf(OpenAI.BadRequestError);
    expect(e.param).toBe("n");
    expect(l.server.calls).toHaveLength(0);
    expect(l.proxy.audit.modelCalls.map((r) => [r.refused, r.status])).toEqual([["untranslatable", 400]]);
  });
});
