import { randomUUID } from "node:crypto";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { Readable } from "node:stream";
import type { ModelLaneSpec } from "@benchwright/shared/contract/policy";
import { MODEL_LANE_PLACEHOLDER_KEY, ModelCallRow } from "@benchwright/shared/contract/proxy-wire";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { type ModelLane, type ModelLaneOutcome, modelLane } from "../../proxy-image/src/proxy/model/lane";
import { SseFilter } from "../../proxy-image/src/proxy/model/sse-relay";
import { createUpstream } from "../../proxy-image/src/proxy/upstream";
import { createTestCa, selfSignedCert, type TestCa } from "../../scripts/lib/test-ca";
import {
  type ContractServer,
  type ContractServerOptions,
  TEXT_DELTAS as FAKE_DELTAS,
} from "../fixtures/contract-server";
import { OPENAI_USAGE as FAKE_USAGE, startOpenAiContractServer } from "../fixtures/openai-contract-server";
import { until } from "../until";

// The model lane in front of OpenAI's contract server (same format in and out: passthrough)
// over real TLS on 127.0.0.1, dialled through the real upstream module (address checks, verified TLS). A real
// HTTP server hands each request to the lane as the proxy does. The canary key must reach the
// provider and nothing the sandbox sees.

const CANARY = `sk-canary-${randomUUID()}`;
const HOST = "api.model.test";
const SELF_SIGNED_HOST = "selfsigned.model.test";
const SPEC: ModelLaneSpec = {
  name: "bench-model",
  provider: "openai",
  baseUrl: `https://${HOST}/v1`,
  upstreamModel: "fake-model-2025",
  secret: "MODEL_KEY",
  budget: null,
};
const PLACEHOLDER = { authorization: `Bearer ${MODEL_LANE_PLACEHOLDER_KEY}` };

let ca: TestCa;
let cert: { certPem: string; keyPem: string };
const cleanups: Array<() => Promise<void>> = [];
/** Everything the sandbox side got (headers and bodies), and every log record and outcome. */
let sandboxSaw: string[];
let logs: unknown[];

beforeAll(async () => {
  ca = await createTestCa();
  cert = await ca.issue([HOST]);
});

beforeEach(() => {
  sandboxSaw = [];
  logs = [];
});

afterEach(async () => {
  for (const text of [...sandboxSaw, JSON.stringify(logs)]) expect(text).not.toContain(CANARY);
  await Promise.all(cleanups.splice(0).map((c) => c()));
});

interface Harness {
  base: string;
  fake: ContractServer;
  outcomes: ModelLaneOutcome[];
}

async function start(
  options: {
    fake?: Partial<ContractServerOptions>;
    spec?: ModelLaneSpec | null;
    allowLoopback?: boolean;
  } = {},
): Promise<Harness> {
  const fake = await startOpenAiContractServer({ cert, expectedKey: CANARY, ...options.fake });
  const upstream = createUpstream({
    addressPolicy: createAddressPolicy(
      options.allowLoopback === false ? {} : { allowCidrs: ["127.0.0.0/8"] },
    ),
    extraCaPem: ca.certPem,
    testRoutes: new Map([
      [
        options.spec?.baseUrl.includes(SELF_SIGNED_HOST) ? SELF_SIGNED_HOST : HOST,
        { address: "127.0.0.1", port: fake.port },
      ],
    ]),
  });
  const lane: ModelLane = modelLane({ upstream, log: (r) => void logs.push(r) });
  const outcomes: ModelLaneOutcome[] = [];
  const spec = options.spec === undefined ? SPEC : options.spec;
  const front: Server = createServer((req, res) => {
    void lane(req, res, req.url ?? "/", spec === null ? null : { spec, secret: CANARY }).then((o) =>
      outcomes.push(o),
    );
  });
  await new Promise<void>((resolve) => front.listen(0, "127.0.0.1", resolve));
  cleanups.push(async () => {
    front.closeAllConnections();
    await new Promise<void>((resolve) => front.close(() => resolve()));
    await upstream.closeAll();
    await fake.stop();
  });
  return { base: `http://127.0.0.1:${(front.address() as AddressInfo).port}`, fake, outcomes };
}

