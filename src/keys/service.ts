import type { ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";
import { and, desc, eq, isNull } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { issueKey } from "../auth/provision";
import { scopeCovers } from "../auth/scope";
import type { Principal } from "../context";
import { apiKeys, sessions } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";
import { CreatedKey, createdMicros, olderThan } from "../lists/newest-first";
import { resolveExpiry } from "./expiry";

// Self-served API keys (case K3): make, list, revoke, within the caller's environment. The key
// exists in clear only in createKey's answer; what is kept is its hash and display prefix.
//
// Decisions:
//   - A key never makes a key wider than its own (scopeCovers). Today a read key cannot POST at
//     all (src/auth/middleware.ts), so this is the second line, kept for any scope added later.
//   - A key may revoke itself: whoever holds a leaked key should be able to kill it with that
//     key alone. The answer is still 204; the key's next request is 401.
//   - Revoking an already revoked key is 204 again (DELETE is idempotent); another
//     environment's key, or an unknown id, is 404.

export type KeyState = "active" | "expired" | "revoked";

export interface KeyInfo {
  id: string;
  name: string;
  prefix: string;
  scope: ApiKeyScope;
  createdAt: Date;
  lastUsedAt: Date | null;
  expiresAt: Date | null;
  revokedAt: Date | null;
  state: KeyState;
  /** Whether this is the key the request came with. */
  current: boolean;
}

export interface CreateKeyInput {
  name: string;
  scope?: ApiKeyScope | undefined;
  expiresAt?: string | undefined;
  expiresIn?: string | undefined;
}

const columns = {
  id: apiKeys.id,
  name: apiKeys.name,
  prefix: apiKeys.prefix,
  scope: apiKeys.scope,
  createdAt: apiKeys.createdAt,
  lastUsedAt: apiKeys.lastUsedAt,
  expiresAt: apiKeys.expiresAt,
  revokedAt: apiKeys.revokedAt,
};
type Row = Omit<KeyInfo, "state" | "current">;

function info(p: Principal, row: Row, now: Date): KeyInfo {
  const state: KeyState = row.revokedAt
    ? "revoked"
    : row.expiresAt && row.expiresAt <= now
      ? "expired"
      : "active";
  return { ...row, state, current: row.id === p.keyId };
}

export async function createKey(
  db: Db,
  p: Principal,
  callerScope: ApiKeyScope,
  input: CreateKeyInput,
  now = new Date(),
): Promise<Result<{ info: KeyInfo; key: string }>> {
  const scope = input.scope ?? "full";
  if (!scopeCovers(callerScope, scope)) {
    return fail("scope_too_wide", `A ${callerScope} key cannot make a ${scope} key.`);
  }
  const expiry = resolveExpiry(input, now);
  if (!expiry.ok) return expiry;
  const issued = await issueKey(db, p, { name: input.name, scope, expiresAt: expiry.value });
  const [row] = await db.select(columns).from(apiKeys).where(eq(apiKeys.id, issued.keyId));
  if (!row) throw new Error("api key row vanished");
  return ok({ info: info(p, row, now), key: issued.key });
}

/** A page of the environment's keys, newest first, revoked and expired ones included (marked). */
export async function listKeys(
  db: Db,
  p: Principal,
  page: PageRequest,
  now = new Date(),
): Promise<Result<Page<KeyInfo>>> {
  const after = await openCursor(page, "api-keys", p.environmentId, CreatedKey);
  if (!after.ok) return after;
  const rows = await db
    .select({ row: columns, micros: createdMicros(apiKeys.createdAt) })
    .from(apiKeys)
    .where(
      and(eq(apiKeys.environmentId, p.environmentId), olderThan(apiKeys.createdAt, apiKeys.id, after.value)),
    )
    .orderBy(desc(apiKeys.createdAt), desc(apiKeys.id))
    .limit(page.limit + 1);
  const found = await pageOf(page, "api-keys", p.environmentId, rows, (r) => [r.micros, r.row.id]);
  return ok({ items: found.items.map((r) => info(p, r.row, now)), nextCursor: found.nextCursor });
}

/** Revokes a key of the environment, and ends the sessions opened with it. */
export async function revokeKey(db: Db, p: Owner, id: string, now = new Date()): Promise<Result<null>> {
  return db.transaction(async (tx) => {
    const mine = and(eq(apiKeys.id, id), eq(apiKeys.environmentId, p.environmentId));
    const [row] = await tx.select({ revokedAt: apiKeys.revokedAt }).from(apiKeys).where(mine);
    if (!row) return fail("not_found", `No API key ${id}.`);
    if (row.revokedAt) return ok(null);
    await tx.update(apiKeys).set({ revokedAt: now }).where(mine);
    // readSession already refuses a revoked key's sessions; ending them says so in the table.
    await tx
      .update(sessions)
      .set({ endedAt: now })
      .where(and(eq(sessions.apiKeyId, id), isNull(sessions.endedAt)));
    return ok(null);
  });
}
