import { and, eq, isNull } from "drizzle-orm";
import { createMiddleware } from "hono/factory";
import type { AppEnv, Principal } from "../context";
import { hashApiKey, looksLikeApiKey, timingSafeEqualHex } from "../crypto/api-keys";
import { apiKeys } from "../db/schema";
import type { Db } from "../db/types";
import { ApiError } from "../errors";

/** The principal a (not revoked) API key speaks for, or null. Used by the API and the login page. */
export async function principalForKey(db: Db, key: string): Promise<Principal | null> {
  if (!looksLikeApiKey(key)) return null;
  const hash = await hashApiKey(key);
  const [row] = await db
    .select({
      id: apiKeys.id,
      hash: apiKeys.hash,
      userId: apiKeys.userId,
      environmentId: apiKeys.environmentId,
    })
    .from(apiKeys)
    .where(and(eq(apiKeys.hash, hash), isNull(apiKeys.revokedAt)));
  // The lookup is by hash; compare again in constant time so no timing depends on the key.
  if (!row || !timingSafeEqualHex(row.hash, hash)) return null;
  return { userId: row.userId, environmentId: row.environmentId, keyId: row.id };
}

/** `Authorization: Bearer <key>` → the principal the key speaks for, or 401. */
export const requireApiKey = createMiddleware<AppEnv>(async (c, next) => {
  const header = c.req.header("authorization") ?? "";
  const match = /^Bearer ([^\s]+)$/.exec(header);
  const key = match?.[1];
  if (!key || !looksLikeApiKey(key)) {
    throw new ApiError("unauthorized", "Send an API key as `Authorization: Bearer <key>`.");
  }
  const principal = await principalForKey(c.var.db, key);
  if (!principal) throw new ApiError("unauthorized", "The API key is not valid (unknown or revoked).");
  c.set("principal", principal);
  await next();
});
