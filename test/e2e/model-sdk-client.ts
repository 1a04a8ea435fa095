import Anthropic from "@anthropic-ai/sdk";
import OpenAI from "openai";

// The benchmark side of the model e2e test (model-sdks.test.ts): bundled with esbuild into one
// file, uploaded as the run's bundle and run inside a real work sandbox. Both official SDKs are
// constructed with no arguments at all, as a harness would: OPENAI_BASE_URL / OPENAI_API_KEY and
// ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY come from the sandbox's environment (placeholders; the
// real key stays in the proxy). Each SDK makes a plain call, a streamed one, a tool-use round
// trip and a streamed tool call, and one call past the run's budget; the test asserts on the one
// JSON line printed at the end (answers, stop reasons, usage, error statuses), never on prompts.

const MODEL = process.argv[2] ?? "eval-model";
const WEATHER = {
  name: "get_weather",
  description: "The weather in a city",
  parameters: { type: "object" as const, properties: { city: { type: "string" } }, required: ["city"] },
};

async function openai() {
  const client = new OpenAI({ maxRetries: 0 });
  const user = { role: "user" as const, content: "What is the weather in Paris?" };
  const plain = await client.chat.completions.create({ model: MODEL, messages: [user], max_tokens: 64 });
  let streamed = "";
  let streamUsage: unknown = null;
  const stream = await client.chat.completions.create({
    model: MODEL,
    messages: [user],
    max_tokens: 64,
    stream: true,
    stream_options: { include_usage: true },
  });
  for await (const chunk of stream) {
    streamed += chunk.choices[0]?.delta?.content ?? "";
    if (chunk.usage) streamUsage = chunk.usage;
  }
  const tools = [{ type: "function" as const, function: WEATHER }];
  const call = await client.chat.completions.create({
    model: MODEL,
    messages: [user],
    tools,
    max_tokens: 64,
  });
  const toolCall = call.choices[0]?.message.tool_calls?.[0];
  const answer =
    toolCall && toolCall.type === "function"
      ? await client.chat.completions.create({
          model: MODEL,
          max_tokens: 64,
          tools,
          messages: [
            user,
            call.choices[0]?.message as OpenAI.ChatCompletionMessageParam,
            { role: "tool", tool_call_id: toolCall.id, content: "sunny, 21 C" },
          ],
        })
      : null;
  // Tool arguments arrive in fragments; the SDK's stream helper puts them together.
  const toolStream = client.chat.completions.stream({
    model: MODEL,
    messages: [user],
    tools,
    max_tokens: 64,
  });
  const streamedCall = (await toolStream.finalChatCompletion()).choices[0]?.message.tool_calls?.[0];
  const responses = await client.responses.create({
    model: MODEL,
    input: "Say hello",
    max_output_tokens: 64,
  });
  return {
    plain: {
      text: plain.choices[0]?.message.content,
      finish: plain.choices[0]?.finish_reason,
      usage: plain.usage,
    },
    stream: { text: streamed, usage: streamUsage },
    tool: {
      finish: call.choices[0]?.finish_reason,
      name: toolCall?.type === "function" ? toolCall.function.name : null,
      args: toolCall?.type === "function" ? JSON.parse(toolCall.function.arguments) : null,
      answer: answer?.choices[0]?.message.content ?? null,
    },
    streamTool: {
      name: streamedCall?.type === "function" ? streamedCall.function.name : null,
      args: streamedCall?.type === "function" ? JSON.parse(streamedCall.function.arguments) : null,
    },
    responses: { text: responses.output_text, status: responses.status },
    other: await statusOf(client.chat.completions.create({ model: "not-declared", messages: [user] })),
  };
}

