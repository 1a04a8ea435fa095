import { isTerminal } from "@benchwright/shared/contract/run-states";
import { and, eq, isNull, sql } from "drizzle-orm";
import { encodeBase64Url, hashApiKey, randomId, timingSafeEqualHex } from "../crypto/api-keys";
import { computeCapabilities, runs } from "../db/schema";
import type { Db } from "../db/types";
import type { RunOwner } from "../runs/proxy-credentials";

// The compute-control capability: what a run's work (or Harbor orchestrator) sandbox holds
// instead of a backend credential. It lets the holder ask the broker, through /v1/compute, for
// sandbox lifecycle of its own run only. Each is one random token (`bwc_`, stored as SHA-256),
// valid for CAPABILITY_TTL_MS and renewable while the run lives (the renewal revokes the old
// one, atomically: one successor at most), revoked one by one or all at once when the run ends. Task sandboxes are never given one.

export const CAPABILITY_TTL_MS = 15 * 60_000;
const TOKEN_PATTERN = /^bwc_[A-Za-z0-9_-]{43}$/;

export interface Capability {
  id: string;
  run: RunOwner;
  holderSandboxId: string;
  expiresAt: Date;
}

/** A fresh capability for the holder sandbox; the token's plaintext exists only in the answer. */
export async function issueCapability(
  db: Db,
  runId: string,
  holderSandboxId: string,
  now = new Date(),
): Promise<{ id: string; token: string; expiresAt: Date }> {
  const { token, hash } = await newToken();
  const id = randomId("cap_");
  const expiresAt = new Date(now.getTime() + CAPABILITY_TTL_MS);
  await db.insert(computeCapabilities).values({ id, runId, holderSandboxId, tokenHash: hash, expiresAt });
  return { id, token, expiresAt };
}

async function newToken(): Promise<{ token: string; hash: string }> {
  const token = `bwc_${encodeBase64Url(crypto.getRandomValues(new Uint8Array(32)))}`;
  return { token, hash: await hashApiKey(token) };
}

/**
 * The capability a token stands for, or null: unknown, malformed, expired, revoked, or its run
 * has ended. One answer for all of them (the caller learns nothing about which).
 */
export async function findCapability(db: Db, token: string, now = new Date()): Promise<Capability | null> {
  if (!TOKEN_PATTERN.test(token)) return null;
  const hash = await hashApiKey(token);
  const [row] = await db
    .select({
      id: computeCapabilities.id,
      hash: computeCapabilities.tokenHash,
      holderSandboxId: computeCapabilities.holderSandboxId,
      expiresAt: computeCapabilities.expiresAt,
      revokedAt: computeCapabilities.revokedAt,
      runId: runs.id,
      userId: runs.userId,
      environmentId: runs.environmentId,
      status: runs.status,
    })
    .from(computeCapabilities)
    .innerJoin(runs, eq(runs.id, computeCapabilities.runId))
    .where(eq(computeCapabilities.tokenHash, hash));
  if (!row || !timingSafeEqualHex(row.hash, hash)) return null;
  if (row.revokedAt !== null || row.expiresAt.getTime() <= now.getTime()) return null;
  if (isTerminal(row.status)) return null;
  return {
    id: row.id,
    run: { id: row.runId, userId: row.userId, environmentId: row.environmentId },
    holderSandboxId: row.holderSandboxId,
    expiresAt: row.expiresAt,
  };
}

/**
 * Exchanges a live capability for a new one (same run and holder), or null if it is no longer
 * live. One statement: the old row is revoked only if it still is unrevoked and unexpired, and
 * the new row is made only from the row that update returned. Postgres locks the old row for the
 * update, so of any number of renewals at once (from any isolates: the lock is in the database
 * they share) one revokes it and mints; the others wait for it, find it revoked, and mint
 * nothing (case L6). `renewed_from` is unique as well: a capability has one successor at most.
 */
export async function renewCapability(db: Db, cap: Capability, now = new Date()) {
  const { token, hash } = await newToken();
  const id = randomId("cap_");
  const expiresAt = new Date(now.getTime() + CAPABILITY_TTL_MS);
  // Raw SQL: drizzle's insert-from-select wants every column in table order, which hides the point.
  const made = await db.execute(sql`
    with old as (
      update compute_capabilities set revoked_at = ${now.toISOString()}::timestamptz
      where id = ${cap.id} and revoked_at is null and expires_at > ${now.toISOString()}::timestamptz
      returning run_id, holder_sandbox_id
    )
    insert into compute_capabilities (id, run_id, holder_sandbox_id, token_hash, expires_at, renewed_from)
    select ${id}, run_id, holder_sandbox_id, ${hash}, ${expiresAt.toISOString()}::timestamptz, ${cap.id}
    from old
    returning id`);
  return made.rows.length === 1 ? { id, token, expiresAt } : null;
}

export async function revokeCapability(db: Db, id: string, now = new Date()): Promise<void> {
  await db
    .update(computeCapabilities)
    .set({ revokedAt: now })
    .where(and(eq(computeCapabilities.id, id), isNull(computeCapabilities.revokedAt)));
}

/** Every capability of the run (its end, or a cancel). Idempotent. */
export async function revokeRunCapabilities(db: Db, runId: string, now = new Date()): Promise<void> {
  await db
    .update(computeCapabilities)
    .set({ revokedAt: now })
    .where(and(eq(computeCapabilities.runId, runId), isNull(computeCapabilities.revokedAt)));
}