async function call(
  h: Harness,
  path: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; headers: Headers; text: string }> {
  const res = await fetch(`${h.base}${path}`, {
    method: "POST",
    headers: { ...PLACEHOLDER, "content-type": "application/json", ...headers },
    body: typeof body === "string" ? body : JSON.stringify(body),
  });
  return seen(res);
}

async function seen(res: Response): Promise<{ status: number; headers: Headers; text: string }> {
  const text = await res.text();
  sandboxSaw.push(JSON.stringify([...res.headers]), text);
  return { status: res.status, headers: res.headers, text };
}

/** The outcome of the one request, once the lane has finished with it. */
async function outcome(h: Harness): Promise<ModelLaneOutcome> {
  const deadline = Date.now() + 5_000;
  while (h.outcomes.length === 0) {
    if (Date.now() > deadline) throw new Error("the lane did not finish");
    await new Promise((resolve) => setImmediate(resolve));
  }
  expect(h.outcomes).toHaveLength(1);
  return h.outcomes[0] as ModelLaneOutcome;
}

const sseData = (text: string) =>
  text
    .split(/\r\n\r\n|\n\n/)
    .map((event) => /(?:^|\n)data: (.*)/.exec(event.replaceAll("\r\n", "\n"))?.[1])
    .filter((d): d is string => d !== undefined);

const chat = (more: Record<string, unknown> = {}) => ({
  model: SPEC.name,
  messages: [{ role: "user", content: "Say hello." }],
  ...more,
});
const responses = (more: Record<string, unknown> = {}) => ({
  model: SPEC.name,
  input: "Say hello.",
  ...more,
});

