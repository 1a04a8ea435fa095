import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { describe, expect, it, vi } from "vitest";
import { randomId } from "../../src/crypto/api-keys";
import { runs } from "../../src/db/schema";
import { loggedIn } from "./browser";
import { newTenant, tenantWithUnreadableVault, withDb } from "./harness";
import { expectPage, has, lacks, textOf } from "./pages-fixtures";
import { newRun, setRunStatus } from "./run-fixtures";

// The runs list (/runs, src/pages/run-pages.tsx) through a logged-in browser over the real Worker
// and Postgres: its paging, the launch form (which refuses what POST /v1/runs refuses), and the
// login redirect for a browser without a session. One run's own page is in pages-run-page.

// Each test logs in and reads several pages over the real database; a few drive a run's alarms.
vi.setConfig({ testTimeout: 60_000 });

describe("the runs list", () => {
  it("shows an empty state, then the caller's runs newest first, paged, with links", async () => {
    const t = await newTenant();
    const b = await loggedIn(t, "/runs");
    has(expectPage(await b.get("/runs")), "No runs yet");

    // 21 run rows, a millisecond apart (one page of 20 and one more).
    const ids = Array.from({ length: 21 }, () => randomId("run_"));
    const base = Date.now() - 60_000;
    await withDb((db) =>
      db.insert(runs).values(
        ids.map((id, i) => ({
          id,
          userId: t.userId,
          environmentId: t.environmentId,
          spec: RunSpec.parse({ commands: ["true"] }),
          backend: "local",
          createdAt: new Date(base + i),
        })),
      ),
    );
    await setRunStatus(ids[20] as string, "stopped");
    const other = await newRun(await newTenant());

    const first = await b.get("/runs");
    expectPage(first);
    const listed = [...first.html.matchAll(/href="\/runs\/(run_[a-z0-9]+)"/g)].map((m) => m[1]);
    expect(listed).toEqual(ids.slice(1).reverse());
    lacks(first.html, other.id);
    has(textOf(first.html), "stopped");
    const older = /href="(\/runs\?cursor=[^"]+)"/.exec(first.html)?.[1]?.replaceAll("&amp;", "&");
    expect(older).toBeDefined();

    const second = await b.get(older as string);
    const text = expectPage(second);
    expect([...second.html.matchAll(/href="\/runs\/(run_[a-z0-9]+)"/g)].map((m) => m[1])).toEqual([ids[0]]);
    has(text, "Newest");
    lacks(second.html, "cursor=");

    const bad = await b.get("/runs?cursor=zzz");
    has(expectPage(bad, 400), "not one this site gave");
  });

  it("shows each run's benchmark, status and duration, and filters by status and benchmark", async () => {
    const t = await newTenant();
    const b = await loggedIn(t, "/runs");
    const launched = new Date(Date.now() - 3_725_000);
    const rows = [
      {
        id: randomId("run_"),
        spec: { benchmark: "demo" },
        status: "finished" as const,
        endedAt: new Date(launched.getTime() + 65_000),
      },
      {
        id: randomId("run_"),
        spec: { benchmark: "demo" },
        status: "failed" as const,
        endedAt: new Date(launched.getTime() + 5_000),
      },
      { id: randomId("run_"), spec: { commands: ["true"] }, status: "running" as const, endedAt: null },
    ];
    await withDb((db) =>
      db.insert(runs).values(
        rows.map((r) => ({
          id: r.id,
          userId: t.userId,
          environmentId: t.environmentId,
          spec: RunSpec.parse(r.spec),
          backend: "local",
          status: r.status,
          createdAt: launched,
          endedAt: r.endedAt,
        })),
      ),
    );
    const all = textOf(expectPage(await b.get("/runs")));
    for (const shown of [
      "demo",
      "commands",
      "1 min 5 s",
      "5 s",
      "1 h 2 min",
      "so far",
      "finished",
      "failed",
      "running",
    ])
      has(all, shown);
    const listedOn = (html: string) => [...html.matchAll(/href="\/runs\/(run_[a-z0-9]+)"/g)].map((m) => m[1]);
    const [finished, failed, running] = rows.map((r) => r.id);

    const demo = await b.get("/runs?benchmark=demo");
    expectPage(demo);
    expect(new Set(listedOn(demo.html))).toEqual(new Set([finished, failed]));
    has(demo.html, '<option value="demo" selected');
    const failedOnly = await b.get("/runs?benchmark=demo&status=failed");
    expect(listedOn(failedOnly.html)).toEqual([failed]);
    expect(listedOn((await b.get("/runs?status=running")).html)).toEqual([running]);
    has(textOf(expectPage(await b.get("/runs?status=stopped"))), "No runs match this filter");
  });

  it("launches a run from the form as POST /v1/runs would, refusing what the API refuses", async () => {
    const t = await tenantWithUnreadableVault("canary-launch-value");
    const b = await loggedIn(t, "/runs");
    const made = await b.post("/runs", { benchmark: "demo", lingerSeconds: "600", commands: "" });
    expect(made.status).toBe(303);
    const id = /^\/runs\/(run_[a-z2-7]+)\?ok=Launched/.exec(made.location ?? "")?.[1];
    expect(id, made.location ?? "").toBeDefined();
    const run = await t.api("GET", `/v1/runs/${id}`);
    expect(run.json.spec).toMatchObject({ benchmark: "demo", lingerSeconds: 600 });
    await t.api("POST", `/v1/runs/${id}/cancel`);
    const commands = await b.post("/runs", { benchmark: "", commands: "echo one\n\n  echo two  \n" });
    const second = /^\/runs\/(run_[a-z2-7]+)/.exec(commands.location ?? "")?.[1];
    expect((await t.api("GET", `/v1/runs/${second}`)).json.spec.commands).toEqual(["echo one", "echo two"]);
    await t.api("POST", `/v1/runs/${second}/cancel`);
    const before = (await t.api("GET", "/v1/runs")).json.runs.length;
    for (const [fields, words] of [
      [{ benchmark: "", commands: "" }, "commands"],
      [{ benchmark: "demo", lingerSeconds: "90000" }, "at most 86400 seconds"],
      [{ benchmark: "demo", lingerSeconds: "soon" }, "lingerSeconds"],
      [{ benchmark: "nope" }, "No benchmark"],
    ] as const) {
      const refused = await b.post("/runs", fields);
      expect(refused.status).toBe(303);
      expect(refused.location).toMatch(/^\/runs\?error=/);
      has(textOf(expectPage(await b.get(refused.location ?? ""))), words);
    }
    expect((await t.api("GET", "/v1/runs")).json.runs.length).toBe(before);
    const forged = await b.post("/runs", { benchmark: "demo", _csrf: "0".repeat(64) });
    expect(forged.status).toBe(403);
  });

  it("sends a browser without a session to the login page", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const b = await loggedIn(t, "/runs");
    b.cookie = null;
    const res = await b.get(`/runs/${run.id}`);
    expect(res.status).toBe(303);
    expect(res.location).toBe(`/login?next=${encodeURIComponent(`/runs/${run.id}`)}`);
  });
});
