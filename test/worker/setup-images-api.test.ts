import { env } from "cloudflare:workers";
import { eq, inArray } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import type { BrokerResult } from "../../src/broker/interface";
import { loadConfig } from "../../src/config";
import { setupImages } from "../../src/db/schema";
import type { Tx } from "../../src/db/types";
import { reconcile } from "../../src/reaper/reconcile";
import { type DropPort, LAPSED_BUILD_MS, reapSetupImages } from "../../src/setup-images/reap";
import { call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { expectStatus } from "./isolation-fixtures";
import { newRun } from "./run-fixtures";
import { newDigest, plantSetupImage } from "./setup-image-fixtures";

// GET and DELETE /v1/setup-images and the reaper's step, on real Postgres through the Worker.
// The rows are written as the broker would leave them (setup-image-fixtures.ts).

const HOUR = 60 * 60_000;
const DAY = 24 * HOUR;

const rowOf = (id: string) =>
  withDb(async (db) => (await db.select().from(setupImages).where(eq(setupImages.id, id)))[0]);

const readKey = async (t: Tenant) =>
  expectStatus(await t.api("POST", "/v1/api-keys", { name: "watcher", scope: "read" }), 201, "read key").json
    .key as string;

describe("GET /v1/setup-images", () => {
  it("lists the caller's environment's setup images only, most recently used first, with their inputs", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const run = await newRun(a);
    const now = Date.now();
    const [used, idle, building, theirs] = await withDb(async (db) => [
      await plantSetupImage(db, a.environmentId, "used", {
        builtByRunId: run.id,
        builtAt: new Date(now - 3 * HOUR),
        lastUsedAt: new Date(now - 60_000),
      }),
      await plantSetupImage(db, a.environmentId, "idle", { builtAt: new Date(now - 2 * HOUR) }),
      await plantSetupImage(db, a.environmentId, "building", {
        status: "building",
        digest: null,
        sizeBytes: null,
        files: null,
        builtAt: null,
        builderRunId: run.id,
        builderSandboxId: "sbx_builder",
        leaseUntil: new Date(now + 120_000),
      }),
      await plantSetupImage(db, b.environmentId, "theirs"),
    ]);
    const res = expectStatus(await a.api("GET", "/v1/setup-images"), 200, "list");
    expect(res.json.nextCursor).toBeNull();
    expect(res.json.setupImages.map((i: { key: string }) => i.key)).toEqual([
      building.key,
      used.key,
      idle.key,
    ]);
    expect(res.json.setupImages[1]).toEqual({
      key: used.key,
      status: "built",
      digest: used.digest,
      sizeBytes: 4096,
      backend: "local",
      builtBy: run.id,
      builtAt: new Date(now - 3 * HOUR).toISOString(),
      lastUsedAt: new Date(now - 60_000).toISOString(),
      bundle: null,
      setup: ["pip install used"],
      resources: { memoryMb: 1024, pids: 512 },
    });
    expect(res.json.setupImages[0]).toMatchObject({ status: "building", digest: null, builtBy: null });
    // Nothing of B's environment: not its key, not its digest, not its setup.
    expect(res.text).not.toContain(theirs.key);
    expect(res.text).not.toContain(String(theirs.digest));
    expect(res.text).not.toContain("theirs");
    expect(res.text).not.toContain(b.environmentId);
    // A read key may look.
    const read = expectStatus(await call(await readKey(a), "GET", "/v1/setup-images"), 200, "read key");
    expect(read.json.setupImages).toHaveLength(3);
  });

  it("pages with the lists' cursor; a cursor it did not give, or a bad limit, is 400", async () => {
    const t = await newTenant();
    const now = Date.now();
    // Two with the same last use: the id breaks the tie, and no page repeats or skips one.
    const planted = await withDb(async (db) => {
      const out = [];
      for (const [i, at] of [
        now - HOUR,
        now - 2 * HOUR,
        now - 2 * HOUR,
        now - 3 * HOUR,
        now - 4 * HOUR,
      ].entries()) {
        out.push(await plantSetupImage(db, t.environmentId, `page${i}`, { lastUsedAt: new Date(at) }));
      }
      return out;
    });
    const seen: string[] = [];
    let cursor: string | null = null;
    let pages = 0;
    do {
      const q: string = cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
      const res = expectStatus(await t.api("GET", `/v1/setup-images?limit=2${q}`), 200, "page");
      expect(res.json.setupImages.length).toBeLessThanOrEqual(2);
      seen.push(...res.json.setupImages.map((i: { key: string }) => i.key));
      cursor = res.json.nextCursor;
      pages++;
    } while (cursor && pages < 10);
    expect(pages).toBe(3);
    expect(seen).toHaveLength(5);
    expect(new Set(seen)).toEqual(new Set(planted.map((p) => p.key)));
    expect(seen[0]).toBe(planted[0]?.key);
    expect(seen[4]).toBe(planted[4]?.key);

    expectProblem(await t.api("GET", "/v1/setup-images?cursor=bm90LW91cnM"), 400, "invalid_cursor");
    expectProblem(await t.api("GET", "/v1/setup-images?limit=0"), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/setup-images?limit=201"), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/setup-images?environmentId=x"), 400, "unknown_field");
  });
});

