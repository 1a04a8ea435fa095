import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { and, desc, eq, isNull } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { randomId } from "../crypto/api-keys";
import { decryptSecret, encryptSecret, type SecretAad } from "../crypto/vault-crypto";
import { webhookDeliveries, webhooks } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { createRun } from "../runs/service";
import { newWebhookSecret } from "./signature";

// Webhooks over Postgres. Management calls are scoped by the caller's environment (another
// tenant's webhook is a 404). The signing secret exists in clear only in the response that shows
// it (create, rotate) and, briefly, while a delivery is verified; the table keeps ciphertexts.

/** How long the previous secret keeps verifying after a rotation, so senders can roll over. */
export const ROTATION_WINDOW_MS = 24 * 60 * 60 * 1000;

export type WebhookRow = typeof webhooks.$inferSelect;

const secretAad = (w: Pick<WebhookRow, "id" | "userId" | "environmentId">): SecretAad => ({
  userId: w.userId,
  environmentId: w.environmentId,
  secretId: `webhook:${w.id}`,
});

const scoped = (p: Owner, id: string) =>
  and(eq(webhooks.id, id), eq(webhooks.environmentId, p.environmentId), isNull(webhooks.revokedAt));

export async function createWebhook(
  db: Db,
  ring: KeyRing,
  p: Owner,
  input: { name: string; run: RunSpec },
): Promise<{ webhook: WebhookRow; secret: string }> {
  const id = randomId("whk_");
  const secret = newWebhookSecret();
  const owner = { id, userId: p.userId, environmentId: p.environmentId };
  const [row] = await db
    .insert(webhooks)
    .values({
      ...owner,
      name: input.name,
      runTemplate: input.run,
      secretCiphertext: await encryptSecret(ring, secretAad(owner), secret),
    })
    .returning();
  if (!row) throw new Error("insert returned no webhook");
  return { webhook: row, secret };
}

export async function listWebhooks(db: Db, p: Owner): Promise<WebhookRow[]> {
  return db
    .select()
    .from(webhooks)
    .where(and(eq(webhooks.environmentId, p.environmentId), isNull(webhooks.revokedAt)))
    .orderBy(desc(webhooks.createdAt), desc(webhooks.id));
}

export async function getWebhook(db: Db, p: Owner, id: string): Promise<Result<WebhookRow>> {
  const [row] = await db.select().from(webhooks).where(scoped(p, id));
  return row ? ok(row) : fail("not_found", `No webhook ${id}.`);
}

/** Revokes: later deliveries are 404, and both secrets' ciphertexts are dropped. */
export async function revokeWebhook(db: Db, p: Owner, id: string): Promise<Result<void>> {
  const [row] = await db
    .update(webhooks)
    .set({
      revokedAt: new Date(),
      secretCiphertext: null,
      previousSecretCiphertext: null,
      previousSecretExpiresAt: null,
    })
    .where(scoped(p, id))
    .returning({ id: webhooks.id });
  return row ? ok(undefined) : fail("not_found", `No webhook ${id}.`);
}

/**
 * A new secret; the current one becomes the previous one and keeps verifying for
 * ROTATION_WINDOW_MS. A second rotation inside the window drops the oldest secret at once.
 */
export async function rotateSecret(
  db: Db,
  ring: KeyRing,
  p: Owner,
  id: string,
  now = new Date(),
): Promise<Result<{ webhook: WebhookRow; secret: string }>> {
  return db.transaction(async (tx) => {
    const [current] = await tx.select().from(webhooks).where(scoped(p, id)).for("update");
    if (!current) return fail("not_found", `No webhook ${id}.`);
    const secret = newWebhookSecret();
    const [row] = await tx
      .update(webhooks)
      .set({
        secretCiphertext: await encryptSecret(ring, secretAad(current), secret),
        previousSecretCiphertext: current.secretCiphertext,
        previousSecretExpiresAt: current.secretCiphertext
          ? new Date(now.getTime() + ROTATION_WINDOW_MS)
          : null,
        rotatedAt: now,
      })
      .where(eq(webhooks.id, id))
      .returning();
    if (!row) throw new Error("update returned no webhook");
    return ok({ webhook: row, secret });
  });
}

// ---- deliveries (no caller principal: the webhook's own owner acts) ----

/** A live (not revoked) webhook by id alone, for the public delivery endpoint. */
export async function findLiveWebhook(db: Db, id: string): Promise<WebhookRow | null> {
  const [row] = await db
    .select()
    .from(webhooks)
    .where(and(eq(webhooks.id, id), isNull(webhooks.revokedAt)));
  return row ?? null;
}

/**
 * The secrets a delivery may be signed with now: the current one, and the previous one while its
 * window lasts. Throws VaultDecryptError when a ciphertext does not decrypt.
 */
export async function verificationSecrets(ring: KeyRing, w: WebhookRow, now = new Date()): Promise<string[]> {
  const out: string[] = [];
  if (w.secretCiphertext) out.push(await decryptSecret(ring, secretAad(w), w.secretCiphertext));
  if (w.previousSecretCiphertext && w.previousSecretExpiresAt && w.previousSecretExpiresAt > now) {
    out.push(await decryptSecret(ring, secretAad(w), w.previousSecretCiphertext));
  }
  return out;
}

export type Delivery = { fresh: true; runId: string } | { fresh: false; runId: string };

/**
 * Records a verified delivery and creates its run, in one transaction. The (webhook, delivery id)
 * key makes a replay or a retry find the first delivery's row: it gets that run, and no new one
 * (case D3). A concurrent duplicate waits on the key until the first commits, then finds it.
 */
export async function recordDelivery(
  db: Db,
  w: WebhookRow,
  delivery: { deliveryId: string; bodyBytes: number },
  spec: RunSpec,
  backend: string,
  maxActiveRuns: number,
): Promise<Result<Delivery>> {
  return db.transaction(async (tx) => {
    // Locks out a concurrent revoke: a delivery is recorded only while the webhook is live.
    const [live] = await tx
      .select({ id: webhooks.id })
      .from(webhooks)
      .where(and(eq(webhooks.id, w.id), isNull(webhooks.revokedAt)))
      .for("share");
    if (!live) return fail("not_found", "No such webhook.");
    const key = and(
      eq(webhookDeliveries.webhookId, w.id),
      eq(webhookDeliveries.deliveryId, delivery.deliveryId),
    );
    const inserted = await tx
      .insert(webhookDeliveries)
      .values({ webhookId: w.id, deliveryId: delivery.deliveryId, bodyBytes: delivery.bodyBytes })
      .onConflictDoNothing()
      .returning({ deliveryId: webhookDeliveries.deliveryId });
    if (inserted.length === 0) {
      const [first] = await tx.select({ runId: webhookDeliveries.runId }).from(webhookDeliveries).where(key);
      if (!first?.runId) throw new Error("a recorded delivery has no run");
      return ok({ fresh: false, runId: first.runId });
    }
    // createRun's own transaction nests in this one as a savepoint, so the run and the delivery
    // row commit together or not at all.
    const run = await createRun(tx, w, spec, backend, maxActiveRuns);
    await tx.update(webhookDeliveries).set({ runId: run.id }).where(key);
    return ok({ fresh: true, runId: run.id });
  });
}