describe("model lane: calls", () => {
  it("non-streaming chat: the declared model upstream, the key injected, usage recorded", async () => {
    const h = await start();
    const res = await call(h, "/v1/chat/completions?api-version=7", chat(), {
      "openai-beta": "assistants=v2",
      "openai-organization": "org-someone-else",
      cookie: "session=1",
      "x-benchwright-run": "nope",
    });
    expect(res.status).toBe(200);
    const body = JSON.parse(res.text);
    expect(body.choices[0].message.content).toBe(FAKE_DELTAS.join(""));
    expect(h.fake.calls).toHaveLength(1);
    const sent = h.fake.calls[0];
    expect(sent).toMatchObject({
      method: "POST",
      path: "/v1/chat/completions",
      model: SPEC.upstreamModel,
      keyPresent: true,
      keyMatches: true,
      placeholderSent: false,
      acceptEncoding: "identity",
    });
    expect(sent?.headerNames).toContain("openai-beta");
    for (const name of ["openai-organization", "cookie", "x-benchwright-run"])
      expect(sent?.headerNames).not.toContain(name);
    const o = await outcome(h);
    expect(o).toMatchObject({ status: 200, code: null });
    expect(ModelCallRow.parse(o.call)).toEqual(o.call);
    expect(o.call).toMatchObject({
      model: SPEC.name,
      provider: SPEC.provider,
      endpoint: "chat.completions",
      stream: false,
      status: 200,
      inputTokens: FAKE_USAGE["chat.completions"].input,
      outputTokens: FAKE_USAGE["chat.completions"].output,
    });
    expect(o.call?.callId).toMatch(/^[A-Za-z0-9_-]{8,64}$/);
  });

  it("non-streaming responses, asked for by the upstream name, usage recorded", async () => {
    const h = await start();
    const res = await call(h, "/v1/responses", responses({ model: SPEC.upstreamModel }));
    expect(res.status).toBe(200);
    expect(JSON.parse(res.text).output[0].content[0].text).toBe("Hello world");
    expect(h.fake.calls[0]).toMatchObject({
      path: "/v1/responses",
      model: SPEC.upstreamModel,
      keyMatches: true,
    });
    expect((await outcome(h)).call).toMatchObject({
      endpoint: "responses",
      stream: false,
      inputTokens: FAKE_USAGE.responses.input,
      outputTokens: FAKE_USAGE.responses.output,
    });
  });

  it("streaming chat: the lane asks for usage and hides the usage chunk from a client that did not", async () => {
    const h = await start();
    const res = await call(h, "/v1/chat/completions", chat({ stream: true }));
    expect(res.status).toBe(200);
    expect(res.headers.get("content-type")).toBe("text/event-stream");
    expect(h.fake.calls[0]).toMatchObject({
      stream: true,
      body: { stream_options: { include_usage: true } },
    });
    const data = sseData(res.text);
    const chunks = data.slice(0, -1).map((d) => JSON.parse(d));
    // Every chunk the provider sent but the usage-only one, as it sent them.
    expect(chunks.map((c) => c.choices[0]?.delta.content ?? "").join("")).toBe(FAKE_DELTAS.join(""));
    expect(chunks.at(-1).choices[0].finish_reason).toBe("stop");
    expect(data.at(-1)).toBe("[DONE]");
    expect(data.some((d) => d.includes('"choices":[]'))).toBe(false);
    expect((await outcome(h)).call).toMatchObject({
      endpoint: "chat.completions",
      stream: true,
      inputTokens: FAKE_USAGE["chat.completions"].input,
      outputTokens: FAKE_USAGE["chat.completions"].output,
    });
  });

  it("streaming chat: a client that asked for usage itself keeps the usage chunk", async () => {
    const h = await start();
    const res = await call(
      h,
      "/v1/chat/completions",
      chat({ stream: true, stream_options: { include_usage: true } }),
    );
    const data = sseData(res.text);
    const usage = data
      .map((d) => (d === "[DONE]" ? null : JSON.parse(d)))
      .find((c) => c?.choices?.length === 0);
    expect(usage?.usage.prompt_tokens).toBe(FAKE_USAGE["chat.completions"].input);
    expect((await outcome(h)).call).toMatchObject({ inputTokens: 12, outputTokens: 5 });
  });

  it("streaming with CRLF and events split mid-line across writes", async () => {
    const h = await start({ fake: { awkwardFraming: true } });
    const res = await call(h, "/v1/chat/completions", chat({ stream: true }));
    expect(res.text).toContain("\r\n\r\n");
    expect(sseData(res.text).some((d) => d.includes('"choices":[]'))).toBe(false);
    expect(sseData(res.text).at(-1)).toBe("[DONE]");
    expect((await outcome(h)).call).toMatchObject({ inputTokens: 12, outputTokens: 5 });
  });

  it("streaming responses: usage from response.completed", async () => {
    const h = await start();
    const res = await call(h, "/v1/responses", responses({ stream: true }));
    const types = sseData(res.text).map((d) => JSON.parse(d).type);
    expect(types).toEqual([
      "response.created",
      "response.in_progress",
      "response.output_item.added",
      "response.content_part.added",
      "response.output_text.delta",
      "response.output_text.delta",
      "response.output_text.done",
      "response.content_part.done",
      "response.output_item.done",
      "response.completed",
    ]);
    expect((await outcome(h)).call).toMatchObject({
      endpoint: "responses",
      stream: true,
      inputTokens: 9,
      outputTokens: 4,
    });
  });

  it("streams as it arrives: the first delta reaches the client before the provider has finished", async () => {
    let release: () => void = () => {};
    const gate = new Promise<void>((resolve) => {
      release = resolve;
    });
    const h = await start({ fake: { midStream: () => gate } });
    const res = await fetch(`${h.base}/v1/chat/completions`, {
      method: "POST",
      headers: { ...PLACEHOLDER, "content-type": "application/json" },
      body: JSON.stringify(chat({ stream: true })),
    });
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    const decoder = new TextDecoder();
    let text = "";
    while (!text.includes(FAKE_DELTAS[0])) {
      const { value, done } = await reader.read();
      if (done) throw new Error("the stream ended early");
      text += decoder.decode(value, { stream: true });
    }
    expect(h.outcomes).toHaveLength(0);
    release();
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      text += decoder.decode(value, { stream: true });
    }
    sandboxSaw.push(text);
    expect(sseData(text).at(-1)).toBe("[DONE]");
    expect((await outcome(h)).call).toMatchObject({ inputTokens: 12, outputTokens: 5 });
  });

  it("GET /v1/models answers with the declared model only", async () => {
    const h = await start();
    const res = await seen(await fetch(`${h.base}/v1/models`, { headers: PLACEHOLDER }));
    expect(res.status).toBe(200);
    expect(JSON.parse(res.text).data.map((m: { id: string }) => m.id)).toEqual([SPEC.name]);
    expect(h.fake.calls).toHaveLength(0);
  });
});

