import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { Transform, type TransformCallback } from "node:stream";
import { pipeline } from "node:stream/promises";
import type { ModelLaneSpec } from "../../src/contract/policy";
import { ModelCallRow, type ModelEndpoint } from "../../src/contract/proxy-wire";
import { splitHostPort } from "../../src/policy/host";
import { decodersFor, filterResponseHeaders } from "./http-rules";
import { maskAll, maskString, needlesFor, RedactStream } from "./redact";
import type { Upstream } from "./upstream";

// The model lane: the work sandbox talks to http(s)://model.benchwright.invalid/v1 with a
// placeholder key; this proxy makes the real call to the run's declared model (OpenAI wire
// format) with the vault key. Outside host policy by design (the model is what the run
// evaluates), but through the same resolve, address checks (A12, A13) and verified TLS (B3) as
// every other upstream, and with the key scrubbed from everything that comes back (B7). Per call
// it yields one row of counts (no prompt, no output) for the audit batches.

/** A model request is a JSON document; a larger body is refused (413). */
export const MAX_MODEL_BODY_BYTES = 16 * 1024 * 1024;
/** Bound on one SSE event and on the JSON body kept for reading usage. */
const MAX_EVENT_BYTES = 16 * 1024 * 1024;
// A long generation can take minutes before the first byte (the pool's default is 60 s).
const UPSTREAM_TIMEOUT_MS = 10 * 60_000;

const ENDPOINTS = new Map<string, { endpoint: ModelEndpoint; rest: string }>([
  ["/v1/chat/completions", { endpoint: "chat.completions", rest: "/chat/completions" }],
  ["/v1/responses", { endpoint: "responses", rest: "/responses" }],
]);
// What of the sandbox's request goes along besides the body: nothing that could pick another
// account under the user's key (openai-organization, openai-project) or carry a credential.
const FORWARDED_REQUEST_HEADERS = ["accept", "openai-beta"];
// Account details and cookies of the user's provider account are not the sandbox's business.
const DROPPED_RESPONSE_HEADERS = new Set(["set-cookie", "openai-organization", "openai-project"]);
// Errors after which the request may well have reached the provider: still a call to record.
const SENT_ERRORS = new Set(["UND_ERR_HEADERS_TIMEOUT", "UND_ERR_SOCKET", "ECONNRESET"]);

export type ModelLaneErrorCode =
  | "model_not_declared"
  | "not_found"
  | "invalid_request"
  | "payload_too_large"
  | "upstream_failed";

const TITLES: Record<ModelLaneErrorCode, string> = {
  model_not_declared: "Model not declared",
  not_found: "Not found",
  invalid_request: "Invalid request",
  payload_too_large: "Payload too large",
  upstream_failed: "Upstream failed",
};

export interface ModelLaneOutcome {
  /** The status sent to the sandbox; 499 when the sandbox went away before an answer. */
  status: number;
  /** Why the lane answered itself, or null when the answer is the provider's (or the model list). */
  code: ModelLaneErrorCode | null;
  /** The call to record (log it, hand it to the audit reporter), when one went upstream. */
  call: ModelCallRow | null;
}

export interface ModelLaneOptions {
  upstream: Upstream;
  /** Structured problems (codes and reasons only, never a header, body or secret). */
  log?: (record: Record<string, unknown>) => void;
  newCallId?: () => string;
  /** Clock for the row's `at` and `ms` (ms since the epoch). */
  now?: () => number;
  maxBodyBytes?: number;
}

export type ModelLane = (
  req: IncomingMessage,
  res: ServerResponse,
  path: string,
  lane: { spec: ModelLaneSpec; secret: string } | null,
) => Promise<ModelLaneOutcome>;