async function anthropic() {
  const client = new Anthropic({ maxRetries: 0 });
  const user = { role: "user" as const, content: "What is the weather in Paris?" };
  const plain = await client.messages.create({ model: MODEL, max_tokens: 64, messages: [user] });
  const stream = client.messages.stream({ model: MODEL, max_tokens: 64, messages: [user] });
  let streamed = "";
  stream.on("text", (t) => {
    streamed += t;
  });
  const streamedFinal = await stream.finalMessage();
  const tools = [{ name: WEATHER.name, description: WEATHER.description, input_schema: WEATHER.parameters }];
  const call = await client.messages.create({ model: MODEL, max_tokens: 64, tools, messages: [user] });
  const use = call.content.find((b) => b.type === "tool_use");
  const answer = use
    ? await client.messages.create({
        model: MODEL,
        max_tokens: 64,
        tools,
        messages: [
          user,
          { role: "assistant", content: call.content },
          { role: "user", content: [{ type: "tool_result", tool_use_id: use.id, content: "sunny, 21 C" }] },
        ],
      })
    : null;
  const toolStream = client.messages.stream({ model: MODEL, max_tokens: 64, tools, messages: [user] });
  const streamedUse = (await toolStream.finalMessage()).content.find((b) => b.type === "tool_use");
  return {
    plain: { text: textOf(plain.content), stop: plain.stop_reason, usage: plain.usage },
    stream: { text: streamed, stop: streamedFinal.stop_reason, usage: streamedFinal.usage },
    tool: {
      stop: call.stop_reason,
      name: use?.name ?? null,
      args: use?.input ?? null,
      answer: answer ? textOf(answer.content) : null,
    },
    streamTool: { name: streamedUse?.name ?? null, args: streamedUse?.input ?? null },
    other: await statusOf(client.messages.create({ model: "not-declared", max_tokens: 8, messages: [user] })),
  };
}

function textOf(content: Anthropic.ContentBlock[]): string {
  return content.map((b) => (b.type === "text" ? b.text : "")).join("");
}

// By class, not by constructor name: the bundle renames one SDK's classes where both use a name.
const ERROR_CLASSES: Array<[string, (e: unknown) => boolean]> = [
  ["BadRequestError", (e) => e instanceof OpenAI.BadRequestError || e instanceof Anthropic.BadRequestError],
  ["RateLimitError", (e) => e instanceof OpenAI.RateLimitError || e instanceof Anthropic.RateLimitError],
  ["APIError", (e) => e instanceof OpenAI.APIError || e instanceof Anthropic.APIError],
];

/** The status and error class of a call that should fail (the SDKs throw APIError subclasses). */
async function statusOf(call: Promise<unknown>): Promise<{ status: number | null; error: string }> {
  try {
    await call;
    return { status: null, error: "none" };
  } catch (e) {
    const error = ERROR_CLASSES.find(([, is]) => is(e))?.[0] ?? (e as Error).name;
    return { status: (e as { status?: number }).status ?? null, error };
  }
}

/** Calls until the lane refuses (the run's budget), at most `limit`. */
async function untilRefused(limit: number) {
  const client = new OpenAI({ maxRetries: 2 });
  for (let i = 0; i < limit; i++) {
    const r = await statusOf(
      client.chat.completions.create({
        model: MODEL,
        messages: [{ role: "user", content: "again" }],
        max_tokens: 8,
      }),
    );
    if (r.status !== null) return { after: i, ...r };
  }
  return { after: limit, status: null, error: "none" };
}

async function main() {
  const env = {
    openaiBase: process.env.OPENAI_BASE_URL,
    anthropicBase: process.env.ANTHROPIC_BASE_URL,
    openaiKey: process.env.OPENAI_API_KEY,
    anthropicKey: process.env.ANTHROPIC_API_KEY,
  };
  const out = { env, openai: await openai(), anthropic: await anthropic(), budget: await untilRefused(50) };
  console.log(JSON.stringify(out));
}

main().catch((e: Error) => {
  console.log(JSON.stringify({ failed: `${e.constructor.name}: ${e.message}` }));
  process.exit(1);
});
