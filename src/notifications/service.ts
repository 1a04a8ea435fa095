import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import { and, asc, desc, eq, inArray, isNull, lt, lte, min, sql } from "drizzle-orm";
import { z } from "zod";
import type { Owner } from "../auth/owner";
import { derivedId, randomId } from "../crypto/api-keys";
import { decryptSecret, encryptSecret, type SecretAad } from "../crypto/vault-crypto";
import {
  type NOTIFICATION_EVENTS,
  notificationAttempts,
  notificationDeliveries,
  notifications,
  runs,
} from "../db/schema";
import type { Db, Q } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { openCursor, type Page, type PageRequest, pageOf } from "../lists/cursor";
import { CreatedKey, createdMicros, EpochMicros, olderThan, RowId } from "../lists/newest-first";
import { newWebhookSecret } from "../webhooks/signature";

// Run-end notifications over Postgres. Management calls are scoped by the caller's environment
// (another tenant's notification is a 404). The signing secret is in clear only in the response
// that shows it and, briefly, in the alarm that signs an attempt; the table keeps a ciphertext.

export type NotificationRow = typeof notifications.$inferSelect;
export type DeliveryRow = typeof notificationDeliveries.$inferSelect;
export type AttemptRow = typeof notificationAttempts.$inferSelect;
export type NotificationEvent = (typeof NOTIFICATION_EVENTS)[number];
/** What a run.ended body tells of the run: these columns of its row. */
export type EndedRun = Pick<
  typeof runs.$inferSelect,
  "id" | "status" | "reason" | "reasonDetail" | "endedAt" | "updatedAt"
>;

/** Live notification URLs per environment, at most: each run's end fans out to all of them. */
export const MAX_NOTIFICATIONS_PER_ENVIRONMENT = 10;

const secretAad = (n: Pick<NotificationRow, "id" | "userId" | "environmentId">): SecretAad => ({
  userId: n.userId,
  environmentId: n.environmentId,
  secretId: `notification:${n.id}`,
});

const scoped = (p: Owner, id: string) =>
  and(
    eq(notifications.id, id),
    eq(notifications.environmentId, p.environmentId),
    isNull(notifications.revokedAt),
  );

export async function createNotification(
  db: Db,
  ring: KeyRing,
  p: Owner,
  input: { url: string; events: NotificationEvent[]; origin: string },
): Promise<Result<{ notification: NotificationRow; secret: string }>> {
  return db.transaction(async (tx) => {
    // Counted under a lock on the environment's rows, so two concurrent creates cannot both
    // take the last place.
    const live = await tx
      .select({ id: notifications.id })
      .from(notifications)
      .where(and(eq(notifications.environmentId, p.environmentId), isNull(notifications.revokedAt)))
      .for("update");
    if (live.length >= MAX_NOTIFICATIONS_PER_ENVIRONMENT) {
      return fail(
        "too_many_notifications",
        `An environment may have ${MAX_NOTIFICATIONS_PER_ENVIRONMENT} notification URLs; revoke one first.`,
      );
    }
    const id = randomId("ntf_");
    const secret = newWebhookSecret();
    const owner = { id, userId: p.userId, environmentId: p.environmentId };
    const [row] = await tx
      .insert(notifications)
      .values({
        ...owner,
        url: input.url,
        events: input.events,
        origin: input.origin,
        secretCiphertext: await encryptSecret(ring, secretAad(owner), secret),
      })
      .returning();
    if (!row) throw new Error("insert returned no notification");
    return ok({ notification: row, secret });
  });
}

/** A page of the environment's live notification URLs, newest first. */
export async function listNotifications(
  db: Db,
  p: Owner,
  page: PageRequest,
): Promise<Result<Page<NotificationRow>>> {
  const after = await openCursor(page, "notifications", p.environmentId, CreatedKey);
  if (!after.ok) return after;
  const rows = await db
    .select({ row: notifications, micros: createdMicros(notifications.createdAt) })
    .from(notifications)
    .where(
      and(
        eq(notifications.environmentId, p.environmentId),
        isNull(notifications.revokedAt),
        olderThan(notifications.createdAt, notifications.id, after.value),
      ),
    )
    .orderBy(desc(notifications.createdAt), desc(notifications.id))
    .limit(page.limit + 1);
  const found = await pageOf(page, "notifications", p.environmentId, rows, (r) => [r.micros, r.row.id]);
  return ok({ items: found.items.map((r) => r.row), nextCursor: found.nextCursor });
}