describe("model lane: the key (B3, B7)", () => {
  it("an upstream echoing the key in headers, body and stream gives the client only asterisks", async () => {
    const h = await start({ fake: { echoKey: true } });
    const masked = "*".repeat(CANARY.length);
    const plain = await call(h, "/v1/chat/completions", chat());
    expect(plain.headers.get("x-echo-key")).toBe(masked);
    expect(JSON.parse(plain.text).choices[0].message.content).toBe(`Hello world [${masked}]`);
    const streamed = await call(h, "/v1/responses", responses({ stream: true }));
    expect(sseData(streamed.text).join("\n")).toContain(`[${masked}]`);
    expect(streamed.headers.get("x-echo-key")).toBe(masked);
  });

  it("an upstream with a self-signed certificate: 502, and the key never sent", async () => {
    const h = await start({
      fake: { cert: await selfSignedCert([SELF_SIGNED_HOST]) },
      spec: { ...SPEC, baseUrl: `https://${SELF_SIGNED_HOST}/v1` },
    });
    const res = await call(h, "/v1/chat/completions", chat());
    expect(res.status).toBe(502);
    expect(JSON.parse(res.text).error.code).toBe("upstream_failed");
    expect(h.fake.calls).toHaveLength(0);
    expect((await outcome(h)).call).toBeNull();
  });

  it("an upstream at a refused address (A12): 502, nothing dialled", async () => {
    const h = await start({ allowLoopback: false });
    const res = await call(h, "/v1/chat/completions", chat());
    expect(res.status).toBe(502);
    expect(h.fake.connections).toBe(0);
    expect((await outcome(h)).call).toBeNull();
  });
});

describe("model lane: refusals", () => {
  // OpenAI's error format, with the lane's code as type and code (refuse.ts).
  const problem = (text: string) => (JSON.parse(text) as { error: { code: string; type: string } }).error;

  it("case J1: another model: 400 model_not_declared, nothing sent upstream, a refused row", async () => {
    const h = await start();
    const res = await call(h, "/v1/chat/completions", chat({ model: "gpt-4o" }));
    expect(res.status).toBe(400);
    expect(res.headers.get("content-type")).toBe("application/json");
    expect(problem(res.text)).toMatchObject({ code: "model_not_declared", type: "invalid_request_error" });
    const missing = await call(h, "/v1/responses", { input: "no model" });
    expect(problem(missing.text).code).toBe("model_not_declared");
    expect(h.fake.connections).toBe(0);
    expect(h.fake.calls).toHaveLength(0);
    // Each refused call is recorded, with no tokens (J1).
    await until("both outcomes", () => h.outcomes.length === 2);
    for (const o of h.outcomes)
      expect(o.call).toMatchObject({
        refused: "model_not_declared",
        status: 400,
        inputTokens: 0,
        outputTokens: 0,
      });
  });

  it("a run without a declared model: 404 model_not_declared", async () => {
    const h = await start({ spec: null });
    const res = await call(h, "/v1/chat/completions", chat());
    expect(res.status).toBe(404);
    expect(problem(res.text).code).toBe("model_not_declared");
    expect(h.fake.calls).toHaveLength(0);
  });

  it("other paths and methods: 404 not_found; a body that is not JSON: 400 invalid_request", async () => {
    const h = await start();
    expect(problem((await call(h, "/v1/embeddings", chat())).text).code).toBe("not_found");
    expect(problem((await call(h, "/v1/chat/completions/", chat())).text).code).toBe("not_found");
    const get = await seen(await fetch(`${h.base}/v1/chat/completions`, { headers: PLACEHOLDER }));
    expect([get.status, problem(get.text).code]).toEqual([404, "not_found"]);
    const bad = await call(h, "/v1/chat/completions", "{not json");
    expect([bad.status, problem(bad.text).code]).toEqual([400, "invalid_request"]);
    expect(problem((await call(h, "/v1/chat/completions", "[1]")).text).code).toBe("invalid_request");
    expect(h.fake.calls).toHaveLength(0);
  });

  it("a body over 16 MiB: 413, with or without a Content-Length, nothing sent upstream", async () => {
    const h = await start();
    const big = Buffer.alloc(16 * 1024 * 1024 + 1, 0x20);
    const declared = await call(h, "/v1/chat/completions", big.toString("latin1"));
    expect([declared.status, problem(declared.text).code]).toEqual([413, "payload_too_large"]);
    const chunked = await seen(
      await fetch(`${h.base}/v1/chat/completions`, {
        method: "POST",
        headers: { ...PLACEHOLDER, "content-type": "application/json" },
        body: Readable.toWeb(
          Readable.from([big.subarray(0, 1 << 20), big.subarray(1 << 20)]),
        ) as ReadableStream,
        duplex: "half",
      } as RequestInit),
    );
    expect([chunked.status, problem(chunked.text).code]).toEqual([413, "payload_too_large"]);
    expect(h.fake.calls).toHaveLength(0);
  });
});

