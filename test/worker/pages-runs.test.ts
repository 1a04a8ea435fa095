import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it, vi } from "vitest";
import type { ModelCallRow } from "../../src/contract/proxy-wire";
import { coordinatorStub } from "../../src/coordinator/run-coordinator";
import { randomId } from "../../src/crypto/api-keys";
import { type RunState, runEvents, runs } from "../../src/db/schema";
import { type ProxyLook, ProxyPage } from "../../src/pages/proxy-page";
import { storeAuditBatch } from "../../src/runs/proxy-reports";
import { addEvent, addNote, type RunRow, recordTransition } from "../../src/runs/service";
import { RunSpec } from "../../src/runs/spec";
import { loggedIn, type PageResponse } from "./browser";
import { call, newTenant, type Tenant, tenantWithUnreadableVault, withDb } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { auditBatch, driveToEnd, newRun, postBatch, setRunStatus } from "./run-fixtures";

// The run pages (src/pages/run-pages.tsx) through a logged-in browser, over the real Worker, the
// real coordinator Durable Object and the real Postgres: the runs list, a run's dashboard, its
// proxy's page and every form on them; tenant isolation (C1) and the canary secret (B5).

// Each test logs in and reads several pages over the real database; a few drive a run's alarms.
vi.setConfig({ testTimeout: 60_000 });

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

/** The value the coordinator Durable Object stored under `key` (what its methods were asked). */
const stored = (runId: string, key: string) =>
  runInDurableObject(coordinatorStub(env, runId), (_o, state) => state.storage.get(key));

