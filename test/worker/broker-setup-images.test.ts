import { DEFAULT_RESOURCES } from "@benchwright/shared/contract/local-agent";
import type { SetupImageInputs } from "@benchwright/shared/contract/setup-image";
import { and, eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { BackendError, type SandboxSpec } from "../../src/broker/backend";
import type { SandboxRequest, SetupImageRequest } from "../../src/broker/interface";
import { sweepLayers, UNNAMED_LAYER_MS } from "../../src/broker/setup-images";
import { randomId } from "../../src/crypto/api-keys";
import { sandboxes, setupImages } from "../../src/db/schema";
import { recordingBackend, sandboxRow, withBackend } from "./broker-fixtures";
import { newTenant, type Tenant, withDb } from "./harness";
import { newRun } from "./run-fixtures";

// The broker keeps setup images for a run's own environment only: it reads the digest a sandbox
// starts from itself, from that environment's built row, so a run naming another environment's
// key, or one not built, starts nothing (case P3). Real Postgres, the broker's real Durable
// Object; the backend records what it is handed (test/worker/broker-fixtures.ts).

const hex = () =>
  Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, "0")).join("");
const newDigest = () => `sha256:${hex()}` as const;
const BASE = `sha256:${"b".repeat(64)}`;
const MIB = 1024 * 1024;

const INPUTS: SetupImageInputs = {
  format: 1,
  backend: "local",
  base: BASE,
  bundle: null,
  setup: ["true"],
  resources: { memoryMb: 2048, pids: 1024 },
};

/** A setup image row as the broker leaves one it recorded (status built unless said). */
async function imageRow(
  t: Tenant,
  fields: { key?: string; digest?: string; runId?: string | null; sizeBytes?: number } & Partial<
    Pick<typeof setupImages.$inferInsert, "status" | "backend">
  > = {},
) {
  const row = {
    id: randomId("simg_"),
    environmentId: t.environmentId,
    key: fields.key ?? hex(),
    status: fields.status ?? "built",
    backend: fields.backend ?? "local",
    inputs: INPUTS,
    digest: fields.digest ?? newDigest(),
    sizeBytes: fields.sizeBytes ?? 1000,
    files: 1,
    builtByRunId: fields.runId ?? null,
    builtAt: new Date(),
  } as const;
  await withDb((db) => db.insert(setupImages).values(row));
  return row;
}

async function rowOf(t: Tenant, key: string) {
  const [row] = await withDb((db) =>
    db
      .select()
      .from(setupImages)
      .where(and(eq(setupImages.environmentId, t.environmentId), eq(setupImages.key, key))),
  );
  return row ?? null;
}

function task(
  proxySandboxId: string,
  extra: Partial<Exclude<SandboxRequest, { kind: "proxy" }>> = {},
): SandboxRequest {
  return {
    id: randomId("sbx_"),
    kind: "task",
    taskIndex: 0,
    proxySandboxId,
    routing: "default",
    hostsFile: [],
    ...extra,
  };
}

const setup = (over: Partial<SetupImageRequest> = {}): SetupImageRequest => ({
  setup: ["pip install thing"],
  bundle: null,
  resources: DEFAULT_RESOURCES.task,
  mode: "use",
  ...over,
});

