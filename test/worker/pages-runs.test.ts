import { runDurableObjectAlarm } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { coordinatorStub } from "../../src/coordinator/run-coordinator";
import { randomId } from "../../src/crypto/api-keys";
import { runEvents, runs } from "../../src/db/schema";
import { addEvent, addNote } from "../../src/runs/service";
import { loggedIn, type PageResponse } from "./browser";
import { newTenant, type Tenant, tenantWithUnreadableVault, withDb } from "./harness";
import { newCanary } from "./leaks";
import { auditBatch, newRun, postBatch, setRunStatus } from "./run-fixtures";

// The run pages (src/pages/run-pages.tsx) through a logged-in browser, over the real Worker, the
// real coordinator Durable Object and the real Postgres: the runs list, a run's dashboard, its
// proxy's page and every form on them; tenant isolation (C1) and the canary secret (B5).

const TERMINAL = new Set(["finished", "stopped", "failed"]);

/** Drives the run's alarms (no sleeping on timers) until it ends, as runs.test.ts does. */
async function driveToEnd(t: Tenant, runId: string) {
  const stub = coordinatorStub(env, runId);
  for (let i = 0; i < 200; i++) {
    const run = await t.api("GET", `/v1/runs/${runId}`);
    if (TERMINAL.has(run.json.status)) return run;
    const fired = await runDurableObjectAlarm(stub);
    if (!fired) await new Promise((r) => setTimeout(r, 50));
  }
  throw new Error(`run ${runId} did not end`);
}

async function launch(t: Tenant, spec: Record<string, unknown> = { commands: ["echo hi"] }): Promise<string> {
  const res = await t.api("POST", "/v1/runs", spec);
  if (res.status !== 202) throw new Error(`launch: ${res.status} ${res.text}`);
  return res.json.id;
}

/** The page's visible text, roughly: tags dropped, entities decoded, whitespace squeezed. */
function textOf(html: string): string {
  return html
    .replace(/<style>[\s\S]*?<\/style>/g, " ")
    .replace(/<[^>]+>/g, " ")
    .replaceAll("&lt;", "<")
    .replaceAll("&gt;", ">")
    .replaceAll("&quot;", '"')
    .replaceAll("&#39;", "'")
    .replaceAll("&amp;", "&")
    .replace(/\s+/g, " ");
}

/** Asserts `page` contains (or, with `not`, lacks) `needle`, quoting only a little of the page. */
function has(page: string, needle: string | RegExp, not = false) {
  const found = typeof needle === "string" ? page.includes(needle) : needle.test(page);
  if (found === not) {
    throw new Error(
      `expected the page ${not ? "not " : ""}to contain ${String(needle)}; page: ${page.slice(0, 600)}…`,
    );
  }
}
const lacks = (page: string, needle: string | RegExp) => has(page, needle, true);

function expectPage(res: PageResponse, status = 200): string {
  if (res.status !== status)
    throw new Error(`expected ${status}, got ${res.status}: ${res.html.slice(0, 400)}`);
  expect(res.headers.get("content-type")).toMatch(/^text\/html/);
  expect(res.headers.get("content-security-policy")).toContain("default-src 'none'");
  // Pages never run script and never show a stack.
  lacks(res.html, /<script/i);
  lacks(res.html, /\n\s+at .*\(.*:\d+:\d+\)/);
  return textOf(res.html);
}

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
          spec: { commands: ["true"] },
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

