import { randomUUID } from "node:crypto";
import type { IncomingMessage, ServerResponse } from "node:http";
import { splitHostPort } from "@benchwright/shared/contract/host-name";
import type { LogRecord } from "@benchwright/shared/contract/log";
import type { ModelLaneSpec } from "@benchwright/shared/contract/policy";
import { ModelCallRow, type ModelEndpoint } from "@benchwright/shared/contract/proxy-wire";
import { decodersFor } from "../http-rules";
import { needlesFor } from "../redact";
import type { Upstream } from "../upstream";
import { askedOutput, capOutput, choicesOf, type Settlement, Spend } from "./budget";
import { CALLER_FORMAT, routeFor } from "./providers";
import { formatOfRequest, laneRefusal, type ModelLaneErrorCode, refuse } from "./refuse";
import { isObject, NO_USAGE, relay } from "./relay";
import { type Refusal, translation, type Usage, type WireFormat } from "./translate";

export type { ModelLaneErrorCode } from "./refuse";

// The model lane: the work sandbox talks to http(s)://model.benchwright.invalid/v1 with a
// placeholder key, in OpenAI's format (chat completions, responses) or Anthropic's (messages);
// this proxy makes the real call to the run's declared model in its provider's format
// (providers.ts), translating where the two differ (translate.ts), with the vault key. Outside
// host policy by design (the model is what the run evaluates), but through the same resolve,
// address checks (A12, A13) and verified TLS (B3) as every other upstream, with the key scrubbed
// from everything that comes back (B7, J2), only the declared model (J1) and within the run's
// budget (J3, budget.ts), which a client cannot slip by hanging up, asking for many choices or a
// background response (L3: a sent call is read to its end for its usage). Per call it yields one
// row of counts (no prompt, no output).

/** A model request is a JSON document; a larger body is refused (413). */
export const MAX_MODEL_BODY_BYTES = 16 * 1024 * 1024;
// A long generation can take minutes before the first byte (the pool's default is 60 s).
const UPSTREAM_TIMEOUT_MS = 10 * 60_000;
/**
 * The output bound sent to a provider that requires one (Anthropic's max_tokens) when the
 * caller's format does not (OpenAI's): enough for a long answer, and still a bound.
 */
export const DEFAULT_MAX_TOKENS = 8192;

const ENDPOINTS = new Map<string, ModelEndpoint>([
  ["/v1/chat/completions", "chat.completions"],
  ["/v1/responses", "responses"],
  ["/v1/messages", "messages"],
]);
// Errors after which the request may well have reached the provider: still a call to record,
// and to charge (its usage unknown).
const SENT_ERRORS = new Set(["UND_ERR_HEADERS_TIMEOUT", "UND_ERR_SOCKET", "ECONNRESET"]);

export interface ModelLaneOutcome {
  /** The status sent to the sandbox; 499 when the sandbox went away before the whole answer. */
  status: number;
  /** Why the lane answered itself, or null when the answer is the provider's (or the model list). */
  code: ModelLaneErrorCode | null;
  /** The call to record (a refused one too: J1, J3), or null when there was no call. */
  call: ModelCallRow | null;
}

export interface ModelLaneOptions {
  upstream: Upstream;
  /** Structured problems (codes and reasons only, never a header, body or secret). */
  log?: (record: LogRecord) => void;
  newCallId?: () => string;
  /** Clock for the row's `at` and `ms` (ms since the epoch). */
  now?: () => number;
  maxBodyBytes?: number;
  maxTokensDefault?: number;
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
  const maxTokensDefault = options.maxTokensDefault ?? DEFAULT_MAX_TOKENS;
  // One proxy serves one run: this is the run's spend.
  const spend = new Spend();

