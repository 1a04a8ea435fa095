// The demo's (and the end-to-end tests') upstream: runs inside a network namespace of its own,
// started by scripts/lib/demo-upstream.ts. Plain JavaScript so that it needs nothing but node.
//
// stdin: one JSON line { certPem, keyPem, expectedKey, httpsPort, directPort, bind?, static? }.
// HTTPS: every request gets JSON { host, path, keyPresent, keyMatches } back: whether an
// Authorization header came and whether it is `Bearer <expectedKey>`; never the header itself.
// static (optional): [{ host, path, contentType, base64 }], files served as they are for their
// hosts (a pip index: scripts/lib/pip-index.ts); any other path on such a host is a 404. Their
// seen-lines add `static` (the status answered).
// bind (default 0.0.0.0) and ports 0 (any free port) are for tests on loopback: the ports bound
// come as one line { event: "listening", httpsPort, directPort } before "ready".
// POST /v1/chat/completions and /v1/responses (any host): a model provider speaking the OpenAI
// wire format, JSON or server-sent events (`stream: true`), with fixed usage numbers; 401 unless
// `Bearer <expectedKey>`. POST /v1/messages: Anthropic's Messages format the same way, 401
// unless `x-api-key: <expectedKey>`. Chat and messages call the first tool given when a user
// turn is last, and quote a tool result when one is last. The seen-line adds endpoint, model
// and stream. The same answers as test/fixtures/{openai,anthropic}-contract-server.ts, which
// also check requests as the real APIs do (a short copy: this file needs nothing but node).
// TCP directPort: writes "direct\n" and closes (something a sandbox could reach if nothing stopped it).
// stdout: one JSON line per request seen, then "ready" once listening.

import { createServer } from "node:https";
import { createServer as createTcpServer } from "node:net";

let input = "";
process.stdin.setEncoding("utf8");
process.stdin.on("data", (d) => {
  input += d;
});
process.stdin.on("end", () => {
  const config = JSON.parse(input);
  const files = new Map((config.static ?? []).map((r) => [`${r.host.toLowerCase()} ${r.path}`, r]));
  const staticHosts = new Set((config.static ?? []).map((r) => r.host.toLowerCase()));
  const https = createServer({ cert: config.certPem, key: config.keyPem }, (req, res) => {
    const host = (req.headers.host ?? "").toLowerCase().replace(/:\d+$/, "");
    if (staticHosts.has(host)) return serveStatic(req, res, host, files, config.expectedKey);
    const endpoint = req.method === "POST" ? MODEL_ENDPOINTS[(req.url ?? "").split("?", 1)[0]] : undefined;
    if (endpoint === "messages")
      return void messagesCall(req, res, config.expectedKey).catch(() => res.destroy());
    if (endpoint) return void modelCall(req, res, endpoint, config.expectedKey).catch(() => res.destroy());
    const auth = req.headers.authorization;
    const seen = {
      event: "request",
      host: req.headers.host ?? null,
      path: req.url,
      keyPresent: auth !== undefined,
      keyMatches: auth === `Bearer ${config.expectedKey}`,
    };
    process.stdout.write(`${JSON.stringify(seen)}\n`);
    res.writeHead(200, { "content-type": "application/json" });
    res.end(JSON.stringify(seen));
  });
  const direct = createTcpServer((socket) => {
    process.stdout.write(`${JSON.stringify({ event: "direct", from: socket.remoteAddress })}\n`);
    socket.end("direct\n");
    socket.on("error", () => {});
  });
  const bind = config.bind ?? "0.0.0.0";
  https.listen(config.httpsPort, bind, () => {
    direct.listen(config.directPort, bind, () => {
      const ports = { httpsPort: https.address().port, directPort: direct.address().port };
      process.stdout.write(`${JSON.stringify({ event: "listening", ...ports })}\nready\n`);
    });
  });
});

function serveStatic(req, res, host, files, expectedKey) {
  const path = (req.url ?? "").split("?", 1)[0];
  const file = req.method === "GET" || req.method === "HEAD" ? files.get(`${host} ${path}`) : undefined;
  const auth = req.headers.authorization;
  const seen = {
    event: "request",
    host,
    path: req.url,
    keyPresent: auth !== undefined,
    keyMatches: auth === `Bearer ${expectedKey}`,
    static: file ? 200 : 404,
  };
  process.stdout.write(`${JSON.stringify(seen)}\n`);
  if (!file) {
    res.writeHead(404, { "content-type": "text/plain" });
    return res.end("not found\n");
  }
  const body = Buffer.from(file.base64, "base64");
  res.writeHead(200, { "content-type": file.contentType, "content-length": body.byteLength });
  res.end(req.method === "HEAD" ? undefined : body);
}

