import type { AuditBatch, ProxyReady } from "@benchwright/shared/contract/proxy-wire";
import { eq, sql } from "drizzle-orm";
import {
  auditBatches,
  blockedHostLog,
  egressRouteLog,
  limitRefusalLog,
  modelCallLog,
  runEvents,
  runs,
  strayPlaceholderLog,
} from "../db/schema";
import type { Db } from "../db/types";
import { lockTrace } from "./events";
import type { RunOwner } from "./proxy-credentials";

// What a run's proxy reports to the control plane, stored: its ready call (the run CA) and its
// audit batches (counts per host, per limit refused and per stray placeholder, and the model
// lane's calls; de-duplicated by batch id, and the calls by call id too).

/**
 * Stores the run CA and when the proxy became ready, and appends one trace row. Idempotent: a
 * repeated call refreshes the CA columns but keeps the first ready time and the one trace row.
 */
export async function storeProxyReady(db: Db, runId: string, ready: ProxyReady): Promise<void> {
  await db.transaction(async (tx) => {
    await lockTrace(tx, runId);
    await tx
      .update(runs)
      .set({
        caCertPem: ready.caCertPem,
        caFingerprint: ready.caFingerprint256,
        proxyReadyAt: sql`coalesce(${runs.proxyReadyAt}, now())`,
        updatedAt: new Date(),
      })
      .where(eq(runs.id, runId));
    await tx
      .insert(runEvents)
      .values({
        runId,
        key: "proxy_ready",
        kind: "proxy",
        detail: {
          caFingerprint256: ready.caFingerprint256,
          policyVersion: ready.policyVersion,
          listeners: ready.listeners,
        },
      })
      .onConflictDoNothing({ target: [runEvents.runId, runEvents.key] });
  });
}

// Rows per INSERT: at most 12 parameters a row stays far below Postgres's 65535 a statement.
const CHUNK = 1000;
const chunks = <T>(rows: readonly T[]): T[][] =>
  Array.from({ length: Math.ceil(rows.length / CHUNK) }, (_, i) => rows.slice(i * CHUNK, (i + 1) * CHUNK));

/**
 * Stores a verified batch in one transaction: its id first (a batch already stored → false,
 * nothing written, case D5), then its counts added to the run's rows (per host, per host, method
 * and limit, per host and secret name). Returns whether it was stored now.
 */
export async function storeAuditBatch(db: Db, run: RunOwner, batch: AuditBatch): Promise<boolean> {
  return db.transaction(async (tx) => {
    const fresh = await tx
      .insert(auditBatches)
      .values({ runId: run.id, batchId: batch.batchId })
      .onConflictDoNothing()
      .returning({ batchId: auditBatches.batchId });
    if (fresh.length === 0) return false;
    for (const rows of chunks(batch.blockedHosts)) {
      await tx
        .insert(blockedHostLog)
        .values(
          rows.map((r) => ({
            userId: run.userId,
            environmentId: run.environmentId,
            runId: run.id,
            host: r.host,
            seenCount: r.count,
            firstSeen: new Date(r.firstSeen),
            lastSeen: new Date(r.lastSeen),
            source: batch.source,
          })),
        )
        .onConflictDoUpdate({
          target: [blockedHostLog.runId, blockedHostLog.host],
          set: {
            seenCount: sql`${blockedHostLog.seenCount} + excluded.seen_count`,
            firstSeen: sql`least(${blockedHostLog.firstSeen}, excluded.first_seen)`,
            lastSeen: sql`greatest(${blockedHostLog.lastSeen}, excluded.last_seen)`,
            // Seen by the proxy and by the user's local egress agent: "both".
            source: sql`case when ${blockedHostLog.source} = excluded.source then ${blockedHostLog.source} else 'both' end`,
          },
        });
    }
    for (const rows of chunks(batch.egressRoutes)) {
      await tx
        .insert(egressRouteLog)
        .values(
          rows.map((r) => ({
            environmentId: run.environmentId,
            runId: run.id,
            host: r.host,
            route: r.route,
            count: r.count,
            firstSeen: new Date(r.firstSeen),
            lastSeen: new Date(r.lastSeen),
          })),
        )
        .onConflictDoUpdate({
          target: [egressRouteLog.runId, egressRouteLog.host, egressRouteLog.route],
          set: {
            count: sql`${egressRouteLog.count} + excluded.count`,
            firstSeen: sql`least(${egressRouteLog.firstSeen}, excluded.first_seen)`,
            lastSeen: sql`greatest(${egressRouteLog.lastSeen}, excluded.last_seen)`,
          },
        });
    }
    for (const rows of chunks(batch.limitRefusals)) {
      await tx
        .insert(limitRefusalLog)
        .values(
          rows.map((r) => ({
            environmentId: run.environmentId,
            runId: run.id,
            host: r.host,
            method: r.method,
            limit: r.limit,
            count: r.count,
            firstSeen: new Date(r.firstSeen),
            lastSeen: new Date(r.lastSeen),
          })),
        )
        .onConflictDoUpdate({
          target: [
            limitRefusalLog.runId,
            limitRefusalLog.host,
            limitRefusalLog.method,
            limitRefusalLog.limit,
          ],
          set: {
            count: sql`${limitRefusalLog.count} + excluded.count`,
            firstSeen: sql`least(${limitRefusalLog.firstSeen}, excluded.first_seen)`,
            lastSeen: sql`greatest(${limitRefusalLog.lastSeen}, excluded.last_seen)`,
          },
        });
    }
    for (const rows of chunks(batch.strayPlaceholders)) {
      await tx
        .insert(strayPlaceholderLog)
        .values(
          rows.map((r) => ({
            environmentId: run.environmentId,
            runId: run.id,
            host: r.host,
            secret: r.secret,
            count: r.count,
            firstSeen: new Date(r.firstSeen),
            lastSeen: new Date(r.lastSeen),
          })),
        )
        .onConflictDoUpdate({
          target: [strayPlaceholderLog.runId, strayPlaceholderLog.host, strayPlaceholderLog.secret],
          set: {
            count: sql`${strayPlaceholderLog.count} + excluded.count`,
            firstSeen: sql`least(${strayPlaceholderLog.firstSeen}, excluded.first_seen)`,
            lastSeen: sql`greatest(${strayPlaceholderLog.lastSeen}, excluded.last_seen)`,
          },
        });
    }
    for (const rows of chunks(batch.modelCalls)) {
      await tx
        .insert(modelCallLog)
        .values(
          rows.map((r) => ({
            environmentId: run.environmentId,
            runId: run.id,
            callId: r.callId,
            at: new Date(r.at),
            model: r.model,
            provider: r.provider,
            endpoint: r.endpoint,
            stream: r.stream,
            status: r.status,
            inputTokens: r.inputTokens,
            outputTokens: r.outputTokens,
            cachedInputTokens: r.cachedInputTokens,
            refused: r.refused,
            ms: r.ms,
          })),
        )
        // A call the proxy re-sent in a later batch (after a crash) is kept once.
        .onConflictDoNothing({ target: [modelCallLog.runId, modelCallLog.callId] });
    }
    return true;
  });
}