export function modelLane(options: ModelLaneOptions): ModelLane {
  const log = options.log ?? ((r) => process.stdout.write(`${JSON.stringify(r)}\n`));
  const newCallId = options.newCallId ?? randomUUID;
  const now = options.now ?? Date.now;
  const maxBody = options.maxBodyBytes ?? MAX_MODEL_BODY_BYTES;

  return async (req, res, path, lane) => {
    const started = now();
    const method = req.method ?? "GET";
    // The query is ignored: nothing the sandbox puts there is forwarded.
    const pathname = path.split("?", 1)[0] ?? "";
    if (lane === null)
      return problem(
        res,
        404,
        "model_not_declared",
        "This run declares no model, so the model lane has none to call.",
      );
    const { spec, secret } = lane;

    if (method === "GET" && pathname === "/v1/models") {
      return json(res, 200, { object: "list", data: [modelObject(spec)] });
    }
    if (method === "GET" && pathname === `/v1/models/${encodeURIComponent(spec.name)}`) {
      return json(res, 200, modelObject(spec));
    }
    const route = ENDPOINTS.get(pathname);
    if (method !== "POST" || route === undefined) {
      return problem(
        res,
        404,
        "not_found",
        "The model lane serves POST /v1/chat/completions and POST /v1/responses.",
      );
    }

    const raw = await readBody(req, maxBody);
    if (raw === "too_large") return problem(res, 413, "payload_too_large", `At most ${maxBody} bytes.`);
    if (raw === "failed") return problem(res, 400, "invalid_request", "The request body did not arrive.");
    let body: unknown;
    try {
      body = JSON.parse(raw.toString("utf8"));
    } catch {
      return problem(res, 400, "invalid_request", "The body is not JSON.");
    }
    if (!isObject(body)) return problem(res, 400, "invalid_request", "The body is not a JSON object.");
    // Never another model than the declared one, whatever the sandbox asks for.
    if (body.model !== spec.name && body.model !== spec.upstreamModel) {
      return problem(
        res,
        400,
        "model_not_declared",
        `This run declares the model ${JSON.stringify(spec.name)}.`,
      );
    }
    body.model = spec.upstreamModel;
    const stream = body.stream === true;
    // Chat streams carry usage only when asked: ask, and hide the answer from a sandbox that did not.
    let hideUsage = false;
    if (route.endpoint === "chat.completions" && stream) {
      const asked = isObject(body.stream_options) ? body.stream_options : {};
      if (asked.include_usage !== true) {
        body.stream_options = { ...asked, include_usage: true };
        hideUsage = true;
      }
    }
    // Serialised again, so the provider reads exactly the one `model` checked here.
    const out = Buffer.from(JSON.stringify(body), "utf8");

    const base = new URL(spec.baseUrl);
    const target = splitHostPort(base.host);
    const upstreamPath = `${base.pathname.replace(/\/+$/, "")}${route.rest}${base.search}`;
    if (base.protocol !== "https:" || target === null) {
      log({ event: "model_lane", problem: "base URL unusable" });
      return problem(res, 502, "upstream_failed", "The declared model's provider cannot be reached.");
    }
    const resolved = await options.upstream.resolve(target.host, target.port ?? 443);
    if (!resolved.ok) {
      log({ event: "model_lane", problem: "upstream refused", reason: resolved.reason });
      return problem(res, 502, "upstream_failed", "The declared model's provider cannot be reached.");
    }

    const row = (status: number, usage: Usage): ModelCallRow | null => {
      const candidate = {
        callId: newCallId(),
        at: new Date(started).toISOString(),
        model: spec.name,
        provider: spec.provider,
        endpoint: route.endpoint,
        stream,
        status,
        inputTokens: usage.input,
        outputTokens: usage.output,
        ms: Math.max(0, Math.round(now() - started)),
      };
      const parsed = ModelCallRow.safeParse(candidate);
      if (parsed.success) return parsed.data;
      log({
        event: "model_lane",
        problem: "call row invalid",
        fields: parsed.error.issues.map((i) => i.path.join(".")),
      });
      return null;
    };

    const headers = [
      "content-type",
      "application/json",
      // Plain bytes, so the scrubber and the usage reader see them (B7).
      "accept-encoding",
      "identity",
      "authorization",
      `Bearer ${secret}`,
    ];
    for (const name of FORWARDED_REQUEST_HEADERS) {
      const value = req.headers[name];
      if (typeof value === "string") headers.push(name, value);
    }
    if (typeof req.headers.accept !== "string")
      headers.push("accept", stream ? "text/event-stream" : "application/json");

    // The sandbox going away before the answer ends the upstream call too.
    const abort = new AbortController();
    res.once("close", () => {
      if (!res.writableFinished) abort.abort();
    });
    const pool = options.upstream.poolFor("https:", target.host, resolved.address, resolved.port);
    let upstream: Awaited<ReturnType<typeof pool.request>>;
    try {
      upstream = await pool.request({
        method: "POST",
        path: upstreamPath,
        headers,
        body: out,
        signal: abort.signal,
        headersTimeout: UPSTREAM_TIMEOUT_MS,
        bodyTimeout: UPSTREAM_TIMEOUT_MS,
      });
    } catch (error) {
      const code = errorCode(error);
      log({ event: "model_lane", problem: "upstream failed", error: code });
      if (abort.signal.aborted) return { status: 499, code: "upstream_failed", call: row(499, NO_USAGE) };
      const outcome = problem(res, 502, "upstream_failed", "The declared model's provider did not answer.");
      return { ...outcome, call: SENT_ERRORS.has(code) ? row(502, NO_USAGE) : null };
    }

    // The same forms the main path masks (case I9): the key as sent is `Bearer <key>`.
    const needles = needlesFor(secret, `Bearer ${secret}`);
    const decoders = decodersFor(upstream.headers["content-encoding"]);
    if (decoders === null) {
      // An encoding the scrubber cannot read could carry the key past it (same rule as proxy.ts).
      upstream.body.on("error", () => {}).destroy();
      log({ event: "model_lane", problem: "response encoding cannot be scrubbed" });
      const outcome = problem(res, 502, "upstream_failed", "The provider's answer cannot be passed on.");
      return { ...outcome, call: row(502, NO_USAGE) };
    }
    const contentType = String(upstream.headers["content-type"] ?? "").toLowerCase();
    const sse = stream && contentType.startsWith("text/event-stream");
    const outHeaders = filterResponseHeaders(upstream.headers).filter(
      ([k]) => !DROPPED_RESPONSE_HEADERS.has(k),
    );
    for (let i = outHeaders.length - 1; i >= 0; i--) {
      const k = outHeaders[i]?.[0];
      if (k === "content-length" && (sse || decoders.length > 0)) outHeaders.splice(i, 1);
      else if (k === "content-encoding" && decoders.length > 0) outHeaders.splice(i, 1);
    }
    for (const h of outHeaders) h[1] = maskString(h[1], needles);

    const usage: Usage = { ...NO_USAGE };
    const stages: Transform[] = [...decoders];
    let kept: BodyTap | null = null;
    if (sse) {
      stages.push(
        new SseFilter(
          needles,
          route.endpoint === "chat.completions" ? chatEvent(usage, hideUsage) : responsesEvent(usage),
        ),
      );
    } else {
      kept = new BodyTap(MAX_EVENT_BYTES);
      stages.push(kept, new RedactStream(needles));
    }
    res.writeHead(upstream.statusCode, outHeaders.flat());
    try {
      await pipeline([upstream.body, ...stages, res]);
    } catch (error) {
      log({ event: "model_lane", problem: "response stream failed", error: errorCode(error) });
    }
    if (kept !== null) readUsage(kept.body(), route.endpoint, usage);
    return { status: upstream.statusCode, code: null, call: row(upstream.statusCode, usage) };
  };
}