/** The flash a form's redirect carries. */
/** The flash a form's redirect carries (its MAC, `fs`, is checked by the page that shows it). */
function flashOf(res: PageResponse): Record<string, string> {
  expect(res.status).toBe(303);
  const { fs, ...flash } = Object.fromEntries(new URL(res.location ?? "", "http://x").searchParams);
  expect(fs).toMatch(/^[0-9a-f]{64}$/);
  return flash;
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

  it("a halted run: says so and offers Resume; a lingering one offers no halt", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    // The note the coordinator writes when it halts the run's commands.
    await withDb((db) =>
      addEvent(db, run.id, "halt:1", "note", {
        text: "Halted for review: the run's commands are stopped.",
        halted: true,
      }),
    );
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    has(expectPage(res), "running halted for review");
    has(res.html, `action="/runs/${run.id}/resume"`);
    lacks(res.html, `action="/runs/${run.id}/halt"`);
    await setRunStatus(run.id, "lingering");
    const lingering = await b.get(`/runs/${run.id}`);
    has(expectPage(lingering), "Cancel (ends the linger)");
    lacks(lingering.html, `action="/runs/${run.id}/halt"`);
    lacks(lingering.html, `action="/runs/${run.id}/resume"`);
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

  // case G6: the run page says which setup command failed and why; case G7: which limit.
  it("shows each sandbox's two stages, the failing setup command (case G6) and the limit hit (case G7)", async () => {
    const t = await newTenant();
    const spec = {
      commands: ["python task_impl.py"],
      setup: ["pip install requests"],
      tasks: [{ name: "t1", commands: ["echo t1"], setup: ["apt-get install -y <nothing>"] }],
    };
    const failed = await newRun(t, { status: "running", spec });
    await withDb(async (db) => {
      const ev = (key: string, kind: "output" | "note" | "proxy", detail: Record<string, unknown>) =>
        addEvent(db, failed.id, key, kind, detail);
      const w = { sandbox: "sbx_w", name: "work" };
      const t1 = { sandbox: "sbx_t", name: "t1" };
      await ev("setup:sbx_w:0:stdout:9", "output", {
        ...w,
        stage: "setup",
        command: 0,
        stream: "stdout",
        text: "installed",
        truncated: false,
      });
      await ev("exit-setup:sbx_w:0", "output", {
        ...w,
        stage: "setup",
        command: 0,
        exitCode: 0,
        signal: null,
      });
      await ev("exit-setup:sbx_t:0", "output", {
        ...t1,
        stage: "setup",
        command: 0,
        exitCode: 0,
        signal: null,
      });
      await ev("exit-setup:sbx_t:1", "output", {
        ...t1,
        stage: "setup",
        command: 1,
        exitCode: 100,
        signal: null,
      });
      await ev("seal:sbx_w", "note", {
        ...w,
        stage: "seal",
        killed: 1,
        text: "The setup stage of work ended.",
      });
      await ev("collect:sbx_t", "note", {
        ...t1,
        stage: "collect",
        ok: true,
        files: 2,
        bytes: 30,
        cut: 1,
        text: "Collected.",
      });
      await recordTransition(db, failed.id, {
        to: "stopped",
        reason: "setup_failed",
        detail: "t1 (sbx_t): setup command 2 exited 100: apt-get install -y <nothing>",
      });
    });
    const b = await loggedIn(t, `/runs/${failed.id}`);
    const res = await b.get(`/runs/${failed.id}`);
    const text = expectPage(res);
    has(text, "A setup command failed, so the run stopped before any command ran after it");
    has(text, "t1 (sbx_t): setup command 2 exited 100: apt-get install -y <nothing>");
    has(res.html, "<summary>Stages of <strong>t1</strong></summary>");
    // The task's setup: the run's, then its own; the failing one marked, the commands not run.
    has(text, "setup setup 1: pip install requests exited 0");
    has(text, "setup setup 2: apt-get install -y <nothing> exited 100");
    has(
      res.html,
      /<tr class="error"><td>setup<\/td><td class="mono">setup 2: apt-get install -y &lt;nothing&gt;/,
    );
    has(text, "execute command 1: echo t1 not run");
    has(text, "$BW_OUT collected 2 file(s), 30 bytes, 1 cut");
    has(text, "sealed: its leftover processes killed, the wiring re-installed 1 process(es) killed");
    // The setup output is shown under its own header, apart from the commands'.
    has(text, "$ setup 1: pip install requests installed");
    lacks(res.html, "<nothing>");

    const killed = await newRun(t, { status: "running", spec: { commands: ["python hog.py"] } });
    await withDb(async (db) => {
      await addEvent(db, killed.id, "exit:sbx_k:0", "output", {
        sandbox: "sbx_k",
        name: "work",
        stage: "execute",
        command: 0,
        exitCode: null,
        signal: "SIGKILL",
        limit: "memory",
      });
      await recordTransition(db, killed.id, {
        to: "stopped",
        reason: "resource_exhausted",
        detail: "work (sbx_k) hit its memory limit (2048 MiB) in command 1",
      });
    });
    const page = expectPage(await b.get(`/runs/${killed.id}`));
    has(page, "A sandbox was killed at a resource limit (work: memory), so the run stopped");
    has(page, "work (sbx_k) hit its memory limit (2048 MiB) in command 1");
    has(page, "execute command 1: python hog.py killed at its memory limit");
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
    // A host that is not a host name (the audit route refuses one; stored here directly) is
    // escaped, never markup.
    const hostile = `<img src=x onerror=alert(1)>"'.example`;
    await withDb((db) =>
      storeAuditBatch(
        db,
        { id: run.id, userId: t.userId, environmentId: t.environmentId },
        auditBatch(run.id, { blockedHosts: [{ host: hostile, count: 1, firstSeen: now, lastSeen: now }] }),
      ),
    );
    const again = await b.get(`/runs/${run.id}`);
    expectPage(again);
    lacks(again.html, "<img");
    has(again.html, '<td class="mono host">&lt;img src=x onerror=alert(1)&gt;&quot;&#39;.example</td>');
    has(again.html, 'name="host" value="&lt;img src=x onerror=alert(1)&gt;&quot;&#39;.example"');
    // Cells wrap: the layout's fixed table layout and overflow-wrap on every cell.
    has(res.html, /table\{[^}]*table-layout:fixed/);
    has(res.html, /th,td\{[^}]*overflow-wrap:anywhere/);
  });

  it("Allow this host puts an allow entry in the vault (GET /v1/vault/hosts shows it) and says so", async () => {
    const t = await newTenant();
    await t.api("POST", "/v1/vault/hosts", { pattern: "blocked.example", action: "block" });
    const run = await newRun(t, { status: "running" });
    const now = new Date().toISOString();
    const label = "c".repeat(63);
    const long = `${label}.${label}.${label}.${"d".repeat(61)}`;
    await postBatch(
      run,
      auditBatch(run.id, {
        blockedHosts: ["new.example", "blocked.example", long].map((host) => ({
          host,
          count: 1,
          firstSeen: now,
          lastSeen: now,
        })),
      }),
    );
    const b = await loggedIn(t, `/runs/${run.id}`);
    const hosts = async () =>
      Object.fromEntries(
        ((await t.api("GET", "/v1/vault/hosts")).json.hosts as { pattern: string; action: string }[]).map(
          (h) => [h.pattern, h.action],
        ),
      );

    const created = await b.post(`/runs/${run.id}/allow-host`, { host: "new.example" });
    expect(flashOf(created)).toEqual({
      ok: "new.example is now allowed: a new allow entry in the vault. Running proxies pick it up within seconds; earlier refusals stay in this list.",
    });
    expect(created.headers.get("location")).toMatch(/#denied$/);
    has(expectPage(await b.get(created.location as string)), "new.example is now allowed");
    expect(await hosts()).toEqual({ "blocked.example": "block", "new.example": "allow" });

    const updated = await b.post(`/runs/${run.id}/allow-host`, { host: "blocked.example" });
    expect(flashOf(updated).ok).toMatch(
      /^blocked\.example is now allowed: its entry is now allow in the vault/,
    );
    expect((await hosts())["blocked.example"]).toBe("allow");
    expect(flashOf(await b.post(`/runs/${run.id}/allow-host`, { host: "blocked.example" }))).toEqual({
      ok: "blocked.example was already allowed in the vault.",
    });
    expect(flashOf(await b.post(`/runs/${run.id}/allow-host`, { host: long })).ok).toContain(
      "is now allowed",
    );
    expect((await hosts())[long]).toBe("allow");

    // The service's refusals, in its words; nothing is written.
    const before = await hosts();
    for (const host of ["*.example.com", "", "not a host"]) {
      const flash = flashOf(await b.post(`/runs/${run.id}/allow-host`, { host }));
      expect(flash.error, host).toBeTruthy();
      expect(flash.ok).toBeUndefined();
    }
    expect(flashOf(await b.post(`/runs/${run.id}/allow-host`, { host: "*.example.com" })).error).toContain(
      "exact host names only",
    );
    expect(await hosts()).toEqual(before);
  });
});

describe("the run's forms", () => {
  it("linger: above the cap the flash names it and nothing changes; a valid value is asked for", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const over = await b.post(`/runs/${run.id}/linger`, { seconds: "86401" });
    expect(over.status).toBe(303);
    expect(over.location).toMatch(new RegExp(`^/runs/${run.id}\\?error=`));
    const page = await b.get(over.location as string);
    has(expectPage(page), "A proxy may linger at most 86400 seconds (24 h); 86401 were asked for.");
    has(page.html, '<p class="error">');
    expect(await stored(run.id, "linger")).toBeUndefined();
    for (const bad of ["", "-1", "1.5", "3600s", "1e3"]) {
      const res = await b.post(`/runs/${run.id}/linger`, { seconds: bad });
      expect(flashOf(res)).toEqual({ error: "seconds: a whole number of seconds, 0 to 86400." });
    }
    expect(await stored(run.id, "linger")).toBeUndefined();

    const okay = await b.post(`/runs/${run.id}/linger`, { seconds: "3600" });
    has(
      expectPage(await b.get(okay.location as string)),
      "The proxy will linger 3600 s after the run's commands end.",
    );
    expect(await stored(run.id, "linger")).toBe(3600);
  });

  it("linger, halt and resume on an ended run → the API's refusal as a flash; cancel says it had ended", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "finished" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const cases: [string, Record<string, string>, string][] = [
      ["linger", { seconds: "60" }, `Run ${run.id} has ended or is ending; its proxy can no longer be kept.`],
      ["halt", {}, `Run ${run.id} has ended (finished); there is nothing to halt.`],
      ["resume", {}, `Run ${run.id} has ended (finished); there is nothing to resume.`],
      ["cancel", {}, `Run ${run.id} has already ended (finished); there is nothing to cancel.`],
    ];
    for (const [action, fields, refusal] of cases) {
      const res = await b.post(`/runs/${run.id}/${action}`, fields);
      expect(res.status).toBe(303);
      const page = await b.get(res.location as string);
      has(expectPage(page), refusal);
      has(page.html, '<p class="error">');
    }
    expect(await stored(run.id, "linger")).toBeUndefined();
    expect(await stored(run.id, "halt")).toBeUndefined();
    expect(await stored(run.id, "cancel")).toBeUndefined();
  });

  it("cancel, halt and resume on a live run reach its coordinator", async () => {
    const canary = newCanary("cancel");
    const t = await tenantWithUnreadableVault(canary);
    // Its vault never reads: it stays alive, retrying, until it is driven on.
    const id = await launch(t);
    const b = await loggedIn(t, `/runs/${id}`);
    const halted = await b.post(`/runs/${id}/halt`, {});
    has(expectPage(await b.get(halted.location as string)), "Halt asked for");
    expect(await stored(id, "halt")).toBe(true);
    await b.post(`/runs/${id}/resume`, {});
    expect(await stored(id, "halt")).toBe(false);
    const cancelled = await b.post(`/runs/${id}/cancel`, {});
    has(expectPage(await b.get(cancelled.location as string)), "Cancel asked for");
    const run = await driveToEnd(t, id);
    expect(run.json).toMatchObject({ status: "stopped", reason: "cancelled" });
    const page = await b.get(`/runs/${id}`);
    has(expectPage(page), "Stopped: cancelled");
    lacks(page.html, canary);
  });

  it("cancel on a run whose coordinator never started stops it, as the API does", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "queued" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.post(`/runs/${run.id}/cancel`, {});
    has(
      expectPage(await b.get(res.location as string)),
      "Cancelled: the run had not started; it is stopped.",
    );
    expect((await t.api("GET", `/v1/runs/${run.id}`)).json).toMatchObject({
      status: "stopped",
      reason: "cancelled",
    });
  });

  it("files a bug report: on the page and in GET /v1/runs/{id}/bug-reports; bad ones get the API's words", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "finished" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const filed = await b.post(`/runs/${run.id}/bug-reports`, {
      title: "The proxy refused <npm>",
      body: "Line one\r\nline two & <b>three</b>",
    });
    expect(filed.status).toBe(303);
    const page = await b.get(filed.location as string);
    const text = expectPage(page);
    has(text, "filed; it is in the run's trace");
    has(page.html, "<strong>The proxy refused &lt;npm&gt;</strong>");
    has(page.html, "Line one\r\nline two &amp; &lt;b&gt;three&lt;/b&gt;");
    has(text, "bug report The proxy refused <npm>");
    const api = await t.api("GET", `/v1/runs/${run.id}/bug-reports`);
    expect(api.json.bugReports).toHaveLength(1);
    expect(api.json.bugReports[0]).toMatchObject({
      title: "The proxy refused <npm>",
      body: "Line one\r\nline two & <b>three</b>",
    });

    const refusals: [Record<string, string>, string][] = [
      [{ title: "", body: "x" }, "title: the title is empty"],
      [{ title: "x".repeat(201), body: "x" }, "title: at most 200 characters"],
      [{ title: "two\nlines", body: "x" }, "title: one line, no control characters"],
      [{ title: "ok", body: "" }, "body: the body is empty"],
      [{ title: "ok", body: "é".repeat(8193) }, "body: at most 16 KiB (UTF-8)"],
      [{ title: "ok", body: "nul \u0000 here" }, "body: no NUL characters, well-formed Unicode"],
    ];
    for (const [fields, message] of refusals) {
      const res = await b.post(`/runs/${run.id}/bug-reports`, fields);
      const again = await b.get(res.location as string);
      has(expectPage(again), message);
      // The refused title is offered again; the body never travels in the redirect.
      lacks(res.location as string, "body=");
      if (fields.title === "ok") has(again.html, /name="title"[^>]*value="ok"/);
    }
    expect((await t.api("GET", `/v1/runs/${run.id}/bug-reports`)).json.bugReports).toHaveLength(1);
  });
});

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

