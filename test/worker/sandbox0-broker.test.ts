import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { objectName, secretName } from "../../src/broker/kubernetes/manifests";
import { SandboxBroker } from "../../src/broker/sandbox-broker";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { brokerValue } from "../../src/coordinator/ports";
import { randomId } from "../../src/crypto/api-keys";
import { runs, sandboxes } from "../../src/db/schema";
import { expectBrokerFailure } from "./backend-fixtures";
import { newTenant, withDb } from "./harness";
import { newRun } from "./run-fixtures";
import { api, b64, envFor, k8s, LABEL, line, newNs, type Obj, objects, recorded } from "./sandbox0-fixtures";

// The sandbox0 backend through the SandboxBroker Durable Object: no credential reaches a work pod,
// another run's sandbox is refused before any Kubernetes call, and a run's teardown touches only
// its own objects. Apart because it drives the broker, the database and a tenant, not the backend.

describe("sandbox0 through the broker", () => {
  it("keeps every credential out of work pods, and refuses another run's sandbox before any Kubernetes call", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const brokerEnv = { ...env, COMPUTE_BACKEND: "sandbox0", ...envFor(ns) };
    // An instance of its own: this test calls about two runs through one broker object.
    const stub = env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.newUniqueId());
    const broker = <T>(fn: (b: SandboxBroker) => Promise<T>) =>
      runInDurableObject(stub, (_instance, state) => fn(new SandboxBroker(state, brokerEnv)));

    const tenant = await newTenant();
    const vaultCanary = `vault-canary-${crypto.randomUUID()}`;
    expect(
      (await tenant.api("POST", "/v1/vault/secrets", { name: "CANARY", value: vaultCanary })).status,
    ).toBe(201);
    const [a, other] = [await newRun(tenant), await newRun(tenant)];
    for (const r of [a, other]) {
      await withDb((db) => db.update(runs).set({ backend: "sandbox0" }).where(eq(runs.id, r.id)));
    }
    const proxyA = randomId("sbx_");
    const proxyB = randomId("sbx_");
    expect(await broker((b) => b.create(a.id, { id: proxyA, kind: "proxy" }))).toMatchObject({ ok: true });
    expect(await broker((b) => b.create(other.id, { id: proxyB, kind: "proxy" }))).toMatchObject({
      ok: true,
    });
    const [row] = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.id, proxyA)));
    expect(row).toMatchObject({ backend: "sandbox0", status: "ready" });
    await broker((b) =>
      b
        .exec(a.id, proxyA, {
          id: "proxy-1",
          argv: ["bw-proxy"],
          env: { ...PROXY_ENV, BW_RUN_ID: a.id, BW_PROXY_TOKEN: a.proxyToken, BW_AUDIT_KEY: a.auditKey },
          stage: "setup",
          timeoutMs: null,
        })
        .then(brokerValue),
    );
    const work = { kind: "work" as const, taskIndex: null, hostsFile: ["api.example.com"] };
    const made = await broker((b) =>
      b.create(a.id, { ...work, id: randomId("sbx_"), proxySandboxId: proxyA, routing: "catch-all" }),
    );
    expect(made).toMatchObject({
      ok: true,
      value: { routing: "catch-all", wiring: { hostsInstalled: true } },
    });
    await broker((b) =>
      b.create(a.id, {
        id: randomId("sbx_"),
        kind: "task",
        taskIndex: 0,
        hostsFile: [],
        proxySandboxId: proxyA,
        routing: "default",
      }),
    );

    // Another run's sandbox: refused by the broker, no request reaches Kubernetes.
    const mark = (await recorded(ns)).length;
    expect(
      await broker((b) =>
        b.create(a.id, { ...work, id: randomId("sbx_"), proxySandboxId: proxyB, routing: "default" }),
      ),
    ).toMatchObject({ ok: false, code: "not_found", retryable: false });
    await expectBrokerFailure(
      broker((b) => b.exec(a.id, proxyB, { argv: ["bw-proxy-view"], stage: "setup" })),
      "not_found",
    );
    await expectBrokerFailure(
      broker((b) => b.freeze(a.id, proxyB, true)),
      "not_found",
    );
    await expectBrokerFailure(
      broker((b) => b.poll(a.id, proxyB, "proxy-1", {})),
      "not_found",
    );
    expect((await recorded(ns)).length).toBe(mark);

    // Every request carried the token in its header only; no credential is in any pod but the
    // proxy's Secret reference, and the Secret is the only place the proxy's credentials are.
    const reqs = await recorded(ns);
    expect(reqs.every((r) => r.auth === "ok")).toBe(true);
    const everything = JSON.stringify(reqs);
    expect(everything).not.toContain(k8s.token);
    expect(everything).not.toContain(vaultCanary);
    const pods = reqs
      .filter((r) => r.method === "POST" && r.path.endsWith("/pods"))
      .map((r) => r.body as Obj);
    expect(pods.map((p) => p.metadata.labels[LABEL.kind])).toEqual(["proxy", "work", "task"]);
    for (const pod of pods) {
      const text = JSON.stringify(pod);
      for (const needle of [a.proxyToken, a.auditKey, b64(a.proxyToken), b64(a.auditKey)]) {
        expect(text).not.toContain(needle);
      }
      const refersToSecret =
        text.includes("secretKeyRef") || text.includes('"secret":') || text.includes(secretName(proxyA));
      expect(refersToSecret).toBe(pod.metadata.labels[LABEL.kind] === "proxy");
    }
    const carriers = reqs.filter((r) => JSON.stringify(r.body ?? null).includes(b64(a.proxyToken)));
    expect(carriers.map(line)).toEqual([`POST ${api(ns, "secrets")} 201`]);

    // Teardown of run A touches run A's objects only.
    const before = (await recorded(ns)).length;
    // Four rows: the refused work sandbox's row was written before the refusal (rows come first).
    expect(await broker((b) => b.destroyRun(a.id).then(brokerValue))).toBe(4);
    const teardown = (await recorded(ns)).slice(before);
    expect(teardown.some((r) => r.path.includes(objectName(proxyB)))).toBe(false);
    const left = await objects(ns);
    expect(
      [...left.pods, ...left.services, ...left.secrets, ...left.networkpolicies].map(
        (o) => o.metadata.labels[LABEL.run],
      ),
    ).toEqual([other.id, other.id]);
  });
});
