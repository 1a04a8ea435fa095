import type { ServerResponse } from "node:http";
import {
  pipeline as pipelineCb,
  type Readable,
  Transform,
  type TransformCallback,
  Writable,
} from "node:stream";
import { pipeline } from "node:stream/promises";
import { relayBody } from "../body-relay";
import type { UpstreamAnswer } from "../handler/send";
import { filterResponseHeaders } from "../http-rules";
import { maskAll, maskString, RedactStream } from "../redact";
import { MAX_EVENT_BYTES, SseFilter, type Verdict } from "./sse-relay";
import { ToClient } from "./to-client";
import {
  reportedUsage,
  type SseEvent,
  type Translation,
  type Usage,
  usageMeter,
  type WireFormat,
} from "./translate";

// The provider's answer, on its way back to the sandbox: passed through when the caller spoke
// the provider's format (bytes as they came, streams untouched but for the usage chunk the lane
// asked for), translated otherwise (a JSON body whole, a stream event by event as it arrives).
// Either way every byte is scrubbed of the key (B7, J2) and the provider's usage is read, from
// the provider's own events or body whatever the caller's format. The answer is read to its end
// even when the sandbox hangs up (to-client.ts), so that usage is not lost (case L3). A
// translated answer is scrubbed twice: as the provider wrote it, before anything can cut,
// split or re-escape a key in it (a bounded error message, a re-chunked delta), and as the
// caller gets it.

export const NO_USAGE: Usage = { input: 0, output: 0, cached: 0 };

// A translated answer keeps only what both SDKs read whatever the format: retry advice and the
// provider's request id (for a bug report). The rest describe the provider's API, not the
// caller's.
const TRANSLATED_HEADERS = new Set([
  "retry-after",
  "retry-after-ms",
  "x-should-retry",
  "request-id",
  "x-request-id",
]);

export interface RelayInput {
  answer: Pick<UpstreamAnswer, "status" | "headers" | "body">;
  /** Decoders for the answer's Content-Encoding (the scrubber reads plain bytes). */
  decoders: Transform[];
  res: ServerResponse;
  needles: readonly Buffer[];
  /** The format sent upstream (the provider's). */
  upstream: WireFormat;
  /** null: passthrough. */
  translation: Translation | null;
  stream: boolean;
  /** The declared model's name, shown in a translated answer. */
  model: string;
  droppedHeaders: ReadonlySet<string>;
  /** Chat passthrough: drop the usage-only chunk the lane asked for and the caller did not. */
  hideUsage: boolean;
  /** Translated chat streams: the caller asked for the usage chunk (stream_options.include_usage). */
  includeUsage: boolean;
}

export interface Relayed {
  /** The provider's usage when `reported`; else what of it was seen before the answer ended. */
  usage: Usage;
  /** Whether the provider's final count came (an error status counts as reported: not billed). */
  reported: boolean;
  /** Whether the sandbox went away before it had the whole answer. */
  clientGone: boolean;
  /** Why the answer could not be handed on whole (a log reason, never content), or null. */
  problem: string | null;
}

