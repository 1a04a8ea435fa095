import { LIST_LIMIT } from "@benchwright/shared/contract/list";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { notificationDeliveries, notifications, runs } from "../../src/db/schema";
import { ErrorCode } from "../../src/errors";
import { BASE, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { auditBatch, newRun, postBatch, setRunStatus } from "./run-fixtures";

// One list contract (shared/contract/list.ts, src/lists/cursor.ts): every paginated list takes
// the same limit range and default and one sealed cursor form, bound to its list and environment.
// Against real Postgres through the real routes.

const toJson = (cursor: string) => {
  const [body] = cursor.split(".");
  return JSON.parse(atob((body ?? "").replaceAll("-", "+").replaceAll("_", "/")));
};
const fromJson = (value: unknown, rest: string) => {
  const body = btoa(JSON.stringify(value)).replaceAll("+", "-").replaceAll("/", "_").replace(/=+$/, "");
  return `${body}.${rest}`;
};
const macOf = (cursor: string) => cursor.split(".").slice(1).join(".");

async function runsWithAudit(t: Tenant, count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) {
    const run = await newRun(t, { spec: { benchmark: i % 2 === 0 ? "demo" : "other" } });
    const blockedHosts = ["a", "b", "c"].map((h) => ({
      host: `${h}.blocked.example`,
      count: 1,
      firstSeen: new Date().toISOString(),
      lastSeen: new Date().toISOString(),
    }));
    const egressRoutes = blockedHosts.map(({ host, ...times }) => ({
      host,
      route: "refused" as const,
      ...times,
    }));
    expect((await postBatch(run, auditBatch(run.id, { blockedHosts, egressRoutes }))).status).toBe(204);
    await setRunStatus(run.id, "finished");
    ids.push(run.id);
  }
  return ids;
}

