import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { describe, expect, it, vi } from "vitest";
import { randomId } from "../../src/crypto/api-keys";
import { blockedHostLog, runEvents, runs } from "../../src/db/schema";
import { LABEL_W, PLOT_W } from "../../src/pages/run-timeline";
import { storeAuditBatch } from "../../src/runs/proxy-reports";
import { loggedIn, type PageResponse } from "./browser";
import { newTenant, type Tenant, withDb } from "./harness";
import { auditBatch, newRun, setRunStatus } from "./run-fixtures";

// Issue 23 item 9, over the real Worker and the real Postgres: the run page's timeline drawn from
// a trace whose times the test chose (one bar per phase that happened, placed and sized by them,
// the notes and denials marked), the page reloading itself only while the run moves, and the
// vault page's refusals per day matching blocked_host_log.

vi.setConfig({ testTimeout: 60_000 });

function expectPage(res: PageResponse): string {
  if (res.status !== 200) throw new Error(`expected 200, got ${res.status}: ${res.html.slice(0, 400)}`);
  expect(res.headers.get("content-security-policy")).toContain("default-src 'none'");
  expect(res.html).not.toMatch(/<script/i);
  return res.html;
}

const T0 = Date.parse("2026-03-01T10:00:00.000Z");
const at = (seconds: number) => new Date(T0 + seconds * 1000);

type Row = typeof runEvents.$inferInsert;
const move = (runId: string, state: string, seconds: number, reason = "x"): Row => ({
  runId,
  key: `t:${state}`,
  kind: "transition",
  state,
  reason,
  at: at(seconds),
});
const row = (runId: string, key: string, kind: Row["kind"], seconds: number, detail: unknown): Row => ({
  runId,
  key,
  kind,
  detail,
  at: at(seconds),
});

/** A run's trace as the coordinator would have written it, at the given seconds after T0. */
function fullTrace(runId: string): Row[] {
  const sbx = { sandbox: "sbx_w", name: "work" };
  return [
    move(runId, "queued", -5, "launched"),
    move(runId, "fetching_vault", 0, "started"),
    move(runId, "starting_proxy", 2, "vault_read"),
    move(runId, "starting_sandboxes", 6, "proxy_ready"),
    move(runId, "wiring", 10, "sandboxes_ready"),
    move(runId, "running", 12, "boundary_proved"),
    row(runId, "setup:sbx_w:0:stdout:3", "output", 14, { ...sbx, stage: "setup", command: 0, text: "ok\n" }),
    row(runId, "exit-setup:sbx_w:0", "output", 16, { ...sbx, stage: "setup", command: 0, exitCode: 0 }),
    row(runId, "seal:sbx_w", "note", 20, { ...sbx, stage: "seal", killed: 0, text: "sealed" }),
    row(runId, "rewire:sbx_w", "proxy", 21, {
      ...sbx,
      stage: "execute",
      installed: true,
      routing: "default",
      proof: { ok: true },
    }),
    row(runId, "n:routing_change_not_retrofitted", "note", 25, {
      level: "warning",
      code: "routing_change_not_retrofitted",
      text: "The vault's routing changed.",
    }),
    row(runId, "exit:sbx_w:0", "output", 38, { ...sbx, stage: "execute", command: 0, exitCode: 0 }),
    move(runId, "finishing", 40, "completed"),
    move(runId, "finished", 42, "completed"),
  ];
}

interface Bar {
  phase: string;
  ongoing: boolean;
  x: number;
  width: number;
}

function barsOf(html: string): Bar[] {
  const svg = /<svg class="timeline"[\s\S]*?<\/svg>/.exec(html)?.[0] ?? "";
  return [
    ...svg.matchAll(
      /<g class="phase( ongoing)?" data-phase="(\w+)"[^>]*>[\s\S]*?<rect class="ph-\w+" x="([\d.]+)" y="[\d.]+" width="([\d.]+)"/g,
    ),
  ].map((m) => ({ phase: m[2] ?? "", ongoing: m[1] !== undefined, x: Number(m[3]), width: Number(m[4]) }));
}

