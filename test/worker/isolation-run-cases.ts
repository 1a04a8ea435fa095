import { expect } from "vitest";
import { storeAuditBatch } from "../../src/runs/proxy-reports";
import { addEvent } from "../../src/runs/service";
import { expectProblem, withDb } from "./harness";
import { type Case, expectNoWidening, expectStatus, ownRunOnly } from "./isolation-fixtures";
import { auditBatch, auditRows } from "./run-fixtures";

// The isolation cases of runs' routes (launch, list, read, the actions on a run, its audit
// reads, model calls, bug reports, the environment's blocked hosts): one per operation, merged
// into the table of the whole document in isolation-cases.ts; isolation-runs.test.ts runs them.
// A run's files (artifacts) are with bundles, in isolation-file-cases.ts.

/**
 * A call on one run: B's run id → 404 with B's run unchanged; `own`: the status on A's own run.
 * `body`: a valid body, so the answer is about whose run it is, not about the body.
 */
function runAction(own: number | null, body?: unknown): Case {
  return {
    kind: "run",
    id: true,
    ...(body === undefined ? {} : { body: () => body }),
    ...(own === null ? {} : { own }),
    check: async ({ a, b }, method, path) => {
      const before = await b.t.api("GET", `/v1/runs/${b.runId}`);
      expectProblem(await a.t.api(method, path.replace("{id}", b.runId), body), 404, "not_found");
      expect((await b.t.api("GET", `/v1/runs/${b.runId}`)).json).toEqual(before.json);
      if (own !== null) expect((await a.t.api(method, path.replace("{id}", a.runId), body)).status).toBe(own);
    },
  };
}