describe("the model card", () => {
  const at = (minute: number, second: number) =>
    new Date(Date.UTC(2026, 2, 1, 9, minute, second)).toISOString();
  const call = (i: number, fields: Partial<ModelCallRow>): ModelCallRow => ({
    callId: `call_page_${i}_${crypto.randomUUID().slice(0, 8)}`,
    at: at(0, 0),
    model: "eval-model",
    provider: "openai-compatible",
    endpoint: "chat.completions",
    stream: false,
    status: 200,
    inputTokens: 0,
    outputTokens: 0,
    cachedInputTokens: 0,
    refused: null,
    ms: 0,
    ...fields,
  });
  // Over three minutes: a call with cached input, a provider error, a streamed Anthropic-format
  // call, and a call the lane refused (over budget, never sent upstream).
  const calls = () => [
    call(1, { at: at(0, 10), inputTokens: 100, outputTokens: 10, cachedInputTokens: 40, ms: 100 }),
    call(2, { at: at(0, 40), inputTokens: 200, outputTokens: 20, status: 500, ms: 300 }),
    call(3, {
      at: at(2, 5),
      inputTokens: 300,
      outputTokens: 30,
      endpoint: "messages",
      stream: true,
      ms: 200,
    }),
    call(4, { at: at(2, 30), status: 429, refused: "over_budget" }),
  ];

  it("case J3, control plane side: the numbers, spend against the budget, tokens per minute as SVG bars, the last calls; never the key", async () => {
    const t = await newTenant();
    const key = newCanary("pagemodel");
    expect((await t.api("POST", "/v1/vault/secrets", { name: "M_KEY", value: key })).status).toBe(201);
    const model = {
      name: "eval-model",
      provider: "openai-compatible",
      baseUrl: "https://openrouter.ai/api/v1",
      secret: "M_KEY",
    };
    expect((await t.api("POST", "/v1/vault/models", model)).status).toBe(201);
    const run = await newRun(t, {
      status: "running",
      spec: { commands: ["true"], model: "eval-model", modelBudget: { calls: 10, inputTokens: 1000 } },
    });
    const owner = { id: run.id, userId: t.userId, environmentId: t.environmentId };
    await withDb((db) => storeAuditBatch(db, owner, auditBatch(run.id, { modelCalls: calls() })));
    const b = await loggedIn(t, `/runs/${run.id}`);
    const res = await b.get(`/runs/${run.id}`);
    const text = expectPage(res);
    has(text, "The declared model stays outside host policy by design");
    has(
      text,
      "Model eval-model Provider openai-compatible API host — Calls 4 (1 refused, 1 errors) Tokens 600 in (40 cached), 60 out Latency p50 200 ms, p95 300 ms",
    );
    // Refused calls spend nothing; output tokens have no limit here.
    has(text, "Calls 3 / 10 calls");
    has(text, "Input tokens 600 / 1,000 input tokens");
    has(text, "Output tokens no limit 60 output tokens");
    // A live run: as of the page's load, with when the proxy last reported.
    has(text, "Live: figures as of this page's load");
    has(text, /the run's proxy last reported \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC/);
    // One column per minute, the empty minute included; input and output stacked, scaled to the peak.
    const svg = /<svg class="tpm"[^>]*>([\s\S]*?)<\/svg>/.exec(res.html)?.[1] ?? "";
    const columns = [
      ...svg.matchAll(/<g data-minute="([^"]+)" data-input="(\d+)" data-output="(\d+)">([\s\S]*?)<\/g>/g),
    ];
    expect(columns.map((c) => [c[1], Number(c[2]), Number(c[3])])).toEqual([
      ["2026-03-01T09:00:00.000Z", 300, 30],
      ["2026-03-01T09:01:00.000Z", 0, 0],
      ["2026-03-01T09:02:00.000Z", 300, 30],
    ]);
    const rects = columns.map((c) => [
      ...(c[4] ?? "").matchAll(/<rect class="(tpm-in|tpm-out)"[^>]* height="([\d.]+)"/g),
    ]);
    expect(rects.map((r) => r.map((m) => [m[1], Math.round(Number(m[2]))]))).toEqual([
      [
        ["tpm-in", 91],
        ["tpm-out", 9],
      ],
      [],
      [
        ["tpm-in", 91],
        ["tpm-out", 9],
      ],
    ]);
    has(svg, "<title>09:02 UTC: 300 in, 30 out</title>");
    // The last calls, newest first: counts only.
    const table = /<table id="model-calls">([\s\S]*?)<\/table>/.exec(res.html)?.[1] ?? "";
    const rows = textOf(table);
    has(rows, "eval-model chat.completions 429 0 / 0 / 0 0 over_budget");
    has(rows, "eval-model messages (stream) 200 300 / 30 / 0 200");
    has(rows, "eval-model chat.completions 500 200 / 20 / 0 300");
    expect(rows.indexOf("over_budget")).toBeLessThan(rows.indexOf("(stream)"));
    expect(findNeedles("page", res.html, await leakNeedles(key))).toEqual([]);

    // Lingering, the card stays; ended, its figures are final (no "live" line).
    await setRunStatus(run.id, "lingering");
    const lingering = expectPage(await b.get(`/runs/${run.id}`));
    has(lingering, "Calls 3 / 10 calls");
    has(lingering, "Live: figures as of this page's load");
    await setRunStatus(run.id, "finished");
    const ended = expectPage(await b.get(`/runs/${run.id}`));
    has(ended, "Calls 3 / 10 calls");
    lacks(ended, "Live: figures");

    // A run without a budget says so; a run without a model says that.
    const free = await newRun(t, { status: "running", spec: { commands: ["true"], model: "eval-model" } });
    const freePage = expectPage(await b.get(`/runs/${free.id}`));
    has(freePage, "No model budget: the run set no modelBudget.");
    has(freePage, "No calls yet.");
    has(freePage, "the run's proxy last reported nothing yet");
    const plain = await launch(t);
    const plainPage = expectPage(await b.get(`/runs/${plain}`));
    has(plainPage, "This run declared no model.");
    lacks(plainPage, "outside host policy");
  });
});

