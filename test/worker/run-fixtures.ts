import { runDurableObjectAlarm } from "cloudflare:test";
import { env } from "cloudflare:workers";
import {
  type AuditBatch,
  auditPath,
  policyPath,
  readyPath,
  signAuditBatch,
} from "@benchwright/shared/contract/proxy-wire";
import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { isTerminal } from "@benchwright/shared/contract/run-states";
import { eq } from "drizzle-orm";
import { loadConfig } from "../../src/config";
import { coordinatorStub } from "../../src/coordinator/client";
import { randomId } from "../../src/crypto/api-keys";
import {
  blockedHostLog,
  egressRouteLog,
  limitRefusalLog,
  type RunState,
  runs,
  strayPlaceholderLog,
} from "../../src/db/schema";
import { issueProxyCredentials } from "../../src/runs/proxy-credentials";
import { storeAuditBatch } from "../../src/runs/proxy-reports";
import { type ApiResponse, call, type Tenant, withDb } from "./harness";

// Runs for route tests, made by writing rows directly (the public runs API is not needed to
// test what hangs off a run), with real proxy credentials issued by the code under test.

export interface TestRun {
  id: string;
  tenant: Tenant;
  proxyToken: string;
  auditKey: string;
  /** Calls the internal API as this run's proxy. */
  proxy: (
    method: string,
    path: string,
    body?: unknown,
    headers?: Record<string, string>,
  ) => Promise<ApiResponse>;
}

export async function newRun(
  tenant: Tenant,
  options: { spec?: Record<string, unknown>; status?: RunState } = {},
): Promise<TestRun> {
  const id = randomId("run_");
  const ring = loadConfig(env).keyRing;
  const { proxyToken, auditKey } = await withDb(async (db) => {
    await db.insert(runs).values({
      id,
      userId: tenant.userId,
      environmentId: tenant.environmentId,
      status: options.status ?? "starting_proxy",
      // Parsed as a launch is: the fixture's spec is one a launch could have stored.
      spec: RunSpec.parse(options.spec ?? { commands: ["true"] }),
      backend: "local",
    });
    return issueProxyCredentials(db, ring, {
      id,
      userId: tenant.userId,
      environmentId: tenant.environmentId,
    });
  });
  return {
    id,
    tenant,
    proxyToken,
    auditKey,
    proxy: (method, path, body, headers) => call(proxyToken, method, path, body, headers),
  };
}

export async function setRunStatus(runId: string, status: RunState): Promise<void> {
  await withDb((db) =>
    db
      .update(runs)
      .set({ status, endedAt: isTerminal(status) ? new Date() : null })
      .where(eq(runs.id, runId)),
  );
}

export const paths = {
  policy: (run: { id: string }) => policyPath(run.id),
  ready: (run: { id: string }) => readyPath(run.id),
  audit: (run: { id: string }) => auditPath(run.id),
};

let batchCount = 0;

/** A valid batch for `runId` (override any field). */
export function auditBatch(runId: string, fields: Partial<AuditBatch> = {}): AuditBatch {
  return {
    schema: 1,
    runId,
    batchId: `bat_${++batchCount}_${crypto.randomUUID().slice(0, 8)}`,
    source: "proxy",
    createdAt: new Date().toISOString(),
    modelCalls: [],
    limitRefusals: [],
    strayPlaceholders: [],
    blockedHosts: [],
    egressRoutes: [],
    ...fields,
  };
}

/** Body and headers of a batch signed with `auditKey`, as the proxy sends it. */
export function signed(
  auditKey: string,
  batch: AuditBatch,
  at: Date = new Date(),
): { body: string; headers: Record<string, string> } {
  const body = JSON.stringify(batch);
  return { body, headers: { ...signAuditBatch(auditKey, batch.batchId, at, body) } };
}

/** Posts a batch signed with the run's own key to `path` (default: the run's audit path). */
export function postBatch(
  run: TestRun,
  batch: AuditBatch,
  options: { path?: string; key?: string; at?: Date } = {},
): Promise<ApiResponse> {
  const { body, headers } = signed(options.key ?? run.auditKey, batch, options.at);
  return run.proxy("POST", options.path ?? paths.audit(run), body, {
    ...headers,
    "content-type": "application/json",
  });
}