describe("a run's page", () => {
  it("a run whose vault is unreadable: stopped, vault_unreadable as a warning, its trace (E1)", async () => {
    const canary = newCanary("e1page");
    const t = await tenantWithUnreadableVault(canary);
    const id = await launch(t);
    await driveToEnd(t, id);
    const b = await loggedIn(t, `/runs/${id}`);
    const res = await b.get(`/runs/${id}`);
    const text = expectPage(res);
    has(text, "stopped");
    has(res.html, /<p class="warning">Stopped: <code>vault_unreadable<\/code>/);
    has(text, "no benchmark code ran");
    // The trace: its transitions with their reasons, and the vault's attempts.
    for (const state of ["queued", "fetching_vault", "finishing", "stopped"]) has(text, `→ ${state}`);
    has(text, "launched");
    has(text, "Vault read attempt 4 of 4 failed");
    // Empty states.
    has(text, "Sandboxes None made.");
    has(text, "No host was refused");
    has(text, "No traffic recorded");
    has(text, "No bug reports");
    has(text, "No command output");
    has(text, "Not proved yet");
    has(text, "The run has ended (stopped)");
    lacks(res.html, canary);
  });

  it("a queued run: its empty states and its controls", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "queued" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    const text = expectPage(res);
    has(text, "Queued: the run's coordinator has not started it yet");
    has(text, "Nothing: the run's network is as the vault asks");
    has(text, "Sandboxes None made yet.");
    has(res.html, `action="/runs/${run.id}/cancel"`);
    has(res.html, `action="/runs/${run.id}/halt"`);
    has(res.html, `action="/runs/${run.id}/linger"`);
    has(res.html, `href="/runs/${run.id}/proxy"`);
    has(res.html, `action="/runs/${run.id}/bug-reports"`);
  });

  it("shows the notes with their level, routing_change_not_retrofitted with its advice", async () => {
    const t = await newTenant();
    // A real run with no compute backend: it stops with a plain note and a warning.
    const id = await launch(t);
    await driveToEnd(t, id);
    await withDb((db) =>
      addNote(db, id, {
        level: "warning",
        code: "routing_change_not_retrofitted",
        text: "The vault now needs catch-all routing (block_default), which cannot be installed.",
      }),
    );
    const b = await loggedIn(t, `/runs/${id}`);
    const res = await b.get(`/runs/${id}`);
    expectPage(res);
    has(res.html, /<div class="note"><strong>Note<\/strong> <code>no_proxy<\/code>/);
    has(
      res.html,
      /<div class="warning"><strong>Warning<\/strong> <code>routing_change_not_retrofitted<\/code><div>The vault now needs catch-all routing/,
    );
    has(textOf(res.html), "What to do: relaunch the run");
    has(res.html, /<div class="warning"><strong>Warning<\/strong> <code>(?!routing_change)/);
  });

  it("bounds the trace rows and each sandbox's output, in <details>", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running", spec: { commands: ["echo a", "echo b"] } });
    await withDb(async (db) => {
      await db.insert(runEvents).values(
        Array.from({ length: 400 }, (_, i) => ({
          runId: run.id,
          key: `n:test:${i}`,
          kind: "note" as const,
          detail: { text: `row ${i} of the trace` },
        })),
      );
      const out = (command: number, text: string, end: number) =>
        addEvent(db, run.id, `out:sbx_w:${command}:stdout:${end}`, "output", {
          sandbox: "sbx_w",
          name: "work",
          command,
          stream: "stdout",
          text,
          truncated: false,
        });
      await out(0, `${"x".repeat(70_000)}`, 70_000);
      await addEvent(db, run.id, "exit:sbx_w:0", "output", {
        sandbox: "sbx_w",
        name: "work",
        command: 0,
        exitCode: 0,
        signal: null,
      });
      await out(1, "the last words <b>", 18);
    });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    const text = expectPage(res);
    has(text, "row 0 of the trace");
    has(text, "row 399 of the trace");
    lacks(text, "row 100 of the trace");
    has(text, /… \d+ rows not shown here/);
    has(res.html, "<summary>Output of <strong>work</strong></summary>");
    has(text, "$ command 1: echo a");
    // 64 KiB shown, the rest counted; the second command's output did not fit.
    has(res.html, `${"x".repeat(65_536)}<`);
    lacks(res.html, "x".repeat(65_537));
    has(text, `${70_000 + 18 - 65_536} more characters not shown`);
    lacks(res.html, "<b>");
  });

  it("unknown run → a 404 page with a link back", async () => {
    const t = await newTenant();
    const b = await loggedIn(t, "/runs");
    for (const id of ["run_doesnotexist", `run_${"a".repeat(300)}`, "<script>x</script>"]) {
      const res = await b.get(`/runs/${encodeURIComponent(id)}`);
      const text = expectPage(res, 404);
      has(text, "There is no run");
      has(res.html, 'href="/runs"');
      lacks(res.html, "a".repeat(100));
    }
  });
});

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

describe("audit cards", () => {
  it("shows the run's denied hosts and egress routes; a 253-character host wraps, escaped", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const label = "a".repeat(63);
    const long = `${label}.${label}.${label}.${"b".repeat(61)}`;
    expect(long).toHaveLength(253);
    const now = new Date().toISOString();
    const batch = auditBatch(run.id, {
      blockedHosts: [
        { host: "evil.example", count: 3, firstSeen: now, lastSeen: now },
        { host: long, count: 1, firstSeen: now, lastSeen: now },
      ],
      egressRoutes: [
        { host: "api.example.com", route: "direct", count: 7, firstSeen: now, lastSeen: now },
        { host: "evil.example", route: "refused", count: 3, firstSeen: now, lastSeen: now },
      ],
    });
    expect((await postBatch(run, batch)).status).toBe(204);
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    expectPage(res);
    const denied = res.html.slice(res.html.indexOf('id="denied"'), res.html.indexOf('id="routes"'));
    has(denied, '<td class="mono host">evil.example</td><td>3</td>');
    has(denied, `<td class="mono host">${long}</td><td>1</td>`);
    has(denied, '<input type="hidden" name="host" value="evil.example"/>');
    has(denied, "Allow this host");
    const routes = res.html.slice(res.html.indexOf('id="routes"'), res.html.indexOf('id="sandboxes"'));
    has(routes, '<td class="mono host">api.example.com</td><td>direct</td><td>7</td>');
    has(routes, '<td class="mono host">evil.example</td><td>refused</td><td>3</td>');
    // Cells wrap: the layout's fixed table layout and overflow-wrap on every cell.
    has(res.html, /table\{[^}]*table-layout:fixed/);
    has(res.html, /th,td\{[^}]*overflow-wrap:anywhere/);
  });
});