function marksOf(html: string): { kind: string; at: string; cx: number; title: string }[] {
  return [
    ...html.matchAll(
      /<g class="mark (note|denial)" data-at="([^"]+)"><title>([^<]*)<\/title><line class="mark-line" x1="([\d.]+)"/g,
    ),
  ].map((m) => ({ kind: m[1] ?? "", at: m[2] ?? "", title: m[3] ?? "", cx: Number(m[4]) }));
}

async function runWith(t: Tenant, status: RunRowStatus, trace: (id: string) => Row[]): Promise<string> {
  const run = await newRun(t, { status });
  await withDb((db) => db.insert(runEvents).values(trace(run.id)));
  if (status === "finished") await setRunStatus(run.id, "finished");
  return run.id;
}
type RunRowStatus = typeof runs.$inferSelect.status;

describe("the run page's timeline", () => {
  it("draws one bar per phase that happened, placed by the trace's times, with notes and denials marked", async () => {
    const t = await newTenant();
    const id = await runWith(t, "finished", fullTrace);
    // A host refused from 30 s to 35 s into the run, five times.
    const owner = { id, userId: t.userId, environmentId: t.environmentId };
    await withDb((db) =>
      storeAuditBatch(
        db,
        owner,
        auditBatch(id, {
          blockedHosts: [
            {
              host: "evil.example",
              count: 5,
              firstSeen: at(30).toISOString(),
              lastSeen: at(35).toISOString(),
            },
          ],
        }),
      ),
    );
    const b = await loggedIn(t, `/runs/${id}`);
    const html = expectPage(await b.get(`/runs/${id}`));

    // 42 s from the vault's fetch to the end: PLOT_W units for 42 s, from LABEL_W.
    const x = (s: number) => LABEL_W + (s / 42) * PLOT_W;
    const expected: [string, number, number][] = [
      ["vault", 0, 2],
      ["proxy", 2, 6],
      ["sandboxes", 6, 10],
      ["wiring", 10, 12],
      // running splits at the seal, the last setup-stage row.
      ["setup", 12, 20],
      ["execute", 20, 40],
      ["teardown", 40, 42],
    ];
    const bars = barsOf(html);
    expect(bars.map((b) => b.phase)).toEqual(expected.map((e) => e[0]));
    for (const [i, [, from, to]] of expected.entries()) {
      expect(bars[i]?.x).toBeCloseTo(x(from), 1);
      expect(bars[i]?.width).toBeCloseTo(x(to) - x(from), 1);
      expect(bars[i]?.ongoing).toBe(false);
    }
    // Each bar is titled with its times and how long it took.
    expect(html).toContain("<title>setup: 10:00:12 UTC to 10:00:20 UTC, 8.0 s</title>");

    const marks = marksOf(html);
    expect(marks.map((m) => [m.kind, m.at])).toEqual([
      ["note", at(25).toISOString()],
      ["denial", at(30).toISOString()],
    ]);
    expect(marks[0]?.cx).toBeCloseTo(x(25), 1);
    expect(marks[0]?.title).toContain(
      "warning routing_change_not_retrofitted: The vault&#39;s routing changed.",
    );
    expect(marks[1]?.cx).toBeCloseTo(x(30), 1);
    expect(marks[1]?.title).toBe("evil.example refused 5 times (10:00:30 UTC to 10:00:35 UTC)");
    // The denial's span, from its first refusal to its last.
    const span = /<line class="mark-span" x1="([\d.]+)" x2="([\d.]+)"/.exec(html);
    expect(Number(span?.[1])).toBeCloseTo(x(30), 1);
    expect(Number(span?.[2])).toBeCloseTo(x(35), 1);

    // The text fallback says the same.
    const table = /<table id="timeline-table">([\s\S]*?)<\/table>/.exec(html)?.[1] ?? "";
    expect(table).toContain("<td>execute</td>");
    expect(table).toContain("<td>20.0 s</td>");
    expect(table).toContain("evil.example refused 5 times");
    // The SVG is an image with a name, for assistive technology.
    expect(html).toMatch(/<svg class="timeline"[^>]*role="img"[^>]*aria-labelledby="timeline-title"/);
  });

  it("a run stopped in its vault has a vault and a teardown bar only; a queued run none", async () => {
    const t = await newTenant();
    const stopped = await runWith(t, "finished", (id) => [
      move(id, "queued", -1),
      move(id, "fetching_vault", 0),
      move(id, "finishing", 3),
      move(id, "stopped", 4),
    ]);
    const b = await loggedIn(t, `/runs/${stopped}`);
    const bars = barsOf(expectPage(await b.get(`/runs/${stopped}`)));
    expect(bars.map((x) => x.phase)).toEqual(["vault", "teardown"]);
    expect(bars[0]?.width).toBeCloseTo(PLOT_W * 0.75, 1);

    const queued = await newRun(t, { status: "queued" });
    const page = expectPage(await b.get(`/runs/${queued.id}`));
    expect(barsOf(page)).toEqual([]);
    expect(page).toContain("Not started yet");
  });

  it("a live run's current phase runs to now, marked ongoing; a lingering run's linger likewise", async () => {
    const t = await newTenant();
    const secondsAgo = (s: number) => (Date.now() - T0) / 1000 - s;
    const live = await runWith(t, "running", (id) => [
      move(id, "fetching_vault", secondsAgo(30)),
      move(id, "starting_proxy", secondsAgo(20)),
      move(id, "starting_sandboxes", secondsAgo(10)),
    ]);
    const b = await loggedIn(t, `/runs/${live}`);
    const bars = barsOf(expectPage(await b.get(`/runs/${live}`)));
    expect(bars.map((x) => [x.phase, x.ongoing])).toEqual([
      ["vault", false],
      ["proxy", false],
      ["sandboxes", true],
    ]);
    // Ten of the ~thirty seconds so far: the ongoing bar reaches the plot's right edge.
    expect((bars[2]?.x ?? 0) + (bars[2]?.width ?? 0)).toBeCloseTo(LABEL_W + PLOT_W, 0);

    const lingering = await runWith(t, "lingering", (id) => [
      move(id, "fetching_vault", secondsAgo(60)),
      move(id, "running", secondsAgo(50)),
      move(id, "finishing", secondsAgo(40)),
      move(id, "lingering", secondsAgo(30)),
    ]);
    const lingerBars = barsOf(expectPage(await b.get(`/runs/${lingering}`)));
    expect(lingerBars.map((x) => [x.phase, x.ongoing])).toEqual([
      ["vault", false],
      ["execute", false],
      ["teardown", false],
      ["linger", true],
    ]);
  });
});