describe("DELETE /v1/setup-images/{key}", () => {
  it("marks the image dropping (204), twice alike; a read key is refused and changes nothing", async () => {
    const t = await newTenant();
    const image = await withDb((db) => plantSetupImage(db, t.environmentId, "drop"));
    expectProblem(
      await call(await readKey(t), "DELETE", `/v1/setup-images/${image.key}`),
      403,
      "read_only_key",
    );
    expect((await rowOf(image.id))?.status).toBe("built");
    expectStatus(await t.api("DELETE", `/v1/setup-images/${image.key}`), 204, "drop");
    expect((await rowOf(image.id))?.status).toBe("dropping");
    // Already going: the same answer, still there until the reaper takes it.
    expectStatus(await t.api("DELETE", `/v1/setup-images/${image.key}`), 204, "drop again");
    const listed = expectStatus(await t.api("GET", "/v1/setup-images"), 200, "list").json.setupImages;
    expect(listed).toMatchObject([{ key: image.key, status: "dropping" }]);
  });

  it("another environment's key is 404 not_found, as an unknown key is, and stays as it was", async () => {
    // case P3
    const [a, b] = [await newTenant(), await newTenant()];
    const theirs = await withDb((db) => plantSetupImage(db, b.environmentId, "theirs"));
    const before = await rowOf(theirs.id);
    const refused = expectProblem(await a.api("DELETE", `/v1/setup-images/${theirs.key}`), 404, "not_found");
    const unknown = "ab".repeat(32);
    const absent = expectProblem(await a.api("DELETE", `/v1/setup-images/${unknown}`), 404, "not_found");
    // The same words for both: nothing says the key exists elsewhere.
    expect(refused.json.detail.replace(theirs.key, unknown)).toBe(absent.json.detail);
    expect(refused.text).not.toContain(b.environmentId);
    expect(await rowOf(theirs.id)).toEqual(before);
  });

  it("is 409 setup_image_building while a build or a rebuild holds its lease; a lapsed rebuild lease does not hold", async () => {
    const t = await newTenant();
    const now = Date.now();
    const [building, rebuilding, lapsed] = await withDb(async (db) => [
      await plantSetupImage(db, t.environmentId, "building", {
        status: "building",
        digest: null,
        builtAt: null,
        builderSandboxId: "sbx_b",
        leaseUntil: new Date(now + 120_000),
      }),
      await plantSetupImage(db, t.environmentId, "rebuilding", {
        builderSandboxId: "sbx_r",
        leaseUntil: new Date(now + 120_000),
      }),
      await plantSetupImage(db, t.environmentId, "lapsed", {
        builderSandboxId: "sbx_l",
        leaseUntil: new Date(now - 1000),
      }),
    ]);
    const res = expectProblem(
      await t.api("DELETE", `/v1/setup-images/${building.key}`),
      409,
      "setup_image_building",
    );
    expect(res.json.detail).toContain("built");
    expectProblem(await t.api("DELETE", `/v1/setup-images/${rebuilding.key}`), 409, "setup_image_building");
    expect((await rowOf(building.id))?.status).toBe("building");
    expect((await rowOf(rebuilding.id))?.status).toBe("built");
    expectStatus(await t.api("DELETE", `/v1/setup-images/${lapsed.key}`), 204, "lapsed lease");
    expect((await rowOf(lapsed.id))?.status).toBe("dropping");
  });

  it("a key that is not 64 lower-case hex digits is 400 invalid_request naming the key", async () => {
    const t = await newTenant();
    for (const bad of [
      "abc",
      "AB".repeat(32),
      "a".repeat(65),
      `${"a".repeat(63)}g`,
      `sha256:${"a".repeat(64)}`,
    ]) {
      const res = expectProblem(
        await t.api("DELETE", `/v1/setup-images/${encodeURIComponent(bad)}`),
        400,
        "invalid_request",
      );
      expect(res.json.detail).toMatch(/^key: .*64 lower-case hex digits/);
    }
  });
});

