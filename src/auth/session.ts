import type { ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";
import { and, eq, gt, isNull } from "drizzle-orm";
import type { Principal } from "../context";
import { hashApiKey, randomId, timingSafeEqualHex } from "../crypto/api-keys";
import { apiKeys, environments, sessions, users } from "../db/schema";
import type { Db } from "../db/types";
import { keyIsLive, touchKey } from "./middleware";

// Browser sessions for the pages. Logging in with an API key opens one; the cookie carries a
// random token (only its SHA-256 is stored), the session speaks for that key and ends with it
// (logout, its own expiry, or the key's revocation or expiry: checked on every page, K3). Forms carry a CSRF token derived from the session
// token, so nothing more is stored and a form from another site cannot post (SameSite=Strict is
// the first line; the token the second).

export const SESSION_COOKIE = "bw_session";
export const SESSION_TTL_MS = 12 * 60 * 60_000;

export interface Session {
  principal: Principal;
  /** The key's scope: a read key's session may only look (src/pages/routes.tsx). */
  scope: ApiKeyScope;
  /** Who is signed in, as every page's header shows it: a page never leaves that in doubt (K1). */
  account: { email: string; environment: string };
  /** The value forms must send back as `_csrf`. */
  csrf: string;
}

/** Opens a session for the key's principal; returns the cookie's token (shown to the browser only). */
export async function openSession(db: Db, principal: Principal, now = Date.now()): Promise<string> {
  const token = randomToken();
  await db.insert(sessions).values({
    id: randomId("ses_"),
    tokenHash: await hashApiKey(token),
    apiKeyId: principal.keyId,
    expiresAt: new Date(now + SESSION_TTL_MS),
  });
  return token;
}

/** The live session a cookie token names, or null (unknown, ended, expired, key revoked). */
export async function readSession(db: Db, token: string, now = Date.now()): Promise<Session | null> {
  if (!/^[A-Za-z0-9_-]{43}$/.test(token)) return null;
  const hash = await hashApiKey(token);
  const [row] = await db
    .select({
      hash: sessions.tokenHash,
      keyId: apiKeys.id,
      scope: apiKeys.scope,
      lastUsedAt: apiKeys.lastUsedAt,
      userId: apiKeys.userId,
      environmentId: apiKeys.environmentId,
      email: users.email,
      environment: environments.name,
    })
    .from(sessions)
    .innerJoin(apiKeys, eq(apiKeys.id, sessions.apiKeyId))
    .innerJoin(users, eq(users.id, apiKeys.userId))
    .innerJoin(environments, eq(environments.id, apiKeys.environmentId))
    .where(
      and(
        eq(sessions.tokenHash, hash),
        isNull(sessions.endedAt),
        gt(sessions.expiresAt, new Date(now)),
        keyIsLive(new Date(now)),
      ),
    );
  if (!row || !timingSafeEqualHex(row.hash, hash)) return null;
  // A page seen is a use of the key the session speaks for.
  await touchKey(db, row.keyId, row.lastUsedAt, new Date(now));
  return {
    principal: { userId: row.userId, environmentId: row.environmentId, keyId: row.keyId },
    scope: row.scope,
    account: { email: row.email, environment: row.environment },
    csrf: await csrfFor(token),
  };
}

export async function endSession(db: Db, token: string): Promise<void> {
  await db
    .update(sessions)
    .set({ endedAt: new Date() })
    .where(eq(sessions.tokenHash, await hashApiKey(token)));
}

/** The form token of a session: SHA-256 of a fixed label and the session token, hex. */
export async function csrfFor(token: string): Promise<string> {
  return hashApiKey(`csrf:${token}`);
}

export function csrfMatches(session: Session, sent: unknown): boolean {
  return typeof sent === "string" && timingSafeEqualHex(session.csrf, sent);
}

function randomToken(): string {
  const bytes = crypto.getRandomValues(new Uint8Array(32));
  return btoa(String.fromCharCode(...bytes))
    .replaceAll("+", "-")
    .replaceAll("/", "_")
    .replace(/=+$/, "");
}