describe("the run page reloads itself while the run moves", () => {
  const refreshOf = (html: string) => /<meta http-equiv="refresh" content="([^"]*)"/.exec(html)?.[1] ?? null;

  it("every 5 s while running (keeping cursors, dropping a flash); not lingering, not ended, not when asked", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const page = expectPage(await b.get(`/runs/${run.id}`));
    expect(refreshOf(page)).toBe(`5; url=/runs/${run.id}`);
    expect(page).toContain("this page reloads itself every 5 s");
    // The card cursors stay, an ok flash (read once) does not.
    const paged = expectPage(await b.get(`/runs/${run.id}?reports=abc&ok=Done&fs=${"0".repeat(64)}`));
    expect(refreshOf(paged)).toBe(`5; url=/runs/${run.id}?reports=abc`);
    // To fill in a form: ?refresh=off, with a way back.
    const off = expectPage(await b.get(`/runs/${run.id}?refresh=off`));
    expect(refreshOf(off)).toBeNull();
    expect(off).toContain(`<a href="/runs/${run.id}">Follow the run</a>`);
    // A refused bug report keeps its title on the page: that page stays put.
    expect(refreshOf(expectPage(await b.get(`/runs/${run.id}?title=half+written`)))).toBeNull();

    for (const status of ["queued", "wiring", "finishing"] as const) {
      await setRunStatus(run.id, status);
      expect(refreshOf(expectPage(await b.get(`/runs/${run.id}`))), status).not.toBeNull();
    }
    for (const status of ["lingering", "finished", "stopped", "failed"] as const) {
      await setRunStatus(run.id, status);
      const ended = expectPage(await b.get(`/runs/${run.id}`));
      expect(refreshOf(ended), status).toBeNull();
      expect(ended).not.toContain("http-equiv");
      expect(ended).not.toContain('id="live"');
    }
  });
});

