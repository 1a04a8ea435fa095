import type { ModelCallRow } from "@benchwright/shared/contract/proxy-wire";
import { describe, expect, it, vi } from "vitest";
import { storeAuditBatch } from "../../src/runs/proxy-reports";
import { loggedIn } from "./browser";
import { call, newTenant, withDb } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { expectPage, flashOf, has, lacks, launch, textOf } from "./pages-fixtures";
import { auditBatch, newRun, postBatch, setRunStatus } from "./run-fixtures";

// The run page's cards over the real Worker and Postgres: the audit cards (denied hosts, egress
// routes, "Allow this host", limit refusals, stray placeholders; src/pages/run-audit-cards.tsx), the model card (J3;
// src/pages/model-card.tsx) and the egress agent card's one-time command. Apart from the
// dashboard's own rows (pages-run-page) because each card reads its own audit data.

// Each test logs in and reads several pages over the real database; a few drive a run's alarms.
vi.setConfig({ testTimeout: 60_000 });

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

  // case N3 and case N2: the run page says what the proxy refused by a limit and which
  // placeholders went elsewhere, by host, method, limit and secret name only
  it("shows the requests refused by a limit and the placeholders sent to another host", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const b = await loggedIn(t, `/runs/${run.id}`);
    const empty = await b.get(`/runs/${run.id}`);
    has(expectPage(empty), "No request was refused by a limit.");
    has(empty.html, "No placeholder went to another host.");

    const now = new Date().toISOString();
    const batch = auditBatch(run.id, {
      limitRefusals: [
        {
          host: "api.example.com",
          method: "DELETE",
          limit: "method",
          count: 3,
          firstSeen: now,
          lastSeen: now,
        },
        { host: "api.example.com", method: "GET", limit: "path", count: 2, firstSeen: now, lastSeen: now },
        {
          host: "files.example.com",
          method: "GET",
          limit: "unnormalisable_path",
          count: 1,
          firstSeen: now,
          lastSeen: now,
        },
      ],
      strayPlaceholders: [
        { host: "evil.example", secret: "API_KEY", count: 4, firstSeen: now, lastSeen: now },
      ],
    });
    expect((await postBatch(run, batch)).status).toBe(204);
    const res = await b.get(`/runs/${run.id}`);
    expectPage(res);
    const limits = res.html.slice(res.html.indexOf('id="limits"'), res.html.indexOf('id="strays"'));
    has(limits, "Refused by a method or path limit");
    has(
      limits,
      '<td class="mono host">api.example.com</td><td class="mono">DELETE</td><td>method not in the list</td><td>3</td>',
    );
    has(
      limits,
      '<td class="mono host">api.example.com</td><td class="mono">GET</td><td>path not in the list</td><td>2</td>',
    );
    has(limits, "<td>path that does not normalise</td><td>1</td>");
    has(limits, "the path is never recorded");
    const strays = res.html.slice(res.html.indexOf('id="strays"'), res.html.indexOf('id="model"'));
    has(strays, "Placeholders sent to another host");
    has(strays, '<td class="mono host">evil.example</td><td class="mono">API_KEY</td><td>4</td>');
    has(strays, "It went out unswapped: that host saw only the placeholder, never the secret.");

    // A cursor that is not one of the card's: said on that card only, the other keeps its rows.
    const bad = await b.get(`/runs/${run.id}?strays=garbage`);
    expectPage(bad);
    const badStrays = bad.html.slice(bad.html.indexOf('id="strays"'), bad.html.indexOf('id="model"'));
    has(badStrays, "cursor: not a cursor this API gave");
    has(bad.html.slice(bad.html.indexOf('id="limits"'), bad.html.indexOf('id="strays"')), "<td>3</td>");
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