export async function getNotification(db: Db, p: Owner, id: string): Promise<Result<NotificationRow>> {
  const [row] = await db.select().from(notifications).where(scoped(p, id));
  return row ? ok(row) : fail("not_found", `No notification ${id}.`);
}

/** Revokes: nothing more is sent to it, pending deliveries are cancelled, the secret is dropped. */
export async function revokeNotification(db: Db, p: Owner, id: string): Promise<Result<void>> {
  return db.transaction(async (tx) => {
    const [row] = await tx
      .update(notifications)
      .set({ revokedAt: new Date(), secretCiphertext: null })
      .where(scoped(p, id))
      .returning({ id: notifications.id });
    if (!row) return fail("not_found", `No notification ${id}.`);
    await tx
      .update(notificationDeliveries)
      .set({ status: "cancelled", nextAttemptAt: null })
      .where(
        and(eq(notificationDeliveries.notificationId, id), eq(notificationDeliveries.status, "pending")),
      );
    return ok(undefined);
  });
}

export type DeliveryWithAttempts = DeliveryRow & { attemptLog: AttemptRow[] };

// A deliveries cursor also names its notification: it is a position in that one's list only.
const DeliveryKey = z.tuple([EpochMicros, RowId, RowId]);

/** A page of a notification's deliveries, newest first, each with its attempts in order. */
export async function listDeliveries(
  db: Db,
  p: Owner,
  id: string,
  page: PageRequest,
): Promise<Result<Page<DeliveryWithAttempts>>> {
  const found = await getNotification(db, p, id);
  if (!found.ok) return found;
  const after = await openCursor(page, "notification-deliveries", p.environmentId, DeliveryKey);
  if (!after.ok) return after;
  if (after.value && after.value[2] !== id)
    return fail("invalid_cursor", "cursor: another notification's deliveries, not this one's");
  const key: CreatedKey | null = after.value && [after.value[0], after.value[1]];
  const fetched = await db
    .select({ row: notificationDeliveries, micros: createdMicros(notificationDeliveries.createdAt) })
    .from(notificationDeliveries)
    .where(
      and(
        eq(notificationDeliveries.notificationId, id),
        olderThan(notificationDeliveries.createdAt, notificationDeliveries.id, key),
      ),
    )
    .orderBy(desc(notificationDeliveries.createdAt), desc(notificationDeliveries.id))
    .limit(page.limit + 1);
  const sealed = await pageOf(page, "notification-deliveries", p.environmentId, fetched, (r) => [
    r.micros,
    r.row.id,
    id,
  ]);
  const rows = sealed.items.map((r) => r.row);
  if (rows.length === 0) return ok({ items: [], nextCursor: sealed.nextCursor });
  const attempts = await db
    .select()
    .from(notificationAttempts)
    .where(
      inArray(
        notificationAttempts.deliveryId,
        rows.map((r) => r.id),
      ),
    )
    .orderBy(asc(notificationAttempts.attempt));
  return ok({
    items: rows.map((r) => ({ ...r, attemptLog: attempts.filter((a) => a.deliveryId === r.id) })),
    nextCursor: sealed.nextCursor,
  });
}

// ---- the outbox: written when a run ends, read and updated by its RunNotifier ----

/** The run whose end the deliveries describe; null when it is gone. */
export async function endedRun(db: Q, runId: string): Promise<EndedRun | null> {
  const [row] = await db
    .select({
      id: runs.id,
      status: runs.status,
      reason: runs.reason,
      reasonDetail: runs.reasonDetail,
      endedAt: runs.endedAt,
      updatedAt: runs.updatedAt,
    })
    .from(runs)
    .where(eq(runs.id, runId));
  return row ?? null;
}

/**
 * Owes a `run.ended` delivery to each live notification of the run's environment that asked for
 * it. Called inside the transaction that moves the run to its terminal state, so the debt
 * commits with the end itself; the unique key makes a replay add nothing.
 */
