import {
  createExecutionContext,
  createScheduledController,
  runInDurableObject,
  waitOnExecutionContext,
} from "cloudflare:test";
import { env } from "cloudflare:workers";
import { isTerminal, type RunState } from "@benchwright/shared/contract/run-states";
import { eq } from "drizzle-orm";
import { describe, expect, it, vi } from "vitest";
import { coordinatorStub } from "../../src/coordinator/client";
import type { Final, StoredState } from "../../src/coordinator/state";
import { runs } from "../../src/db/schema";
import worker from "../../src/index";
import { LINGER_GRACE_MS, reconcile, STALE_MS, STUCK_MS } from "../../src/reaper/reconcile";
import { newTenant, tenantWithUnreadableVault, withDb } from "./harness";
import { captureLogs } from "./leaks";
import { driveUntil, newRun } from "./run-fixtures";

// The cron backstop, driven explicitly (createScheduledController, no waiting for a schedule):
// it starts a run whose launch never reached its coordinator, re-arms nothing that is alive,
// and never touches a run that is moving. The suite shares one database with other files, so
// these runs are aged past the thresholds as seen from a sweep "nine days ago", which sees them only.

const DAY = 24 * 60 * 60_000;
const SWEEP_AT = () => Date.now() - 9 * DAY;

const age = (runId: string, ms: number) =>
  withDb((db) =>
    db
      .update(runs)
      .set({ updatedAt: new Date(Date.now() - ms) })
      .where(eq(runs.id, runId)),
  );

describe("reaper (cron backstop)", () => {
  it("starts a quiet run whose coordinator never got its start, from the scheduled handler", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "queued", spec: { commands: ["true"], egress: "direct" } });
    await age(run.id, 9 * DAY + STALE_MS + 60_000);
    expect(await coordinatorStub(env, run.id).snapshot()).toBeUndefined();
    const ctx = createExecutionContext();
    await worker.scheduled(
      createScheduledController({ cron: "*/5 * * * *", scheduledTime: SWEEP_AT() }),
      env,
      ctx,
    );
    await waitOnExecutionContext(ctx);
    const state = await coordinatorStub(env, run.id).snapshot();
    expect(state?.runId).toBe(run.id);
    // Its coordinator now drives it (here it stops: no compute backend in workerd).
    await driveUntil(run.id, async () => isTerminal(await snap(run.id)));
    expect(await snap(run.id)).toBe("stopped");
  });

  it("leaves alone a run that moved recently, and a quiet one whose alarm is pending", async () => {
    const t = await tenantWithUnreadableVault("canary-reaper-value");
    const fresh = await newRun(t, { status: "queued", spec: { commands: ["true"], egress: "direct" } });
    // A live run: its coordinator retries the vault with backoff (alarm pending), and its row has
    // not moved since it entered fetching_vault.
    const live = (await t.api("POST", "/v1/runs", { commands: ["true"] })).json.id as string;
    await driveUntil(live, async () => (await snap(live)) === "fetching_vault", "fetch its vault");
    await age(live, 9 * DAY + STALE_MS + 60_000);
    const report = await reconcile(env, SWEEP_AT());
    expect(report.nudged[fresh.id]).toBeUndefined();
    expect(await coordinatorStub(env, fresh.id).snapshot()).toBeUndefined();
    expect(report.nudged[live]).toBe("alive");
    expect(await snap(live)).toBe("fetching_vault");
  });
});

