import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { DEFAULT_RESOURCES } from "@benchwright/shared/contract/local-agent";
import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import type { SandboxSpec } from "../../src/broker/backend";
import type { BrokerResult } from "../../src/broker/interface";
import { brokerStub, runBrokerName, SandboxBroker, SWEEP_BROKER_NAME } from "../../src/broker/sandbox-broker";
import { bundleKey } from "../../src/bundles/service";
import { loadConfig } from "../../src/config";
import { coordinatorStub } from "../../src/coordinator/client";
import { brokerValue } from "../../src/coordinator/ports";
import { RunCoordinator } from "../../src/coordinator/run-coordinator";
import { randomId } from "../../src/crypto/api-keys";
import { bundles, runs, sandboxes } from "../../src/db/schema";
import { ORPHAN_MS, reconcile } from "../../src/reaper/reconcile";
import { createRun } from "../../src/runs/service";
import { BACKEND, recordingBackend, sandboxRow, withBackend } from "./broker-fixtures";
import { newTenant, type Tenant, withDb } from "./harness";
import { newRun } from "./run-fixtures";

// The sandbox broker addresses a run's own sandboxes only (case C2 for the compute side). The
// backend it is given is a loopback port nothing listens on: a refusal must come before any call.

describe("sandbox broker", () => {
  it("refuses a work sandbox on another run's proxy sandbox → not_found, not retryable", async () => {
    const t = await newTenant();
    const [a, b] = [await newRun(t), await newRun(t)];
    const theirs = randomId("sbx_");
    await withDb((db) =>
      db
        .insert(sandboxes)
        .values({ id: theirs, runId: b.id, kind: "proxy", backend: "local", status: "ready" }),
    );
    const mine = randomId("sbx_");
    const result = await runInDurableObject(brokerStub(env, a.id), (_instance, state) =>
      new SandboxBroker(state, { ...env, ...BACKEND }).create(a.id, {
        id: mine,
        kind: "work",
        taskIndex: null,
        proxySandboxId: theirs,
        routing: "default",
        hostsFile: [],
      }),
    );
    expect(result).toMatchObject({ ok: false, code: "not_found", retryable: false });
    const [row] = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.id, theirs)));
    expect(row?.status).toBe("ready");
  });
});

