import { eq } from "drizzle-orm";
import { describe, expect, it, vi } from "vitest";
import { type RunState, runs } from "../../src/db/schema";
import { type ProxyLook, ProxyPage } from "../../src/pages/proxy-page";
import type { RunRow } from "../../src/runs/service";
import { loggedIn } from "./browser";
import { newTenant, withDb } from "./harness";
import { expectPage, has, lacks, textOf } from "./pages-fixtures";
import { newRun } from "./run-fixtures";

// A run's proxy page (/runs/{id}/proxy, src/pages/proxy-page.tsx): the route's answer when there
// is no proxy to look at, and the page's component rendering the views a live proxy would return
// (no compute backend runs in workerd; the e2e suite reads real ones).

// Each test logs in and reads several pages over the real database; a few drive a run's alarms.
vi.setConfig({ testTimeout: 60_000 });

describe("the proxy page", () => {
  it("a run with no proxy says so (proxy_gone), as does an ended run, without a stack", async () => {
    const t = await newTenant();
    const notStarted = await newRun(t, { status: "running" });
    const b = await loggedIn(t, `/runs/${notStarted.id}/proxy`);
    const res = await b.get(`/runs/${notStarted.id}/proxy`);
    const text = expectPage(res, 409);
    has(text, "proxy_gone");
    has(text, "This run has no proxy running");
    lacks(text, /Error|stack/);

    const ended = await newRun(t, { status: "finished" });
    const gone = await b.get(`/runs/${ended.id}/proxy`);
    has(expectPage(gone, 409), `Run ${ended.id} has ended (finished); its proxy is gone.`);
    has(gone.html, `href="/runs/${ended.id}"`);
  });
});

describe("the proxy page's view", () => {
  // No compute backend runs in workerd, so no proxy answers here: the view the coordinator would
  // return (the e2e suite reads real ones) is rendered by the page's own component.
  const decision = (i: number) => ({
    at: new Date(Date.UTC(2030, 0, 1, 0, 0, i % 60)).toISOString(),
    listener: "tls" as const,
    host: i === 99 ? `<img src=x>.${"h".repeat(240)}` : `host-${i}.example`,
    port: 443,
    method: "GET",
    decision: i % 2 ? ("block" as const) : ("allow" as const),
    reason: i % 2 ? "host_blocked" : "allowed",
    status: i % 2 ? 403 : 200,
    rule: i % 2 ? null : 0,
    policyVersion: 3,
    ms: 1.5,
  });
  const view = (recent: number) => ({
    runId: "run_aaaaaaaaaaaaaaaaaaaaaaaaaa",
    startedAt: new Date().toISOString(),
    generatedAt: new Date().toISOString(),
    policyVersion: 3,
    policyState: "ready" as const,
    counts: { requests: 1234, allow: 1000, block: 200, refuse: 30, error: 4, injected: 777 },
    recent: Array.from({ length: recent }, (_, i) => decision(i)),
    audit: {
      rowsRecorded: 9,
      rowsSent: 8,
      rowsRejected: 0,
      rowsRefused: 0,
      batchesSent: 2,
      batchesRejected: 0,
      pendingBatches: 1,
      accepting: false,
    },
  });

  async function render(look: ProxyLook, status: RunState = "lingering"): Promise<string> {
    const t = await newTenant();
    const made = await newRun(t, { status });
    const [run] = await withDb((db) => db.select().from(runs).where(eq(runs.id, made.id)));
    return String(await ProxyPage({ run: run as RunRow, look, csrf: "0".repeat(64) }).toString());
  }

  it("a paused proxy resumed by the look says so; counts, policy, audit; decisions newest first, escaped", async () => {
    const html = await render({ ok: true, resumed: true, view: view(100) });
    const text = textOf(html);
    has(text, "This proxy was paused for idleness; looking at it resumed it");
    for (const n of ["1234", "1000", "777", "200", "30"]) has(text, n);
    has(text, "The audit spool is full");
    has(html, "&lt;img src=x&gt;.");
    lacks(html, "<img");
    // Newest first: decision 99 before decision 0.
    expect(html.indexOf("&lt;img src=x")).toBeLessThan(html.indexOf("host-0.example"));
    // The counts table (header, one row) and the decisions table (header, 100 rows).
    expect(html.match(/<tr>/g)?.length).toBe(2 + 1 + 100);
  });

  it("a look that did not wake anyone, an unreachable proxy, and no decisions yet", async () => {
    const awake = await render({ ok: true, resumed: false, view: view(0) });
    has(textOf(awake), "Looking at a lingering proxy keeps it awake");
    has(textOf(awake), "No request has gone through the proxy yet");
    lacks(textOf(awake), "resumed it");
    const unreachable = await render({
      ok: false,
      code: "proxy_unreachable",
      detail: "Run run_x: the proxy did not answer in time.",
    });
    has(
      textOf(unreachable),
      "proxy_unreachable The run's proxy did not answer. Run run_x: the proxy did not answer in time.",
    );
    has(unreachable, '<p class="error">');
  });
});