interface Usage {
  input: number;
  output: number;
}
const NO_USAGE: Usage = { input: 0, output: 0 };

type Verdict = "keep" | "drop";

/** Chat stream: usage from any chunk carrying it; the usage-only chunk dropped when the lane asked for it. */
function chatEvent(usage: Usage, hideUsage: boolean): (data: string) => Verdict {
  return (data) => {
    if (!data.includes('"usage"')) return "keep";
    const chunk = parseObject(data);
    if (chunk === null || !isObject(chunk.usage)) return "keep";
    usage.input = tokens(chunk.usage.prompt_tokens);
    usage.output = tokens(chunk.usage.completion_tokens);
    return hideUsage && Array.isArray(chunk.choices) && chunk.choices.length === 0 ? "drop" : "keep";
  };
}

/** Responses stream: usage in the final event's `response.usage` (completed, incomplete, failed). */
function responsesEvent(usage: Usage): (data: string) => Verdict {
  return (data) => {
    if (!data.includes('"usage"')) return "keep";
    const event = parseObject(data);
    const response = event?.response;
    if (isObject(response) && isObject(response.usage)) {
      usage.input = tokens(response.usage.input_tokens);
      usage.output = tokens(response.usage.output_tokens);
    }
    return "keep";
  };
}

function readUsage(body: Buffer | null, endpoint: ModelEndpoint, usage: Usage): void {
  const parsed = body === null ? null : parseObject(body.toString("utf8"));
  if (parsed === null || !isObject(parsed.usage)) return;
  const u = parsed.usage;
  usage.input = tokens(endpoint === "chat.completions" ? u.prompt_tokens : u.input_tokens);
  usage.output = tokens(endpoint === "chat.completions" ? u.completion_tokens : u.output_tokens);
}