describe("the vault page's refusals per day", () => {
  it("one column a day for 14 days, each the day's sum of the environment's refusals", async () => {
    const t = await newTenant();
    const other = await newTenant();
    const day = 86_400_000;
    const today = new Date(Math.floor(Date.now() / day) * day);
    const iso = (d: Date) => d.toISOString();
    const daysAgo = (n: number, hour = 1) => new Date(today.getTime() - n * day + hour * 3_600_000);
    const runFor = async (tenant: Tenant) => {
      const id = randomId("run_");
      await withDb((db) =>
        db.insert(runs).values({
          id,
          userId: tenant.userId,
          environmentId: tenant.environmentId,
          spec: RunSpec.parse({ commands: ["true"] }),
          backend: "local",
          status: "finished",
        }),
      );
      return id;
    };
    const log = async (tenant: Tenant, runId: string, host: string, count: number, last: Date) =>
      withDb((db) =>
        db.insert(blockedHostLog).values({
          userId: tenant.userId,
          environmentId: tenant.environmentId,
          runId,
          host,
          seenCount: count,
          firstSeen: new Date(last.getTime() - 60_000),
          lastSeen: last,
          source: "proxy",
        }),
      );
    const [a, c] = [await runFor(t), await runFor(t)];
    await log(t, a, "one.example", 3, daysAgo(0));
    await log(t, c, "one.example", 4, daysAgo(0, 0));
    await log(t, a, "two.example", 5, daysAgo(2, 23));
    await log(t, c, "old.example", 9, daysAgo(20));
    // Another tenant's refusals are not ours.
    await log(other, await runFor(other), "theirs.example", 50, daysAgo(0));

    const b = await loggedIn(t, "/manage/vault");
    const html = expectPage(await b.get("/manage/vault"));
    const svg = /<svg class="per-day"[\s\S]*?<\/svg>/.exec(html)?.[0] ?? "";
    const columns = [...svg.matchAll(/<g data-day="([\d-]+)" data-refusals="(\d+)">([\s\S]*?)<\/g>/g)];
    const expected = Array.from({ length: 14 }, (_, i) => {
      const d = iso(new Date(today.getTime() - (13 - i) * day)).slice(0, 10);
      return [d, i === 13 ? 7 : i === 11 ? 5 : 0];
    });
    expect(columns.map((m) => [m[1], Number(m[2])])).toEqual(expected);
    const height = (m: RegExpMatchArray | undefined) =>
      Number(/<rect class="bar"[^>]* height="([\d.]+)"/.exec(m?.[3] ?? "")?.[1] ?? 0);
    // The busiest day is the chart's full height; the others scale to it; an empty day has no bar.
    expect(height(columns[13])).toBe(100);
    expect(height(columns[11])).toBeCloseTo((5 / 7) * 100, 1);
    expect(columns[0]?.[3]).not.toContain("<rect");
    expect(columns[13]?.[3]).toContain(`<title>${expected[13]?.[0]}: 7 refusals of 1 host</title>`);
    expect(svg).toMatch(/role="img" aria-labelledby="per-day-title"/);
    expect(svg).toContain("12 in all, at most 7 a day");
  });

  it("no chart before any refusal", async () => {
    const t = await newTenant();
    const b = await loggedIn(t, "/manage/vault");
    const html = expectPage(await b.get("/manage/vault"));
    expect(html).toContain("No run has been refused a host yet.");
    expect(html).not.toContain('<svg class="per-day"');
  });
});
