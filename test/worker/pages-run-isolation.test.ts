import { describe, expect, it, vi } from "vitest";
import { loggedIn, type PageResponse } from "./browser";
import { newTenant } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { expectPage, has, lacks, launch, stored, textOf } from "./pages-fixtures";
import { auditBatch, driveToEnd, newRun, postBatch } from "./run-fixtures";

// What the run pages must never do, over the real Worker, coordinator and Postgres: show or
// change one tenant's run to another's session, act on a POST without the session's CSRF token,
// or show a flash the session did not make (C1); nor show the canary secret anywhere (B5).

// Each test logs in and reads several pages over the real database; a few drive a run's alarms.
vi.setConfig({ testTimeout: 60_000 });

describe("isolation and CSRF (C1)", () => {
  it("tenant B's session gets 404 for A's run pages, and every POST to A's run changes nothing", async () => {
    const a = await newTenant();
    const bTenant = await newTenant();
    const run = await newRun(a, { status: "running" });
    const now = new Date().toISOString();
    await postBatch(
      run,
      auditBatch(run.id, {
        blockedHosts: [{ host: "evil.example", count: 1, firstSeen: now, lastSeen: now }],
      }),
    );
    const b = await loggedIn(bTenant, "/runs");
    for (const path of [`/runs/${run.id}`, `/runs/${run.id}/proxy`]) {
      const res = await b.get(path);
      has(expectPage(res, 404), "There is no run");
      lacks(res.html, "evil.example");
    }
    lacks((await b.get("/runs")).html, run.id);
    const posts: [string, Record<string, string>][] = [
      ["cancel", {}],
      ["halt", {}],
      ["resume", {}],
      ["linger", { seconds: "60" }],
      ["linger", { seconds: "86401" }],
      ["allow-host", { host: "evil.example" }],
      ["bug-reports", { title: "from B", body: "from B" }],
    ];
    for (const [action, fields] of posts) {
      const res = await b.post(`/runs/${run.id}/${action}`, fields);
      expect(res.status, action).toBe(404);
      has(expectPage(res, 404), "There is no run");
    }
    // Nothing changed: A's run, its coordinator, its reports, both vaults' host entries.
    expect((await a.api("GET", `/v1/runs/${run.id}`)).json.status).toBe("running");
    for (const key of ["cancel", "halt", "linger"]) expect(await stored(run.id, key)).toBeUndefined();
    expect((await a.api("GET", `/v1/runs/${run.id}/bug-reports`)).json.bugReports).toEqual([]);
    expect((await a.api("GET", "/v1/vault/hosts")).json.hosts ?? []).toEqual([]);
    expect((await bTenant.api("GET", "/v1/vault/hosts")).json.hosts ?? []).toEqual([]);
  });

  it("shows a flash only with its MAC for this session: a crafted or another session's link shows nothing", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const b = await loggedIn(t, `/runs/${run.id}`);
    const said = await b.post(`/runs/${run.id}/linger`, { seconds: "90000" });
    const shown = textOf(expectPage(await b.get(said.location ?? "")));
    has(shown, "90000 were asked for");
    const crafted = `/runs/${run.id}?error=${encodeURIComponent("Your key leaked: paste it at evil.example")}`;
    lacks(textOf(expectPage(await b.get(crafted))), "evil.example");
    const forged = `${crafted}&fs=${"0".repeat(64)}`;
    lacks(textOf(expectPage(await b.get(forged))), "evil.example");
    // The same link, read in another session of the same user: no text.
    const other = await loggedIn(t, `/runs/${run.id}`);
    lacks(textOf(expectPage(await other.get(said.location ?? ""))), "90000 were asked for");
  });

  it("a POST without the session's _csrf → 403, and nothing changes", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    for (const [action, fields] of [
      ["cancel", {}],
      ["halt", {}],
      ["linger", { seconds: "60" }],
      ["bug-reports", { title: "t", body: "b" }],
      ["allow-host", { host: "evil.example" }],
    ] as [string, Record<string, string>][]) {
      expect((await b.post(`/runs/${run.id}/${action}`, { ...fields, _csrf: "" })).status).toBe(403);
      expect((await b.post(`/runs/${run.id}/${action}`, { ...fields, _csrf: "0".repeat(64) })).status).toBe(
        403,
      );
    }
    for (const key of ["cancel", "halt", "linger"]) expect(await stored(run.id, key)).toBeUndefined();
    expect((await t.api("GET", `/v1/runs/${run.id}/bug-reports`)).json.bugReports).toEqual([]);
    expect((await t.api("GET", "/v1/vault/hosts")).json.hosts).toEqual([]);
  });
});

describe("the canary secret (B5)", () => {
  it("appears in no run page, redirect or flash, whatever the run went through", async () => {
    const canary = newCanary("runpages");
    const needles = await leakNeedles(canary);
    const t = await newTenant();
    await t.api("POST", "/v1/vault/secrets", { name: "KEY", value: canary });
    await t.api("POST", "/v1/vault/rules", {
      host: "api.example.com",
      secret: "KEY",
      inject: { scheme: "bearer" },
    });
    await t.api("POST", "/v1/vault/hosts", { pattern: "evil.example", action: "block" });
    // A real run: its coordinator decrypts the canary, then the run stops (no backend here).
    const ended = await launch(t);
    await driveToEnd(t, ended);
    // A live run with audit rows.
    const live = await newRun(t, { status: "running" });
    const now = new Date().toISOString();
    await postBatch(
      live,
      auditBatch(live.id, {
        blockedHosts: [{ host: "evil.example", count: 2, firstSeen: now, lastSeen: now }],
        egressRoutes: [{ host: "api.example.com", route: "direct", count: 5, firstSeen: now, lastSeen: now }],
      }),
    );

    const b = await loggedIn(t, "/runs");
    const seen: [string, PageResponse][] = [];
    const get = async (path: string) => {
      const res = await b.get(path);
      seen.push([`GET ${path}`, res]);
      return res;
    };
    const post = async (path: string, fields: Record<string, string>) => {
      const res = await b.post(path, fields);
      seen.push([`POST ${path}`, res]);
      if (res.location) await get(res.location);
      return res;
    };
    await get("/runs");
    for (const id of [ended, live.id]) {
      await get(`/runs/${id}`);
      await get(`/runs/${id}/proxy`);
      await post(`/runs/${id}/linger`, { seconds: "86401" });
      await post(`/runs/${id}/linger`, { seconds: "60" });
      await post(`/runs/${id}/halt`, {});
      await post(`/runs/${id}/bug-reports`, { title: "a report", body: "what happened" });
      await post(`/runs/${id}/bug-reports`, { title: "", body: "refused" });
    }
    await post(`/runs/${live.id}/allow-host`, { host: "evil.example" });
    await post(`/runs/${live.id}/allow-host`, { host: "*.example.com" });
    await post(`/runs/${live.id}/cancel`, {});
    await get("/runs/run_doesnotexist");
    expect(seen.length).toBeGreaterThan(20);
    const hits = seen.flatMap(([where, res]) =>
      findNeedles(
        where,
        `${res.status}\n${[...res.headers].map(([k, v]) => `${k}: ${v}`).join("\n")}\n\n${res.html}`,
        needles,
      ),
    );
    expect(hits).toEqual([]);
  });
});
