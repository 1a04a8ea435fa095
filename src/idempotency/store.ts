import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import { and, eq, isNull, lt } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { decryptSecret, encryptSecret, keyedDigest } from "../crypto/vault-crypto";
import { idempotencyKeys, type ReplayHeaders } from "../db/schema";
import type { Db } from "../db/types";

// The idempotency_keys table: claim a key for a request, record its answer, replay it, release
// it, and forget keys after a day. One row per (environment, key).

/** How long a key holds its first answer (Stripe's window). */
export const KEY_TTL_MS = 24 * 60 * 60_000;

/**
 * A claim this old and still unanswered belongs to a request that died mid-way (its Worker was
 * stopped): no creating route takes this long. Its outcome is unknown, so it is never run again.
 */
export const ABANDONED_MS = 5 * 60_000;

/** The first answer to a key, as stored. */
export interface StoredAnswer {
  status: number;
  headers: ReplayHeaders;
  body: string;
}

export type KeyRow = typeof idempotencyKeys.$inferSelect;

export type Claim = { claimed: true } | { claimed: false; row: KeyRow };

const DIGEST_INFO = "idempotency-request/v1";

/** The keyed digest of a request's own digest (method, path and body: see middleware.ts). */
export function requestDigest(ring: KeyRing, requestHash: Uint8Array<ArrayBuffer>): Promise<string> {
  return keyedDigest(ring, DIGEST_INFO, requestHash);
}

/**
 * Whether a stored digest is of the same request: recomputed under the key it names, so a KEK
 * rotation within the day does not turn a retry into a reuse. A retired key cannot vouch for it.
 */
export async function sameRequest(
  ring: KeyRing,
  stored: string,
  requestHash: Uint8Array<ArrayBuffer>,
): Promise<boolean> {
  const keyId = stored.slice(0, stored.indexOf("."));
  if (!ring.keyIds.includes(keyId)) return false;
  return (await keyedDigest(ring, DIGEST_INFO, requestHash, keyId)) === stored;
}

const where = (environmentId: string, key: string) =>
  and(eq(idempotencyKeys.environmentId, environmentId), eq(idempotencyKeys.key, key));

/**
 * Claims the key for this request, or returns the row that holds it. A row past its day (the
 * reaper has not come by yet) counts as absent and is taken over in the same statement, so two
 * requests can never both own a key.
 */
export async function claimKey(
  db: Db,
  environmentId: string,
  key: string,
  digest: string,
  now: number,
): Promise<Claim> {
  // A row can go between the failed insert and the read (its request failed with a 5xx, or the
  // reaper); then the insert is tried again.
  for (let attempt = 0; attempt < 3; attempt++) {
    const inserted = await db
      .insert(idempotencyKeys)
      .values({ environmentId, key, requestDigest: digest, createdAt: new Date(now) })
      .onConflictDoNothing()
      .returning({ key: idempotencyKeys.key });
    if (inserted.length > 0) return { claimed: true };
    const taken = await db
      .update(idempotencyKeys)
      .set({
        requestDigest: digest,
        responseStatus: null,
        responseHeaders: null,
        responseCiphertext: null,
        createdAt: new Date(now),
        completedAt: null,
      })
      .where(and(where(environmentId, key), lt(idempotencyKeys.createdAt, new Date(now - KEY_TTL_MS))))
      .returning({ key: idempotencyKeys.key });
    if (taken.length > 0) return { claimed: true };
    const [row] = await db.select().from(idempotencyKeys).where(where(environmentId, key));
    if (row) return { claimed: false, row };
  }
  throw new Error("idempotency key neither claimed nor found");
}

// The sealed answer is bound to its environment and key: copied into another row, it does not open.
const aad = (p: Owner, key: string) => ({
  userId: p.userId,
  environmentId: p.environmentId,
  secretId: `idempotency:${key}`,
});

/** Records the claimed key's answer (only an unanswered claim: never overwrites one). */
export async function recordAnswer(
  db: Db,
  ring: KeyRing,
  p: Owner,
  key: string,
  answer: StoredAnswer,
): Promise<void> {
  await db
    .update(idempotencyKeys)
    .set({
      responseStatus: answer.status,
      responseHeaders: answer.headers,
      responseCiphertext: await encryptSecret(ring, aad(p, key), answer.body),
      completedAt: new Date(),
    })
    .where(and(where(p.environmentId, key), isNull(idempotencyKeys.responseStatus)));
}

/** The stored answer of a finished row (null while its request runs). */
export async function storedAnswer(ring: KeyRing, p: Owner, row: KeyRow): Promise<StoredAnswer | null> {
  if (row.responseStatus === null || row.responseCiphertext === null) return null;
  return {
    status: row.responseStatus,
    headers: row.responseHeaders ?? {},
    body: await decryptSecret(ring, aad(p, row.key), row.responseCiphertext),
  };
}

/** Gives an unanswered claim up, so that a retry runs again (after a 5xx or a 429). */
export async function releaseKey(db: Db, environmentId: string, key: string): Promise<void> {
  await db
    .delete(idempotencyKeys)
    .where(and(where(environmentId, key), isNull(idempotencyKeys.responseStatus)));
}

/** The reaper's part: keys past their day. Returns how many went. */
export async function purgeExpiredKeys(db: Db, now: number): Promise<number> {
  const gone = await db
    .delete(idempotencyKeys)
    .where(lt(idempotencyKeys.createdAt, new Date(now - KEY_TTL_MS)))
    .returning({ key: idempotencyKeys.key });
  return gone.length;
}