describe("reaper: stuck runs", () => {
  it("stops a run stuck in a setup state past its deadline, with the reason reaped", async () => {
    const t = await newTenant();
    const stuck = await newRun(t, { status: "wiring", spec: { commands: ["true"], egress: "direct" } });
    await age(stuck.id, 9 * DAY + STUCK_MS + 60_000);
    const lines = captureLogs();
    const report = await reconcile(env, SWEEP_AT());
    vi.restoreAllMocks();
    expect(report.reaped[stuck.id]).toBe("stopped");
    expect(report.nudged[stuck.id]).toBeUndefined();
    // The sweep's one log line: level and timestamp first, the report's fields as they were; a
    // sweep that reaped something is a warning (an alert in docs/operator-guide.md).
    const line = lines.find((l) => l.includes('"event":"reconcile"')) ?? "";
    expect(line).toMatch(/^warn: \{"level":"warn","ts":"\d{4}-\d\d-\d\dT[\d:.]+Z","event":"reconcile",/);
    const record = JSON.parse(line.slice("warn: ".length));
    expect(record.reaped[stuck.id]).toBe("stopped");
    expect(Date.parse(record.ts)).toBeGreaterThan(0);
    const run = await t.api("GET", `/v1/runs/${stuck.id}`);
    expect(run.json).toMatchObject({ status: "stopped", reason: "reaped" });
  });
});

describe("reaper: lingering runs", () => {
  /** A run whose commands ended and whose proxy lingers until `until`; its alarm lost or not. */
  async function lingeringRun(t: Awaited<ReturnType<typeof newTenant>>, until: number, alarm: number | null) {
    const run = await newRun(t, { status: "lingering", spec: { commands: ["true"], egress: "direct" } });
    await withDb((db) =>
      db
        .update(runs)
        .set({ lingerSeconds: 3600, lingerUntil: new Date(until), lingerPausedAt: new Date(until - 1000) })
        .where(eq(runs.id, run.id)),
    );
    const outcome: Final = { to: "finished", reason: "completed", detail: "Every command exited 0." };
    const state: StoredState = {
      runId: run.id,
      state: "lingering",
      attempt: 0,
      faults: 0,
      enteredAt: until - 3_600_000,
      cancel: false,
      final: outcome,
      spec: { commands: ["true"], egress: "direct", onProxyFailure: "stop" },
      policy: {
        version: 1,
        routing: { mode: "default", reasons: [] },
        enforce: true,
        hostsFile: [],
        note: null,
      },
      // No sandbox rows: the teardown has nothing to ask a backend for (none is configured here).
      network: { sandboxId: "sbx_gone", created: true },
      proxy: { launches: 1, execId: "proxy-1", caCertPem: "CA", unfiltered: false },
      workers: [],
      traceBytes: 0,
      linger: {
        seconds: 3600,
        startedAt: until - 3_600_000,
        lastActivity: until - 3_600_000,
        paused: true,
        pauses: 1,
        outcome,
      },
    };
    await runInDurableObject(coordinatorStub(env, run.id), async (_o, ctx) => {
      await ctx.storage.put("machine", state);
      if (alarm !== null) await ctx.storage.setAlarm(alarm);
    });
    return run;
  }

  it("ends a linger whose window lapsed and whose alarm was lost (linger_lapsed); never a live one", async () => {
    const t = await newTenant();
    const sweep = SWEEP_AT();
    const lapsed = await lingeringRun(t, sweep - LINGER_GRACE_MS - 60_000, null);
    const live = await lingeringRun(t, Date.now() + DAY, Date.now() + DAY);
    await age(live.id, 9 * DAY + STALE_MS + 60_000);
    const report = await reconcile(env, sweep);
    expect(report.reaped[lapsed.id]).toBe("stopping");
    expect(report.reaped[live.id]).toBeUndefined();
    expect(report.nudged[live.id]).toBe("alive");
    await driveUntil(lapsed.id, async () => isTerminal(await snap(lapsed.id)));
    const ended = await t.api("GET", `/v1/runs/${lapsed.id}`);
    expect(ended.json).toMatchObject({ status: "finished", reason: "linger_lapsed" });
    expect(ended.json.reasonDetail).toContain("completed");
    expect(await snap(live.id)).toBe("lingering");
    expect((await coordinatorStub(env, live.id).snapshot())?.linger?.paused).toBe(true);
    // Its proxy credentials were revoked with the end of the linger.
    const [row] = await withDb((db) =>
      db.select({ token: runs.proxyTokenHash }).from(runs).where(eq(runs.id, lapsed.id)),
    );
    expect(row?.token).toBeNull();
  });
});

async function snap(runId: string): Promise<RunState> {
  const [row] = await withDb((db) => db.select({ status: runs.status }).from(runs).where(eq(runs.id, runId)));
  if (!row) throw new Error(`no run ${runId}`);
  return row.status;
}
