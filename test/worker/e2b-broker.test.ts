import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { brokerStub, SandboxBroker, sweepBrokerStub } from "../../src/broker/sandbox-broker";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { brokerValue } from "../../src/coordinator/ports";
import { randomId } from "../../src/crypto/api-keys";
import { runs, sandboxes } from "../../src/db/schema";
import { body, contractSandboxes, e2b, e2bDeployment, META, SLOW } from "./e2b-fixtures";
import { newTenant, withDb } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { newRun } from "./run-fixtures";

// The e2b backend through the sandbox broker, inside workerd, with the real `e2b` SDK against the
// E2B CONTRACT SERVER (test/contract/e2b-server.ts): a run's proxy, work and task sandboxes made,
// run and torn down as the coordinator does it, searched for every secret the run holds, and the
// orphan sweep. Apart from the backend's own tests (e2b-create, e2b-execs, e2b-lifecycle): here
// the broker, its Durable Object and the database rows are in the loop.

const { ENV, backend, requests, mark } = e2bDeployment("https://broker.contract.test", { unowned: true });

describe("e2b backend through the sandbox broker", SLOW, () => {
  it("no vault secret, no E2B key, no proxy credential in any work or task sandbox request", async () => {
    const t = await newTenant();
    const canary = newCanary("e2b");
    const put = await t.api("POST", "/v1/vault/secrets", { name: "OPENAI_API_KEY", value: canary });
    expect(put.status).toBe(201);
    const run = await newRun(t);
    await withDb((db) => db.update(runs).set({ backend: "e2b" }).where(eq(runs.id, run.id)));
    const over = { ...env, ...ENV, COMPUTE_BACKEND: "e2b" };
    const since = await mark();
    const [proxyId, workId, taskId] = [randomId("sbx_"), randomId("sbx_"), randomId("sbx_")];
    const made = await runInDurableObject(brokerStub(env, run.id), async (_i, state) => {
      const broker = new SandboxBroker(state, over);
      const exec = (...args: Parameters<SandboxBroker["exec"]>) => broker.exec(...args).then(brokerValue);
      const proxy = await broker.create(run.id, { id: proxyId, kind: "proxy" });
      await exec(run.id, proxyId, {
        id: "proxy-1",
        argv: ["bw-proxy"],
        env: { ...PROXY_ENV, BW_RUN_ID: run.id, BW_PROXY_TOKEN: run.proxyToken, BW_AUDIT_KEY: run.auditKey },
        stage: "setup",
        timeoutMs: null,
      });
      const work = await broker.create(run.id, {
        id: workId,
        kind: "work",
        taskIndex: null,
        proxySandboxId: proxyId,
        routing: "default",
        hostsFile: ["api.openai.com"],
      });
      const task = await broker.create(run.id, {
        id: taskId,
        kind: "task",
        taskIndex: 0,
        proxySandboxId: proxyId,
        routing: "catch-all",
        hostsFile: [],
      });
      for (const id of [workId, taskId]) {
        await exec(run.id, id, {
          id: "wiring",
          argv: ["bw-wiring"],
          env: {},
          stage: "setup",
          stdin: JSON.stringify({ mode: "default", proxyAddress: "127.0.0.1" }),
          timeoutMs: 60_000,
        });
        await exec(run.id, id, {
          id: "cmd-0",
          argv: ["sh", "-c", "echo hello"],
          env: {},
          stage: "execute",
          timeoutMs: 600_000,
        });
      }
      return { proxy, work, task };
    });
    expect(made.proxy.ok && made.work.ok && made.task.ok).toBe(true);
    const ids = new Set(
      [made.work, made.task].map((m) => (m.ok ? m.value.address : "")).filter((a) => a !== ""),
    );
    const rs = await requests(since);
    const theirs = rs.filter(
      (r) =>
        (r.sandboxId !== null && ids.has(r.sandboxId)) ||
        (r.path === "/v2/sandboxes" && body(r)?.metadata?.[META.kind] !== "proxy" && r.method === "POST"),
    );
    expect(theirs.length).toBeGreaterThan(8);
    const needles = [
      ...(await leakNeedles(canary)),
      ...(await leakNeedles(e2b.apiKey)),
      ...(await leakNeedles(run.proxyToken)),
      ...(await leakNeedles(run.auditKey)),
    ];
    expect(theirs.flatMap((r) => findNeedles(`${r.method} ${r.path}`, JSON.stringify(r), needles))).toEqual(
      [],
    );
    // The search finds what is there: the proxy token is in the proxy's own launch, once.
    const tokenNeedles = await leakNeedles(run.proxyToken);
    expect(rs.filter((r) => findNeedles("", JSON.stringify(r), tokenNeedles).length > 0)).toHaveLength(1);
    // No sandbox of the run carries settings of its own (envs), nor anything secret in metadata.
    for (const s of await contractSandboxes(run.id)) {
      expect(s.envVars).toEqual({});
      expect(findNeedles(s.sandboxID, JSON.stringify(s), needles)).toEqual([]);
    }

    // Teardown through the broker: every sandbox of the run killed, work and task first.
    const destroyed = await runInDurableObject(brokerStub(env, run.id), (_i, state) =>
      new SandboxBroker(state, over).destroyRun(run.id).then(brokerValue),
    );
    expect(destroyed).toBe(3);
    expect(await contractSandboxes(run.id)).toEqual([]);
    const rows = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.runId, run.id)));
    expect(rows.every((r) => r.status === "destroyed" && r.backend === "e2b")).toBe(true);
  });

  it("the orphan sweep destroys an E2B sandbox no live row owns, and leaves a live one", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    await withDb((db) => db.update(runs).set({ backend: "e2b" }).where(eq(runs.id, run.id)));
    const over = { ...env, ...ENV, COMPUTE_BACKEND: "e2b" };
    const live = randomId("sbx_");
    await runInDurableObject(brokerStub(env, run.id), (_i, state) =>
      new SandboxBroker(state, over).create(run.id, { id: live, kind: "proxy" }),
    );
    const orphan = randomId("sbx_");
    await backend().create({ kind: "proxy", id: orphan, runId: randomId("run_") });
    const swept = await runInDurableObject(sweepBrokerStub(env), (_i, state) =>
      new SandboxBroker(state, over).sweepUnowned().then(brokerValue),
    );
    expect(swept).toMatchObject({ destroyed: expect.arrayContaining([orphan]) });
    expect((swept as { destroyed: string[] }).destroyed).not.toContain(live);
    const ids = (await backend().list()).map((l) => l.id);
    expect(ids).toContain(live);
    expect(ids).not.toContain(orphan);
    await backend().destroy(live);
  });
});
