import type { SetupImageInputs, SetupImageMode } from "@benchwright/shared/contract/setup-image";
import { and, eq, sql } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { randomId } from "../../src/crypto/api-keys";
import { setupImages } from "../../src/db/schema";
import * as records from "../../src/setup-images/records";
import { newTenant, type Tenant, withDb } from "./harness";
import { newRun } from "./run-fixtures";

// Who builds a setup image: the setup_images rows arbitrate, on the real Postgres every isolate
// shares (src/setup-images/records.ts). Each claim below runs on a connection of its own, as
// claims from different runs' brokers would.

const INPUTS: SetupImageInputs = {
  format: 1,
  backend: "local",
  base: `sha256:${"0".repeat(64)}`,
  bundle: null,
  setup: ["pip install thing"],
  resources: { memoryMb: 2048, pids: 1024 },
};
const LEASE_MS = 120_000;

const newKey = () =>
  Array.from(crypto.getRandomValues(new Uint8Array(32)), (b) => b.toString(16).padStart(2, "0")).join("");
const digestOf = (c: string) => `sha256:${c.repeat(64)}` as const;

/** A claimant in the tenant's environment: a run of its own and a sandbox id. */
async function claimant(t: Tenant) {
  return { runId: (await newRun(t)).id, sandboxId: randomId("sbx_") };
}

function claim(
  t: Tenant,
  key: string,
  who: { runId: string; sandboxId: string },
  mode: SetupImageMode = "use",
) {
  return withDb((db) =>
    records.claim(db, {
      environmentId: t.environmentId,
      key,
      inputs: INPUTS,
      backend: "local",
      mode,
      leaseMs: LEASE_MS,
      ...who,
    }),
  );
}

function markBuilt(
  t: Tenant,
  key: string,
  who: { runId: string; sandboxId: string },
  digest: `sha256:${string}`,
) {
  return withDb((db) =>
    records.markBuilt(db, { environmentId: t.environmentId, key, digest, sizeBytes: 1000, files: 3, ...who }),
  );
}

async function rowOf(t: Tenant, key: string) {
  const rows = await withDb((db) =>
    db
      .select()
      .from(setupImages)
      .where(and(eq(setupImages.environmentId, t.environmentId), eq(setupImages.key, key))),
  );
  expect(rows.length).toBeLessThanOrEqual(1);
  return rows[0] ?? null;
}

/** Moves the row's lease into the past, as if its builder stopped renewing it a while ago. */
async function lapse(t: Tenant, key: string) {
  await withDb((db) =>
    db
      .update(setupImages)
      .set({ leaseUntil: sql`now() - interval '1 second'` })
      .where(and(eq(setupImages.environmentId, t.environmentId), eq(setupImages.key, key))),
  );
}