describe("broker: starting from a setup image (case P3)", () => {
  // case P3
  it("case P3: a key another environment built, one not built, or one of another backend is refused before the backend", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const [runA, runB] = [await newRun(a), await newRun(b)];
    const theirs = await imageRow(b, { runId: runB.id });
    const building = await imageRow(a, { status: "building", digest: undefined });
    await withDb((db) => db.update(setupImages).set({ digest: null }).where(eq(setupImages.id, building.id)));
    const otherBackend = await imageRow(a, { backend: "e2b" });
    const proxy = await sandboxRow(runA.id, "proxy");
    const backend = recordingBackend({ base: BASE });
    const asked = [theirs.key, building.key, otherBackend.key, hex()];
    const answers = await withBackend(backend, async (broker) => {
      const out: unknown[] = [];
      for (const key of asked) out.push(await broker.create(runA.id, task(proxy, { setupImage: { key } })));
      return out;
    });
    for (const answer of answers) {
      expect(answer).toMatchObject({ ok: false, code: "setup_image_not_found", retryable: false });
    }
    expect(backend.calls).toEqual([]);
    // Nothing was recorded for the refused sandboxes either.
    const rows = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.runId, runA.id)));
    expect(rows.map((r) => r.id)).toEqual([proxy]);
  });

  // case P3
  it("case P3: the backend is given exactly the digest of the run's own environment's image", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const [runA, runB] = [await newRun(a), await newRun(b)];
    const key = hex();
    // The other environment's row first: a lookup by key alone would find it first.
    await imageRow(b, { key, runId: runB.id });
    const mine = await imageRow(a, { key, runId: runA.id });
    const proxy = await sandboxRow(runA.id, "proxy");
    const backend = recordingBackend({ base: BASE });
    const made = await withBackend(backend, (broker) =>
      broker.create(runA.id, task(proxy, { setupImage: { key } })),
    );
    expect(made).toMatchObject({ ok: true });
    const [create] = backend.calls;
    const spec = create?.args[0] as Exclude<SandboxSpec, { kind: "proxy" }>;
    expect(spec.layer).toEqual({ digest: mine.digest, environmentId: a.environmentId });
    expect(spec.capture).toBeUndefined();
    expect((await rowOf(a, key))?.lastUsedAt).toBeInstanceOf(Date);
    expect((await rowOf(b, key))?.lastUsedAt).toBeNull();
  });

  it("a sandbox asked both to start from an image and to capture one is refused", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const image = await imageRow(t, { runId: run.id });
    const proxy = await sandboxRow(run.id, "proxy");
    const backend = recordingBackend({ base: BASE });
    const made = await withBackend(backend, (broker) =>
      broker.create(run.id, task(proxy, { setupImage: { key: image.key }, capture: true })),
    );
    expect(made).toMatchObject({ ok: false, code: "invalid_request" });
    expect(backend.calls).toEqual([]);
  });

  // case P6
  it("case P6: a layer the backend finds missing or mismatching drops the row, so the next claim builds it", async () => {
    for (const code of ["setup_image_missing", "setup_image_mismatch"] as const) {
      const t = await newTenant();
      const run = await newRun(t);
      const proxy = await sandboxRow(run.id, "proxy");
      const backend = recordingBackend({
        base: BASE,
        createError: new BackendError(code, "the stored layer does not hash to its digest"),
      });
      const request = setup();
      const key = await withBackend(backend, async (broker) => {
        // Built once by this environment (the broker's own claim and capture).
        const builder = await sandboxRow(run.id, "work");
        const claimed = await broker.claimSetupImage(run.id, builder, request);
        if (!claimed.ok || claimed.value.role !== "build")
          throw new Error(`expected build: ${JSON.stringify(claimed)}`);
        backend.setupImages.capture = async () => ({ digest: newDigest(), bytes: 10, files: 1 });
        expect(await broker.captureSetupImage(run.id, builder, claimed.value.key)).toMatchObject({
          ok: true,
        });
        const made = await broker.create(run.id, task(proxy, { setupImage: { key: claimed.value.key } }));
        expect(made).toMatchObject({ ok: false, code });
        const again = await broker.claimSetupImage(run.id, randomId("sbx_"), request);
        expect(again).toMatchObject({ ok: true, value: { role: "build" } });
        return claimed.value.key;
      });
      expect(await rowOf(t, key)).toMatchObject({ status: "building", digest: null });
      // The refused sandbox was not left behind.
      expect(backend.calls.map((c) => c.method)).toEqual(["captureLayer", "create", "destroy"]);
    }
  });
});

