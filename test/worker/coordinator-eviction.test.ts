import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { asc, eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { loadConfig } from "../../src/config";
import { coordinatorStub } from "../../src/coordinator/client";
import type { RunCoordinator } from "../../src/coordinator/run-coordinator";
import type { MachineState } from "../../src/coordinator/state";
import { runEvents, runs } from "../../src/db/schema";
import { createRun } from "../../src/runs/service";
import { newTenant, type Tenant, withDb } from "./harness";

// case E6: a Durable Object alarm that throws is retried and is idempotent; an eviction mid-run
// keeps state. Shown inside workerd on the real RunCoordinator against the real Postgres; with no
// compute backend here a run goes queued → fetching_vault → starting_proxy → finishing → stopped
// (backend_not_configured).
// - Eviction: ctx.abort() drops the instance (the next call gets a new object: identity checked)
//   and keeps storage; the run then ends exactly as an uninterrupted one, each transition once
//   (run_events is unique on (run, key), so what can go wrong is a state skipped or repeated
//   under another key: the list of transitions is compared whole). workerd logs the abort as an
//   uncaught exception; that is expected.
// - Retry: the runtime retries an alarm that threw with the storage it had before the throw. No
//   honest way makes alarm() itself throw here (step() catches what its ports throw), so every
//   step is replayed from the storage taken before it, i.e. a crash after the step's side effects
//   but before its save: the trace and the run row must come out as after one run.
// - A cancel stored between two alarms survives an eviction (it lives under its own key).
// The runtime fires an alarm set for "now" by itself, within milliseconds, which would race a
// test's runDurableObjectAlarm; so alarms are fired here as runDurableObjectAlarm fires them, but
// inside blockConcurrencyWhile, and the next one is parked an hour out: only the test fires them.

const PARKED_MS = 60 * 60_000;
const stub = (runId: string) => coordinatorStub(env, runId);

/** Runs fn in the run's object with no other event let in, then parks any pending alarm. */
function inObject<T>(runId: string, fn: (o: RunCoordinator, s: DurableObjectState) => Promise<T>) {
  return runInDurableObject(stub(runId), (o: RunCoordinator, s) =>
    s.blockConcurrencyWhile(async () => {
      const out = await fn(o, s);
      if ((await s.storage.getAlarm()) !== null) await s.storage.setAlarm(Date.now() + PARKED_MS);
      return out;
    }),
  );
}

/** What POST /v1/runs does (the row, its t:queued, the coordinator's start), alarm parked. */
async function launch(t: Tenant): Promise<string> {
  const owner = { userId: t.userId, environmentId: t.environmentId };
  const run = await withDb((db) =>
    createRun(db, owner, RunSpec.parse({ commands: ["true"] }), "local", loadConfig(env).maxActiveRuns),
  );
  await inObject(run.id, (o) => o.start(run.id));
  return run.id;
}

/** The pending alarm, run now (getAlarm, deleteAlarm, alarm(): what runDurableObjectAlarm does). */
const fire = (runId: string) =>
  inObject(runId, async (o, s) => {
    if ((await s.storage.getAlarm()) === null) return false;
    await s.storage.deleteAlarm();
    await o.alarm();
    return true;
  });

const stored = <T>(runId: string, key: string) =>
  runInDurableObject(stub(runId), (_o, s) => s.storage.get<T>(key));
const machine = (runId: string) => stored<MachineState>(runId, "machine");
const instance = (runId: string) => runInDurableObject(stub(runId), (o: RunCoordinator) => o);

/** Fires alarms until none is left; the machine's state after each. */
async function driveToEnd(runId: string): Promise<(string | undefined)[]> {
  const states = [];
  for (let i = 0; i < 20 && (await fire(runId)); i++) states.push((await machine(runId))?.state);
  return states;
}

/** Evicts the object: ctx.abort() resets it; the next call must get a new instance. */
async function evict(runId: string): Promise<void> {
  const old = await instance(runId);
  await expect(runInDurableObject(stub(runId), (_o, s) => s.abort("evicted by the test"))).rejects.toThrow(
    "evicted by the test",
  );
  expect(await instance(runId)).not.toBe(old);
}

const trace = (runId: string) =>
  withDb((db) => db.select().from(runEvents).where(eq(runEvents.runId, runId)).orderBy(asc(runEvents.id)));
const transitions = (rows: { kind: string; state: string | null }[]) =>
  rows.filter((e) => e.kind === "transition").map((e) => e.state);
const row = async (runId: string) =>
  (await withDb((db) => db.select().from(runs).where(eq(runs.id, runId))))[0];

/**
 * What a step leaves behind. The row's updatedAt is left out: it says when the coordinator last
 * touched the row (the reaper's liveness signal), and a replayed step does touch it.
 */
async function observe(runId: string) {
  const { updatedAt: _, ...fields } = (await row(runId)) ?? {};
  return { trace: await trace(runId), row: fields, state: (await machine(runId))?.state };
}

const NO_BACKEND = ["queued", "fetching_vault", "starting_proxy", "finishing", "stopped"];

describe("run coordinator: retries, replays and evictions (E6)", () => {
  it("an eviction mid-run keeps its state; the run ends as an uninterrupted one, each transition once", async () => {
    const t = await newTenant();
    const plain = await launch(t);
    expect(await driveToEnd(plain)).toEqual(NO_BACKEND.slice(1));

    const id = await launch(t);
    expect(await fire(id)).toBe(true);
    const mid = await machine(id);
    expect(mid?.state).toBe("fetching_vault");
    expect((await row(id))?.status).toBe("fetching_vault");
    const same = await instance(id);
    expect(await instance(id)).toBe(same); // without an eviction the object stays: evict() can fail
    await evict(id);
    expect(await machine(id)).toEqual(mid);

    expect(await driveToEnd(id)).toEqual(NO_BACKEND.slice(2));
    expect(await row(id)).toMatchObject({ status: "stopped", reason: "backend_not_configured" });
    expect((await row(plain))?.reason).toBe("backend_not_configured");
    const shape = (rows: Awaited<ReturnType<typeof trace>>) =>
      rows.map(({ key, kind, state, reason, detail }) => ({ key, kind, state, reason, detail }));
    const evicted = await trace(id);
    expect(transitions(evicted)).toEqual(NO_BACKEND);
    expect(shape(evicted)).toEqual(shape(await trace(plain)));
  });

  it("every alarm replayed after its side effects but before its save changes nothing twice", async () => {
    const t = await newTenant();
    const id = await launch(t);
    const states = [];
    for (let i = 0; i < 20; i++) {
      const before = await inObject(id, async (_o, s) => [...(await s.storage.list())]);
      if (!(await fire(id))) break;
      const once = await observe(id);
      // The retry sees the storage as it was before the step: its save never happened.
      await inObject(id, async (_o, s) => {
        await s.storage.delete([...(await s.storage.list()).keys()]);
        await s.storage.put(Object.fromEntries(before));
        await s.storage.setAlarm(Date.now());
      });
      expect(await fire(id)).toBe(true);
      const twice = await observe(id);
      expect(twice, `step ${i} replayed`).toEqual(once);
      states.push(once.state);
    }
    expect(states).toEqual(NO_BACKEND.slice(1));
    expect(transitions(await trace(id))).toEqual(NO_BACKEND);
  });

  it("a cancel stored between two alarms is honoured after an eviction", async () => {
    const t = await newTenant();
    const id = await launch(t);
    await fire(id);
    expect(await inObject(id, (o) => o.cancel())).toBe(true);
    await evict(id);
    expect(await stored(id, "cancel")).toBe("cancelled");
    expect((await machine(id))?.cancel).toBe(false); // no step has seen it yet: only its key holds it
    expect(await driveToEnd(id)).toEqual(["stopped"]);
    expect(await row(id)).toMatchObject({ status: "stopped", reason: "cancelled" });
    expect(transitions(await trace(id))).toEqual(["queued", "fetching_vault", "finishing", "stopped"]);
  });
});