// The reaper's step on its own, with a drop port of the test's (what it was asked, what it
// answers). Each test works in a transaction it rolls back, and sweeps "as of" sixty days ago
// over rows made before then, so no other file's rows or sweeps meet these.
describe("reaper: setup images", () => {
  const unusedMs = loadConfig(env).setupImages.unusedMs;
  const T = Date.now() - 60 * DAY;
  const made = { createdAt: new Date(T - DAY) };

  class RolledBack extends Error {}
  async function rolledBack(fn: (tx: Tx) => Promise<void>): Promise<void> {
    await withDb((db) =>
      db
        .transaction(async (tx) => {
          await fn(tx);
          throw new RolledBack();
        })
        .catch((e) => {
          if (!(e instanceof RolledBack)) throw e;
        }),
    );
  }

  type Images = Parameters<DropPort>[0];
  /** A drop port that records what it was asked and answers with `answer`. */
  function port(answer: (images: Images) => BrokerResult<{ dropped: string[]; inUse: string[] }>) {
    const asked: Images[] = [];
    const drop: DropPort = async (images) => {
      asked.push(images);
      return answer(images);
    };
    return { asked, drop };
  }
  const dropsAll = () =>
    port((images) => ({ ok: true, value: { dropped: images.map((i) => i.digest), inUse: [] } }));

  const statuses = async (tx: Tx, ids: string[]) =>
    Object.fromEntries(
      (await tx.select().from(setupImages).where(inArray(setupImages.id, ids))).map((r) => [r.id, r.status]),
    );

  it("deletes a build whose lease lapsed 15 minutes ago; a build still held, or lapsed just now, is kept", async () => {
    // case P6: a failed or abandoned build is never cached
    const t = await newTenant();
    await rolledBack(async (tx) => {
      const building = (tag: string, leaseUntil: number) =>
        plantSetupImage(tx, t.environmentId, tag, {
          ...made,
          status: "building",
          digest: null,
          builtAt: null,
          builderSandboxId: `sbx_${tag}`,
          leaseUntil: new Date(leaseUntil),
        });
      const abandoned = await building("abandoned", T - LAPSED_BUILD_MS - 60_000);
      const late = await building("late", T - LAPSED_BUILD_MS + 60_000);
      const held = await building("held", T + 60_000);
      const { asked, drop } = dropsAll();
      const report = await reapSetupImages(tx, drop, unusedMs, T);
      expect(report).toEqual({ lapsed: [abandoned.id], unused: [], dropped: [], inUse: [] });
      expect(await statuses(tx, [abandoned.id, late.id, held.id])).toEqual({
        [late.id]: "building",
        [held.id]: "building",
      });
      expect(asked).toEqual([]);
    });
  });

  it("drops images unused for the setting's days through the port, then their rows; recently used ones stay", async () => {
    const t = await newTenant();
    await rolledBack(async (tx) => {
      const image = (tag: string, fields: Parameters<typeof plantSetupImage>[3]) =>
        plantSetupImage(tx, t.environmentId, tag, { ...made, ...fields });
      const neverUsed = await image("never", { builtAt: new Date(T - unusedMs - HOUR) });
      const usedLongAgo = await image("long", {
        builtAt: new Date(T - 2 * unusedMs),
        lastUsedAt: new Date(T - unusedMs - HOUR),
      });
      const usedRecently = await image("recent", {
        builtAt: new Date(T - 2 * unusedMs),
        lastUsedAt: new Date(T - HOUR),
      });
      const builtRecently = await image("new", { builtAt: new Date(T - HOUR) });
      const rebuilding = await image("rebuild", {
        builtAt: new Date(T - 2 * unusedMs),
        builderSandboxId: "sbx_rebuild",
        leaseUntil: new Date(T + 60_000),
      });
      const { asked, drop } = dropsAll();
      const report = await reapSetupImages(tx, drop, unusedMs, T);
      expect([...report.unused].sort()).toEqual([neverUsed.id, usedLongAgo.id].sort());
      expect([...report.dropped].sort()).toEqual([neverUsed.id, usedLongAgo.id].sort());
      expect(report.inUse).toEqual([]);
      expect(asked).toHaveLength(1);
      const byDigest = (x: { digest?: string | null }, y: { digest?: string | null }) =>
        String(x.digest).localeCompare(String(y.digest));
      expect([...(asked[0] ?? [])].sort(byDigest)).toEqual(
        [neverUsed, usedLongAgo]
          .map((r) => ({ backend: "local", digest: r.digest, repository: null }))
          .sort(byDigest),
      );
      const ids = [neverUsed, usedLongAgo, usedRecently, builtRecently, rebuilding].map((r) => r.id);
      expect(await statuses(tx, ids)).toEqual({
        [usedRecently.id]: "built",
        [builtRecently.id]: "built",
        [rebuilding.id]: "built",
      });
    });
  });

  it("keeps an image a live sandbox still uses and drops it on a later sweep; a failed port keeps every row", async () => {
    const t = await newTenant();
    await rolledBack(async (tx) => {
      const dropping = { ...made, status: "dropping" as const };
      const free = await plantSetupImage(tx, t.environmentId, "free", dropping);
      const busy = await plantSetupImage(tx, t.environmentId, "busy", dropping);
      const first = port(() => ({
        ok: true,
        value: { dropped: [String(free.digest)], inUse: [String(busy.digest)] },
      }));
      const report = await reapSetupImages(tx, first.drop, unusedMs, T);
      expect(report).toEqual({ lapsed: [], unused: [], dropped: [free.id], inUse: [busy.id] });
      expect(await statuses(tx, [free.id, busy.id])).toEqual({ [busy.id]: "dropping" });

      const down = port(() => ({
        ok: false,
        code: "backend_unreachable",
        message: "agent away",
        retryable: true,
      }));
      const failed = await reapSetupImages(tx, down.drop, unusedMs, T);
      expect(failed).toEqual({
        lapsed: [],
        unused: [],
        dropped: [],
        inUse: [],
        error: "backend_unreachable",
      });
      expect(await statuses(tx, [busy.id])).toEqual({ [busy.id]: "dropping" });

      const later = dropsAll();
      expect((await reapSetupImages(tx, later.drop, unusedMs, T)).dropped).toEqual([busy.id]);
      expect(later.asked).toEqual([[{ backend: "local", digest: busy.digest, repository: null }]]);
      expect(await statuses(tx, [busy.id])).toEqual({});
    });
  });

  it("leaves an artifact another environment's live image names; a row that stored nothing just goes", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    await rolledBack(async (tx) => {
      // The local store is by content: the same layer can be two environments' image.
      const digest = newDigest();
      const mine = await plantSetupImage(tx, a.environmentId, "shared", {
        ...made,
        status: "dropping",
        digest,
      });
      const theirs = await plantSetupImage(tx, b.environmentId, "shared", { ...made, digest });
      const empty = await plantSetupImage(tx, a.environmentId, "empty", {
        ...made,
        status: "dropping",
        digest: null,
      });
      const { asked, drop } = dropsAll();
      const report = await reapSetupImages(tx, drop, unusedMs, T);
      expect([...report.dropped].sort()).toEqual([mine.id, empty.id].sort());
      expect(asked).toEqual([]);
      expect(await statuses(tx, [mine.id, theirs.id, empty.id])).toEqual({ [theirs.id]: "built" });
    });
  });

  it("reconcile runs the step, with the sweep broker as the drop port", async () => {
    // Its own time, after the tests above and long before any other file's sweep: the row is
    // committed (reconcile opens its own connection).
    const t = await newTenant();
    const at = Date.now() - 45 * DAY;
    const abandoned = await withDb((db) =>
      plantSetupImage(db, t.environmentId, "abandoned", {
        createdAt: new Date(at - DAY),
        status: "building",
        digest: null,
        builtAt: null,
        leaseUntil: new Date(at - LAPSED_BUILD_MS - 60_000),
      }),
    );
    const report = await reconcile(env, at);
    expect(report.setupImages).toMatchObject({ unused: expect.any(Array), inUse: expect.any(Array) });
    expect(report.setupImages).not.toHaveProperty("error");
    expect(await rowOf(abandoned.id)).toBeUndefined();
  });
});