// ---- the model provider ----

const MODEL_ENDPOINTS = {
  "/v1/chat/completions": "chat.completions",
  "/v1/responses": "responses",
  "/v1/messages": "messages",
};
const TOOL_ARGS = { location: "Paris", unit: "celsius" };
const TOOL_RESULT_PREFIX = "The tool said: ";
const textOf = (content) =>
  typeof content === "string"
    ? content
    : Array.isArray(content)
      ? content.map((p) => (typeof p?.text === "string" ? p.text : "")).join("")
      : "";
const USAGE = { "chat.completions": { input: 12, output: 5 }, responses: { input: 9, output: 4 } };
const DELTAS = ["Hello", " world"];
const CREATED = 1_700_000_000;

async function modelCall(req, res, endpoint, expectedKey) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size <= 1024 * 1024) chunks.push(chunk);
  }
  let body = {};
  try {
    body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {}
  const auth = req.headers.authorization;
  const stream = body?.stream === true;
  const model = typeof body?.model === "string" ? body.model : "unknown";
  const seen = {
    event: "request",
    host: req.headers.host ?? null,
    path: req.url,
    keyPresent: auth !== undefined,
    keyMatches: auth === `Bearer ${expectedKey}`,
    endpoint,
    model,
    stream,
  };
  process.stdout.write(`${JSON.stringify(seen)}\n`);
  const json = (status, value) => {
    const text = JSON.stringify(value);
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
    res.end(text);
  };
  if (!seen.keyMatches) {
    return json(401, {
      error: {
        message: "Incorrect API key provided.",
        type: "invalid_request_error",
        code: "invalid_api_key",
      },
    });
  }
  if (size > 1024 * 1024 || typeof body !== "object" || body === null) {
    return json(400, { error: { message: "Expected a JSON object.", type: "invalid_request_error" } });
  }
  const u = USAGE[endpoint];
  const text = DELTAS.join("");
  const response = (status, done) => ({
    id: "resp_demo",
    object: "response",
    created_at: CREATED,
    status,
    model,
    output: done
      ? [
          {
            type: "message",
            id: "msg_demo",
            status: "completed",
            role: "assistant",
            content: [{ type: "output_text", text, annotations: [] }],
          },
        ]
      : [],
    usage: done ? { input_tokens: u.input, output_tokens: u.output, total_tokens: u.input + u.output } : null,
  });
  const chatUsage = { prompt_tokens: u.input, completion_tokens: u.output, total_tokens: u.input + u.output };
  // Chat: a tool call when tools are given and a user turn is last; a tool result last is quoted.
  const last = Array.isArray(body.messages) ? body.messages.at(-1) : undefined;
  const tool =
    endpoint === "chat.completions" && last?.role === "user" ? body.tools?.[0]?.function?.name : undefined;
  const call = {
    id: "call_demo1",
    type: "function",
    function: { name: tool, arguments: JSON.stringify(TOOL_ARGS) },
  };
  const answer = last?.role === "tool" ? `${TOOL_RESULT_PREFIX}${textOf(last.content)}` : text;
  if (!stream) {
    if (endpoint === "responses") return json(200, response("completed", true));
    const message = tool
      ? { role: "assistant", content: null, tool_calls: [call] }
      : { role: "assistant", content: answer };
    return json(200, {
      id: "chatcmpl-demo",
      object: "chat.completion",
      created: CREATED,
      model,
      choices: [{ index: 0, message, finish_reason: tool ? "tool_calls" : "stop" }],
      usage: chatUsage,
    });
  }
  const events = [];
  if (endpoint === "responses") {
    const typed = (type, value) =>
      events.push(`event: ${type}\ndata: ${JSON.stringify({ type, ...value })}\n\n`);
    typed("response.created", { response: response("in_progress", false) });
    for (const delta of DELTAS) {
      typed("response.output_text.delta", { item_id: "msg_demo", output_index: 0, content_index: 0, delta });
    }
    typed("response.completed", { response: response("completed", true) });
  } else {
    const includeUsage = body.stream_options?.include_usage === true;
    const chunk = (choices, more = {}) =>
      events.push(
        `data: ${JSON.stringify({ id: "chatcmpl-demo", object: "chat.completion.chunk", created: CREATED, model, choices, ...(includeUsage ? { usage: null } : {}), ...more })}\n\n`,
      );
    chunk([{ index: 0, delta: { role: "assistant", content: "" }, finish_reason: null }]);
    if (tool) chunk([{ index: 0, delta: { tool_calls: [{ index: 0, ...call }] }, finish_reason: null }]);
    else if (last?.role === "tool") chunk([{ index: 0, delta: { content: answer }, finish_reason: null }]);
    else for (const content of DELTAS) chunk([{ index: 0, delta: { content }, finish_reason: null }]);
    chunk([{ index: 0, delta: {}, finish_reason: tool ? "tool_calls" : "stop" }]);
    if (includeUsage) chunk([], { usage: chatUsage });
    events.push("data: [DONE]\n\n");
  }
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  for (const event of events) res.write(event);
  res.end();
}

