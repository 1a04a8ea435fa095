import { DurableObject } from "cloudflare:workers";
import { consoleLog } from "@benchwright/shared/contract/log";
import { type Config, loadConfig } from "../config";
import { VaultDecryptError } from "../crypto/vault-crypto";
import { openDb } from "../db/client";
import type { Db } from "../db/types";
import { runEndedPayload, sendAttempt } from "./delivery";
import {
  type DueDelivery,
  dueDeliveries,
  type EndedRun,
  endedRun,
  nextAttemptAt,
  recordAttempt,
  signingSecret,
} from "./service";
import { checkTarget } from "./target";

// A run's notifier: one Durable Object per run (named by the run id) that sends what the run owes
// its environment's notification URLs (the outbox rows written when it ended) and retries each
// with backoff from its alarm. Postgres holds the state (deliveries, attempts); the object holds
// only its run id and an alarm, so an evicted or restarted object loses nothing. Delivery is at
// least once: an alarm cut off between a send and its record sends again, with the same
// `webhook-id`.

const RUN_KEY = "runId";

export function notifierStub(env: Env, runId: string): DurableObjectStub<RunNotifier> {
  return env.RUN_NOTIFIER.get(env.RUN_NOTIFIER.idFromName(runId));
}

/**
 * Tells the run's notifier that it may owe deliveries. After the commit that owed them; a failed
 * call is only logged, since the reaper wakes notifiers whose deliveries are overdue.
 */
export async function wakeNotifier(env: Env, runId: string): Promise<void> {
  try {
    await notifierStub(env, runId).wake(runId);
  } catch (error) {
    consoleLog("warn", { event: "notifier_wake_failed", runId, error: (error as Error).name });
  }
}

export class RunNotifier extends DurableObject<Env> {
  /** Sends what is due now (from the alarm, at once) and keeps the alarm for what is owed later. */
  async wake(runId: string): Promise<void> {
    await this.ctx.storage.put(RUN_KEY, runId);
    const current = await this.ctx.storage.getAlarm();
    const now = Date.now();
    if (current === null || current > now) await this.ctx.storage.setAlarm(now);
  }

  override async alarm(): Promise<void> {
    const runId = await this.ctx.storage.get<string>(RUN_KEY);
    if (!runId) return;
    const config = loadConfig(this.env);
    const { db, close } = openDb(config);
    try {
      const due = await dueDeliveries(db, runId);
      // One read of the run for every delivery it owes: they all describe the same end.
      const run = due.length > 0 ? await endedRun(db, runId) : null;
      await Promise.all(due.map((d) => this.attempt(db, config, runId, run, d)));
      const next = await nextAttemptAt(db, runId);
      if (next === null) await this.ctx.storage.deleteAll();
      else await this.ctx.storage.setAlarm(Math.max(next.getTime(), Date.now() + 1000));
    } finally {
      await close().catch(() => {});
    }
  }

  private async attempt(
    db: Db,
    config: Config,
    runId: string,
    run: EndedRun | null,
    { delivery, notification }: DueDelivery,
  ): Promise<void> {
    const attempt = delivery.attempts + 1;
    const refuse = (error: string) =>
      recordAttempt(db, delivery, {
        startedAt: new Date(),
        durationMs: 0,
        statusCode: null,
        error,
        next: { status: "failed" },
      });
    // Checked again before every attempt: the operator's deny list may have grown since.
    const target = checkTarget(notification.url, config.notificationTargets);
    if (!target.ok) return refuse(`not sent: ${target.reason}`);
    let secret: string | null;
    try {
      secret = await signingSecret(config.keyRing, notification);
    } catch (error) {
      const reason = error instanceof VaultDecryptError ? error.reason : "error";
      consoleLog("error", {
        event: "notification_secret_unreadable",
        notificationId: notification.id,
        reason,
      });
      return refuse("not sent: the signing secret could not be read");
    }
    if (secret === null) return refuse("not sent: the notification was revoked");
    if (!run) return refuse("not sent: the run is gone");
    const outcome = await sendAttempt({
      url: target.url,
      deliveryId: delivery.id,
      secret,
      body: runEndedPayload(run, notification.origin),
      attempt,
    });
    await recordAttempt(db, delivery, outcome);
    const level = outcome.next.status === "failed" ? "warn" : "info";
    consoleLog(level, {
      event: "notification_attempt",
      runId,
      notificationId: notification.id,
      deliveryId: delivery.id,
      attempt,
      statusCode: outcome.statusCode,
      outcome: outcome.next.status,
    });
  }
}
