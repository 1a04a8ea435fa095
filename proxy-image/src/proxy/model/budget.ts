import type { ModelBudget } from "../../../../shared/contract/policy";
import type { Usage, WireFormat } from "./translate";

// The run's model budget (case J3), kept by the proxy: one proxy serves one run, so one Spend
// per lane is the run's. Counts are the provider's own (what it reported per call).
//
// When each thing is counted, and why:
// - A call counts when it is admitted, before it goes upstream, so concurrent calls cannot
//   together pass the call limit. A call that never reached the provider is given back.
// - Tokens count when the answer is in (only the provider knows them). Input tokens cannot be
//   known before, so a call admitted under the input limit may pass it by its own input.
// - Output tokens cannot pass their limit: each admitted call's output bound (max_tokens and
//   kin) is set or lowered to what is left, and that much is reserved while it runs. A call
//   that finds everything left reserved by calls in flight is refused as retryable
//   (budget_in_flight, with Retry-After) rather than over budget: the budget is not spent yet.

export type Admission =
  | { ok: true; outputCap: number | null; settle(usage: Usage | null): void }
  | { ok: false; code: "over_budget" | "budget_in_flight"; what: "calls" | "input tokens" | "output tokens" };

export interface SpendSnapshot {
  calls: number;
  inputTokens: number;
  outputTokens: number;
}

export class Spend {
  private calls = 0;
  private input = 0;
  private output = 0;
  private reserved = 0;

  snapshot(): SpendSnapshot {
    return { calls: this.calls, inputTokens: this.input, outputTokens: this.output };
  }

  /**
   * `asked`: the output bound the request itself carries, if any; `least`: the smallest bound
   * the provider accepts (OpenAI's responses: 16), below which what is left cannot be asked for.
   */
  admit(budget: ModelBudget | null, asked: number | null, least = 1): Admission {
    const b = budget ?? { calls: null, inputTokens: null, outputTokens: null };
    if (b.calls !== null && this.calls >= b.calls) return { ok: false, code: "over_budget", what: "calls" };
    if (b.inputTokens !== null && this.input >= b.inputTokens)
      return { ok: false, code: "over_budget", what: "input tokens" };
    let cap: number | null = null;
    if (b.outputTokens !== null) {
      if (b.outputTokens - this.output < least)
        return { ok: false, code: "over_budget", what: "output tokens" };
      const left = b.outputTokens - this.output - this.reserved;
      if (left < least) return { ok: false, code: "budget_in_flight", what: "output tokens" };
      cap = asked === null ? left : Math.min(asked, left);
    }
    this.calls++;
    this.reserved += cap ?? 0;
    let settled = false;
    return {
      ok: true,
      outputCap: cap,
      settle: (usage) => {
        if (settled) return;
        settled = true;
        this.reserved -= cap ?? 0;
        // null: the request never reached the provider, so it was no call.
        if (usage === null) this.calls--;
        else {
          this.input += usage.input;
          this.output += usage.output;
        }
      },
    };
  }
}

/** The fields that bound output tokens in each format (chat has a deprecated second name). */
const OUTPUT_FIELDS: Record<WireFormat, readonly string[]> = {
  "openai-chat": ["max_completion_tokens", "max_tokens"],
  "openai-responses": ["max_output_tokens"],
  "anthropic-messages": ["max_tokens"],
};

/** The request's own output bound (the smallest it gives), or null when it gives none. */
export function askedOutput(format: WireFormat, body: Record<string, unknown>): number | null {
  let asked: number | null = null;
  for (const field of OUTPUT_FIELDS[format]) {
    const v = body[field];
    if (typeof v === "number" && Number.isFinite(v) && v >= 0)
      asked = asked === null ? v : Math.min(asked, v);
  }
  return asked;
}

/** Lowers every output bound the body gives to `cap`, or sets `field` when it gives none. */
export function capOutput(
  format: WireFormat,
  body: Record<string, unknown>,
  cap: number,
  field: string,
): void {
  let given = false;
  for (const f of OUTPUT_FIELDS[format]) {
    const v = body[f];
    if (typeof v !== "number") continue;
    given = true;
    body[f] = Math.min(v, cap);
  }
  if (!given) body[field] = cap;
}