describe("SseFilter", () => {
  const chunk = (choices: unknown[], more = {}) =>
    `data: ${JSON.stringify({ id: "c", object: "chat.completion.chunk", model: "m", choices, usage: null, ...more })}`;
  const CHAT_EVENTS = [
    chunk([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]),
    `event: named\n${chunk([{ index: 0, delta: { content: "Hello" }, finish_reason: null }])}`,
    chunk([{ index: 0, delta: {}, finish_reason: "stop" }]),
    chunk([], { usage: { prompt_tokens: 12, completion_tokens: 5 } }),
    "data: [DONE]",
  ];
  const stream = (eol: string) =>
    `: keep-alive${eol}${eol}${CHAT_EVENTS.map((e) => `${e.replaceAll("\n", eol)}${eol}${eol}`).join("")}`;
  const run = async (chunks: Buffer[], secret = "sk-never-here") => {
    const usage: number[] = [];
    const filter = new SseFilter([Buffer.from(secret)], ({ data }) => {
      if (data.includes('"choices":[]')) {
        usage.push(JSON.parse(data).usage.prompt_tokens);
        return "drop";
      }
      return "keep";
    });
    const out: Buffer[] = [];
    filter.on("data", (c: Buffer) => out.push(c));
    const done = new Promise((resolve) => filter.on("end", resolve));
    for (const c of chunks) filter.write(c);
    filter.end();
    await done;
    return { text: Buffer.concat(out).toString("utf8"), usage };
  };

  for (const eol of ["\n", "\r\n", "\r"]) {
    it(`drops exactly the usage event wherever the bytes split (${JSON.stringify(eol)})`, async () => {
      const input = Buffer.from(stream(eol));
      const events = input.toString().split(`${eol}${eol}`);
      const expected = `${events.filter((e) => !e.includes('"choices":[]')).join(`${eol}${eol}`)}`;
      for (let at = 0; at <= input.length; at += 3) {
        const { text, usage } = await run([input.subarray(0, at), input.subarray(at)]);
        expect(text).toBe(expected);
        expect(usage).toEqual([12]);
      }
      const bytewise = await run([...input].map((b) => Buffer.from([b])));
      expect(bytewise.text).toBe(expected);
    });
  }

  it("masks the key inside events", async () => {
    const { text } = await run([Buffer.from(`data: {"k":"sk-secret-1"}\n\ndata: [DONE]\n\n`)], "sk-secret-1");
    expect(text).toBe(`data: {"k":"***********"}\n\ndata: [DONE]\n\n`);
  });
});