describe("broker: claiming and capturing setup images", () => {
  // case P1
  it("case P1: the key a claim computes changes with setup, bundle, memory, pids and base, not with the run or cpus", async () => {
    const t = await newTenant();
    const backend = recordingBackend({ base: BASE });
    const keyOf = async (request: SetupImageRequest) => {
      const run = await newRun(t);
      const answer = await withBackend(backend, (broker) =>
        broker.claimSetupImage(run.id, randomId("sbx_"), request),
      );
      if (!answer.ok || answer.value.role === "none") throw new Error(JSON.stringify(answer));
      return answer.value.key;
    };
    const marker = hex(); // a setup of this test's own, so its keys are new
    const base = setup({ setup: [`echo ${marker}`, "pip install thing"] });
    const key = await keyOf(base);
    // Another run, other cpus: the same key (this second claim waits for the first's build).
    expect(await keyOf(base)).toBe(key);
    expect(await keyOf({ ...base, resources: { ...base.resources, cpus: 4 } })).toBe(key);
    const changed = [
      { ...base, setup: [...base.setup].reverse() },
      { ...base, setup: [...base.setup, "true"] },
      { ...base, bundle: hex() },
      { ...base, resources: { ...base.resources, memoryMb: 4096 } },
      { ...base, resources: { ...base.resources, pids: 2048 } },
    ];
    const keys = new Set([key]);
    for (const request of changed) keys.add(await keyOf(request));
    backend.setupImages.base = `sha256:${"c".repeat(64)}`;
    keys.add(await keyOf(base));
    expect(keys.size).toBe(changed.length + 2);
  });

  it("a backend that keeps no setup images, or a sandbox with no setup, is answered none", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const backend = recordingBackend({ base: null });
    const [noBase, noSetup] = await withBackend(backend, async (broker) => [
      await broker.claimSetupImage(run.id, randomId("sbx_"), setup()),
      await broker.claimSetupImage(run.id, randomId("sbx_"), setup({ setup: [] })),
    ]);
    expect(noBase).toMatchObject({ ok: true, value: { role: "none" } });
    expect(noBase.ok && noBase.value.role === "none" && noBase.value.reason).toContain("local backend");
    expect(noSetup).toMatchObject({ ok: true, value: { role: "none" } });
  });

  it("another run's sandbox cannot claim, and only the builder captures; its capture is then used", async () => {
    const t = await newTenant();
    const [run, other] = [await newRun(t), await newRun(t)];
    const [builder, bystander] = [await sandboxRow(run.id, "work"), await sandboxRow(run.id, "task")];
    const theirs = await sandboxRow(other.id, "task");
    const digest = newDigest();
    const backend = recordingBackend({
      base: BASE,
      capture: async () => ({ digest, bytes: 5 * MIB, files: 7 }),
    });
    const request = setup({ setup: [`echo ${hex()}`] });
    const { key, refusedClaim, refused, captured, again, later, theirsAfter } = await withBackend(
      backend,
      async (broker) => {
        const refusedClaim = await broker.claimSetupImage(run.id, theirs, request);
        const claimed = await broker.claimSetupImage(run.id, builder, request);
        if (!claimed.ok || claimed.value.role !== "build") throw new Error(JSON.stringify(claimed));
        const key = claimed.value.key;
        const refused = await broker.captureSetupImage(run.id, bystander, key);
        const captured = await broker.captureSetupImage(run.id, builder, key);
        // A coordinator step replayed after a crash asks again: the kept answer, nothing new.
        const again = await broker.captureSetupImage(run.id, builder, key);
        const later = await broker.claimSetupImage(other.id, randomId("sbx_"), request);
        const theirsAfter = await broker.captureSetupImage(other.id, theirs, key);
        return { key, refusedClaim, refused, captured, again, later, theirsAfter };
      },
    );
    expect(refusedClaim).toMatchObject({ ok: false, code: "not_found" });
    expect(refused).toMatchObject({ ok: false, code: "setup_image_not_found" });
    expect(captured).toEqual({ ok: true, value: { digest, bytes: 5 * MIB, files: 7 } });
    expect(again).toEqual(captured);
    // Another run's sandbox asking after the build is no repeat, whatever its backend answers.
    expect(theirsAfter).toMatchObject({ ok: false, code: "setup_image_not_found" });
    expect(later).toMatchObject({ ok: true, value: { role: "use", key, digest, builtByRunId: run.id } });
    expect(backend.calls.filter((c) => c.method === "captureLayer").map((c) => c.sandboxId)).toEqual([
      builder,
      builder,
    ]);
    expect(await rowOf(t, key)).toMatchObject({ status: "built", digest, sizeBytes: 5 * MIB, files: 7 });
  });

  // case P6
  it("case P6: a capture past the layer bound answers setup_image_too_large naming it, and releases the claim", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const builder = await sandboxRow(run.id, "work");
    const backend = recordingBackend({
      base: BASE,
      capture: async (_id, maxBytes) => {
        throw new BackendError("setup_image_too_large", `the layer passed ${maxBytes} bytes`);
      },
    });
    const request = setup({ setup: [`echo ${hex()}`] });
    const { key, answer } = await withBackend(
      backend,
      async (broker) => {
        const claimed = await broker.claimSetupImage(run.id, builder, request);
        if (!claimed.ok || claimed.value.role !== "build") throw new Error(JSON.stringify(claimed));
        return {
          key: claimed.value.key,
          answer: await broker.captureSetupImage(run.id, builder, claimed.value.key),
        };
      },
      { SETUP_IMAGE_MAX_LAYER_MB: "1" },
    );
    expect(answer).toMatchObject({ ok: false, code: "setup_image_too_large" });
    expect(!answer.ok && answer.message).toMatch(/1 MiB \(SETUP_IMAGE_MAX_LAYER_MB\)/);
    expect(backend.calls.find((c) => c.method === "captureLayer")?.args).toEqual([MIB]);
    expect(await rowOf(t, key)).toBeNull();
  });

  // case P6
  it("case P6: past the environment's room the capture answers setup_images_full; a full environment builds nothing new", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    await imageRow(t, { sizeBytes: 4.5 * MIB, runId: run.id });
    const builder = await sandboxRow(run.id, "work");
    const backend = recordingBackend({
      base: BASE,
      capture: async () => {
        throw new BackendError("setup_image_too_large", "too large");
      },
    });
    const bounds = { SETUP_IMAGE_MAX_LAYER_MB: "4", SETUP_IMAGE_MAX_ENVIRONMENT_MB: "5" };
    const request = setup({ setup: [`echo ${hex()}`] });
    const { key, answer, whenFull } = await withBackend(
      backend,
      async (broker) => {
        const claimed = await broker.claimSetupImage(run.id, builder, request);
        if (!claimed.ok || claimed.value.role !== "build") throw new Error(JSON.stringify(claimed));
        const answer = await broker.captureSetupImage(run.id, builder, claimed.value.key);
        await imageRow(t, { sizeBytes: 0.5 * MIB, runId: run.id });
        const whenFull = await broker.claimSetupImage(run.id, randomId("sbx_"), request);
        return { key: claimed.value.key, answer, whenFull };
      },
      bounds,
    );
    // The room left (0.5 MiB) was the tighter bound.
    expect(backend.calls.find((c) => c.method === "captureLayer")?.args).toEqual([0.5 * MIB]);
    expect(answer).toMatchObject({ ok: false, code: "setup_images_full" });
    expect(!answer.ok && answer.message).toContain("keeps 4.5 MiB");
    expect(!answer.ok && answer.message).toContain("bound of 5 MiB (SETUP_IMAGE_MAX_ENVIRONMENT_MB)");
    expect(await rowOf(t, key)).toBeNull();
    expect(whenFull).toMatchObject({ ok: true, value: { role: "none" } });
    expect(whenFull.ok && whenFull.value.role === "none" && whenFull.value.reason).toMatch(
      /^setup_images_full/,
    );
  });

  // case P6
  it("case P6: a run's teardown gives up what it was building: a failed setup is never cached", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const builder = await sandboxRow(run.id, "work");
    const backend = recordingBackend({ base: BASE });
    const request = setup({ setup: [`echo ${hex()}`] });
    const key = await withBackend(backend, async (broker) => {
      const claimed = await broker.claimSetupImage(run.id, builder, request);
      if (!claimed.ok || claimed.value.role !== "build") throw new Error(JSON.stringify(claimed));
      expect(await rowOf(t, claimed.value.key)).toMatchObject({ status: "building" });
      expect(await broker.destroyRun(run.id)).toEqual({ ok: true, value: 1 });
      return claimed.value.key;
    });
    expect(await rowOf(t, key)).toBeNull();
  });
});

