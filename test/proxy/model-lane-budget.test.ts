import { describe, expect, it } from "vitest";
import { type Ask, askedOutput, capOutput, choicesOf, Spend } from "../../proxy-image/src/proxy/model/budget";

// The budget's arithmetic on its own (case J3); the SDK tests (model-lane-cases.test.ts) show it
// through the proxy.

const budget = (calls: number | null, inputTokens: number | null, outputTokens: number | null) => ({
  calls,
  inputTokens,
  outputTokens,
});
const usage = (input: number, output: number) => ({ input, output, cached: 0 });
const reported = (input: number, output: number) => ({ reported: usage(input, output) });
/** One choice, no input estimate, the output bound given (or none), the provider's least. */
const ask = (asked: number | null = null, least = 1, more: Partial<Ask> = {}): Ask => ({
  asked,
  least,
  choices: 1,
  inputEstimate: 0,
  ...more,
});

describe("case J3: Spend", () => {
  it("case J3: counts a call when admitted and gives it back when it never reached the provider", () => {
    const spend = new Spend();
    const a = spend.admit(budget(1, null, null), ask());
    expect(a.ok).toBe(true);
    expect(spend.admit(budget(1, null, null), ask())).toMatchObject({
      ok: false,
      code: "over_budget",
      what: "calls",
    });
    if (a.ok) a.settle(null);
    expect(spend.snapshot().calls).toBe(0);
    expect(spend.admit(budget(1, null, null), ask()).ok).toBe(true);
  });

  it("case J3: tokens are counted from the provider's usage, once", () => {
    const spend = new Spend();
    const a = spend.admit(budget(null, 10, null), ask());
    if (!a.ok) throw new Error("refused");
    a.settle(reported(12, 3));
    a.settle(reported(12, 3));
    expect(spend.snapshot()).toEqual({ calls: 1, inputTokens: 12, outputTokens: 3 });
    expect(spend.admit(budget(null, 10, null), ask())).toMatchObject({ ok: false, what: "input tokens" });
  });

  it("case J3: output: the cap is what is left, reserved while in flight; too little left for the provider's minimum is spent", () => {
    const spend = new Spend();
    const a = spend.admit(budget(null, null, 40), ask(30));
    expect(a).toMatchObject({ ok: true, outputCap: 30 });
    expect(spend.admit(budget(null, null, 40), ask())).toMatchObject({ ok: true, outputCap: 10 });
    expect(spend.admit(budget(null, null, 40), ask())).toMatchObject({ ok: false, code: "budget_in_flight" });
    if (a.ok) a.settle(reported(1, 26));
    // 26 spent, 10 held: 4 left, enough for chat; less than OpenAI's responses minimum of 16,
    // for good (40) or until the held call ends (50).
    expect(spend.admit(budget(null, null, 40), ask(null, 16))).toMatchObject({
      ok: false,
      code: "over_budget",
    });
    expect(spend.admit(budget(null, null, 50), ask(null, 16))).toMatchObject({
      ok: false,
      code: "budget_in_flight",
    });
    expect(spend.admit(budget(null, null, 40), ask())).toMatchObject({ ok: true, outputCap: 4 });
  });

  it("case L3: n choices: each bounded to its share of what is left, the whole held", () => {
    const spend = new Spend();
    const a = spend.admit(budget(null, null, 40), ask(null, 1, { choices: 3 }));
    expect(a).toMatchObject({ ok: true, outputCap: 13 });
    // 39 held: 1 left, too little for 2 choices while it runs; enough for 1.
    expect(spend.admit(budget(null, null, 40), ask(null, 1, { choices: 2 }))).toMatchObject({
      ok: false,
      code: "budget_in_flight",
    });
    expect(spend.admit(budget(null, null, 40), ask())).toMatchObject({ ok: true, outputCap: 1 });
    // More choices than could ever fit: over budget.
    expect(new Spend().admit(budget(null, null, 40), ask(null, 1, { choices: 41 }))).toMatchObject({
      ok: false,
      code: "over_budget",
    });
    expect(choicesOf("openai-chat", { n: 4 })).toBe(4);
    expect(choicesOf("openai-chat", {})).toBe(1);
    expect(choicesOf("openai-chat", { n: null })).toBe(1);
    for (const n of ["4", 2.5, 0, -1, true]) expect(choicesOf("openai-chat", { n })).toBeNull();
    // Only chat has a multiplier (the other formats' providers would refuse an `n`).
    expect(choicesOf("anthropic-messages", { n: 4 })).toBe(1);
  });

  it("case L3: a call whose usage never came is charged what it held, or what was seen when more", () => {
    const spend = new Spend();
    const a = spend.admit(budget(null, 1000, 40), ask(null, 1, { choices: 2, inputEstimate: 300 }));
    if (!a.ok) throw new Error("refused");
    expect(a.outputCap).toBe(20);
    expect(a.settle({ unreported: usage(12, 0) })).toEqual(usage(300, 40));
    const b = spend.admit(budget(null, null, null), ask(100, 1, { inputEstimate: 50 }));
    if (!b.ok) throw new Error("refused");
    // No output limit: the request's own bound is what it may have cost.
    expect(b.settle({ unreported: usage(80, 3) })).toEqual(usage(80, 100));
    expect(spend.snapshot()).toEqual({ calls: 2, inputTokens: 380, outputTokens: 140 });
  });

  it("case L3: calls in flight hold their input estimate: a call is admitted while spent and held are under the limit", () => {
    const spend = new Spend();
    const a = spend.admit(budget(null, 100, null), ask(null, 1, { inputEstimate: 60 }));
    expect(a.ok).toBe(true);
    const b = spend.admit(budget(null, 100, null), ask(null, 1, { inputEstimate: 60 }));
    expect(b.ok).toBe(true);
    // 120 held: retry when they end.
    expect(spend.admit(budget(null, 100, null), ask())).toMatchObject({
      ok: false,
      code: "budget_in_flight",
      what: "input tokens",
    });
    if (a.ok) a.settle(reported(30, 1));
    if (b.ok) b.settle(reported(30, 1));
    expect(spend.admit(budget(null, 100, null), ask()).ok).toBe(true);
  });

  it("capOutput lowers every bound given, or sets the provider's field", () => {
    const chat: Record<string, unknown> = { max_tokens: 100, max_completion_tokens: 5 };
    expect(askedOutput("openai-chat", chat)).toBe(5);
    capOutput("openai-chat", chat, 8, "max_completion_tokens");
    expect(chat).toEqual({ max_tokens: 8, max_completion_tokens: 5 });
    // A bound that is not a number is replaced, never passed on for the provider to read.
    const odd: Record<string, unknown> = { max_tokens: "100000", max_completion_tokens: null };
    capOutput("openai-chat", odd, 8, "max_completion_tokens");
    expect(odd).toEqual({ max_tokens: 8, max_completion_tokens: 8 });
    const none: Record<string, unknown> = {};
    capOutput("openai-responses", none, 20, "max_output_tokens");
    expect(none).toEqual({ max_output_tokens: 20 });
  });
});
