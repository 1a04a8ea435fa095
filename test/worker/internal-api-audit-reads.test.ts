import { describe, expect, it } from "vitest";
import { call, expectProblem, newTenant, type Tenant } from "./harness";
import { auditBatch, newRun, postBatch, type TestRun } from "./run-fixtures";

// GET /v1/runs/{id}/blocked-hosts and /egress-routes (src/routes/run-audit.ts): the public,
// paged reads of what a run's proxy posted to the internal audit route, and that they are the
// run owner's only. Apart from the internal routes because a tenant's API key calls them.

describe("GET /v1/runs/{id}/blocked-hosts and /egress-routes", { timeout: 60_000 }, () => {
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
    expect((await postBatch(run, auditBatch(run.id, { blockedHosts, egressRoutes }))).status).toBe(204);
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

  it("bad paging → 400 with the exact code; a run without audit rows → empty", async () => {
    const t = await newTenant();
    const run = await runWithAudit(t);
    const base = `/v1/runs/${run.id}/blocked-hosts`;
    for (const q of ["limit=0", "limit=201", "limit=x"])
      expectProblem(await t.api("GET", `${base}?${q}`), 400, "invalid_request");
    expectProblem(await t.api("GET", `${base}?cursor=garbage`), 400, "invalid_request");
    expectProblem(await t.api("GET", `${base}?runId=${run.id}`), 400, "unknown_field");
    // A cursor of the other list does not fit this one.
    const routes = await t.api("GET", `/v1/runs/${run.id}/egress-routes?limit=1`);
    expectProblem(await t.api("GET", `${base}?cursor=${routes.json.nextCursor}`), 400, "invalid_request");
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
    for (const path of ["blocked-hosts", "egress-routes"]) {
      const res = expectProblem(await a.api("GET", `/v1/runs/${theirs.id}/${path}`), 404, "not_found");
      expect(res.text).not.toContain("blocked.example");
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