export async function enqueueRunEnded(tx: Q, runId: string, now = new Date()): Promise<void> {
  const owed = await tx
    .select({ id: notifications.id })
    .from(notifications)
    .innerJoin(runs, eq(runs.environmentId, notifications.environmentId))
    .where(
      and(
        eq(runs.id, runId),
        isNull(notifications.revokedAt),
        sql`${notifications.events} @> '["run.ended"]'::jsonb`,
      ),
    );
  if (owed.length === 0) return;
  const values = await Promise.all(
    owed.map(async (n) => ({
      // Derived, so the same debt always has the same `webhook-id`.
      id: await derivedId("msg_", n.id, runId, "run.ended"),
      notificationId: n.id,
      runId,
      event: "run.ended" as const,
      nextAttemptAt: now,
    })),
  );
  await tx.insert(notificationDeliveries).values(values).onConflictDoNothing();
}

export interface DueDelivery {
  delivery: DeliveryRow;
  notification: NotificationRow;
}

/** The run's pending deliveries whose next attempt is due, with their (live) notifications. */
export async function dueDeliveries(db: Db, runId: string, now = new Date()): Promise<DueDelivery[]> {
  const rows = await db
    .select({ delivery: notificationDeliveries, notification: notifications })
    .from(notificationDeliveries)
    .innerJoin(notifications, eq(notifications.id, notificationDeliveries.notificationId))
    .where(
      and(
        eq(notificationDeliveries.runId, runId),
        eq(notificationDeliveries.status, "pending"),
        lte(notificationDeliveries.nextAttemptAt, now),
      ),
    )
    .orderBy(asc(notificationDeliveries.createdAt));
  return rows;
}

/** When the run's next pending attempt is due, or null when nothing is pending. */
export async function nextAttemptAt(db: Db, runId: string): Promise<Date | null> {
  const [row] = await db
    .select({ at: min(notificationDeliveries.nextAttemptAt) })
    .from(notificationDeliveries)
    .where(and(eq(notificationDeliveries.runId, runId), eq(notificationDeliveries.status, "pending")));
  return row?.at ?? null;
}

export interface AttemptOutcome {
  startedAt: Date;
  durationMs: number;
  statusCode: number | null;
  error: string | null;
  /** delivered; pending again at `retryAt`; or failed for good. */
  next: { status: "delivered" } | { status: "pending"; retryAt: Date } | { status: "failed" };
}

/**
 * Records one attempt and moves the delivery on, in one transaction. Guarded by the attempt
 * number, so an alarm retried after a crash cannot record the same attempt twice.
 */
export async function recordAttempt(db: Db, d: DeliveryRow, outcome: AttemptOutcome): Promise<void> {
  const attempt = d.attempts + 1;
  await db.transaction(async (tx) => {
    const moved = await tx
      .update(notificationDeliveries)
      .set({
        attempts: attempt,
        status: outcome.next.status,
        nextAttemptAt: outcome.next.status === "pending" ? outcome.next.retryAt : null,
        ...(outcome.next.status === "delivered" ? { deliveredAt: new Date() } : {}),
      })
      .where(
        and(
          eq(notificationDeliveries.id, d.id),
          eq(notificationDeliveries.attempts, d.attempts),
          eq(notificationDeliveries.status, "pending"),
        ),
      )
      .returning({ id: notificationDeliveries.id });
    if (moved.length === 0) return;
    await tx.insert(notificationAttempts).values({
      deliveryId: d.id,
      attempt,
      startedAt: outcome.startedAt,
      durationMs: outcome.durationMs,
      statusCode: outcome.statusCode,
      error: outcome.error,
    });
  });
}

/** The secret to sign with now; throws VaultDecryptError when it does not decrypt. */
export async function signingSecret(ring: KeyRing, n: NotificationRow): Promise<string | null> {
  return n.secretCiphertext ? decryptSecret(ring, secretAad(n), n.secretCiphertext) : null;
}

/**
 * Runs with a pending delivery overdue by `graceMs`: their notifier lost its wake-up (it is woken
 * after the commit that owes the delivery, and that call can fail), so the reaper wakes them.
 */
export async function overdueRuns(db: Db, now: number, graceMs: number, limit: number): Promise<string[]> {
  const rows = await db
    .selectDistinct({ runId: notificationDeliveries.runId })
    .from(notificationDeliveries)
    .where(
      and(
        eq(notificationDeliveries.status, "pending"),
        lt(notificationDeliveries.nextAttemptAt, new Date(now - graceMs)),
      ),
    )
    .limit(limit);
  return rows.map((r) => r.runId);
}