export async function relay(input: RelayInput): Promise<Relayed> {
  const { answer, res, needles } = input;
  const contentType = String(answer.headers["content-type"] ?? "").toLowerCase();
  const sse = input.stream && answer.status < 300 && contentType.startsWith("text/event-stream");
  const headers = filterResponseHeaders(answer.headers).filter(([k]) => !input.droppedHeaders.has(k));
  const mask = (h: Array<[string, string]>) => h.flatMap(([k, v]) => [k, maskString(v, needles)]);

  if (input.translation === null) {
    const passed = headers.filter(
      ([k]) =>
        !(k === "content-length" && (sse || input.decoders.length > 0)) &&
        !(k === "content-encoding" && input.decoders.length > 0),
    );
    const meter = usageMeter(input.upstream);
    const stages: Transform[] = [...input.decoders];
    const kept = sse ? null : new BodyTap(MAX_EVENT_BYTES);
    if (kept === null) stages.push(new SseFilter(needles, usageReader(meter, input.hideUsage)));
    else stages.push(kept, new RedactStream(needles));
    res.writeHead(answer.status, mask(passed));
    const { problem, clientGone } = await piped(answer.body, stages, res);
    if (answer.status >= 300) return { usage: { ...NO_USAGE }, reported: true, clientGone, problem };
    if (kept === null) return { usage: meter.usage(), reported: meter.reported(), clientGone, problem };
    const body = kept.body();
    const usage = body === null ? null : reportedUsage(input.upstream, parseJson(body));
    return { usage: usage ?? { ...NO_USAGE }, reported: usage !== null, clientGone, problem };
  }

  const translation = input.translation;
  const kept = headers.filter(([k]) => TRANSLATED_HEADERS.has(k));
  if (sse) {
    const translator = translation.stream({ model: input.model, includeUsage: input.includeUsage });
    const meter = usageMeter(input.upstream);
    const onEvent = (e: SseEvent): Verdict => {
      meter.push(e);
      try {
        return translator.push(e);
      } catch {
        // A provider event the translation cannot read is left out, not passed on raw.
        return [];
      }
    };
    const filter = new SseFilter(needles, onEvent, () => translator.end());
    res.writeHead(
      answer.status,
      mask([...kept, ["content-type", "text/event-stream"], ["cache-control", "no-cache"]]),
    );
    const { problem, clientGone } = await piped(
      answer.body,
      [...input.decoders, new RedactStream(needles), filter],
      res,
    );
    return { usage: meter.usage(), reported: meter.reported(), clientGone, problem };
  }

  // A whole JSON body: an answer or the provider's error, read (bounded) and translated.
  const raw = await readAll(answer.body, [...input.decoders, new RedactStream(needles)]);
  const parsed = raw === null ? null : parseJson(raw);
  let body: Record<string, unknown>;
  let problem: string | null = raw === null ? "answer unreadable or too large" : null;
  try {
    body =
      answer.status >= 300
        ? translation.error(answer.status, parsed)
        : translation.response(parsed, { model: input.model }).body;
  } catch {
    problem = "answer could not be translated";
    body = translation.error(502, null);
  }
  // What the provider reported is the spend, whatever became of the answer.
  const usage = answer.status >= 300 ? { ...NO_USAGE } : reportedUsage(input.upstream, parsed);
  const status = problem === "answer could not be translated" ? 502 : answer.status;
  const text = maskAll(Buffer.from(JSON.stringify(body), "utf8"), needles);
  // Gone while the provider answered: the answer was read all the same, for its usage.
  const clientGone = res.destroyed;
  res.writeHead(
    status,
    mask([...kept, ["content-type", "application/json"], ["content-length", String(text.length)]]),
  );
  res.end(text);
  return { usage: usage ?? { ...NO_USAGE }, reported: usage !== null, clientGone, problem };
}

/**
 * The answer through its stages (decoders, scrubber, filter) and on to the client by relayBody,
 * to its end even when the client goes away (ToClient).
 */
async function piped(
  body: Readable,
  stages: Transform[],
  res: ServerResponse,
): Promise<{ problem: string | null; clientGone: boolean }> {
  const last = stages[stages.length - 1] ?? null;
  // A stage's error or abort reaches the relay through the last stage (as on the main path).
  if (last !== null) pipelineCb([body, ...stages], () => {});
  const client = new ToClient(res);
  try {
    await relayBody(last ?? body, client, null, { bytesOut: 0 });
    return { problem: null, clientGone: client.clientGone };
  } catch (error) {
    const why = error instanceof Error ? ((error as { code?: string }).code ?? error.name) : "unknown";
    return { problem: `response stream failed: ${why}`, clientGone: client.clientGone };
  }
}

/**
 * A passthrough stream's usage, followed event by event (usageMeter), and for chat the
 * usage-only chunk dropped when the lane asked for it and the caller did not.
 */
function usageReader(meter: ReturnType<typeof usageMeter>, hideUsage: boolean): (e: SseEvent) => Verdict {
  return (e) => {
    if (!e.data.includes("usage")) return "keep";
    meter.push(e);
    if (!hideUsage) return "keep";
    const event = parseJson(Buffer.from(e.data, "utf8"));
    const usageOnly =
      isObject(event) && isObject(event.usage) && Array.isArray(event.choices) && event.choices.length === 0;
    return usageOnly ? "drop" : "keep";
  };
}

function parseJson(raw: Buffer): unknown {
  try {
    return JSON.parse(raw.toString("utf8"));
  } catch {
    return null;
  }
}

export function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

/** The whole body through its decoders, or null when it fails or passes MAX_EVENT_BYTES. */
async function readAll(body: Readable, decoders: Transform[]): Promise<Buffer | null> {
  const chunks: Buffer[] = [];
  let size = 0;
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      size += chunk.length;
      if (size > MAX_EVENT_BYTES) return done(new Error("too large"));
      chunks.push(chunk);
      done();
    },
  });
  try {
    await pipeline([body, ...decoders, sink]);
    return Buffer.concat(chunks);
  } catch {
    return null;
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