export const RUN_CASES: Record<string, Case> = {
  "POST /v1/runs": {
    kind: "run",
    id: false,
    body: () => ({ commands: ["true"] }),
    check: async ({ a, b }, method, path) => {
      const bBefore = await b.t.api("GET", "/v1/runs");
      const made = expectStatus(await a.t.api(method, path, { commands: ["true"] }), 202, "launch");
      expect((await a.t.api("GET", `/v1/runs/${made.json.id}`)).status).toBe(200);
      expectProblem(await b.t.api("GET", `/v1/runs/${made.json.id}`), 404, "not_found");
      expect((await b.t.api("GET", "/v1/runs")).json.runs).toEqual(bBefore.json.runs);
    },
  },
  "GET /v1/runs": {
    kind: "run",
    id: false,
    check: async ({ a, b }, method, path) => {
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      expect(res.json.runs.map((r: { id: string }) => r.id)).toEqual([a.runId]);
      expect(res.text).not.toContain(b.runId);
    },
  },
  "GET /v1/runs/{id}": {
    kind: "run",
    id: true,
    check: async (ctx, method, path) => {
      const own = await ownRunOnly(ctx, method, path, "read");
      expect(own.json.id).toBe(ctx.a.runId);
    },
  },
  "GET /v1/runs/{id}/events": {
    kind: "run",
    id: true,
    check: async (ctx, method, path) => {
      const { a, b } = ctx;
      for (const v of [a, b]) {
        await withDb((db) => addEvent(db, v.runId, `iso:${v.tag}`, "output", { text: `out ${v.tag}` }));
      }
      const own = await ownRunOnly(ctx, method, path, "read");
      expect(own.json.events.map((e: { detail: unknown }) => e.detail)).toContainEqual({
        text: `out ${a.tag}`,
      });
      // A cursor of B's run names nothing in A's: refused, not read as a position in A's trace.
      const theirs = (await b.t.api(method, path.replace("{id}", b.runId))).json.cursor;
      const refused = await a.t.api(method, `${path.replace("{id}", a.runId)}?after=${theirs}`);
      expect(refused.status).toBe(400);
      expect(refused.text).not.toContain(b.tag);
      await expectNoWidening(ctx, method, path);
    },
  },
  // Actions on a run: B's run → 404 and unchanged; halt and resume also act on A's own run
  // (cancel does too, in the C3 walk, last: it ends the run).
  "POST /v1/runs/{id}/cancel": runAction(null),
  "POST /v1/runs/{id}/halt": runAction(202),
  "POST /v1/runs/{id}/resume": runAction(202),
  "POST /v1/runs/{id}/linger": runAction(202, { seconds: 600 }),
  // A's own run gets a fresh egress agent token; B's run keeps its own (no token minted for it).
  "POST /v1/runs/{id}/egress-agent-token": runAction(201),
  // A's run has no proxy running here (no compute backend in this suite): 409 proxy_gone.
  "GET /v1/runs/{id}/proxy": runAction(409),
  "GET /v1/runs/{id}/blocked-hosts": { kind: "by-run", key: "blockedHosts" },
  "GET /v1/runs/{id}/egress-routes": { kind: "by-run", key: "egressRoutes" },
  "GET /v1/runs/{id}/limit-refusals": { kind: "by-run", key: "limitRefusals" },
  "GET /v1/runs/{id}/stray-placeholders": { kind: "by-run", key: "strayPlaceholders" },
  "GET /v1/runs/{id}/model-calls": {
    kind: "run",
    id: true,
    check: async (ctx, method, path) => {
      const { a, b } = ctx;
      // One model call on each run, named after its tenant's tag.
      for (const v of [a, b]) {
        const call = {
          callId: `call_${v.tag}`,
          at: new Date().toISOString(),
          model: `model-${v.tag}`,
          provider: `provider-${v.tag}`,
          endpoint: "chat.completions" as const,
          stream: false,
          status: 200,
          inputTokens: 5,
          outputTokens: 7,
          cachedInputTokens: 0,
          refused: null,
          ms: 100,
        };
        const owner = { id: v.runId, userId: v.t.userId, environmentId: v.t.environmentId };
        await withDb((db) => storeAuditBatch(db, owner, auditBatch(v.runId, { modelCalls: [call] })));
      }
      const own = await ownRunOnly(ctx, method, path, "list");
      expect(own.json.calls.map((c: { model: string }) => c.model)).toEqual([`model-${a.tag}`]);
      expect(own.json.totals).toMatchObject({ calls: 1, inputTokens: 5, outputTokens: 7 });
      await expectNoWidening(ctx, method, path);
    },
  },
  "GET /v1/blocked-hosts": {
    kind: "run",
    id: false,
    check: async ({ a, b }, method, path) => {
      // Environment-wide: A's runs' hosts only; B's run id as a filter is 404, as for no run.
      const bBefore = await auditRows(b.runId);
      const res = expectStatus(await a.t.api(method, path), 200, "list");
      const hosts = res.json.blockedHosts as { host: string; runs: string[] }[];
      expect(hosts.map((h) => h.host).sort()).toEqual([`blocked.${a.tag}.example`, `other.${a.tag}.example`]);
      expect(hosts.every((h) => h.runs.length === 1 && h.runs[0] === a.runId)).toBe(true);
      expect(res.text).not.toContain(b.tag);
      expect(res.text).not.toContain(b.runId);
      const theirs = expectProblem(await a.t.api(method, `${path}?runId=${b.runId}`), 404, "not_found");
      expect(theirs.text).not.toContain(b.tag);
      expect(await auditRows(b.runId)).toEqual(bBefore);
      expectProblem(
        await a.t.api(method, `${path}?environmentId=${b.t.environmentId}`),
        400,
        "unknown_field",
      );
    },
  },
  "POST /v1/bug-reports": {
    kind: "run",
    id: false,
    body: ({ a }) => ({ runId: a.runId, title: `report ${a.tag}`, body: "it broke" }),
    check: async ({ a, b }, method, path) => {
      // B's run id in the body: 404 as for no run, and B's run (trace included) is unchanged.
      const before = await b.t.api("GET", `/v1/runs/${b.runId}`);
      const report = { runId: b.runId, title: `report ${a.tag}`, body: "it broke" };
      const res = expectProblem(await a.t.api(method, path, report), 404, "not_found");
      expect(res.text).not.toContain(b.tag);
      expect((await b.t.api("GET", `/v1/runs/${b.runId}`)).json).toEqual(before.json);
      expect((await b.t.api("GET", `/v1/runs/${b.runId}/bug-reports`)).json.bugReports).toEqual([]);
      const made = expectStatus(await a.t.api(method, path, { ...report, runId: a.runId }), 201, "report");
      const mine = await a.t.api("GET", `/v1/runs/${a.runId}/bug-reports`);
      expect(mine.json.bugReports.map((r: { id: string }) => r.id)).toEqual([made.json.id]);
    },
  },
  "GET /v1/runs/{id}/bug-reports": {
    kind: "run",
    id: true,
    check: async (ctx, method, path) => {
      for (const v of [ctx.a, ctx.b]) {
        const report = { runId: v.runId, title: `report ${v.tag}`, body: `body ${v.tag}` };
        expectStatus(await v.t.api("POST", "/v1/bug-reports", report), 201, `${v.role} report`);
      }
      const own = await ownRunOnly(ctx, method, path, "list");
      expect(own.json.bugReports.map((r: { title: string }) => r.title)).toEqual([`report ${ctx.a.tag}`]);
      await expectNoWidening(ctx, method, path);
    },
  },
};
