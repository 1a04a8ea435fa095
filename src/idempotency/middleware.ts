import { consoleLog } from "@benchwright/shared/contract/log";
import { z } from "@hono/zod-openapi";
import type { Context } from "hono";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../context";
import type { ReplayHeaders } from "../db/schema";
import { ApiError } from "../errors";
import {
  ABANDONED_MS,
  claimKey,
  type KeyRow,
  recordAnswer,
  releaseKey,
  requestDigest,
  sameRequest,
  storedAnswer,
} from "./store";
import { WITHHELD_HEADER, withhold } from "./withheld";

// `Idempotency-Key` on the POSTs that create something (IDEMPOTENT_POSTS in ./routes.ts), with
// Stripe's semantics (docs/user-guide.md, "Retries and limits"):
//   - a key's first request runs; its answer (status, body, the headers below) is kept a day;
//   - the same key, method, path and body again → that answer, replayed (`Idempotent-Replayed`),
//     and nothing runs again;
//   - the same key with another request → 409 idempotency_key_reused;
//   - the same key while its first request still runs → 409 idempotency_key_in_use.
// 4xx answers are kept and replayed like successes (the same request would be refused the same
// way), except 429: "retry later" is not an answer. 5xx answers are not kept: the claim is given
// up and a retry runs again, since a 5xx here nearly always means nothing was made (the database
// was away); storing it would turn a blip into a day of failures. Keys are per environment.

/** 1 to 255 printable ASCII characters (Stripe's bound; a UUID fits). */
export const IdempotencyKey = z
  .string()
  .regex(/^[\x20-\x7e]{1,255}$/)
  .openapi({
    description:
      "Makes this POST safe to retry: the same key with the same body within 24 h answers as the first request did, without doing it again. 1-255 printable ASCII characters, e.g. a random UUID; keys are per environment",
    example: "5f0c8e0e-4f0b-4bd4-8d53-3c1a1c1f2b7e",
  });

/** The answer headers a replay carries (the rest, such as x-request-id, are the replay's own). */
const REPLAYED_HEADERS = ["content-type", "location"];

/** Answers kept for the key's day: all but server faults and "retry later". */
export const keepsAnswer = (status: number) => status < 500 && status !== 429;

type Body = { chunks: Uint8Array<ArrayBuffer>[] } | { tooLarge: true };

/**
 * The body, read once into its chunks (not copied) so it can be hashed, and handed on to the
 * route as the same chunks. Larger than `maxBytes` (the largest body any route takes): not
 * hashed, handed on whole, and the route refuses it with its own code; nothing is claimed.
 */
async function takeBody(c: Context<AppEnv>, maxBytes: number): Promise<Body> {
  const raw = c.req.raw;
  const length = c.req.header("content-length");
  if (length !== undefined && /^\d+$/.test(length) && Number(length) > maxBytes) return { tooLarge: true };
  if (!raw.body) return { chunks: [] };
  const reader = raw.body.getReader();
  const chunks: Uint8Array<ArrayBuffer>[] = [];
  let size = 0;
  for (;;) {
    const next = await reader.read();
    if (next.done) break;
    chunks.push(next.value as Uint8Array<ArrayBuffer>);
    size += next.value.byteLength;
    if (size > maxBytes) {
      c.req.raw = new Request(raw, { body: streamOf(chunks, reader) });
      return { tooLarge: true };
    }
  }
  c.req.raw = new Request(raw, { body: chunks.length > 0 ? streamOf(chunks) : null });
  return { chunks };
}

/** The chunks, one at a time, then whatever `rest` still has. */
function streamOf(
  chunks: readonly Uint8Array<ArrayBuffer>[],
  rest?: ReadableStreamDefaultReader<Uint8Array>,
): ReadableStream<Uint8Array> {
  let i = 0;
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      const chunk = chunks[i++];
      if (chunk) return controller.enqueue(chunk);
      const next = rest ? await rest.read() : { done: true as const };
      if (next.done) controller.close();
      else controller.enqueue(next.value);
    },
    cancel: (reason) => rest?.cancel(reason),
  });
}

