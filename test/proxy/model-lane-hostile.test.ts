import { once } from "node:events";
import { request as httpRequest } from "node:http";
import type { Socket } from "node:net";
import type { ModelBudget, ModelProvider } from "@benchwright/shared/contract/policy";
import { MODEL_LANE_HOST, MODEL_LANE_PLACEHOLDER_KEY } from "@benchwright/shared/contract/proxy-wire";
import OpenAI from "openai";
import { afterEach, describe, expect, it } from "vitest";
import type { ContractServerOptions } from "../fixtures/contract-server";
import { type LaneSetup, MODEL, OPENAI_USAGE, startLane } from "./model-sdk";

// Case L3: a hostile model client against the run's token budgets, through the real proxy and
// the real lane in front of the providers' contract servers. The contract servers record what
// each answer costs (`billed`: what the provider bills, whether or not its usage reached anyone),
// so each test can sum what the provider would charge the user's key and hold it to the budget:
// output never past its limit, input past it by at most one call's own input, and the spend the
// lane recorded equal to what the provider reported.

const lanes: LaneSetup[] = [];
afterEach(async () => {
  await Promise.all(lanes.splice(0).map((l) => l.close()));
});
async function lane(
  provider: ModelProvider,
  budget: ModelBudget,
  server: Partial<ContractServerOptions> = {},
): Promise<LaneSetup> {
  const l = await startLane(provider, { budget, server, maxRetries: 0 });
  lanes.push(l);
  return l;
}

/**
 * A point the contract server stops at (mid-stream, or before a whole answer) until released:
 * the test hangs the client up there, before the usage is sent.
 */
class Hold {
  private held: Array<() => void> = [];
  private arrivals: Array<() => void> = [];
  readonly wait = (): Promise<void> =>
    new Promise((resolve) => {
      this.held.push(resolve);
      for (const arrived of this.arrivals.splice(0)) arrived();
    });
  reached(): Promise<void> {
    if (this.held.length > 0) return Promise.resolve();
    return new Promise((resolve) => this.arrivals.push(resolve));
  }
  release(): void {
    for (const go of this.held.splice(0)) go();
  }
}

type Path = "/v1/chat/completions" | "/v1/responses" | "/v1/messages";
const hello = [{ role: "user" as const, content: "Say hello." }];
const BODIES: Record<Path, Record<string, unknown>> = {
  "/v1/chat/completions": { model: MODEL, messages: hello },
  "/v1/responses": { model: MODEL, input: "Say hello." },
  "/v1/messages": { model: MODEL, max_tokens: 256, messages: hello },
};
const HEADERS: Record<Path, Record<string, string>> = {
  "/v1/chat/completions": { authorization: `Bearer ${MODEL_LANE_PLACEHOLDER_KEY}` },
  "/v1/responses": { authorization: `Bearer ${MODEL_LANE_PLACEHOLDER_KEY}` },
  "/v1/messages": { "x-api-key": MODEL_LANE_PLACEHOLDER_KEY, "anthropic-version": "2023-06-01" },
};

interface Answer {
  status: number;
  text: string;
  hungUp: boolean;
}

/**
 * One call on its own connection to the proxy, as a sandbox makes it: answered (a refusal), or
 * hung up once the provider has begun (`hold` reached), before any usage. It returns when the
 * proxy has seen its connection close; the provider is then let go on, and the lane's record
 * of the call is awaited.
 */