  return async (req, res, path, lane) => {
    const started = now();
    const method = req.method ?? "GET";
    // The query is ignored: nothing the sandbox puts there is forwarded.
    const pathname = path.split("?", 1)[0] ?? "";
    const endpoint = ENDPOINTS.get(pathname);
    const caller: WireFormat =
      endpoint === undefined ? formatOfRequest(pathname, req.headers) : CALLER_FORMAT[endpoint];
    const answer = (status: number, code: ModelLaneErrorCode, message: string) => ({
      status: refuse(res, caller, laneRefusal(status, code, message)),
      code,
      call: null,
    });
    if (lane === null)
      return answer(
        404,
        "model_not_declared",
        "This run declares no model, so the model lane has none to call.",
      );
    const { spec, secret } = lane;

    if (method === "GET" && pathname === "/v1/models") return models(res, caller, spec, true);
    if (method === "GET" && pathname === `/v1/models/${encodeURIComponent(spec.name)}`)
      return models(res, caller, spec, false);
    if (method !== "POST" || endpoint === undefined) {
      return answer(
        404,
        "not_found",
        "The model lane serves POST /v1/chat/completions, /v1/responses and /v1/messages.",
      );
    }

    const raw = await readBody(req, maxBody);
    if (raw === "too_large") return answer(413, "payload_too_large", `At most ${maxBody} bytes.`);
    if (raw === "failed") return answer(400, "invalid_request", "The request body did not arrive.");
    let body: unknown;
    try {
      body = JSON.parse(raw.toString("utf8"));
    } catch {
      return answer(400, "invalid_request", "The body is not JSON.");
    }
    if (!isObject(body)) return answer(400, "invalid_request", "The body is not a JSON object.");

    const route = routeFor(spec.provider, caller);
    let stream = body.stream === true;
    const row = (status: number, usage: Usage, refused: ModelLaneErrorCode | null): ModelCallRow | null => {
      const candidate = {
        callId: newCallId(),
        at: new Date(started).toISOString(),
        model: spec.name,
        provider: spec.provider,
        endpoint,
        stream,
        status,
        inputTokens: usage.input,
        outputTokens: usage.output,
        cachedInputTokens: Math.min(usage.cached, usage.input),
        refused,
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
    // A call the lane refuses itself is recorded too, with no tokens: nothing reached the provider.
    const refused = (code: ModelLaneErrorCode, refusal: Refusal, headers: Record<string, string> = {}) => ({
      status: refuse(res, caller, refusal, headers),
      code,
      call: row(refusal.status, NO_USAGE, code),
    });

    // J1: never another model than the declared one, whatever the sandbox asks for.
    if (body.model !== spec.name && body.model !== spec.upstreamModel)
      return refused(
        "model_not_declared",
        laneRefusal(400, "model_not_declared", `This run declares the model ${JSON.stringify(spec.name)}.`),
      );

    let out: Record<string, unknown>;
    const translate = route.passthrough ? null : translation(caller, route.upstream);
    if (translate === null) out = { ...body, model: spec.upstreamModel };
    else {
      let done: ReturnType<typeof translate.request>;
      try {
        done = translate.request(body, { upstreamModel: spec.upstreamModel, maxTokensDefault });
      } catch {
        // A shape the translation did not foresee is not guessed at either.
        log({ event: "model_lane", problem: "request could not be translated" });
        const why = "The model lane could not translate this request to the provider's format.";
        return refused("untranslatable", laneRefusal(400, "untranslatable", why));
      }
      // What cannot be translated is refused, never dropped (the translation's message says what).
      if (!done.ok) return refused("untranslatable", done.refusal);
      out = done.body;
      stream = done.stream;
    }
    // L3: what the budget cannot count is refused: a background response (its usage, and its
    // answer, come later from an endpoint the lane does not serve) and an `n` that is not a
    // whole number (a provider might read "3" as 3 choices). A whole `n` is counted (budget.ts).
    if (
      route.upstream === "openai-responses" &&
      out.background !== undefined &&
      out.background !== null &&
      out.background !== false
    ) {
      const why =
        "The model lane does not serve background responses: it could not follow their usage or fetch their answer.";
      return refused("unsupported_parameter", laneRefusal(400, "unsupported_parameter", why, "background"));
    }
    const choices = choicesOf(route.upstream, out);
    if (choices === null) {
      const why = "`n` must be a whole number of at least 1.";
      return refused("unsupported_parameter", laneRefusal(400, "unsupported_parameter", why, "n"));
    }
    // Chat streams carry usage only when asked: ask, and hide the answer from a sandbox that did not.
    let hideUsage = false;
    if (route.upstream === "openai-chat" && stream) {
      const asked = isObject(out.stream_options) ? out.stream_options : {};
      if (asked.include_usage !== true) {
        out.stream_options = { ...asked, include_usage: true };
        hideUsage = translate === null;
      }
    }

    const base = new URL(spec.baseUrl);
    const target = splitHostPort(base.host);
    const upstreamPath = `${base.pathname.replace(/\/+$/, "")}${route.provider.paths[route.upstream]}${base.search}`;
    if (base.protocol !== "https:" || target === null) {
      log({ event: "model_lane", problem: "base URL unusable" });
      return answer(502, "upstream_failed", "The declared model's provider cannot be reached.");
    }
    const resolved = await options.upstream.resolve(target.host, target.port ?? 443);
    if (!resolved.ok) {
      log({ event: "model_lane", problem: "upstream refused", reason: resolved.reason });
      return answer(502, "upstream_failed", "The declared model's provider cannot be reached.");
    }

    // J3: admitted within the budget, or refused in the caller's format (budget.ts says when).
    // The input estimate is the body's size in bytes: no less than its tokens for text (a token
    // is at least one byte), which is what the budget's bound on input needs (budget.ts).
    const admission = spend.admit(spec.budget, {
      asked: askedOutput(route.upstream, out),
      least: route.provider.leastOutput[route.upstream] ?? 1,
      choices,
      inputEstimate: Buffer.byteLength(JSON.stringify(out)),
    });
    if (!admission.ok) {
      const retry = admission.code === "budget_in_flight";
      const message = retry
        ? `The run's model budget of ${admission.what} is held by calls in flight; retry when they end.`
        : `The run's model budget of ${admission.what} is spent.`;
      return refused(
        admission.code,
        laneRefusal(429, admission.code, message),
        retry ? { "x-should-retry": "true", "retry-after": "1" } : {},
      );
    }
    const outputField = route.provider.outputLimit[route.upstream];
    if (admission.outputCap !== null && outputField !== undefined)
      capOutput(route.upstream, out, admission.outputCap, outputField);
    // Serialised again, so the provider reads exactly the one `model` checked here.
    const payload = Buffer.from(JSON.stringify(out), "utf8");

    // Only these go upstream: the sandbox's own headers (its placeholder key in Authorization or
    // x-api-key among them) never do, but for the feature flags and version its body is written
    // for, and those only when the body goes as it came (a translated one is the lane's).
    const given = new Map<string, string>();
    if (route.passthrough)
      for (const name of route.provider.forwarded) {
        const value = req.headers[name];
        if (typeof value === "string") given.set(name, value);
      }
    const headers = [
      "content-type",
      "application/json",
      // Plain bytes, so the scrubber and the usage reader see them (B7).
      "accept-encoding",
      "identity",
      "accept",
      stream ? "text/event-stream" : "application/json",
      ...route.provider.fixed.filter(([name]) => !given.has(name)).flat(),
      ...[...given].flat(),
      ...route.provider.auth(secret).flat(),
    ];

    // L3: the sandbox going away does not end the upstream call: once sent, a call is read to
    // its end for its usage (relay.ts), which the provider bills whether anyone reads it or not.
    const pool = options.upstream.poolFor("https:", target.host, resolved.address, resolved.port);
    let upstream: Awaited<ReturnType<typeof pool.request>>;
    try {
      upstream = await pool.request({
        method: "POST",
        path: upstreamPath,
        headers,
        body: payload,
        headersTimeout: UPSTREAM_TIMEOUT_MS,
        bodyTimeout: UPSTREAM_TIMEOUT_MS,
      });
    } catch (error) {
      const code = errorCode(error);
      log({ event: "model_lane", problem: "upstream failed", error: code });
      // A call that may have reached the provider is charged what it held (its usage unknown).
      const sent = SENT_ERRORS.has(code);
      const charged = admission.settle(sent ? { unreported: NO_USAGE } : null);
      if (res.destroyed) return { status: 499, code: "upstream_failed", call: row(499, charged, null) };
      const failed = answer(502, "upstream_failed", "The declared model's provider did not answer.");
      return { ...failed, call: sent ? row(502, charged, null) : null };
    }

    // The same forms the main path masks (case I9), of the key as this provider is sent it.
    const needles = needlesFor(secret, route.provider.injected(secret));
    const decoders = decodersFor(upstream.headers["content-encoding"]);
    if (decoders === null) {
      // An encoding the scrubber cannot read could carry the key past it (same rule as proxy.ts).
      upstream.body.on("error", () => {}).destroy();
      const charged = admission.settle(
        upstream.statusCode >= 300 ? { reported: NO_USAGE } : { unreported: NO_USAGE },
      );
      log({ event: "model_lane", problem: "response encoding cannot be scrubbed" });
      const failed = answer(502, "upstream_failed", "The provider's answer cannot be passed on.");
      return { ...failed, call: row(502, charged, null) };
    }
    const relayed = await relay({
      answer: { status: upstream.statusCode, headers: upstream.headers, body: upstream.body },
      decoders,
      res,
      needles,
      upstream: route.upstream,
      translation: translate,
      stream,
      model: spec.name,
      droppedHeaders: route.provider.droppedResponse,
      hideUsage,
      includeUsage: isObject(body.stream_options) && body.stream_options.include_usage === true,
    });
    if (relayed.problem !== null) log({ event: "model_lane", problem: relayed.problem });
    // The spend is what the provider reported, whatever became of the answer on the way back;
    // what it held when the report never came.
    const settlement: Settlement = relayed.reported
      ? { reported: relayed.usage }
      : { unreported: relayed.usage };
    const charged = admission.settle(settlement);
    const status = relayed.clientGone ? 499 : res.statusCode;
    return { status, code: null, call: row(status, charged, null) };
  };
}

/** The model list, in the caller's format: the declared model only. */
function models(
  res: ServerResponse,
  caller: WireFormat,
  spec: ModelLaneSpec,
  list: boolean,
): ModelLaneOutcome {
  const anthropic = caller === "anthropic-messages";
  const one = anthropic
    ? { type: "model", id: spec.name, display_name: spec.name, created_at: "1970-01-01T00:00:00Z" }
    : { id: spec.name, object: "model", created: 0, owned_by: spec.provider };
  const value = !list
    ? one
    : anthropic
      ? { data: [one], has_more: false, first_id: spec.name, last_id: spec.name }
      : { object: "list", data: [one] };
  const text = JSON.stringify(value);
  res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(text) });
  res.end(text);
  return { status: 200, code: null, call: null };
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

function errorCode(error: unknown): string {
  if (error instanceof Error) {
    const code = (error as { code?: unknown }).code ?? (error as { cause?: { code?: unknown } }).cause?.code;
    return typeof code === "string" ? code : error.name;
  }
  return "unknown";
}
