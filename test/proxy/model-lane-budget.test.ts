import { describe, expect, it } from "vitest";
import { askedOutput, capOutput, Spend } from "../../proxy-image/src/proxy/model/budget";

// The budget's arithmetic on its own (case J3); the SDK tests (model-lane-cases.test.ts) show it
// through the proxy.

const budget = (calls: number | null, inputTokens: number | null, outputTokens: number | null) => ({
  calls,
  inputTokens,
  outputTokens,
});
const usage = (input: number, output: number) => ({ input, output, cached: 0 });

describe("case J3: Spend", () => {
  it("case J3: counts a call when admitted and gives it back when it never reached the provider", () => {
    const spend = new Spend();
    const a = spend.admit(budget(1, null, null), null);
    expect(a.ok).toBe(true);
    expect(spend.admit(budget(1, null, null), null)).toMatchObject({
      ok: false,
      code: "over_budget",
      what: "calls",
    });
    if (a.ok) a.settle(null);
    expect(spend.snapshot().calls).toBe(0);
    expect(spend.admit(budget(1, null, null), null).ok).toBe(true);
  });

  it("case J3: tokens are counted from the provider's usage, once", () => {
    const spend = new Spend();
    const a = spend.admit(budget(null, 10, null), null);
    if (!a.ok) throw new Error("refused");
    a.settle(usage(12, 3));
    a.settle(usage(12, 3));
    expect(spend.snapshot()).toEqual({ calls: 1, inputTokens: 12, outputTokens: 3 });
    expect(spend.admit(budget(null, 10, null), null)).toMatchObject({ ok: false, what: "input tokens" });
  });

  it("case J3: output: the cap is what is left, reserved while in flight; too little left for the provider's minimum is spent", () => {
    const spend = new Spend();
    const a = spend.admit(budget(null, null, 40), 30);
    expect(a).toMatchObject({ ok: true, outputCap: 30 });
    expect(spend.admit(budget(null, null, 40), null)).toMatchObject({ ok: true, outputCap: 10 });
    expect(spend.admit(budget(null, null, 40), null)).toMatchObject({ ok: false, code: "budget_in_flight" });
    if (a.ok) a.settle(usage(1, 26));
    // 26 spent, 10 held: 4 left, enough for chat; less than OpenAI's responses minimum of 16,
    // for good (40) or until the held call ends (50).
    expect(spend.admit(budget(null, null, 40), null, 16)).toMatchObject({ ok: false, code: "over_budget" });
    expect(spend.admit(budget(null, null, 50), null, 16)).toMatchObject({
      ok: false,
      code: "budget_in_flight",
    });
    expect(spend.admit(budget(null, null, 40), null)).toMatchObject({ ok: true, outputCap: 4 });
  });

  it("capOutput lowers every bound given, or sets the provider's field", () => {
    const chat: Record<string, unknown> = { max_tokens: 100, max_completion_tokens: 5 };
    expect(askedOutput("openai-chat", chat)).toBe(5);
    capOutput("openai-chat", chat, 8, "max_completion_tokens");
    expect(chat).toEqual({ max_tokens: 8, max_completion_tokens: 5 });
    const none: Record<string, unknown> = {};
    capOutput("openai-responses", none, 20, "max_output_tokens");
    expect(none).toEqual({ max_output_tokens: 20 });
  });
});