const tokens = (value: unknown): number =>
  typeof value === "number" && Number.isSafeInteger(value) && value >= 0 ? Math.min(value, 2 ** 40) : 0;

const LF = 0x0a;
const CR = 0x0d;
const LF_BYTE = Buffer.from([LF]);

/**
 * Server-sent events, passed on one whole event at a time as they arrive (never the whole
 * stream): each event's data goes to `onData`, which may drop it, and each event is masked as a
 * unit. A secret is printable ASCII, so no form of it spans an event boundary and nothing has to
 * be held back past the end of an event. Lines end in LF, CRLF or CR, split anywhere.
 */
export class SseFilter extends Transform {
  private line: Buffer[] = [];
  private lineBytes = 0;
  private event: Buffer[] = [];
  private eventBytes = 0;
  private data: Buffer[] = [];
  // The last chunk ended in CR: an LF first in the next one belongs to the same line end.
  private afterCr = false;
  private lastKept = true;

  constructor(
    private readonly needles: readonly Buffer[],
    private readonly onData: (data: string) => Verdict,
    private readonly maxEventBytes = MAX_EVENT_BYTES,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    let start = 0;
    if (this.afterCr) {
      this.afterCr = false;
      if (chunk[0] === LF) {
        start = 1;
        if (this.event.length > 0) {
          this.event.push(LF_BYTE);
          this.eventBytes++;
        } else if (this.lastKept) this.push(LF_BYTE);
      }
    }
    for (let i = start; i < chunk.length; i++) {
      const b = chunk[i];
      if (b !== LF && b !== CR) continue;
      let end = i + 1;
      if (b === CR) {
        if (i + 1 === chunk.length) this.afterCr = true;
        else if (chunk[i + 1] === LF) end = i + 2;
      }
      this.endLine(chunk.subarray(start, i), chunk.subarray(i, end));
      start = end;
      i = end - 1;
    }
    if (start < chunk.length) {
      this.line.push(chunk.subarray(start));
      this.lineBytes += chunk.length - start;
    }
    const tooLarge = this.lineBytes + this.eventBytes > this.maxEventBytes;
    done(tooLarge ? new Error(`an event of more than ${this.maxEventBytes} bytes`) : null);
  }

  override _flush(done: TransformCallback): void {
    // An event the stream did not finish is not dispatched (as a client would not), only passed on.
    const rest = [...this.event, ...this.line];
    if (rest.length > 0) this.push(maskAll(Buffer.concat(rest), this.needles));
    done();
  }