describe("setup image claims", () => {
  // case P6
  it("case P6: of 10 claims of one key at once, exactly one builds; the rest wait for it", async () => {
    const t = await newTenant();
    const key = newKey();
    const who = await Promise.all(Array.from({ length: 10 }, () => claimant(t)));
    const roles = await Promise.all(who.map((w) => claim(t, key, w)));
    const builders = roles.flatMap((r, i) => (r.role === "build" ? [who[i]] : []));
    expect(builders).toHaveLength(1);
    const builder = builders[0] as { runId: string; sandboxId: string };
    expect(roles.filter((r) => r.role === "wait")).toHaveLength(9);
    for (const r of roles) if (r.role === "wait") expect(r.builderRunId).toBe(builder.runId);
    const row = await rowOf(t, key);
    expect(row).toMatchObject({ status: "building", builderSandboxId: builder.sandboxId, digest: null });
  });

  it("a lapsed lease is taken over; the old builder can no longer record its capture", async () => {
    const t = await newTenant();
    const key = newKey();
    const [a, b] = [await claimant(t), await claimant(t)];
    expect(await claim(t, key, a)).toEqual({ role: "build", key });
    expect(await claim(t, key, b)).toEqual({ role: "wait", key, builderRunId: a.runId });
    await lapse(t, key);
    expect(await claim(t, key, b)).toEqual({ role: "build", key });
    expect(await markBuilt(t, key, a, digestOf("a"))).toBe(false);
    expect(await rowOf(t, key)).toMatchObject({
      status: "building",
      builderSandboxId: b.sandboxId,
      digest: null,
    });
    expect(await markBuilt(t, key, b, digestOf("b"))).toBe(true);
    expect(await claim(t, key, a)).toMatchObject({
      role: "use",
      digest: digestOf("b"),
      builtByRunId: b.runId,
    });
  });

  it("the builder claiming again renews its lease", async () => {
    const t = await newTenant();
    const key = newKey();
    const a = await claimant(t);
    expect((await claim(t, key, a)).role).toBe("build");
    await lapse(t, key);
    expect(await claim(t, key, a)).toEqual({ role: "build", key });
    const row = await rowOf(t, key);
    // Renewed from the past to about a lease from now (by the database's clock).
    const left = await withDb(async (db) => {
      const [r] = await db
        .select({ ms: sql<string>`extract(epoch from ${setupImages.leaseUntil} - now()) * 1000` })
        .from(setupImages)
        .where(eq(setupImages.id, row?.id ?? ""));
      return Number(r?.ms);
    });
    expect(left).toBeGreaterThan(LEASE_MS - 30_000);
    expect(left).toBeLessThanOrEqual(LEASE_MS);
  });

  it("rebuild: one sandbox rebuilds a built key, its run's others wait for the fresh image, other runs keep the old until then", async () => {
    const t = await newTenant();
    const key = newKey();
    const first = await claimant(t);
    await claim(t, key, first);
    expect(await markBuilt(t, key, first, digestOf("1"))).toBe(true);

    const rebuildRun = (await newRun(t)).id;
    const [r1, r2] = [
      { runId: rebuildRun, sandboxId: randomId("sbx_") },
      { runId: rebuildRun, sandboxId: randomId("sbx_") },
    ];
    expect(await claim(t, key, r1, "rebuild")).toEqual({ role: "build", key });
    expect(await claim(t, key, r2, "rebuild")).toEqual({ role: "wait", key, builderRunId: rebuildRun });
    // Others use the old image while the rebuild runs.
    expect(await claim(t, key, await claimant(t))).toMatchObject({ role: "use", digest: digestOf("1") });
    expect(await rowOf(t, key)).toMatchObject({
      status: "built",
      digest: digestOf("1"),
      builderSandboxId: r1.sandboxId,
    });

    expect(await markBuilt(t, key, r1, digestOf("2"))).toBe(true);
    expect(await rowOf(t, key)).toMatchObject({
      status: "built",
      digest: digestOf("2"),
      builtByRunId: rebuildRun,
      builderSandboxId: null,
      leaseUntil: null,
    });
    // The rebuilding run's other sandboxes start from its fresh image; they do not build it again.
    expect(await claim(t, key, r2, "rebuild")).toMatchObject({ role: "use", digest: digestOf("2") });
    // A later run's rebuild builds again.
    expect((await claim(t, key, await claimant(t), "rebuild")).role).toBe("build");
  });

  it("release deletes a building row (a failed setup is never cached); a rebuild's release keeps the image", async () => {
    const t = await newTenant();
    const key = newKey();
    const a = await claimant(t);
    await claim(t, key, a);
    // Another run's release names a's sandbox: not its build to give up.
    const other = await claimant(t);
    await withDb((db) =>
      records.release(db, {
        environmentId: t.environmentId,
        key,
        runId: other.runId,
        sandboxId: a.sandboxId,
      }),
    );
    expect(await rowOf(t, key)).toMatchObject({ status: "building", builderSandboxId: a.sandboxId });
    await withDb((db) => records.release(db, { environmentId: t.environmentId, key, ...a }));
    expect(await rowOf(t, key)).toBeNull();
    const b = await claimant(t);
    expect(await claim(t, key, b)).toEqual({ role: "build", key });
    await markBuilt(t, key, b, digestOf("b"));

    const c = await claimant(t);
    expect((await claim(t, key, c, "rebuild")).role).toBe("build");
    await withDb((db) => records.releaseRun(db, c.runId));
    expect(await rowOf(t, key)).toMatchObject({
      status: "built",
      digest: digestOf("b"),
      builderSandboxId: null,
    });
  });

  it("markBuilt by a sandbox that is not the builder changes nothing", async () => {
    const t = await newTenant();
    const key = newKey();
    const [a, b] = [await claimant(t), await claimant(t)];
    await claim(t, key, a);
    const before = await rowOf(t, key);
    expect(await markBuilt(t, key, b, digestOf("b"))).toBe(false);
    expect(await rowOf(t, key)).toEqual(before);
    // Nor in another environment, where the key is not a's at all.
    const u = await newTenant();
    expect(await markBuilt(u, key, a, digestOf("a"))).toBe(false);
    expect(await rowOf(u, key)).toBeNull();
  });

  it("a key being dropped is neither built nor used; the same key in another environment is its own", async () => {
    const t = await newTenant();
    const key = newKey();
    const a = await claimant(t);
    await claim(t, key, a);
    await markBuilt(t, key, a, digestOf("a"));
    await withDb((db) =>
      db
        .update(setupImages)
        .set({ status: "dropping" })
        .where(and(eq(setupImages.environmentId, t.environmentId), eq(setupImages.key, key))),
    );
    expect((await claim(t, key, await claimant(t))).role).toBe("none");
    expect((await claim(t, key, await claimant(t), "rebuild")).role).toBe("none");
    const u = await newTenant();
    expect((await claim(u, key, await claimant(u))).role).toBe("build");
  });
});