/** SHA-256 of the method, the path and the body, injectively framed. */
async function requestHash(method: string, path: string, chunks: readonly Uint8Array[]) {
  const digest = new crypto.DigestStream("SHA-256");
  const writer = digest.getWriter();
  await writer.write(new TextEncoder().encode(`${method}\n${path.length}:${path}\n`));
  for (const chunk of chunks) await writer.write(chunk);
  await writer.close();
  return new Uint8Array(await digest.digest);
}

/** The answer to a key another request holds: its replay, or why not. */
async function answerHeld(c: Context<AppEnv>, row: KeyRow, hash: Uint8Array<ArrayBuffer>): Promise<Response> {
  const ring = c.var.config.keyRing;
  if (!(await sameRequest(ring, row.requestDigest, hash))) {
    throw new ApiError(
      "idempotency_key_reused",
      "This Idempotency-Key was used with another request (method, path or body) in the last 24 hours; use a new key for a new request.",
    );
  }
  const answer = await storedAnswer(ring, c.var.principal, row);
  if (answer === null) {
    if (Date.now() - row.createdAt.getTime() > ABANDONED_MS) {
      throw new ApiError(
        "idempotency_key_in_use",
        `The first request with this Idempotency-Key (${row.createdAt.toISOString()}) never finished, so whether it took effect is unknown; it is not run again. Look for what it would have made (e.g. GET /v1/runs) and retry with a new key if it is not there.`,
      );
    }
    throw new ApiError(
      "idempotency_key_in_use",
      "The first request with this Idempotency-Key has not finished yet; retry when it has.",
      1,
    );
  }
  const headers = new Headers(answer.headers);
  headers.set("idempotent-replayed", "true");
  return new Response(answer.body || null, { status: answer.status, headers });
}

/**
 * The middleware (app.ts applies it to IDEMPOTENT_POSTS, after the API key is known).
 * `maxBodyBytes`: the largest body a covered route takes (a bundle); `withheld`: top-level fields
 * of the answer never stored, so never replayed (WITHHELD_FROM_REPLAY in ./routes.ts, case L5).
 */
export function idempotency(maxBodyBytes: (c: Context<AppEnv>) => number, withheld: readonly string[] = []) {
  return createMiddleware<AppEnv>(async (c, next) => {
    const header = c.req.header("idempotency-key");
    if (c.req.method !== "POST" || header === undefined) return next();
    const parsed = IdempotencyKey.safeParse(header);
    if (!parsed.success) {
      throw new ApiError(
        "invalid_idempotency_key",
        "Idempotency-Key must be 1-255 printable ASCII characters.",
      );
    }
    const key = parsed.data;
    const body = await takeBody(c, maxBodyBytes(c));
    if ("tooLarge" in body) return next();
    const { db, principal, config } = c.var;
    const hash = await requestHash(c.req.method, c.req.path, body.chunks);
    const claim = await claimKey(
      db,
      principal.environmentId,
      key,
      await requestDigest(config.keyRing, hash),
      Date.now(),
    );
    if (!claim.claimed) return answerHeld(c, claim.row, hash);
    // The route and the recording of its answer as one task the runtime finishes even if the
    // client hangs up: a request cancelled between the two would hold its key unanswered.
    const work = (async () => {
      await next();
      await settle(c, key, withheld);
    })();
    c.executionCtx.waitUntil(work.catch(() => {}));
    await work;
  });
}

/** Keeps the route's answer for the key, or gives the key up. Never changes the answer. */
async function settle(c: Context<AppEnv>, key: string, withheld: readonly string[]): Promise<void> {
  const { db, principal, config } = c.var;
  const res = c.res;
  try {
    if (!keepsAnswer(res.status)) {
      await releaseKey(db, principal.environmentId, key);
      return;
    }
    const headers: ReplayHeaders = {};
    for (const name of REPLAYED_HEADERS) {
      const value = res.headers.get(name);
      if (value !== null) headers[name] = value;
    }
    const { text, left } = withhold(await res.clone().text(), withheld);
    if (left.length > 0) headers[WITHHELD_HEADER] = left.join(", ");
    await recordAnswer(db, config.keyRing, principal, key, { status: res.status, headers, body: text });
  } catch (error) {
    // The answer stands; the key stays claimed and unanswered (a retry gets in_use, never a
    // second run). The error's class only: driver messages can quote parameters.
    consoleLog("error", {
      event: "idempotency_record_failed",
      requestId: c.var.requestId,
      error: (error as Error).name,
    });
  }
}