describe("list cursors (case O3)", { timeout: 60_000 }, () => {
  // case O3
  it("a cursor from another list, another environment or a tampered value → 400 invalid_cursor", async () => {
    const alice = await newTenant();
    const bob = await newTenant();
    const [aliceRun] = await runsWithAudit(alice, 2);
    const [bobRun] = await runsWithAudit(bob, 2);

    const runsPage = await alice.api("GET", "/v1/runs?limit=1");
    expect(runsPage.status, runsPage.text).toBe(200);
    const runsCursor: string = runsPage.json.nextCursor;
    expect(runsCursor).toEqual(expect.any(String));
    // The cursor reads back: the next page is the other run.
    const next = await alice.api("GET", `/v1/runs?limit=1&cursor=${encodeURIComponent(runsCursor)}`);
    expect(next.status, next.text).toBe(200);
    expect(next.json.runs).toHaveLength(1);
    expect(next.json.runs[0].id).not.toBe(runsPage.json.runs[0].id);

    const blocked = await alice.api("GET", `/v1/runs/${aliceRun}/blocked-hosts?limit=1`);
    const blockedCursor: string = blocked.json.nextCursor;
    const bobRuns = await bob.api("GET", "/v1/runs?limit=1");
    const bobCursor: string = bobRuns.json.nextCursor;

    // Another list's cursor: the runs cursor on the blocked hosts list, and the other way round,
    // and one run-audit list's cursor on its sibling.
    const refusals = [
      await alice.api("GET", `/v1/runs/${aliceRun}/blocked-hosts?cursor=${encodeURIComponent(runsCursor)}`),
      await alice.api("GET", `/v1/runs?cursor=${encodeURIComponent(blockedCursor)}`),
      await alice.api(
        "GET",
        `/v1/runs/${aliceRun}/egress-routes?cursor=${encodeURIComponent(blockedCursor)}`,
      ),
      await alice.api("GET", `/v1/blocked-hosts?cursor=${encodeURIComponent(blockedCursor)}`),
      await alice.api("GET", `/v1/setup-images?cursor=${encodeURIComponent(runsCursor)}`),
    ];
    for (const res of refusals) expect(expectProblem(res, 400, "invalid_cursor").json.detail).toMatch(/list/);

    // Another environment's cursor, for the same list.
    const foreign = await alice.api("GET", `/v1/runs?cursor=${encodeURIComponent(bobCursor)}`);
    expect(expectProblem(foreign, 400, "invalid_cursor").json.detail).toMatch(/environment/);
    expectProblem(
      await bob.api("GET", `/v1/runs/${bobRun}/blocked-hosts?cursor=${encodeURIComponent(blockedCursor)}`),
      400,
      "invalid_cursor",
    );

    // Tampered: the body changed under its mac (another environment named, another position, a
    // list renamed), the mac changed, the parts cut, and values that were never cursors.
    const body = toJson(runsCursor);
    expect(body).toMatchObject({ list: "runs", env: alice.environmentId });
    const tampered = [
      fromJson({ ...body, env: bob.environmentId }, macOf(runsCursor)),
      fromJson({ ...body, key: ["0", body.key[1]] }, macOf(runsCursor)),
      fromJson({ ...body, list: "run-blocked-hosts" }, macOf(blockedCursor)),
      `${runsCursor.slice(0, -1)}${runsCursor.endsWith("0") ? "1" : "0"}`,
      runsCursor.split(".").slice(0, 2).join("."),
      `${runsCursor}.x`,
      "garbage",
      btoa(JSON.stringify(body)),
    ];
    for (const cursor of tampered) {
      expectProblem(
        await alice.api("GET", `/v1/runs?cursor=${encodeURIComponent(cursor)}`),
        400,
        "invalid_cursor",
      );
    }
    // Bob re-signing nothing: his own cursor with Alice's environment swapped in is refused too.
    const swapped = fromJson({ ...toJson(bobCursor), env: alice.environmentId }, macOf(bobCursor));
    expectProblem(
      await alice.api("GET", `/v1/runs?cursor=${encodeURIComponent(swapped)}`),
      400,
      "invalid_cursor",
    );
  });

  it("every list takes one limit range and default", async () => {
    const t = await newTenant();
    const [run] = await runsWithAudit(t, 1);
    const lists = [
      "/v1/runs",
      "/v1/blocked-hosts",
      "/v1/setup-images",
      `/v1/runs/${run}/blocked-hosts`,
      `/v1/runs/${run}/egress-routes`,
      `/v1/runs/${run}/limit-refusals`,
      `/v1/runs/${run}/stray-placeholders`,
      `/v1/runs/${run}/model-calls`,
      `/v1/runs/${run}/bug-reports`,
      "/v1/api-keys",
      "/v1/notifications",
    ];
    for (const path of lists) {
      expect((await t.api("GET", `${path}?limit=${LIST_LIMIT.max}`)).status, path).toBe(200);
      expect((await t.api("GET", `${path}?limit=${LIST_LIMIT.min}`)).status, path).toBe(200);
      for (const limit of [LIST_LIMIT.min - 1, LIST_LIMIT.max + 1]) {
        expectProblem(await t.api("GET", `${path}?limit=${limit}`), 400, "invalid_request");
      }
    }
    // The default: 50 runs fit one page, the 51st starts the next.
    await withDb(async (db) => {
      const spec = { commands: ["true"], egress: "direct", onProxyFailure: "stop" };
      const rows = Array.from({ length: LIST_LIMIT.default }, (_, i) => ({
        id: `run_default${String(i).padStart(4, "0")}`,
        userId: t.userId,
        environmentId: t.environmentId,
        spec,
        backend: "local",
      }));
      await db.insert(runs).values(rows);
    });
    const first = await t.api("GET", "/v1/runs");
    expect(first.json.runs).toHaveLength(LIST_LIMIT.default);
    const rest = await t.api("GET", `/v1/runs?cursor=${encodeURIComponent(first.json.nextCursor)}`);
    expect(rest.json).toMatchObject({ runs: [expect.anything()], nextCursor: null });
  });
});