describe("broker: dropping stored setup images", () => {
  it("drops layers, keeps one another row still names, reports one a live sandbox uses", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const [shared, alone, busy] = [newDigest(), newDigest(), newDigest()];
    for (const digest of [shared, alone, busy]) await imageRow(a, { digest, status: "dropping" });
    await imageRow(b, { digest: shared });
    const backend = recordingBackend({ inUse: [busy] });
    const answer = await withBackend(backend, (broker) =>
      broker.dropSetupImages(
        [shared, alone, busy].map((digest) => ({ backend: "local", digest, repository: null })),
      ),
    );
    expect(answer).toEqual({ ok: true, value: { dropped: [shared, alone], inUse: [busy] } });
    expect(backend.calls.map((c) => c.args[0])).toEqual([alone, busy]);
  });

  it("the sweep drops stored layers no row names once older than an hour, and none a sandbox uses", async () => {
    const t = await newTenant();
    const now = Date.now();
    const old = new Date(now - UNNAMED_LAYER_MS - 60_000).toISOString();
    const young = new Date(now - UNNAMED_LAYER_MS + 60_000).toISOString();
    const [named, orphan, fresh, used] = [newDigest(), newDigest(), newDigest(), newDigest()];
    await imageRow(t, { digest: named });
    const backend = recordingBackend({
      layers: [
        { digest: named, createdAt: old, inUse: 0 },
        { digest: orphan, createdAt: old, inUse: 0 },
        { digest: fresh, createdAt: young, inUse: 0 },
        { digest: used, createdAt: old, inUse: 1 },
      ],
    });
    const swept = await withDb((db) => sweepLayers(db, backend, now));
    expect(swept).toEqual({ dropped: [orphan], errors: [] });
    expect(backend.calls.map((c) => [c.method, c.args[0]])).toEqual([["dropLayer", orphan]]);
  });
});
