import { Webhook, WebhookVerificationError } from "standardwebhooks";

// Verifying a webhook delivery (cases D1, D2, D4), Standard Webhooks style: HMAC-SHA256 over
// `id.timestamp.body` with the webhook's secret, compared in constant time by the
// `standardwebhooks` library, timestamp within 5 minutes either way, several `v1,` signatures in
// one header. Pure (no Workers or Node imports), with the same care as verifyAuditBatch in
// shared/contract/proxy-wire.ts: the library is lenient where it reads headers, so they are checked
// here first.

export const DELIVERY_ID_HEADER = "webhook-id";
export const DELIVERY_TIMESTAMP_HEADER = "webhook-timestamp";
export const DELIVERY_SIGNATURE_HEADER = "webhook-signature";

/** Deliveries above this are refused (413) before they are read in full. */
export const MAX_DELIVERY_BODY_BYTES = 64 * 1024;
const MAX_SIGNATURE_HEADER_CHARS = 4096;

/**
 * The sender's delivery id, our de-duplication key. No `.`: the signed content is
 * `id.timestamp.body`, so an id with dots could be read as a shorter id and another timestamp.
 */
export const DELIVERY_ID = /^[A-Za-z0-9_-]{1,128}$/;

/** `whsec_` + base64 of 32 random bytes, as the standardwebhooks library reads it. */
export const WEBHOOK_SECRET = /^whsec_[A-Za-z0-9+/]{43}=$/;

export function newWebhookSecret(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return `whsec_${btoa(String.fromCharCode(...bytes))}`;
}

export type HeaderReader = { get(name: string): string | null };

export type Verified = { ok: true; deliveryId: string } | { ok: false; reason: string };

const refused = (reason: string): Verified => ({ ok: false, reason });
const utf8 = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true });

/**
 * Checks a delivery against each of `secrets` (the current one, and the previous one while its
 * rotation window lasts); any one verifying is enough. `rawBody` is the exact bytes received:
 * strict UTF-8 decoding makes the text the library signs map one-to-one onto those bytes, so a
 * re-serialised body (same JSON, other bytes) does not verify. Reasons never quote the headers'
 * values or the body.
 */
export function verifyDelivery(
  secrets: readonly string[],
  headers: HeaderReader,
  rawBody: Uint8Array,
): Verified {
  const id = headers.get(DELIVERY_ID_HEADER);
  const timestamp = headers.get(DELIVERY_TIMESTAMP_HEADER);
  const signature = headers.get(DELIVERY_SIGNATURE_HEADER);
  if (!id || !timestamp || !signature) {
    return refused("missing webhook-id, webhook-timestamp or webhook-signature");
  }
  if (!DELIVERY_ID.test(id)) return refused("webhook-id is not 1-128 of A-Z a-z 0-9 _ -");
  // The library reads the timestamp with parseInt, which accepts "123abc" or "1e3": digits only.
  if (!/^[0-9]{1,12}$/.test(timestamp)) return refused("webhook-timestamp is not an integer");
  if (signature.length > MAX_SIGNATURE_HEADER_CHARS) return refused("webhook-signature is too long");
  if (rawBody.byteLength > MAX_DELIVERY_BODY_BYTES) return refused("the body is too large");
  let body: string;
  try {
    body = utf8.decode(rawBody);
  } catch {
    return refused("the body is not UTF-8, so it cannot match a signature");
  }
  const checked = { [DELIVERY_ID_HEADER]: id, [DELIVERY_TIMESTAMP_HEADER]: timestamp };
  let reason = "no secret to verify with";
  for (const secret of secrets) {
    try {
      new Webhook(secret).verify(
        body,
        { ...checked, [DELIVERY_SIGNATURE_HEADER]: signature },
        { jsonParse: false },
      );
      return { ok: true, deliveryId: id };
    } catch (error) {
      // The timestamp verdict is the same for every secret; a mismatch may differ per secret.
      reason =
        error instanceof WebhookVerificationError ? error.message : "the signature could not be checked";
    }
  }
  return refused(reason);
}
