import { runDurableObjectAlarm } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { and, eq } from "drizzle-orm";
import { describe, expect, inject, it } from "vitest";
import { notificationDeliveries, notifications } from "../../src/db/schema";
import { MAX_ATTEMPTS, RETRY_SCHEDULE_MS } from "../../src/notifications/delivery";
import { notifierStub } from "../../src/notifications/notifier";
import { MAX_NOTIFICATIONS_PER_ENVIRONMENT } from "../../src/notifications/service";
import { reconcile } from "../../src/reaper/reconcile";
import { recordTransition } from "../../src/runs/service";
import { WEBHOOK_SECRET } from "../../src/webhooks/signature";
import type { ReceivedDelivery } from "../fixtures/notification-receiver-contract";
import { BASE, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { findNeedles, scanDatabase } from "./leaks";
import { driveToEnd } from "./run-fixtures";

// Run-end notifications against the real Worker, Postgres and Durable Objects, delivered over
// real TLS to a real receiver (test/fixtures/notification-receiver.ts) that verifies each
// delivery with the `standardwebhooks` library, as a user's receiver would. Retries are driven
// through the notifier's alarm, with the delivery's due time moved to now (no sleeping).

const RECEIVER = inject("notificationReceiver");

let inboxes = 0;
const newInbox = () => `inbox${Date.now()}${++inboxes}`;

async function control(inbox: string, arm?: { secret: string; statuses?: number[]; delayMs?: number }) {
  const res = await fetch(`${RECEIVER}/control/${inbox}`, {
    method: arm ? "PUT" : "GET",
    ...(arm ? { body: JSON.stringify(arm) } : {}),
  });
  if (!arm) return ((await res.json()) as { deliveries: ReceivedDelivery[] }).deliveries;
  await res.body?.cancel();
  return [];
}

interface Registered {
  t: Tenant;
  id: string;
  secret: string;
  inbox: string;
}

/** A tenant (or `t`) with a notification URL at a fresh inbox, armed with its secret. */
async function register(t?: Tenant, statuses: number[] = [], delayMs = 0): Promise<Registered> {
  const tenant = t ?? (await newTenant());
  const inbox = newInbox();
  const res = await tenant.api("POST", "/v1/notifications", { url: `${RECEIVER}/hook/${inbox}` });
  if (res.status !== 201) throw new Error(`register: ${res.status} ${res.text}`);
  await control(inbox, { secret: res.json.secret, statuses, delayMs });
  return { t: tenant, id: res.json.id, secret: res.json.secret, inbox };
}

/** Launches a run (it ends at once: the worker tests have no compute backend) and ends it. */
async function endedRun(t: Tenant): Promise<string> {
  const id = (await t.api("POST", "/v1/runs", { commands: ["echo hi"] })).json.id as string;
  await driveToEnd(t, id);
  return id;
}

const deliveryRows = (runId: string) =>
  withDb((db) => db.select().from(notificationDeliveries).where(eq(notificationDeliveries.runId, runId)));

/**
 * Moves the due time of the run's pending deliveries to now: the backoff's wait, passed. Only of
 * rows still as `seen`: an attempt made since (the alarm also fires by itself) keeps its wait.
 */
async function timePasses(runId: string, seen?: { id: string; attempts: number }[]): Promise<void> {
  const rows = seen ?? (await deliveryRows(runId));
  await withDb(async (db) => {
    for (const r of rows) {
      await db
        .update(notificationDeliveries)
        .set({ nextAttemptAt: new Date() })
        .where(
          and(
            eq(notificationDeliveries.id, r.id),
            eq(notificationDeliveries.attempts, r.attempts),
            eq(notificationDeliveries.status, "pending"),
          ),
        );
    }
  });
}

/** Fires the run's notifier alarm until its deliveries have made `attempts` attempts in all. */
async function driveAttempts(runId: string, attempts: number): Promise<void> {
  for (let i = 0; i < 100; i++) {
    const rows = await deliveryRows(runId);
    const made = rows.reduce((n, r) => n + r.attempts, 0);
    if (rows.length > 0 && made >= attempts) return;
    await timePasses(runId, rows);
    if (!(await runDurableObjectAlarm(notifierStub(env, runId)))) await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`run ${runId}: fewer than ${attempts} attempts`);
}

async function deliveriesOf(r: Registered) {
  const res = await r.t.api("GET", `/v1/notifications/${r.id}/deliveries`);
  expect(res.status).toBe(200);
  return res.json.deliveries as {
    id: string;
    runId: string;
    status: string;
    nextAttemptAt: string | null;
    attempts: { attempt: number; statusCode: number | null; error: string | null }[];
  }[];
}

describe("notification registration", { timeout: 60_000 }, () => {
  it("POST /v1/notifications → 201 with the secret once; GET and list never show it", async () => {
    const t = await newTenant();
    const url = `${RECEIVER}/hook/${newInbox()}`;
    const res = await t.api("POST", "/v1/notifications", { url });
    expect(res.status).toBe(201);
    expect(res.json).toMatchObject({ url, events: ["run.ended"] });
    expect(res.json.id).toMatch(/^ntf_/);
    expect(res.json.secret).toMatch(WEBHOOK_SECRET);
    const read = await t.api("GET", `/v1/notifications/${res.json.id}`);
    expect(read.json).toEqual({ id: res.json.id, url, events: ["run.ended"], createdAt: res.json.createdAt });
    const list = await t.api("GET", "/v1/notifications");
    expect(list.json.notifications.map((n: { id: string }) => n.id)).toEqual([res.json.id]);
    expect(findNeedles("GET", read.text + list.text, [res.json.secret])).toEqual([]);
    // case B5: the secret is stored sealed, never in clear.
    expect((await scanDatabase([res.json.secret])).hits).toEqual([]);
  });

  it.each([
    ["http://hooks.example.com/x", "only https"],
    ["https://10.0.0.8/x", "IP address"],
    ["https://[::1]:8443/x", "IP address"],
    ["https://167772168/x", "IP address"],
    ["https://0xa9.254.169.254/x", "IP address"],
    ["https://2130706433:8443/x", "IP address"],
    ["https://0x7f.1:8443/x", "IP address"],
    ["https://169.254.169.254/latest/meta-data", "IP address"],
    ["https://localhost/x", "local or reserved"],
    ["https://api.localhost/x", "local or reserved"],
    ["https://metadata.google.internal/x", "local or reserved"],
    ["https://printer.local/x", "local or reserved"],
    ["https://intranet/x", "single-label"],
    ["https://user:pw@hooks.example.com/x", "user name or password"],
    ["hooks.example.com/x", "not an absolute URL"],
  ])("refuses %s (%s) with invalid_notification_url, and stores nothing", async (url, why) => {
    const t = await newTenant();
    const res = expectProblem(
      await t.api("POST", "/v1/notifications", { url }),
      400,
      "invalid_notification_url",
    );
    expect(res.json.detail).toContain(why);
    const rows = await withDb((db) =>
      db.select().from(notifications).where(eq(notifications.environmentId, t.environmentId)),
    );
    expect(rows).toEqual([]);
  });

  it("refuses an unknown event and unknown fields", async () => {
    const t = await newTenant();
    const url = `${RECEIVER}/hook/${newInbox()}`;
    expectProblem(
      await t.api("POST", "/v1/notifications", { url, events: ["run.started"] }),
      400,
      "invalid_request",
    );
    expectProblem(await t.api("POST", "/v1/notifications", { url, secret: "mine" }), 400, "unknown_field");
  });

  it(`admits at most ${MAX_NOTIFICATIONS_PER_ENVIRONMENT} live URLs per environment; revoking frees a place`, async () => {
    const t = await newTenant();
    const ids: string[] = [];
    for (let i = 0; i < MAX_NOTIFICATIONS_PER_ENVIRONMENT; i++) ids.push((await register(t)).id);
    const url = `${RECEIVER}/hook/${newInbox()}`;
    expectProblem(await t.api("POST", "/v1/notifications", { url }), 409, "too_many_notifications");
    expect((await t.api("DELETE", `/v1/notifications/${ids[0]}`)).status).toBe(204);
    expect((await t.api("POST", "/v1/notifications", { url })).status).toBe(201);
  });

  it("another tenant's notification is a 404 everywhere, and its runs notify only their own URLs (C1)", async () => {
    const a = await register();
    const b = await register();
    for (const [method, path] of [
      ["GET", `/v1/notifications/${a.id}`],
      ["GET", `/v1/notifications/${a.id}/deliveries`],
      ["DELETE", `/v1/notifications/${a.id}`],
    ] as const) {
      expectProblem(await b.t.api(method, path), 404, "not_found");
    }
    expect(
      (await b.t.api("GET", "/v1/notifications")).json.notifications.map((n: { id: string }) => n.id),
    ).toEqual([b.id]);
    const runId = await endedRun(a.t);
    await driveAttempts(runId, 1);
    expect((await deliveryRows(runId)).map((d) => d.notificationId)).toEqual([a.id]);
    expect(await control(b.inbox)).toEqual([]);
  });
});

describe("run-end deliveries", { timeout: 90_000 }, () => {
  it("a run that ends is POSTed to the URL, signed so that standardwebhooks verifies it", async () => {
    const r = await register();
    const runId = await endedRun(r.t);
    await driveAttempts(runId, 1);
    const [got] = await control(r.inbox);
    expect(got?.verified).toBe(true);
    expect(got?.headers["content-type"]).toBe("application/json");
    const run = (await r.t.api("GET", `/v1/runs/${runId}`)).json;
    expect(JSON.parse(got?.body ?? "null")).toEqual({
      type: "run.ended",
      timestamp: run.endedAt,
      data: {
        runId,
        status: run.status,
        reason: run.reason,
        reasonDetail: expect.any(String),
        endedAt: run.endedAt,
        links: { run: `${BASE}/v1/runs/${runId}`, page: `${BASE}/runs/${runId}` },
      },
    });
    const [delivery] = await deliveriesOf(r);
    expect(delivery).toMatchObject({
      id: got?.headers["webhook-id"],
      runId,
      status: "delivered",
      nextAttemptAt: null,
      attempts: [{ attempt: 1, statusCode: 204, error: null }],
    });
  });

  it("retries a failing receiver with backoff, with the same webhook-id, until it answers 2xx", async () => {
    const r = await register(undefined, [503, 500]);
    const runId = await endedRun(r.t);
    await driveAttempts(runId, 1);
    const [first] = await deliveriesOf(r);
    expect(first?.status).toBe("pending");
    expect(first?.attempts).toMatchObject([
      { attempt: 1, statusCode: 503, error: "the receiver answered 503" },
    ]);
    // The first retry waits RETRY_SCHEDULE_MS[0], ±10%.
    const wait = Date.parse(first?.nextAttemptAt ?? "") - Date.now();
    expect(wait).toBeGreaterThan(RETRY_SCHEDULE_MS[0] * 0.9 - 2_000);
    expect(wait).toBeLessThanOrEqual(RETRY_SCHEDULE_MS[0] * 1.1);
    await driveAttempts(runId, 3);
    const [done] = await deliveriesOf(r);
    expect(done?.status).toBe("delivered");
    expect(done?.attempts.map((a) => a.statusCode)).toEqual([503, 500, 204]);
    const got = await control(r.inbox);
    expect(got.map((d) => d.verified)).toEqual([true, true, true]);
    expect(new Set(got.map((d) => d.headers["webhook-id"]))).toEqual(new Set([done?.id]));
    // Each attempt is signed anew, with its own timestamp.
    const stamps = got.map((d) => Number(d.headers["webhook-timestamp"]));
    expect(stamps).toEqual([...stamps].sort((x, y) => x - y));
  });

  it(`gives up after ${MAX_ATTEMPTS} failed attempts and sends nothing more`, async () => {
    const r = await register(undefined, Array(MAX_ATTEMPTS + 2).fill(503));
    const runId = await endedRun(r.t);
    await driveAttempts(runId, MAX_ATTEMPTS);
    const [gaveUp] = await deliveriesOf(r);
    expect(gaveUp?.status).toBe("failed");
    expect(gaveUp?.nextAttemptAt).toBeNull();
    expect(gaveUp?.attempts.map((a) => a.attempt)).toEqual(
      Array.from({ length: MAX_ATTEMPTS }, (_, i) => i + 1),
    );
    await timePasses(runId);
    await runDurableObjectAlarm(notifierStub(env, runId));
    expect(await control(r.inbox)).toHaveLength(MAX_ATTEMPTS);
  });

  it("does not follow a redirect: it is a failed attempt", async () => {
    const r = await register(undefined, [302]);
    const runId = await endedRun(r.t);
    await driveAttempts(runId, 1);
    const [d] = await deliveriesOf(r);
    expect(d?.attempts[0]).toMatchObject({
      statusCode: 302,
      error: "the receiver redirected; redirects are not followed",
    });
    expect(d?.status).toBe("pending");
  });

  it("revoking cancels what is pending: nothing more is sent", async () => {
    const r = await register(undefined, [503, 503]);
    const runId = await endedRun(r.t);
    await driveAttempts(runId, 1);
    expect((await r.t.api("DELETE", `/v1/notifications/${r.id}`)).status).toBe(204);
    const [row] = await deliveryRows(runId);
    expect(row).toMatchObject({ status: "cancelled", nextAttemptAt: null, attempts: 1 });
    await runDurableObjectAlarm(notifierStub(env, runId));
    expect(await control(r.inbox)).toHaveLength(1);
  });

  it("every URL of the environment is told, once per run, however often the end is replayed", async () => {
    const t = await newTenant();
    const one = await register(t);
    const two = await register(t);
    const runId = await endedRun(t);
    await driveAttempts(runId, 2);
    // A replayed end (a retried alarm) owes nothing again: the trace key and the outbox key hold.
    const status = (await t.api("GET", `/v1/runs/${runId}`)).json.status;
    expect(await withDb((db) => recordTransition(db, runId, { to: status, reason: "again" }))).toBe(false);
    await runDurableObjectAlarm(notifierStub(env, runId));
    expect(await deliveryRows(runId)).toHaveLength(2);
    expect(await control(one.inbox)).toHaveLength(1);
    expect(await control(two.inbox)).toHaveLength(1);
  });

  it("the reaper wakes a notifier whose delivery is overdue (its wake-up was lost)", async () => {
    const r = await register();
    const runId = await endedRun(r.t);
    await driveAttempts(runId, 1);
    // A second debt whose wake-up never came: pending and long overdue.
    const other = await register(r.t);
    await withDb((db) =>
      db.insert(notificationDeliveries).values({
        id: `msg_lost${Date.now()}`,
        notificationId: other.id,
        runId,
        event: "run.ended",
        nextAttemptAt: new Date(Date.now() - 10 * 60_000),
      }),
    );
    const report = await reconcile(env);
    expect(report.notifiersWoken).toContain(runId);
    await driveAttempts(runId, 2);
    expect((await control(other.inbox)).map((d) => d.verified)).toEqual([true]);
  });
});