describe("sandbox broker: bundles, seal, hosts", () => {
  it("makes every sandbox with limits: the run's, else its kind's defaults", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const backend = recordingBackend();
    const proxy = randomId("sbx_");
    const work = randomId("sbx_");
    const resources = { memoryMb: 4096, pids: 300, cpus: 2 };
    await withBackend(backend, async (broker) => {
      expect(await broker.create(run.id, { id: proxy, kind: "proxy" })).toMatchObject({ ok: true });
      const made = await broker.create(run.id, {
        id: work,
        kind: "work",
        taskIndex: null,
        proxySandboxId: proxy,
        routing: "default",
        hostsFile: [],
        resources,
      });
      expect(made).toMatchObject({ ok: true });
    });
    const specs = backend.calls.filter((c) => c.method === "create").map((c) => c.args[0] as SandboxSpec);
    expect(specs.map((s) => s.resources)).toEqual([DEFAULT_RESOURCES.proxy, resources]);
  });

  it("streams the run's bundle from R2 to the backend; the coordinator never holds it", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const work = await sandboxRow(run.id, "work");
    const bytes = new Uint8Array(200_000);
    for (let at = 0; at < bytes.length; at += 65_536) crypto.getRandomValues(bytes.subarray(at, at + 65_536));
    const sha256 = hex(await crypto.subtle.digest("SHA-256", bytes));
    await env.FILES.put(bundleKey(t.environmentId, sha256), bytes);
    await withDb((db) =>
      db
        .insert(bundles)
        .values({ environmentId: t.environmentId, sha256, size: bytes.length, files: 1, unpackedBytes: 1 }),
    );
    const backend = recordingBackend();
    const result = await withBackend(backend, (broker) =>
      broker
        .putBundle(run.id, work, { environmentId: t.environmentId, sha256, dir: "/home/sandbox" })
        .then(brokerValue),
    );
    expect(result).toEqual({ ok: true, files: 1, bytes: bytes.length });
    const [put] = backend.calls;
    expect(put?.method).toBe("putBundle");
    expect(put?.args[1]).toBe("/home/sandbox");
    expect(hex(await crypto.subtle.digest("SHA-256", put?.args[0] as Uint8Array))).toBe(sha256);
  });

  // case H3
  it("case H3: refuses another environment's bundle, another run's sandbox, or the proxy sandbox, before the backend", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const [runA, runB] = [await newRun(a), await newRun(b)];
    const workA = await sandboxRow(runA.id, "work");
    const workB = await sandboxRow(runB.id, "work");
    const proxyA = await sandboxRow(runA.id, "proxy");
    const gone = await sandboxRow(runA.id, "task", "destroyed");
    const sha256 = "b".repeat(64);
    await env.FILES.put(bundleKey(b.environmentId, sha256), "B's bundle");
    await withDb((db) =>
      db
        .insert(bundles)
        .values({ environmentId: b.environmentId, sha256, size: 10, files: 1, unpackedBytes: 1 }),
    );
    const backend = recordingBackend();
    const refusals = await withBackend(backend, async (broker) => {
      const out: string[] = [];
      const attempt = async (fn: () => Promise<BrokerResult<unknown>>) => {
        const answer = await fn();
        out.push(answer.ok ? "accepted" : answer.code);
      };
      const dir = "/home/sandbox";
      // A's run naming B's bundle: by A's environment it is not there; by B's, A's run is not B's.
      await attempt(() => broker.putBundle(runA.id, workA, { environmentId: a.environmentId, sha256, dir }));
      await attempt(() => broker.putBundle(runA.id, workA, { environmentId: b.environmentId, sha256, dir }));
      await attempt(() => broker.putBundle(runA.id, workB, { environmentId: b.environmentId, sha256, dir }));
      const seal = { routing: "default" as const, hostsFile: [], caCertPem: null };
      await attempt(() => broker.seal(runA.id, workB, seal));
      await attempt(() => broker.seal(runA.id, proxyA, seal));
      await attempt(() => broker.seal(runA.id, gone, seal));
      await attempt(() => broker.setHosts(runA.id, workB, ["api.example.com"]));
      await attempt(() => broker.setHosts(runA.id, proxyA, ["api.example.com"]));
      return out;
    });
    expect(refusals).toEqual([
      "bundle_not_found",
      "not_found",
      "not_found",
      "not_found",
      "not_found",
      "not_found",
      "not_found",
      "not_found",
    ]);
    expect(backend.calls).toEqual([]);
  });

  it("passes seal and setHosts on for the run's own work sandbox", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const work = await sandboxRow(run.id, "task");
    const backend = recordingBackend();
    const seal = { routing: "catch-all" as const, hostsFile: ["api.example.com"], caCertPem: "PEM" };
    const killed = await withBackend(backend, async (broker) => {
      const sealed = brokerValue(await broker.seal(run.id, work, seal));
      brokerValue(await broker.setHosts(run.id, work, ["api.example.com", "more.example.com"]));
      return sealed;
    });
    expect(killed).toEqual({ killed: 2 });
    expect(backend.calls.map((c) => [c.method, c.sandboxId, c.args[0]])).toEqual([
      ["seal", work, seal],
      ["setHosts", work, ["api.example.com", "more.example.com"]],
    ]);
  });
});

const hex = (buf: ArrayBuffer) =>
  [...new Uint8Array(buf)].map((x) => x.toString(16).padStart(2, "0")).join("");

/**
 * The Worker's env with its broker namespace watched: every call on a broker stub is recorded with
 * the name of the instance it went to (then made on the real Durable Object, unchanged).
 */
function watchedBrokers() {
  const real = env.SANDBOX_BROKER;
  const names = new Map<string, string>();
  const calls: Array<{ instance: string; method: string; runId: unknown }> = [];
  const namespace = {
    idFromName: (name: string) => {
      const id = real.idFromName(name);
      names.set(id.toString(), name);
      return id;
    },
    get: (id: DurableObjectId) => {
      const stub = real.get(id);
      const instance = names.get(id.toString()) ?? `unnamed ${id.toString()}`;
      return new Proxy(stub, {
        get(target, prop) {
          const value = Reflect.get(target, prop);
          if (typeof prop !== "string" || prop === "then" || typeof value !== "function") return value;
          return (...args: unknown[]) => {
            calls.push({ instance, method: prop, runId: args[0] });
            // Called on the stub itself: an RPC method's own `apply` would be a remote property.
            return (target as unknown as Record<string, (...a: unknown[]) => unknown>)[prop]?.(...args);
          };
        },
      });
    },
  };
  return { env: { ...env, SANDBOX_BROKER: namespace } as unknown as Env, calls };
}