const MESSAGES_USAGE = {
  input_tokens: 10,
  output_tokens: 6,
  cache_read_input_tokens: 0,
  cache_creation_input_tokens: 0,
};

/** Anthropic's Messages (versions 2023-06-01 and 2026-10-21 read alike here). */
async function messagesCall(req, res, expectedKey) {
  const chunks = [];
  let size = 0;
  for await (const chunk of req) {
    size += chunk.length;
    if (size <= 1024 * 1024) chunks.push(chunk);
  }
  let body = {};
  try {
    body = JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {}
  const key = req.headers["x-api-key"];
  const stream = body?.stream === true;
  const model = typeof body?.model === "string" ? body.model : "unknown";
  const seen = {
    event: "request",
    host: req.headers.host ?? null,
    path: req.url,
    keyPresent: key !== undefined,
    keyMatches: key === expectedKey,
    endpoint: "messages",
    model,
    stream,
  };
  process.stdout.write(`${JSON.stringify(seen)}\n`);
  const json = (status, value) => {
    const text = JSON.stringify(value);
    res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
    res.end(text);
  };
  const error = (status, type, message) => json(status, { type: "error", error: { type, message } });
  if (!seen.keyMatches) return error(401, "authentication_error", "invalid x-api-key");
  if (typeof body !== "object" || body === null || !Array.isArray(body.messages))
    return error(400, "invalid_request_error", "messages: Field required");
  if (typeof body.max_tokens !== "number")
    return error(400, "invalid_request_error", "max_tokens: Field required");
  const last = body.messages.at(-1);
  const blocks = Array.isArray(last?.content) ? last.content : [];
  const result = blocks.find((b) => b?.type === "tool_result");
  const tool = !result && last?.role === "user" ? body.tools?.[0]?.name : undefined;
  const text = result ? `${TOOL_RESULT_PREFIX}${textOf(result.content)}` : DELTAS.join("");
  const content = tool
    ? [{ type: "tool_use", id: "toolu_demo1", name: tool, input: TOOL_ARGS }]
    : [{ type: "text", text, citations: null }];
  const stopReason = tool ? "tool_use" : "end_turn";
  const message = (done) => ({
    id: "msg_demo",
    type: "message",
    role: "assistant",
    model,
    content: done ? content : [],
    stop_reason: done ? stopReason : null,
    stop_sequence: null,
    usage: done ? MESSAGES_USAGE : { ...MESSAGES_USAGE, output_tokens: 1 },
  });
  if (!stream) return json(200, message(true));
  const events = [];
  const ev = (type, value) => events.push(`event: ${type}\ndata: ${JSON.stringify({ type, ...value })}\n\n`);
  ev("message_start", { message: message(false) });
  if (tool) {
    ev("content_block_start", {
      index: 0,
      content_block: { type: "tool_use", id: "toolu_demo1", name: tool, input: {} },
    });
    ev("content_block_delta", {
      index: 0,
      delta: { type: "input_json_delta", partial_json: JSON.stringify(TOOL_ARGS) },
    });
  } else {
    ev("content_block_start", { index: 0, content_block: { type: "text", text: "" } });
    for (const t of result ? [text] : DELTAS)
      ev("content_block_delta", { index: 0, delta: { type: "text_delta", text: t } });
  }
  ev("content_block_stop", { index: 0 });
  ev("message_delta", {
    delta: { stop_reason: stopReason, stop_sequence: null },
    usage: { output_tokens: MESSAGES_USAGE.output_tokens },
  });
  ev("message_stop", {});
  res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache" });
  for (const event of events) res.write(event);
  res.end();
}