async function call(l: LaneSetup, path: Path, more: Record<string, unknown>, hold: Hold): Promise<Answer> {
  const logs = l.proxy.logs.length;
  let serverSide: Socket | null = null;
  const onConnection = (s: Socket) => {
    serverSide = s;
  };
  l.proxy.proxy.http.once("connection", onConnection);
  const payload = JSON.stringify({ ...BODIES[path], ...more });
  const answer = await new Promise<Answer>((resolve, reject) => {
    const req = httpRequest({
      host: "127.0.0.1",
      port: l.proxy.httpPort,
      method: "POST",
      path,
      agent: false,
      headers: {
        host: MODEL_LANE_HOST,
        "content-type": "application/json",
        "content-length": Buffer.byteLength(payload),
        ...HEADERS[path],
      },
    });
    let done = false;
    req.on("error", (e) => {
      if (!done) reject(e);
    });
    req.on("response", (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (c: Buffer) => chunks.push(c));
      res.on("end", () => {
        if (done) return;
        done = true;
        resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString(), hungUp: false });
      });
      res.on("error", () => {});
    });
    void hold.reached().then(async () => {
      if (done) return;
      done = true;
      req.destroy();
      const socket = serverSide as Socket | null;
      if (socket !== null && !socket.closed) await once(socket, "close");
      // The proxy's own close handlers (the response's) run after this one.
      await new Promise((r) => setImmediate(r));
      resolve({ status: 0, text: "", hungUp: true });
    });
    req.end(payload);
  });
  l.proxy.proxy.http.off("connection", onConnection);
  hold.release();
  await l.proxy.waitForLog((r) => r.event === "decision" && String(r.reason).startsWith("model lane"), logs);
  return answer;
}

const sum = (values: number[]) => values.reduce((a, b) => a + b, 0);

/** What the provider billed the user's key over the lane's life, and the largest single input. */
function billed(l: LaneSetup) {
  const all = l.server.calls.flatMap((c) => (c.billed === null ? [] : [c.billed]));
  return {
    input: sum(all.map((b) => b.input)),
    output: sum(all.map((b) => b.output)),
    largestInput: Math.max(0, ...all.map((b) => b.input)),
  };
}

/** The spend the lane recorded (its rows). */
function recorded(l: LaneSetup) {
  const rows = l.proxy.audit.modelCalls;
  return { input: sum(rows.map((r) => r.inputTokens)), output: sum(rows.map((r) => r.outputTokens)) };
}

function expectWithinBudget(l: LaneSetup, budget: { inputTokens: number; outputTokens: number }) {
  const cost = billed(l);
  expect(cost.output).toBeLessThanOrEqual(budget.outputTokens);
  expect(cost.input).toBeLessThanOrEqual(budget.inputTokens + cost.largestInput);
}

const BUDGET = { calls: null, inputTokens: 40, outputTokens: 20 };
/** More hang-ups than the budget could ever admit were they counted. */
const ATTEMPTS = 8;