/** Every item of a list, one page of `limit` at a time, following nextCursor. */
async function walk(t: Tenant, path: string, field: string, limit: number): Promise<{ id: string }[]> {
  const items: { id: string }[] = [];
  let cursor: string | null = null;
  do {
    const q = cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
    const res = await t.api("GET", `${path}?limit=${limit}${q}`);
    expect(res.status, res.text).toBe(200);
    expect(res.json[field].length).toBeLessThanOrEqual(limit);
    items.push(...res.json[field]);
    cursor = res.json.nextCursor;
  } while (cursor && items.length < 100);
  return items;
}

/** Notification URLs of the tenant, made in the table (registering one would resolve its host). */
async function notificationsOf(t: Tenant, count: number): Promise<string[]> {
  const ids = Array.from({ length: count }, () => `ntf_list${crypto.randomUUID().replaceAll("-", "")}`);
  await withDb((db) =>
    db.insert(notifications).values(
      ids.map((id) => ({
        id,
        userId: t.userId,
        environmentId: t.environmentId,
        url: `https://hooks.example/${id}`,
        events: ["run.ended" as const],
        origin: BASE,
      })),
    ),
  );
  return ids;
}

describe("lists of keys and notifications", { timeout: 60_000 }, () => {
  // case O3
  it("API keys, notification URLs and deliveries page alike; a cursor stays in its list", async () => {
    const t = await newTenant();
    const other = await newTenant();
    for (const name of ["second", "third"]) {
      expect((await t.api("POST", "/v1/api-keys", { name })).status).toBe(201);
    }
    const keys = (await t.api("GET", "/v1/api-keys")).json.apiKeys.map((k: { id: string }) => k.id);
    expect(keys).toHaveLength(3);
    expect((await walk(t, "/v1/api-keys", "apiKeys", 1)).map((k) => k.id)).toEqual(keys);

    const [ntfA, ntfB] = await notificationsOf(t, 3);
    const listed = (await t.api("GET", "/v1/notifications")).json.notifications.map(
      (n: { id: string }) => n.id,
    );
    expect(listed).toHaveLength(3);
    expect((await walk(t, "/v1/notifications", "notifications", 2)).map((n) => n.id)).toEqual(listed);

    // Three deliveries to A (one per run), two to B.
    const made = [await newRun(t), await newRun(t), await newRun(t)];
    await withDb((db) =>
      db.insert(notificationDeliveries).values([
        ...made.map((run) => ({
          id: `msg_${run.id}`,
          notificationId: ntfA as string,
          runId: run.id,
          event: "run.ended" as const,
        })),
        ...made.slice(0, 2).map((run) => ({
          id: `msg_b${run.id}`,
          notificationId: ntfB as string,
          runId: run.id,
          event: "run.ended" as const,
        })),
      ]),
    );
    const deliveriesA = `/v1/notifications/${ntfA}/deliveries`;
    const deliveriesB = `/v1/notifications/${ntfB}/deliveries`;
    const all = (await t.api("GET", deliveriesA)).json.deliveries.map((d: { id: string }) => d.id);
    expect(all).toHaveLength(3);
    expect((await walk(t, deliveriesA, "deliveries", 2)).map((d) => d.id)).toEqual(all);
    expect(await walk(t, deliveriesB, "deliveries", 1)).toHaveLength(2);
    for (const limit of [LIST_LIMIT.min - 1, LIST_LIMIT.max + 1]) {
      expectProblem(await t.api("GET", `${deliveriesA}?limit=${limit}`), 400, "invalid_request");
    }

    const cursorOf = async (who: Tenant, path: string) => {
      const res = await who.api("GET", `${path}?limit=1`);
      expect(res.json.nextCursor, path).toEqual(expect.any(String));
      return encodeURIComponent(res.json.nextCursor);
    };
    const keysCursor = await cursorOf(t, "/v1/api-keys");
    const notificationsCursor = await cursorOf(t, "/v1/notifications");
    const bCursor = await cursorOf(t, deliveriesB);
    expect((await other.api("POST", "/v1/api-keys", { name: "theirs" })).status).toBe(201);
    const foreignKeysCursor = await cursorOf(other, "/v1/api-keys");
    const refused = [
      [`/v1/notifications?cursor=${keysCursor}`, /list/],
      [`/v1/api-keys?cursor=${notificationsCursor}`, /list/],
      [`${deliveriesA}?cursor=${notificationsCursor}`, /list/],
      [`/v1/runs?cursor=${keysCursor}`, /list/],
      // Another notification's deliveries: the same list, another position's owner.
      [`${deliveriesA}?cursor=${bCursor}`, /another notification/],
      [`/v1/api-keys?cursor=${foreignKeysCursor}`, /environment/],
    ] as const;
    for (const [path, why] of refused) {
      expect(expectProblem(await t.api("GET", path), 400, "invalid_cursor").json.detail, path).toMatch(why);
    }
  });
});