  private endLine(tail: Buffer, ending: Buffer): void {
    const content = this.line.length > 0 ? Buffer.concat([...this.line, tail]) : tail;
    this.line = [];
    this.lineBytes = 0;
    if (content.length > 0) {
      this.event.push(content, ending);
      this.eventBytes += content.length + ending.length;
      const colon = content.indexOf(0x3a);
      const name = colon === -1 ? content : content.subarray(0, colon);
      if (name.toString("latin1") === "data") {
        let value = colon === -1 ? Buffer.alloc(0) : content.subarray(colon + 1);
        if (value[0] === 0x20) value = value.subarray(1);
        this.data.push(value);
      }
      return;
    }
    // A blank line ends the event.
    let verdict: Verdict = "keep";
    if (this.data.length > 0) {
      const parts: Buffer[] = [];
      for (const [i, d] of this.data.entries()) parts.push(...(i > 0 ? [LF_BYTE, d] : [d]));
      try {
        verdict = this.onData(Buffer.concat(parts).toString("utf8"));
      } catch {
        verdict = "keep";
      }
    }
    const raw = Buffer.concat([...this.event, ending]);
    this.event = [];
    this.eventBytes = 0;
    this.data = [];
    this.lastKept = verdict === "keep";
    if (this.lastKept) this.push(maskAll(raw, this.needles));
  }
}

/** Passes bytes on and keeps a copy of up to `max` of them (for reading usage at the end). */
class BodyTap extends Transform {
  private readonly chunks: Buffer[] = [];
  private size = 0;
  constructor(private readonly max: number) {
    super();
  }
  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    this.size += chunk.length;
    if (this.size <= this.max) this.chunks.push(chunk);
    done(null, chunk);
  }
  body(): Buffer | null {
    return this.size <= this.max ? Buffer.concat(this.chunks) : null;
  }
}

/**
 * Reads the body up to `max` bytes. Past that it stops keeping bytes but lets the rest drain, so
 * the 413 reaches a client still sending (and the connection stays usable).
 */
function readBody(req: IncomingMessage, max: number): Promise<Buffer | "too_large" | "failed"> {
  return new Promise((resolve) => {
    const declared = Number(req.headers["content-length"] ?? 0);
    if (declared > max) {
      req.resume();
      return resolve("too_large");
    }
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size > max) {
        req.off("data", onData);
        chunks.length = 0;
        resolve("too_large");
        return;
      }
      chunks.push(chunk);
    };
    req.on("data", onData);
    req.once("end", () => resolve(Buffer.concat(chunks)));
    req.once("error", () => resolve("failed"));
    req.once("close", () => {
      if (!req.complete) resolve("failed");
    });
  });
}

function modelObject(spec: ModelLaneSpec) {
  return { id: spec.name, object: "model", created: 0, owned_by: spec.provider };
}

function json(res: ServerResponse, status: number, value: unknown): ModelLaneOutcome {
  const body = JSON.stringify(value);
  res.writeHead(status, { "content-type": "application/json", "content-length": Buffer.byteLength(body) });
  res.end(body);
  return { status, code: null, call: null };
}

/** Problem details, with OpenAI's `error` member too so SDKs show the reason. */
function problem(
  res: ServerResponse,
  status: number,
  code: ModelLaneErrorCode,
  detail: string,
): ModelLaneOutcome {
  if (res.headersSent) {
    res.destroy();
    return { status, code, call: null };
  }
  const body = JSON.stringify({
    type: "about:blank",
    title: TITLES[code],
    status,
    detail,
    code,
    error: { message: detail, type: status >= 500 ? "api_error" : "invalid_request_error", code },
  });
  res.writeHead(status, {
    "content-type": "application/problem+json",
    "content-length": Buffer.byteLength(body),
  });
  res.end(body);
  return { status, code, call: null };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function parseObject(text: string): Record<string, unknown> | null {
  try {
    const value: unknown = JSON.parse(text);
    return isObject(value) ? value : null;
  } catch {
    return null;
  }
}

function errorCode(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code ?? (error as { cause?: { code?: unknown } }).cause?.code;
    return typeof code === "string" ? code : error.name;
  }
  return "unknown";
}
