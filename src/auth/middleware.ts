import type { ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";
import { and, eq, gt, isNull, lt, or } from "drizzle-orm";
import { createMiddleware } from "hono/factory";
import type { AppEnv, Principal } from "../context";
import { hashApiKey, looksLikeApiKey, timingSafeEqualHex } from "../crypto/api-keys";
import { apiKeys } from "../db/schema";
import type { Db } from "../db/types";
import { ApiError } from "../errors";
import { scopeAllows } from "./scope";

/** How stale `last_used_at` may get: one write a minute per key at most, not one per request. */
export const LAST_USED_GRANULARITY_MS = 60_000;

export interface KeyGrant {
  principal: Principal;
  scope: ApiKeyScope;
}

/**
 * A key still usable at `now`: not revoked and not expired. The one condition every reader of a
 * key (the API, the login form, a session made from it) applies, so they cannot disagree (K3).
 */
export const keyIsLive = (now: Date) =>
  and(isNull(apiKeys.revokedAt), or(isNull(apiKeys.expiresAt), gt(apiKeys.expiresAt, now)));

/** The principal and scope a live API key speaks for, or null. Used by the API and the login page. */
export async function grantForKey(db: Db, key: string, now = new Date()): Promise<KeyGrant | null> {
  if (!looksLikeApiKey(key)) return null;
  const hash = await hashApiKey(key);
  const [row] = await db
    .select({
      id: apiKeys.id,
      hash: apiKeys.hash,
      userId: apiKeys.userId,
      environmentId: apiKeys.environmentId,
      scope: apiKeys.scope,
      lastUsedAt: apiKeys.lastUsedAt,
    })
    .from(apiKeys)
    .where(and(eq(apiKeys.hash, hash), keyIsLive(now)));
  // The lookup is by hash; compare again in constant time so no timing depends on the key.
  if (!row || !timingSafeEqualHex(row.hash, hash)) return null;
  await touchKey(db, row.id, row.lastUsedAt, now);
  return {
    principal: { userId: row.userId, environmentId: row.environmentId, keyId: row.id },
    scope: row.scope,
  };
}

/**
 * Records that a key was used, unless that was recorded in the last minute. The condition is
 * repeated in the UPDATE so concurrent requests of one key write once between them; the read
 * above already skips the write for nearly every request.
 */
export async function touchKey(db: Db, keyId: string, lastUsedAt: Date | null, now: Date): Promise<void> {
  const since = new Date(now.getTime() - LAST_USED_GRANULARITY_MS);
  if (lastUsedAt && lastUsedAt > since) return;
  await db
    .update(apiKeys)
    .set({ lastUsedAt: now })
    .where(and(eq(apiKeys.id, keyId), or(isNull(apiKeys.lastUsedAt), lt(apiKeys.lastUsedAt, since))));
}

/**
 * `Authorization: Bearer <key>` → the principal the key speaks for, or 401; a read key's
 * request with another method than GET or HEAD → 403 read_only_key. Both before the rate limit
 * and the idempotency store, so a refused request is neither counted nor claimed.
 */
export const requireApiKey = createMiddleware<AppEnv>(async (c, next) => {
  const header = c.req.header("authorization") ?? "";
  const match = /^Bearer ([^\s]+)$/.exec(header);
  const key = match?.[1];
  if (!key || !looksLikeApiKey(key)) {
    throw new ApiError("unauthorized", "Send an API key as `Authorization: Bearer <key>`.");
  }
  const grant = await grantForKey(c.var.db, key);
  if (!grant) throw new ApiError("unauthorized", "The API key is not valid (unknown, revoked or expired).");
  if (!scopeAllows(grant.scope, c.req.method)) {
    throw new ApiError("read_only_key", `This API key is read-only: it may not ${c.req.method}.`);
  }
  c.set("principal", grant.principal);
  c.set("keyScope", grant.scope);
  await next();
});