describe("case L3: a client that hangs up before the usage", () => {
  // Passed through and translated, streamed and whole: each way a call can be hung up.
  const ways: Array<{ provider: ModelProvider; path: Path; stream: boolean; how: string }> = [
    { provider: "openai", path: "/v1/chat/completions", stream: true, how: "passed through" },
    { provider: "openai", path: "/v1/chat/completions", stream: false, how: "passed through" },
    { provider: "openai", path: "/v1/responses", stream: true, how: "passed through" },
    { provider: "anthropic", path: "/v1/messages", stream: true, how: "passed through" },
    { provider: "anthropic", path: "/v1/messages", stream: false, how: "passed through" },
    { provider: "anthropic", path: "/v1/chat/completions", stream: true, how: "translated" },
    { provider: "anthropic", path: "/v1/chat/completions", stream: false, how: "translated" },
    { provider: "openai", path: "/v1/messages", stream: true, how: "translated" },
  ];
  for (const { provider, path, stream, how } of ways) {
    it(`case L3: ${path}, ${stream ? "streamed" : "whole"}, ${how} (${provider} provider): the budgets hold and the spend is the provider's`, async () => {
      const hold = new Hold();
      const l = await lane(provider, BUDGET, stream ? { midStream: hold.wait } : { beforeAnswer: hold.wait });
      const answers: Answer[] = [];
      for (let i = 0; i < ATTEMPTS; i++) {
        const answer = await call(l, path, { stream }, hold);
        answers.push(answer);
        if (!answer.hungUp) break;
      }
      // Every call but the last was hung up; the last was refused: the budget is spent.
      expect(answers.slice(0, -1).every((a) => a.hungUp)).toBe(true);
      expect(answers.at(-1)?.status).toBe(429);
      expect(l.proxy.audit.modelCalls.at(-1)?.refused).toBe("over_budget");
      expectWithinBudget(l, BUDGET);
      // Each hung-up call was read to its usage: the spend recorded is what the provider billed.
      expect(recorded(l)).toEqual({ input: billed(l).input, output: billed(l).output });
      expect(l.proxy.audit.modelCalls.filter((r) => r.refused === null).every((r) => r.status === 499)).toBe(
        true,
      );
      // A chat stream reports usage only when asked: the lane asks.
      for (const c of l.server.calls.filter((c) => c.endpoint === "chat.completions" && c.stream))
        expect(c.body.stream_options).toEqual({ include_usage: true });
    });
  }

  it("case L3: a stream that ends without its usage is charged what it held: its output bound and its body's size as input", async () => {
    const l = await lane("openai", BUDGET, { cutStream: true });
    const body = { model: MODEL, messages: hello, stream: true };
    const first = await thrown(
      (async () => {
        const s = await l.openai.chat.completions.create(body as OpenAI.ChatCompletionCreateParamsStreaming);
        for await (const _ of s);
      })(),
    );
    expect(first).toBeInstanceOf(Error);
    const [row] = l.proxy.audit.modelCalls;
    // The whole output bound it held (the budget's 20), and no less input than the body's bytes.
    expect(row?.outputTokens).toBe(BUDGET.outputTokens);
    expect(row?.inputTokens).toBeGreaterThanOrEqual(Buffer.byteLength(JSON.stringify(body)));
    // So nothing is left of the output budget.
    const next = await thrown(l.openai.chat.completions.create({ model: MODEL, messages: hello }));
    expect((next as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("over_budget");
    expectWithinBudget(l, BUDGET);
  });
});

describe("case L3: n choices", () => {
  it("case L3: n > 1 is counted: each choice bounded to its share of what is left, the whole held and charged", async () => {
    const budget = { calls: null, inputTokens: null, outputTokens: 60 };
    const l = await lane("openai", budget);
    const answer = await l.openai.chat.completions.create({ model: MODEL, messages: hello, n: 10 });
    expect(answer.choices).toHaveLength(10);
    const streamed = await l.openai.chat.completions.create({
      model: MODEL,
      messages: hello,
      n: 4,
      stream: true,
    });
    for await (const _ of streamed);
    // 60 left for 10 choices: 6 each (each used 5); then 10 left for 4: 2 each.
    expect(l.server.calls.map((c) => c.body.max_completion_tokens)).toEqual([6, 2]);
    // 2 left: too little for 3 choices; enough for one.
    const three = await thrown(l.openai.chat.completions.create({ model: MODEL, messages: hello, n: 3 }));
    expect((three as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("over_budget");
    await l.openai.chat.completions.create({ model: MODEL, messages: hello, n: 1 });
    const spent = await thrown(l.openai.chat.completions.create({ model: MODEL, messages: hello }));
    expect((spent as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("over_budget");
    expect(billed(l).output).toBe(budget.outputTokens);
    expect(recorded(l).output).toBe(billed(l).output);
  });

  it("case L3: more choices than output is left for: over budget, nothing sent", async () => {
    const l = await lane("openai", { calls: null, inputTokens: null, outputTokens: 20 });
    const e = await thrown(l.openai.chat.completions.create({ model: MODEL, messages: hello, n: 21 }));
    expect(e).toBeInstanceOf(OpenAI.RateLimitError);
    expect((e as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("over_budget");
    expect(l.server.calls).toHaveLength(0);
  });

  it("case L3: an n the lane cannot count (not a whole number) is refused, nothing sent", async () => {
    const l = await lane("openai", { calls: null, inputTokens: null, outputTokens: 20 });
    for (const n of ["10", 2.5, 0, -1, { many: true }]) {
      const e = await thrown(l.openai.chat.completions.create({ model: MODEL, messages: hello, n } as never));
      expect(e, JSON.stringify(n)).toBeInstanceOf(OpenAI.BadRequestError);
      expect((e as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("unsupported_parameter");
      expect((e as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("n");
    }
    expect(l.server.calls).toHaveLength(0);
  });

  it("case L3: an output bound the lane cannot read (a string) is replaced by what is left, never passed on", async () => {
    const l = await lane("openai", { calls: null, inputTokens: null, outputTokens: 20 });
    await l.openai.chat.completions
      .create({
        model: MODEL,
        messages: hello,
        max_tokens: "100000",
      } as never)
      .catch(() => {});
    const sent = l.server.calls[0]?.body;
    expect(sent?.max_tokens).toBe(20);
    expect(sent?.max_completion_tokens).toBeUndefined();
  });
});

describe("case L3: background responses", () => {
  for (const stream of [false, true]) {
    it(`case L3: background: true${stream ? " (streamed)" : ""} is refused in OpenAI's format, nothing sent`, async () => {
      const l = await lane("openai", { calls: null, inputTokens: 1000, outputTokens: 1000 });
      const e = await thrown(
        l.openai.responses.create({ model: MODEL, input: "Say hello.", background: true, stream } as never),
      );
      expect(e).toBeInstanceOf(OpenAI.BadRequestError);
      expect((e as InstanceType<typeof OpenAI.BadRequestError>).code).toBe("unsupported_parameter");
      expect((e as InstanceType<typeof OpenAI.BadRequestError>).param).toBe("background");
      expect(l.server.calls).toHaveLength(0);
      expect(l.proxy.audit.modelCalls.map((r) => [r.refused, r.status])).toEqual([
        ["unsupported_parameter", 400],
      ]);
      // background: false is an ordinary call.
      await l.openai.responses.create({ model: MODEL, input: "Say hello.", background: false });
      expect(l.server.calls).toHaveLength(1);
    });
  }
});

describe("case L3: concurrent calls", () => {
  it("case L3: calls in flight hold an input estimate: together they cannot pass the input budget by more than one call's input", async () => {
    const budget = { calls: null, inputTokens: 20, outputTokens: null };
    const hold = new Hold();
    const l = await lane("openai", budget, { midStream: hold.wait });
    const first = l.openai.chat.completions.create({ model: MODEL, messages: hello, stream: true });
    await hold.reached();
    const others = await Promise.all(
      [1, 2, 3].map(() => thrown(l.openai.chat.completions.create({ model: MODEL, messages: hello }))),
    );
    for (const e of others) {
      expect(e).toBeInstanceOf(OpenAI.RateLimitError);
      expect((e as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("budget_in_flight");
    }
    hold.release();
    for await (const _ of await first);
    // One call's input (12) spent of 20: one more is admitted (it may pass by its own input), then none.
    await l.openai.chat.completions.create({ model: MODEL, messages: hello });
    const spent = await thrown(l.openai.chat.completions.create({ model: MODEL, messages: hello }));
    expect((spent as InstanceType<typeof OpenAI.RateLimitError>).code).toBe("over_budget");
    expect(billed(l).input).toBe(2 * OPENAI_USAGE["chat.completions"].input);
    expect(billed(l).input).toBeLessThanOrEqual(budget.inputTokens + billed(l).largestInput);
  });
});

/** The error a call threw (it must throw). */
async function thrown(p: Promise<unknown>): Promise<Error> {
  try {
    await p;
  } catch (e) {
    return e as Error;
  }
  throw new Error("the call did not fail");
}
