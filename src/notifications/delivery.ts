import { Webhook } from "standardwebhooks";
import type { AttemptOutcome, EndedRun } from "./service";

// One notification attempt, Standard Webhooks style (https://www.standardwebhooks.com, spec
// v1.0.0): a JSON body `{type, timestamp, data}`, signed with the notification's `whsec_` secret
// by the `standardwebhooks` library over `id.timestamp.body`, in the headers `webhook-id` (the
// same on every attempt of a delivery, so a receiver de-dupes), `webhook-timestamp` (this
// attempt's, in seconds) and `webhook-signature` (`v1,<base64>`).

/** Waits after the 1st, 2nd, ... failed attempt (the spec's suggested schedule); then it fails. */
export const RETRY_SCHEDULE_MS = [
  5_000,
  5 * 60_000,
  30 * 60_000,
  2 * 3_600_000,
  5 * 3_600_000,
  10 * 3_600_000,
  10 * 3_600_000,
] as const;
export const MAX_ATTEMPTS = RETRY_SCHEDULE_MS.length + 1;
/** A receiver that has not answered by then has failed this attempt. */
export const ATTEMPT_TIMEOUT_MS = 10_000;

export interface RunEndedPayload {
  type: "run.ended";
  timestamp: string;
  data: {
    runId: string;
    status: string;
    reason: string | null;
    reasonDetail: string | null;
    endedAt: string | null;
    links: { run: string; page: string };
  };
}

/** The body for a run that ended, from its row: the same bytes on every attempt. */
export function runEndedPayload(run: EndedRun, origin: string): string {
  const endedAt = run.endedAt?.toISOString() ?? null;
  const payload: RunEndedPayload = {
    type: "run.ended",
    timestamp: endedAt ?? run.updatedAt.toISOString(),
    data: {
      runId: run.id,
      status: run.status,
      reason: run.reason,
      reasonDetail: run.reasonDetail,
      endedAt,
      links: { run: `${origin}/v1/runs/${run.id}`, page: `${origin}/runs/${run.id}` },
    },
  };
  return JSON.stringify(payload);
}

/** When the attempt after `attempt` failed ones is due, with ±10% jitter; null: give up. */
export function retryAt(attempt: number, now: number, random = Math.random): Date | null {
  const wait = RETRY_SCHEDULE_MS[attempt - 1];
  if (wait === undefined) return null;
  return new Date(now + Math.round(wait * (0.9 + 0.2 * random())));
}

export interface Attempt {
  url: URL;
  deliveryId: string;
  secret: string;
  body: string;
  /** 1 for the first attempt. */
  attempt: number;
}

/**
 * Sends one attempt and says how it went. A 2xx answer delivers; anything else (another status,
 * a redirect, which is never followed, no answer in time, a failed connection) is a failure,
 * retried by RETRY_SCHEDULE_MS. The receiver's body is never read.
 */
export async function sendAttempt(
  a: Attempt,
  fetcher: typeof fetch = fetch,
  now: () => number = Date.now,
): Promise<AttemptOutcome> {
  const startedAt = new Date(now());
  const headers = {
    "content-type": "application/json",
    "user-agent": "Benchwright-Notifications/1",
    "webhook-id": a.deliveryId,
    "webhook-timestamp": String(Math.floor(startedAt.getTime() / 1000)),
    "webhook-signature": new Webhook(a.secret).sign(a.deliveryId, startedAt, a.body),
  };
  let statusCode: number | null = null;
  let error: string | null = null;
  try {
    const res = await fetcher(a.url, {
      method: "POST",
      headers,
      body: a.body,
      redirect: "manual",
      signal: AbortSignal.timeout(ATTEMPT_TIMEOUT_MS),
    });
    statusCode = res.status;
    await res.body?.cancel().catch(() => {});
    if (res.status >= 300 && res.status < 400) error = "the receiver redirected; redirects are not followed";
    else if (res.status < 200 || res.status >= 300) error = `the receiver answered ${res.status}`;
  } catch (e) {
    const name = e instanceof Error ? e.name : "";
    error =
      name === "TimeoutError" || name === "AbortError"
        ? `no answer within ${ATTEMPT_TIMEOUT_MS / 1000} s`
        : "the connection to the receiver failed";
  }
  const durationMs = Math.max(0, now() - startedAt.getTime());
  if (error === null) return { startedAt, durationMs, statusCode, error, next: { status: "delivered" } };
  const at = retryAt(a.attempt, now());
  return {
    startedAt,
    durationMs,
    statusCode,
    error,
    next: at ? { status: "pending", retryAt: at } : { status: "failed" },
  };
}