/**
 * A run launched as POST /v1/runs records it, then its real coordinator (given `over` as its env)
 * driven to its end: with no compute backend here it asks its broker for the proxy sandbox, is
 * refused, and tears down. Alarms are fired here, inside blockConcurrencyWhile, never by the runtime.
 */
async function runThrough(over: Env, t: Tenant): Promise<string> {
  const owner = { userId: t.userId, environmentId: t.environmentId };
  const run = await withDb((db) =>
    createRun(db, owner, RunSpec.parse({ commands: ["true"] }), "local", loadConfig(env).maxActiveRuns),
  );
  await runInDurableObject(coordinatorStub(env, run.id), (_o, state) =>
    state.blockConcurrencyWhile(async () => {
      const coordinator = new RunCoordinator(state, over);
      await coordinator.start(run.id);
      for (let i = 0; i < 20 && (await state.storage.getAlarm()) !== null; i++) {
        await state.storage.deleteAlarm();
        await coordinator.alarm();
      }
      await state.storage.deleteAlarm();
    }),
  );
  return run.id;
}

describe("broker instances (issue 24)", () => {
  it("each run's calls go to its own broker instance, all of them to the same one", async () => {
    const watched = watchedBrokers();
    const t = await newTenant();
    const [a, b] = [await runThrough(watched.env, t), await runThrough(watched.env, t)];
    for (const runId of [a, b]) {
      const [row] = await withDb((db) => db.select().from(runs).where(eq(runs.id, runId)));
      expect(row).toMatchObject({ status: "stopped", reason: "backend_not_configured" });
    }
    const of = (runId: string) => watched.calls.filter((c) => c.runId === runId);
    // The coordinator asked for the proxy sandbox, then tore the run down: both on the run's broker.
    expect(of(a).map((c) => c.method)).toEqual(expect.arrayContaining(["create", "destroyRun"]));
    expect(of(b).map((c) => c.method)).toEqual(expect.arrayContaining(["create", "destroyRun"]));
    expect(new Set(of(a).map((c) => c.instance))).toEqual(new Set([runBrokerName(a)]));
    expect(new Set(of(b).map((c) => c.instance))).toEqual(new Set([runBrokerName(b)]));
    expect(watched.calls.filter((c) => c.runId !== a && c.runId !== b)).toEqual([]);
    // Different names are different objects.
    expect(brokerStub(env, a).id.equals(brokerStub(env, b).id)).toBe(false);
    expect(brokerStub(env, a).id.equals(brokerStub(env, a).id)).toBe(true);
  });

  it("the reaper tears a run down on that run's broker, and sweeps on the sweep's own instance", async () => {
    const watched = watchedBrokers();
    const t = await newTenant();
    // An ended run with a sandbox still recorded live, as seen from a sweep 19 days ago (the suite
    // shares its database; reaper.test.ts ages its rows by nine days, so this sweep misses them).
    const sweepAt = Date.now() - 19 * 24 * 60 * 60_000;
    const run = await newRun(t, { status: "stopped" });
    await withDb(async (db) => {
      await db
        .update(runs)
        .set({ endedAt: new Date(sweepAt - ORPHAN_MS - 60_000), updatedAt: new Date(sweepAt) })
        .where(eq(runs.id, run.id));
      await db
        .insert(sandboxes)
        .values({ id: randomId("sbx_"), runId: run.id, kind: "proxy", backend: "local" });
    });
    const report = await reconcile(watched.env, sweepAt);
    expect(report.tornDown[run.id]).toBeDefined();
    expect(watched.calls.filter((c) => c.runId === run.id)).toEqual([
      { instance: runBrokerName(run.id), method: "destroyRun", runId: run.id },
    ]);
    expect(watched.calls.filter((c) => c.method === "sweepUnowned")).toEqual([
      { instance: SWEEP_BROKER_NAME, method: "sweepUnowned", runId: undefined },
    ]);
    // Every call the sweep made went to a run's broker named for that run, or to the sweep's.
    for (const c of watched.calls) {
      expect(c.instance).toBe(
        c.method === "sweepUnowned" ? SWEEP_BROKER_NAME : runBrokerName(String(c.runId)),
      );
    }
    // The teardown failed (no backend here): leave no live sandbox for other files' sweeps.
    await withDb((db) =>
      db
        .update(sandboxes)
        .set({ status: "destroyed", destroyedAt: new Date() })
        .where(eq(sandboxes.runId, run.id)),
    );
  });
});