describe("GET /v1/runs filters", { timeout: 60_000 }, () => {
  it("filters by status, benchmark and launch time, and pages within the filter", async () => {
    const t = await newTenant();
    const made = [
      await newRun(t, { spec: { benchmark: "demo" }, status: "finished" }),
      await newRun(t, { spec: { benchmark: "demo" }, status: "failed" }),
      await newRun(t, { spec: { benchmark: "other" }, status: "finished" }),
      await newRun(t, { status: "running" }),
    ];
    // Launch times a day apart, oldest first.
    await withDb(async (db) => {
      for (const [i, run] of made.entries()) {
        await db
          .update(runs)
          .set({ createdAt: new Date(Date.UTC(2026, 0, 1 + i, 12)) })
          .where(eq(runs.id, run.id));
      }
    });
    const ids = async (query: string) => {
      const res = await t.api("GET", `/v1/runs?${query}`);
      expect(res.status, res.text).toBe(200);
      return res.json.runs.map((r: { id: string }) => r.id);
    };
    const [a, b, c, d] = made.map((r) => r.id);
    expect(await ids("status=finished")).toEqual([c, a]);
    expect(await ids("benchmark=demo")).toEqual([b, a]);
    expect(await ids("benchmark=demo&status=failed")).toEqual([b]);
    expect(await ids("since=2026-01-02T00:00:00Z")).toEqual([d, c, b]);
    expect(await ids("until=2026-01-02T12:00:00Z")).toEqual([a]);
    expect(await ids("since=2026-01-02T00:00:00Z&until=2026-01-04T00:00:00%2B01:00")).toEqual([c, b]);
    const listed = await t.api("GET", "/v1/runs?benchmark=demo&limit=1");
    expect(listed.json.runs[0]).toMatchObject({ id: b, benchmark: "demo", status: "failed" });
    const second = await t.api(
      "GET",
      `/v1/runs?benchmark=demo&limit=1&cursor=${encodeURIComponent(listed.json.nextCursor)}`,
    );
    expect(second.json).toMatchObject({ runs: [{ id: a }], nextCursor: null });
    expect((await t.api("GET", "/v1/runs?status=running")).json.runs[0]).toMatchObject({
      id: d,
      benchmark: null,
    });

    expectProblem(await t.api("GET", "/v1/runs?status=sleeping"), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/runs?since=yesterday"), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/runs?state=finished"), 400, "unknown_field");
  });
});

describe("problem types", () => {
  it("a problem's `type` is a page this deployment serves, for every code", async () => {
    const t = await newTenant();
    const refused = expectProblem(await t.api("GET", "/v1/runs?cursor=garbage"), 400, "invalid_cursor");
    expect(refused.json.type).toBe(`${BASE}/problems/invalid_cursor`);
    const page = await call(null, "GET", new URL(refused.json.type).pathname);
    expect(page.status).toBe(200);
    expect(page.headers.get("content-type")).toMatch(/^text\/html/);
    expect(page.text).toContain("invalid_cursor");
    expect(page.text).toContain("HTTP status 400");
    // The index links every code, and each of those pages answers.
    const index = await call(null, "GET", "/problems");
    for (const code of ErrorCode.options) expect(index.text).toContain(`/problems/${code}"`);
    expect((await call(null, "GET", "/problems/rate_limited")).text).toContain("HTTP status 429");
    expect((await call(null, "GET", "/problems/no_such_code")).status).toBe(404);
  });
});
