import { describe, expect, it } from "vitest";
import { call, expectProblem, newTenant, type Tenant } from "./harness";
import { auditBatch, newRun, postBatch, type TestRun } from "./run-fixtures";

// GET /v1/runs/{id}/blocked-hosts, /egress-routes, /limit-refusals and /stray-placeholders
// (src/routes/run-audit.ts): the public, paged reads of what a run's proxy posted to the internal
// audit route, and that they are the run owner's only. Apart from the internal routes because a tenant's API key calls them.

describe("GET /v1/runs/{id}/blocked-hosts, /egress-routes, /limit-refusals, /stray-placeholders", {
  timeout: 60_000,
}, () => {
  const minute = (n: number) => new Date(Date.UTC(2026, 1, 1, 9, n)).toISOString();

  async function runWithAudit(t: Tenant): Promise<TestRun> {
    const run = await newRun(t);
    // Seven hosts, two of them sharing a last-seen time (ties break by host name).
    const blockedHosts = [0, 1, 2, 3, 4, 5, 5].map((n, i) => ({
      host: `h${i}.blocked.example`,
      count: i + 1,
      firstSeen: minute(0),
      lastSeen: minute(n),
    }));
    const egressRoutes = (["direct", "tunnel", "refused"] as const).flatMap((route, r) =>
      [0, 1].map((i) => ({
        host: `e${i}.example`,
        route,
        count: 1,
        firstSeen: minute(0),
        lastSeen: minute(r),
      })),
    );
    // Five limit refusals on two hosts, three sharing a last-seen time (ties by host, method, limit).
    const limitRefusals = (
      [
        ["api.example", "DELETE", "method", 2],
        ["api.example", "GET", "path", 2],
        ["api.example", "GET", "unnormalisable_path", 2],
        ["b.example", "POST", "path", 1],
        ["a.example", "PUT", "method", 0],
      ] as const
    ).map(([host, method, limit, n], i) => ({
      host,
      method,
      limit,
      count: i + 1,
      firstSeen: minute(0),
      lastSeen: minute(n),
    }));
    const strayPlaceholders = [
      ["evil.example", "API_KEY", 1],
      ["evil.example", "GH_TOKEN", 1],
      ["other.example", "API_KEY", 3],
      ["a.example", "API_KEY", 0],
    ].map(([host, secret, n], i) => ({
      host: host as string,
      secret: secret as string,
      count: i + 1,
      firstSeen: minute(0),
      lastSeen: minute(n as number),
    }));
    const batch = auditBatch(run.id, { blockedHosts, egressRoutes, limitRefusals, strayPlaceholders });
    expect((await postBatch(run, batch)).status).toBe(204);
    return run;
  }

  async function walk(t: Tenant, path: string, key: string, limit: number) {
    const pages: unknown[][] = [];
    let cursor: string | null = null;
    do {
      const q: string = cursor ? `&cursor=${encodeURIComponent(cursor)}` : "";
      const res = await t.api("GET", `${path}?limit=${limit}${q}`);
      expect(res.status, res.text).toBe(200);
      pages.push(res.json[key]);
      cursor = res.json.nextCursor;
    } while (cursor && pages.length < 20);
    return pages;
  }

  it("pages most recent first, by an opaque cursor, each row once", async () => {
    const t = await newTenant();
    const run = await runWithAudit(t);
    const all = await t.api("GET", `/v1/runs/${run.id}/blocked-hosts`);
    expect(all.status).toBe(200);
    expect(all.json.nextCursor).toBeNull();
    expect(all.json.blockedHosts.map((h: { host: string }) => h.host)).toEqual([
      "h5.blocked.example",
      "h6.blocked.example",
      "h4.blocked.example",
      "h3.blocked.example",
      "h2.blocked.example",
      "h1.blocked.example",
      "h0.blocked.example",
    ]);
    expect(all.json.blockedHosts[0]).toEqual({
      host: "h5.blocked.example",
      seenCount: 6,
      firstSeen: minute(0),
      lastSeen: minute(5),
      source: "proxy",
    });
    for (const limit of [1, 2, 3, 7]) {
      const pages = await walk(t, `/v1/runs/${run.id}/blocked-hosts`, "blockedHosts", limit);
      expect(pages.flat()).toEqual(all.json.blockedHosts);
      expect(pages.every((p) => p.length <= limit)).toBe(true);
    }

    const routes = await t.api("GET", `/v1/runs/${run.id}/egress-routes`);
    expect(
      routes.json.egressRoutes.map((r: { host: string; route: string }) => `${r.route} ${r.host}`),
    ).toEqual([
      "refused e0.example",
      "refused e1.example",
      "tunnel e0.example",
      "tunnel e1.example",
      "direct e0.example",
      "direct e1.example",
    ]);
    for (const limit of [1, 4]) {
      const pages = await walk(t, `/v1/runs/${run.id}/egress-routes`, "egressRoutes", limit);
      expect(pages.flat()).toEqual(routes.json.egressRoutes);
    }
  });

  // case N3 and case N2: what was recorded is shown, host, method, limit or secret name and counts
  it("limit refusals and stray placeholders: as stored, newest first, paged; never a path or value", async () => {
    const t = await newTenant();
    const run = await runWithAudit(t);
    const limits = await t.api("GET", `/v1/runs/${run.id}/limit-refusals`);
    expect(limits.status, limits.text).toBe(200);
    expect(limits.json.nextCursor).toBeNull();
    expect(
      limits.json.limitRefusals.map(
        (r: { host: string; method: string; limit: string; count: number }) =>
          `${r.host} ${r.method} ${r.limit} ${r.count}`,
      ),
    ).toEqual([
      "api.example DELETE method 1",
      "api.example GET path 2",
      "api.example GET unnormalisable_path 3",
      "b.example POST path 4",
      "a.example PUT method 5",
    ]);
    expect(limits.json.limitRefusals[0]).toEqual({
      host: "api.example",
      method: "DELETE",
      limit: "method",
      count: 1,
      firstSeen: minute(0),
      lastSeen: minute(2),
    });
    for (const limit of [1, 2, 4]) {
      const pages = await walk(t, `/v1/runs/${run.id}/limit-refusals`, "limitRefusals", limit);
      expect(pages.flat()).toEqual(limits.json.limitRefusals);
      expect(pages.every((p) => p.length <= limit)).toBe(true);
    }

    const strays = await t.api("GET", `/v1/runs/${run.id}/stray-placeholders`);
    expect(strays.status, strays.text).toBe(200);
    expect(strays.json.strayPlaceholders).toEqual([
      { host: "other.example", secret: "API_KEY", count: 3, firstSeen: minute(0), lastSeen: minute(3) },
      { host: "evil.example", secret: "API_KEY", count: 1, firstSeen: minute(0), lastSeen: minute(1) },
      { host: "evil.example", secret: "GH_TOKEN", count: 2, firstSeen: minute(0), lastSeen: minute(1) },
      { host: "a.example", secret: "API_KEY", count: 4, firstSeen: minute(0), lastSeen: minute(0) },
    ]);
    for (const limit of [1, 3]) {
      const pages = await walk(t, `/v1/runs/${run.id}/stray-placeholders`, "strayPlaceholders", limit);
      expect(pages.flat()).toEqual(strays.json.strayPlaceholders);
    }
    // One list's cursor is not a position in another (case O3).
    const limitCursor = (await t.api("GET", `/v1/runs/${run.id}/limit-refusals?limit=1`)).json.nextCursor;
    const strayCursor = (await t.api("GET", `/v1/runs/${run.id}/stray-placeholders?limit=1`)).json.nextCursor;
    const routeCursor = (await t.api("GET", `/v1/runs/${run.id}/egress-routes?limit=1`)).json.nextCursor;
    for (const [path, cursor] of [
      ["stray-placeholders", limitCursor],
      ["limit-refusals", strayCursor],
      ["limit-refusals", routeCursor],
      ["egress-routes", strayCursor],
      ["blocked-hosts", limitCursor],
    ]) {
      expectProblem(await t.api("GET", `/v1/runs/${run.id}/${path}?cursor=${cursor}`), 400, "invalid_cursor");
    }
    const quiet = await newRun(t);
    expect((await t.api("GET", `/v1/runs/${quiet.id}/limit-refusals`)).json).toEqual({
      limitRefusals: [],
      nextCursor: null,
    });
    expect((await t.api("GET", `/v1/runs/${quiet.id}/stray-placeholders`)).json).toEqual({
      strayPlaceholders: [],
      nextCursor: null,
    });
  });

  it("bad paging → 400 with the exact code; a run without audit rows → empty", async () => {
    const t = await newTenant();
    const run = await runWithAudit(t);
    const base = `/v1/runs/${run.id}/blocked-hosts`;
    for (const q of ["limit=0", "limit=201", "limit=x"])
      expectProblem(await t.api("GET", `${base}?${q}`), 400, "invalid_request");
    expectProblem(await t.api("GET", `${base}?cursor=garbage`), 400, "invalid_cursor");
    expectProblem(await t.api("GET", `${base}?runId=${run.id}`), 400, "unknown_field");
    // A cursor of the other list does not fit this one.
    const routes = await t.api("GET", `/v1/runs/${run.id}/egress-routes?limit=1`);
    expectProblem(await t.api("GET", `${base}?cursor=${routes.json.nextCursor}`), 400, "invalid_cursor");
    const quiet = await newRun(t);
    expect((await t.api("GET", `/v1/runs/${quiet.id}/egress-routes`)).json).toEqual({
      egressRoutes: [],
      nextCursor: null,
    });
  });

  it("another tenant's run → 404 not_found (as a run that does not exist); no key → 401", async () => {
    const a = await newTenant();
    const b = await newTenant();
    const theirs = await runWithAudit(b);
    for (const path of ["blocked-hosts", "egress-routes", "limit-refusals", "stray-placeholders"]) {
      const res = expectProblem(await a.api("GET", `/v1/runs/${theirs.id}/${path}`), 404, "not_found");
      expect(res.text).not.toContain("blocked.example");
      expect(res.text).not.toContain("api.example");
      expectProblem(await a.api("GET", `/v1/runs/run_doesnotexist/${path}`), 404, "not_found");
      expectProblem(await call(null, "GET", `/v1/runs/${theirs.id}/${path}`), 401, "unauthorized");
      // The run's proxy token is not an API key.
      expectProblem(
        await call(theirs.proxyToken, "GET", `/v1/runs/${theirs.id}/${path}`),
        401,
        "unauthorized",
      );
      expect((await b.api("GET", `/v1/runs/${theirs.id}/${path}`)).status).toBe(200);
    }
  });
});
