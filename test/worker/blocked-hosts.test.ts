import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { blockedHostLog, runs } from "../../src/db/schema";
import { call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { auditBatch, newRun, postBatch, type TestRun } from "./run-fixtures";

// GET /v1/blocked-hosts: blocked hosts across every run of the caller's environment, one row per
// host (src/runs/audit-log.ts). The aggregation tests store their rows the honest way, as
// signed audit batches through the internal API with each run's own proxy token; the paging
// tests insert rows straight into blocked_host_log for volume (130 hosts, 12 runs).

const at = (second: number) => new Date(Date.UTC(2026, 2, 1, 9, 0, second)).toISOString();

/** Sets when the run was launched, so "newest run first" does not depend on insert timing. */
async function launchedAt(run: TestRun, second: number): Promise<void> {
  await withDb((db) =>
    db
      .update(runs)
      .set({ createdAt: new Date(at(second)) })
      .where(eq(runs.id, run.id)),
  );
}

interface Row {
  host: string;
  seenCount: number;
  firstSeen: string;
  lastSeen: string;
  source: string;
  runs: string[];
  runCount: number;
}

/** Every page of `query` with `limit`, in order. */
async function walk(t: Tenant, query: string, limit: number): Promise<Row[][]> {
  const pages: Row[][] = [];
  let cursor: string | null = null;
  do {
    const q: string = `limit=${limit}${query ? `&${query}` : ""}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ""}`;
    const res = await t.api("GET", `/v1/blocked-hosts?${q}`);
    expect(res.status, res.text).toBe(200);
    pages.push(res.json.blockedHosts);
    cursor = res.json.nextCursor;
  } while (cursor && pages.length < 200);
  return pages;
}

/**
 * Three runs (launched r1, r2, r3 in that order) whose proxies and local agent report:
 * - evil.example: r1 proxy 3×, r2 agent 2×, r3 proxy 4× → mixed sources → both
 * - dual.example: r1 proxy and r1 agent → that run's row is `both`
 * - proxy-only.example: r1 and r3 proxies → proxy
 * - agent-only.example: r2 agent → local_agent
 */
async function threeRuns(t: Tenant) {
  const [r1, r2, r3] = [await newRun(t), await newRun(t), await newRun(t)] as [TestRun, TestRun, TestRun];
  await launchedAt(r1, 0);
  await launchedAt(r2, 1);
  await launchedAt(r3, 2);
  const seen = (host: string, count: number, first: number, last: number) => ({
    host,
    count,
    firstSeen: at(first),
    lastSeen: at(last),
  });
  const batches: [TestRun, ReturnType<typeof auditBatch>][] = [
    [
      r1,
      auditBatch(r1.id, {
        blockedHosts: [
          seen("evil.example", 3, 10, 12),
          seen("dual.example", 1, 10, 10),
          seen("proxy-only.example", 5, 3, 4),
        ],
      }),
    ],
    [r1, auditBatch(r1.id, { source: "local_agent", blockedHosts: [seen("dual.example", 2, 8, 9)] })],
    [
      r2,
      auditBatch(r2.id, {
        source: "local_agent",
        blockedHosts: [seen("evil.example", 2, 5, 11), seen("agent-only.example", 7, 20, 21)],
      }),
    ],
    [
      r3,
      auditBatch(r3.id, {
        blockedHosts: [seen("evil.example", 4, 20, 30), seen("proxy-only.example", 1, 6, 21)],
      }),
    ],
  ];
  for (const [run, batch] of batches) expect((await postBatch(run, batch)).status).toBe(204);
  return { r1, r2, r3 };
}

describe("GET /v1/blocked-hosts", { timeout: 60_000 }, () => {
  it("one row per host across the environment's runs: counts summed, first/last seen widened, sources merged, newest runs first", async () => {
    const t = await newTenant();
    const { r1, r2, r3 } = await threeRuns(t);
    const res = await t.api("GET", "/v1/blocked-hosts");
    expect(res.status, res.text).toBe(200);
    // Most recently seen first; agent-only and proxy-only were last seen at the same second, so
    // the host name breaks the tie.
    expect(res.json).toEqual({
      blockedHosts: [
        {
          host: "evil.example",
          seenCount: 9,
          firstSeen: at(5),
          lastSeen: at(30),
          source: "both",
          runs: [r3.id, r2.id, r1.id],
          runCount: 3,
        },
        {
          host: "agent-only.example",
          seenCount: 7,
          firstSeen: at(20),
          lastSeen: at(21),
          source: "local_agent",
          runs: [r2.id],
          runCount: 1,
        },
        {
          host: "proxy-only.example",
          seenCount: 6,
          firstSeen: at(3),
          lastSeen: at(21),
          source: "proxy",
          runs: [r3.id, r1.id],
          runCount: 2,
        },
        {
          host: "dual.example",
          seenCount: 3,
          firstSeen: at(8),
          lastSeen: at(10),
          source: "both",
          runs: [r1.id],
          runCount: 1,
        },
      ],
      nextCursor: null,
    });
    // A new batch moves a host up and adds to its counts.
    const more = auditBatch(r1.id, {
      blockedHosts: [{ host: "dual.example", count: 10, firstSeen: at(40), lastSeen: at(41) }],
    });
    expect((await postBatch(r1, more)).status).toBe(204);
    const after = await t.api("GET", "/v1/blocked-hosts?limit=1");
    expect(after.json.blockedHosts).toEqual([
      {
        host: "dual.example",
        seenCount: 13,
        firstSeen: at(8),
        lastSeen: at(41),
        source: "both",
        runs: [r1.id],
        runCount: 1,
      },
    ]);
    expect(after.json.nextCursor).toEqual(expect.any(String));
    // An environment without refusals lists nothing.
    expect((await (await newTenant()).api("GET", "/v1/blocked-hosts")).json).toEqual({
      blockedHosts: [],
      nextCursor: null,
    });
  });

  it("filters: runId picks the run's hosts (numbers stay environment-wide), source the aggregated source", async () => {
    const t = await newTenant();
    const { r1, r2, r3 } = await threeRuns(t);
    const hosts = async (query: string) => {
      const res = await t.api("GET", `/v1/blocked-hosts?${query}`);
      expect(res.status, res.text).toBe(200);
      return res.json.blockedHosts as Row[];
    };
    const all = await hosts("");
    const byHost = new Map(all.map((h) => [h.host, h]));
    const pick = (...names: string[]) => names.map((n) => byHost.get(n));

    expect(await hosts(`runId=${r1.id}`)).toEqual(pick("evil.example", "proxy-only.example", "dual.example"));
    expect(await hosts(`runId=${r2.id}`)).toEqual(pick("evil.example", "agent-only.example"));
    expect(await hosts(`runId=${r3.id}`)).toEqual(pick("evil.example", "proxy-only.example"));
    expect(await hosts("source=both")).toEqual(pick("evil.example", "dual.example"));
    expect(await hosts("source=proxy")).toEqual(pick("proxy-only.example"));
    expect(await hosts("source=local_agent")).toEqual(pick("agent-only.example"));
    expect(await hosts(`source=both&runId=${r2.id}`)).toEqual(pick("evil.example"));
    expect(await hosts(`source=local_agent&runId=${r1.id}`)).toEqual([]);
    // A run of the caller's without refusals: nothing.
    expect(await hosts(`runId=${(await newRun(t)).id}`)).toEqual([]);
    // Filters page like the whole list.
    const pages = await walk(t, `runId=${r1.id}`, 1);
    expect(pages.flat()).toEqual(pick("evil.example", "proxy-only.example", "dual.example"));
    expect(pages).toHaveLength(3);
    expectProblem(await t.api("GET", "/v1/blocked-hosts?source=agent"), 400, "invalid_request");
  });

  it("pages over >1 page with no duplicates or gaps (130 hosts, ties on last seen); runs capped at the 10 newest", async () => {
    const t = await newTenant();
    // Direct inserts (volume): 12 runs launched a second apart; host i is seen by runs
    // i % 12 .. (i % 12) + (i % 3), and hosts come in groups of 4 sharing a last-seen time.
    const list: TestRun[] = [];
    for (let r = 0; r < 12; r++) {
      const run = await newRun(t);
      await launchedAt(run, r);
      list.push(run);
    }
    const expected = new Map<string, { seenCount: number; lastSeen: string; runs: TestRun[] }>();
    const rows: (typeof blockedHostLog.$inferInsert)[] = [];
    for (let i = 0; i < 130; i++) {
      const host = `h${String(i).padStart(3, "0")}.paged.example`;
      const seenBy = [0, 1, 2].slice(0, (i % 3) + 1).map((k) => list[(i + k) % 12] as TestRun);
      const lastSeen = at(Math.floor(i / 4));
      for (const run of seenBy) {
        rows.push({
          userId: t.userId,
          environmentId: t.environmentId,
          runId: run.id,
          host,
          seenCount: 2,
          firstSeen: new Date(at(0)),
          lastSeen: new Date(lastSeen),
          source: "proxy",
        });
      }
      expected.set(host, { seenCount: 2 * seenBy.length, lastSeen, runs: seenBy });
    }
    // One host every run saw: all 12 counted, the 10 newest listed.
    for (const run of list) {
      rows.push({
        userId: t.userId,
        environmentId: t.environmentId,
        runId: run.id,
        host: "everywhere.example",
        seenCount: 1,
        firstSeen: new Date(at(0)),
        lastSeen: new Date(at(59)),
        source: "proxy",
      });
    }
    await withDb((db) => db.insert(blockedHostLog).values(rows));

    const order = [...expected.entries()]
      .sort(([a, x], [b, y]) => y.lastSeen.localeCompare(x.lastSeen) || a.localeCompare(b))
      .map(([host]) => host);
    order.unshift("everywhere.example");

    for (const limit of [50, 7, 100]) {
      const pages = await walk(t, "", limit);
      const flat = pages.flat();
      expect(flat.map((h) => h.host)).toEqual(order);
      expect(new Set(flat.map((h) => h.host)).size).toBe(131);
      expect(pages.slice(0, -1).every((p) => p.length === limit)).toBe(true);
      expect(pages).toHaveLength(Math.ceil(131 / limit));
    }
    // Default limit 50.
    const first = await t.api("GET", "/v1/blocked-hosts");
    expect(first.json.blockedHosts).toHaveLength(50);
    const everywhere = first.json.blockedHosts[0] as Row;
    expect(everywhere).toMatchObject({ host: "everywhere.example", seenCount: 12, runCount: 12 });
    expect(everywhere.runs).toEqual(
      list
        .slice(2)
        .reverse()
        .map((r) => r.id),
    );
    const h128 = first.json.blockedHosts.find((h: Row) => h.host === "h128.paged.example") as Row;
    const e = expected.get("h128.paged.example");
    expect(h128).toEqual({
      host: "h128.paged.example",
      seenCount: e?.seenCount,
      firstSeen: at(0),
      lastSeen: e?.lastSeen,
      source: "proxy",
      // Seen by runs 8, 9 and 10: the later-launched first.
      runs: [list[10]?.id, list[9]?.id, list[8]?.id],
      runCount: 3,
    });
  });

  it("bad paging → 400 invalid_request; unknown query fields → 400 unknown_field", async () => {
    const t = await newTenant();
    await threeRuns(t);
    for (const q of ["limit=0", "limit=201", "limit=x", "limit=1.5", "limit=-1"]) {
      expectProblem(await t.api("GET", `/v1/blocked-hosts?${q}`), 400, "invalid_request");
    }
    const junk = [
      "garbage",
      btoa("not json"),
      btoa(JSON.stringify(["yesterday", "a.example"])),
      btoa(JSON.stringify([at(1)])),
      btoa(JSON.stringify({ lastSeen: at(1), host: "a.example" })),
    ];
    for (const cursor of junk) {
      const res = await t.api("GET", `/v1/blocked-hosts?cursor=${encodeURIComponent(cursor)}`);
      expectProblem(res, 400, "invalid_cursor");
    }
    expectProblem(await t.api("GET", `/v1/blocked-hosts?cursor=${"a".repeat(1025)}`), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/blocked-hosts?environmentId=env_x"), 400, "unknown_field");
  });

  it("another tenant's runId → 404 not_found (as no run at all); their hosts never listed; no key → 401", async () => {
    const a = await newTenant();
    const b = await newTenant();
    const theirs = await threeRuns(b);
    const mine = await newRun(a);
    const batch = auditBatch(mine.id, {
      blockedHosts: [{ host: "mine.example", count: 1, firstSeen: at(1), lastSeen: at(1) }],
    });
    expect((await postBatch(mine, batch)).status).toBe(204);

    const res = expectProblem(
      await a.api("GET", `/v1/blocked-hosts?runId=${theirs.r1.id}`),
      404,
      "not_found",
    );
    expect(res.text).not.toContain("evil.example");
    expectProblem(await a.api("GET", "/v1/blocked-hosts?runId=run_doesnotexist"), 404, "not_found");
    const list = await a.api("GET", "/v1/blocked-hosts");
    expect(list.json.blockedHosts.map((h: Row) => h.host)).toEqual(["mine.example"]);
    for (const run of Object.values(theirs)) expect(list.text).not.toContain(run.id);
    expect((await b.api("GET", `/v1/blocked-hosts?runId=${theirs.r1.id}`)).status).toBe(200);
    expectProblem(await call(null, "GET", "/v1/blocked-hosts"), 401, "unauthorized");
    // A run's proxy token is not an API key.
    expectProblem(await call(mine.proxyToken, "GET", "/v1/blocked-hosts"), 401, "unauthorized");
  });
});

describe("POST /v1/vault/hosts/from-blocked", { timeout: 60_000 }, () => {
  const version = async (t: Tenant) => (await t.api("GET", "/v1/vault/settings")).json.version as number;
  const entries = async (t: Tenant) =>
    (await t.api("GET", "/v1/vault/hosts")).json.hosts as {
      pattern: string;
      action: string;
      implicit: boolean;
    }[];

  it("no entry → created, block → updated, allow → unchanged; canonical names, duplicates once; one version bump", async () => {
    const t = await newTenant();
    for (const [pattern, action] of [
      ["b.example", "block"],
      ["c.example", "allow"],
      ["*.wild.example", "block"],
    ]) {
      expect((await t.api("POST", "/v1/vault/hosts", { pattern, action })).status).toBe(200);
    }
    const before = await version(t);
    const res = await t.api("POST", "/v1/vault/hosts/from-blocked", {
      hosts: ["a.example", "B.Example.", "c.example", "x.wild.example", "a.example", "b.example:443"],
    });
    expect(res.status, res.text).toBe(200);
    expect(res.json).toMatchObject({ created: 2, updated: 1, unchanged: 1 });
    expect(
      res.json.entries.map((e: { pattern: string; action: string; implicit: boolean }) => [
        e.pattern,
        e.action,
        e.implicit,
      ]),
    ).toEqual([
      ["a.example", "allow", false],
      ["b.example", "allow", false],
      ["c.example", "allow", false],
      ["x.wild.example", "allow", false],
    ]);
    // The entries are exactly what GET /v1/vault/hosts shows.
    const listed = await t.api("GET", "/v1/vault/hosts");
    for (const entry of res.json.entries) expect(listed.json.hosts).toContainEqual(entry);
    expect(listed.json.hosts).toHaveLength(5);
    expect(await version(t)).toBe(before + 1);
    // The exact allow beats the wildcard block: the preview's decision follows.
    const preview = await t.api("GET", "/v1/vault/policy-preview");
    expect(preview.json.hosts).toContainEqual({
      pattern: "x.wild.example",
      action: "allow",
      methods: null,
      paths: null,
    });
    expect(preview.json.hosts).toContainEqual({
      pattern: "*.wild.example",
      action: "block",
      methods: null,
      paths: null,
    });

    // Again: nothing to change, still one vault write.
    const again = await t.api("POST", "/v1/vault/hosts/from-blocked", { hosts: ["a.example", "b.example"] });
    expect(again.json).toMatchObject({ created: 0, updated: 0, unchanged: 2 });
    expect(await version(t)).toBe(before + 2);
  });

  it("a rule's implicit allow entry becomes the user's own (updated), so deleting the rule keeps it", async () => {
    const t = await newTenant();
    await t.api("POST", "/v1/vault/secrets", { name: "KEY", value: "not-a-canary-value" });
    const rule = await t.api("POST", "/v1/vault/rules", {
      host: "api.example",
      secret: "KEY",
      inject: { scheme: "bearer" },
    });
    expect(rule.status).toBe(201);
    expect(await entries(t)).toMatchObject([{ pattern: "api.example", action: "allow", implicit: true }]);
    const res = await t.api("POST", "/v1/vault/hosts/from-blocked", { hosts: ["api.example"] });
    expect(res.json).toMatchObject({ created: 0, updated: 1, unchanged: 0 });
    expect(res.json.entries).toMatchObject([{ pattern: "api.example", action: "allow", implicit: false }]);
    expect((await t.api("DELETE", `/v1/vault/rules/${rule.json.id}`)).status).toBe(204);
    expect(await entries(t)).toMatchObject([{ pattern: "api.example", action: "allow", implicit: false }]);
  });

  it("the hosts GET /v1/blocked-hosts lists can be sent as they are", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const batch = auditBatch(run.id, {
      blockedHosts: ["pypi.example", "10.1.2.3", "files.pypi.example"].map((host) => ({
        host,
        count: 1,
        firstSeen: at(1),
        lastSeen: at(2),
      })),
    });
    expect((await postBatch(run, batch)).status).toBe(204);
    await t.api("PUT", "/v1/vault/settings", { default: "block" });
    const hosts = (await t.api("GET", "/v1/blocked-hosts")).json.blockedHosts.map((h: Row) => h.host);
    const res = await t.api("POST", "/v1/vault/hosts/from-blocked", { hosts });
    expect(res.status, res.text).toBe(200);
    expect(res.json.created).toBe(3);
    expect((await entries(t)).map((e) => e.pattern).sort()).toEqual([...hosts].sort());
  });

  it("a wildcard, junk, an IDN, too few or too many → 400 with the exact code; the vault unchanged", async () => {
    const t = await newTenant();
    await t.api("POST", "/v1/vault/hosts", { pattern: "b.example", action: "block" });
    const before = { version: await version(t), hosts: await entries(t) };
    const refused: [unknown, string][] = [
      [{ hosts: ["a.example", "*.evil.example"] }, "invalid_host_pattern"],
      [{ hosts: ["*"] }, "invalid_host_pattern"],
      [{ hosts: ["b.example", "https://a.example/path"] }, "invalid_host_pattern"],
      [{ hosts: ["a b.example"] }, "invalid_host_pattern"],
      [{ hosts: ["a.example\r\nx: y"] }, "invalid_host_pattern"],
      [{ hosts: ["münchen.example"] }, "invalid_host_pattern"],
      [{ hosts: ["user@a.example"] }, "invalid_host_pattern"],
      [{ hosts: [""] }, "invalid_request"],
      [{ hosts: [] }, "invalid_request"],
      [{ hosts: Array.from({ length: 101 }, (_, i) => `h${i}.example`) }, "invalid_request"],
      [{ hosts: "a.example" }, "invalid_request"],
      [{ hosts: [42] }, "invalid_request"],
      [{}, "invalid_request"],
      [{ hosts: ["a.example"], action: "block" }, "unknown_field"],
    ];
    for (const [body, code] of refused) {
      const res = await t.api("POST", "/v1/vault/hosts/from-blocked", body);
      expectProblem(res, 400, code);
    }
    expect({ version: await version(t), hosts: await entries(t) }).toEqual(before);
    // 100 is the most one call takes.
    const hundred = Array.from({ length: 100 }, (_, i) => `h${i}.example`);
    const res = await t.api("POST", "/v1/vault/hosts/from-blocked", { hosts: hundred });
    expect(res.json).toMatchObject({ created: 100, updated: 0, unchanged: 0 });
    expect(await version(t)).toBe(before.version + 1);
  });
});