/** A body for the ready call (a syntactically valid PEM; nothing parses the certificate). */
export function readyBody(overrides: Record<string, unknown> = {}) {
  const der = btoa(String.fromCharCode(...crypto.getRandomValues(new Uint8Array(300))));
  const pem = `-----BEGIN CERTIFICATE-----\n${der.match(/.{1,64}/g)?.join("\n")}\n-----END CERTIFICATE-----\n`;
  const fingerprint = [...crypto.getRandomValues(new Uint8Array(32))]
    .map((b) => b.toString(16).padStart(2, "0"))
    .join("");
  return {
    caCertPem: pem,
    caFingerprint256: fingerprint,
    policyVersion: 1,
    listeners: { tls: 8443, http: 8080, explicit: 3128 },
    ...overrides,
  };
}

/** The run's audit rows as stored. */
export async function auditRows(runId: string) {
  return withDb(async (db) => ({
    blocked: await db
      .select()
      .from(blockedHostLog)
      .where(eq(blockedHostLog.runId, runId))
      .orderBy(blockedHostLog.host),
    routes: await db
      .select()
      .from(egressRouteLog)
      .where(eq(egressRouteLog.runId, runId))
      .orderBy(egressRouteLog.host, egressRouteLog.route),
    limits: await db
      .select()
      .from(limitRefusalLog)
      .where(eq(limitRefusalLog.runId, runId))
      .orderBy(limitRefusalLog.host, limitRefusalLog.method, limitRefusalLog.limit),
    strays: await db
      .select()
      .from(strayPlaceholderLog)
      .where(eq(strayPlaceholderLog.runId, runId))
      .orderBy(strayPlaceholderLog.host, strayPlaceholderLog.secret),
  }));
}

/** What auditRows reads for a run with no audit rows. */
export const NO_AUDIT_ROWS = { blocked: [], routes: [], limits: [], strays: [] };

/**
 * A run with audit rows for `hosts` (one refusal, one direct route, one limit refusal and one
 * stray placeholder each), stored through the audit route's own store function rather than over
 * HTTP: cheap enough for every fixture.
 */
export async function runWithAudit(tenant: Tenant, hosts: readonly string[]): Promise<TestRun> {
  const run = await newRun(tenant);
  const now = new Date().toISOString();
  const batch = auditBatch(run.id, {
    blockedHosts: hosts.map((host) => ({ host, count: 1, firstSeen: now, lastSeen: now })),
    egressRoutes: hosts.map((host) => ({
      host,
      route: "direct" as const,
      count: 1,
      firstSeen: now,
      lastSeen: now,
    })),
    limitRefusals: hosts.map((host) => ({
      host,
      method: "DELETE",
      limit: "method" as const,
      count: 1,
      firstSeen: now,
      lastSeen: now,
    })),
    strayPlaceholders: hosts.map((host) => ({
      host,
      secret: "API_KEY",
      count: 1,
      firstSeen: now,
      lastSeen: now,
    })),
  });
  const owner = { id: run.id, userId: tenant.userId, environmentId: tenant.environmentId };
  await withDb((db) => storeAuditBatch(db, owner, batch));
  return run;
}

/**
 * Drives the run's coordinator alarm by alarm (runDurableObjectAlarm, no waiting on its timers)
 * until `done` says so. A turn with no alarm to run means one fired by itself and is still in its
 * handler; that turn gives it a moment to finish.
 */
export async function driveUntil(runId: string, done: () => Promise<boolean>, what = "end"): Promise<void> {
  const stub = coordinatorStub(env, runId);
  for (let i = 0; i < 200; i++) {
    if (await done()) return;
    const fired = await runDurableObjectAlarm(stub);
    if (!fired) await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`run ${runId} did not ${what}`);
}

/** Drives the run's alarms until it ends; returns GET /v1/runs/{id}. */
export async function driveToEnd(t: Tenant, runId: string): Promise<ApiResponse> {
  let run = await t.api("GET", `/v1/runs/${runId}`);
  await driveUntil(runId, async () => {
    run = await t.api("GET", `/v1/runs/${runId}`);
    return isTerminal(run.json.status);
  });
  return run;
}