describe("the egress agent card", () => {
  it("a run through the user's machine offers the agent's command, shown once on the form's own answer", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running", spec: { commands: ["true"], egress: "local" } });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const look = await b.get(`/runs/${run.id}`);
    has(expectPage(look), "Get the agent's command");
    has(look.html, `action="/runs/${run.id}/egress-agent-token"`);
    lacks(look.html, "bwe_");
    const made = await b.post(`/runs/${run.id}/egress-agent-token`, {});
    const html = expectPage(made);
    expect(made.headers.get("cache-control")).toBe("no-store");
    // K5: the token is the command's environment, never an argument.
    const token = /BENCHWRIGHT_EGRESS_TOKEN=(bwe_[A-Za-z0-9_-]{43}) npx/.exec(html)?.[1];
    lacks(html, "--token");
    expect(token, html.slice(0, 400)).toBeDefined();
    has(html, "npx --no benchwright egress-agent --url");
    // It works for the agent's policy copy, and the next look at the page no longer shows it.
    expect((await call(token as string, "GET", "/egress-agent/policy")).status).toBe(200);
    lacks(expectPage(await b.get(`/runs/${run.id}`)), token as string);
    // Another command replaces it.
    const again = /BENCHWRIGHT_EGRESS_TOKEN=(bwe_[A-Za-z0-9_-]{43}) npx/.exec(
      expectPage(await b.post(`/runs/${run.id}/egress-agent-token`, {})),
    )?.[1];
    expect(again).not.toBe(token);
    expect((await call(token as string, "GET", "/egress-agent/policy")).status).toBe(401);
  });

  it("a direct run has no card; another tenant's run is not found; an ended run gets no token", async () => {
    const t = await newTenant();
    const direct = await newRun(t, { status: "running", spec: { commands: ["true"] } });
    const b = await loggedIn(t, `/runs/${direct.id}`);
    const look = await b.get(`/runs/${direct.id}`);
    expectPage(look);
    lacks(look.html, "egress-agent-token");
    expect(flashOf(await b.post(`/runs/${direct.id}/egress-agent-token`, {})).error).toMatch(
      /needs no egress agent/,
    );
    const other = await newRun(await newTenant(), {
      status: "running",
      spec: { commands: ["true"], egress: "local" },
    });
    expect((await b.post(`/runs/${other.id}/egress-agent-token`, {})).status).toBe(404);
    const ended = await newRun(t, { status: "finished", spec: { commands: ["true"], egress: "local" } });
    expect(flashOf(await b.post(`/runs/${ended.id}/egress-agent-token`, {})).error).toMatch(/has ended/);
  });
});
