import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { runEvents } from "../../src/db/schema";
import { expectProblem, newTenant, type Tenant, withDb } from "./harness";

// Bug reports on a run, inside workerd against real Postgres. Runs are launched through the API;
// with no compute backend configured here they stop quickly with a reason, which is fine: a
// report on an ended run is allowed.

async function launch(t: Tenant): Promise<string> {
  const res = await t.api("POST", "/v1/runs", { commands: ["true"] });
  expect(res.status, res.text).toBe(202);
  return res.json.id;
}

const traceRows = (runId: string) =>
  withDb((db) => db.select().from(runEvents).where(eq(runEvents.runId, runId)).orderBy(runEvents.id));

describe("bug reports", () => {
  it("files a report: 201, listed newest first, in the run's trace with who filed it", async () => {
    const t = await newTenant();
    const runId = await launch(t);
    const first = await t.api("POST", "/v1/bug-reports", {
      runId,
      title: "first",
      body: "It broke.\nTwice.",
    });
    expect(first.status, first.text).toBe(201);
    expect(Object.keys(first.json).sort()).toEqual(["createdAt", "id", "runId", "title"]);
    expect(first.json).toMatchObject({ runId, title: "first" });
    expect(first.json.id).toMatch(/^bug_/);
    const second = await t.api("POST", "/v1/bug-reports", { runId, title: "second", body: "Again ✓" });
    expect(second.status, second.text).toBe(201);

    const keyId = (await t.api("GET", "/v1/me")).json.keyId;
    const list = await t.api("GET", `/v1/runs/${runId}/bug-reports`);
    expect(list.status, list.text).toBe(200);
    expect(list.json).toEqual({
      bugReports: [
        { ...second.json, body: "Again ✓", reportedBy: keyId },
        { ...first.json, body: "It broke.\nTwice.", reportedBy: keyId },
      ],
      nextCursor: null,
    });

    // Paged: one at a time, newest first; a cursor not of this run is refused.
    const page1 = await t.api("GET", `/v1/runs/${runId}/bug-reports?limit=1`);
    expect(page1.json.bugReports.map((r: { id: string }) => r.id)).toEqual([second.json.id]);
    const page2 = await t.api("GET", `/v1/runs/${runId}/bug-reports?limit=1&cursor=${page1.json.nextCursor}`);
    expect(page2.json).toMatchObject({ bugReports: [{ id: first.json.id }], nextCursor: null });
    const otherRun = await launch(t);
    expectProblem(
      await t.api("GET", `/v1/runs/${otherRun}/bug-reports?cursor=${page1.json.nextCursor}`),
      400,
      "invalid_cursor",
    );
    expect((await t.api("GET", `/v1/runs/${otherRun}/bug-reports`)).json.bugReports).toEqual([]);

    // The run's owner sees them in the run, as trace events.
    const run = await t.api("GET", `/v1/runs/${runId}`);
    const inTrace = run.json.trace.filter((e: { kind: string }) => e.kind === "bug_report");
    expect(inTrace.map((e: { detail: unknown }) => e.detail)).toEqual([
      { id: first.json.id, title: "first", body: "It broke.\nTwice.", reportedBy: keyId },
      { id: second.json.id, title: "second", body: "Again ✓", reportedBy: keyId },
    ]);
    expect(inTrace[0].at).toBe(first.json.createdAt);
    const rows = await traceRows(runId);
    expect(rows.filter((r) => r.kind === "bug_report").map((r) => r.key)).toEqual([
      `bug:${first.json.id}`,
      `bug:${second.json.id}`,
    ]);
  });

  it("another tenant's run id → 404 not_found, as for no run; nothing is written to that run", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const theirs = await launch(b);
    const report = { title: "not mine", body: "sneaky" };
    const refused = expectProblem(
      await a.api("POST", "/v1/bug-reports", { runId: theirs, ...report }),
      404,
      "not_found",
    );
    const missing = expectProblem(
      await a.api("POST", "/v1/bug-reports", { runId: "run_doesnotexist", ...report }),
      404,
      "not_found",
    );
    // The same answer, but for the id each one names.
    const shape = (json: { detail: string; requestId: string }, id: string) => ({
      ...json,
      detail: json.detail.replace(id, "<id>"),
      requestId: "",
    });
    expect(shape(refused.json, theirs)).toEqual(shape(missing.json, "run_doesnotexist"));
    expectProblem(await a.api("GET", `/v1/runs/${theirs}/bug-reports`), 404, "not_found");
    expect((await traceRows(theirs)).filter((r) => r.kind === "bug_report")).toEqual([]);
    expect((await b.api("GET", `/v1/runs/${theirs}/bug-reports`)).json.bugReports).toEqual([]);
    // B itself can report on its run.
    expect((await b.api("POST", "/v1/bug-reports", { runId: theirs, ...report })).status).toBe(201);
  });

  it("refuses bad bodies with exact codes, writing nothing", async () => {
    const t = await newTenant();
    const runId = await launch(t);
    const ok = { runId, title: "t", body: "b" };
    const bad: [unknown, number, string][] = [
      [{ ...ok, reportedBy: "key_x" }, 400, "unknown_field"],
      [{ ...ok, userId: "usr_x" }, 400, "unknown_field"],
      [{ ...ok, id: "bug_x" }, 400, "unknown_field"],
      [{ runId, body: "b" }, 400, "invalid_request"],
      [{ ...ok, title: "" }, 400, "invalid_request"],
      [{ ...ok, title: "x".repeat(201) }, 400, "invalid_request"],
      [{ ...ok, title: "two\nlines" }, 400, "invalid_request"],
      [{ ...ok, title: 7 }, 400, "invalid_request"],
      [{ runId, title: "t" }, 400, "invalid_request"],
      [{ ...ok, body: "" }, 400, "invalid_request"],
      [{ ...ok, body: "x".repeat(16 * 1024 + 1) }, 400, "invalid_request"],
      // 8,193 characters, 16,386 bytes in UTF-8.
      [{ ...ok, body: "é".repeat(8193) }, 400, "invalid_request"],
      // Postgres jsonb cannot store these: a 400, not a 500.
      [{ ...ok, body: "nul\u0000" }, 400, "invalid_request"],
      [{ ...ok, body: "lone \ud800" }, 400, "invalid_request"],
      [{ title: "t", body: "b" }, 400, "invalid_request"],
      [{ ...ok, runId: "" }, 400, "invalid_request"],
    ];
    for (const [body, status, code] of bad) {
      const res = await t.api("POST", "/v1/bug-reports", body);
      expect(`${res.status} ${res.json?.code}`, JSON.stringify(body).slice(0, 100)).toBe(`${status} ${code}`);
    }
    expect((await traceRows(runId)).filter((r) => r.kind === "bug_report")).toEqual([]);
    expectProblem(await t.api("GET", `/v1/runs/${runId}/bug-reports?limit=0`), 400, "invalid_request");
    expectProblem(await t.api("GET", `/v1/runs/${runId}/bug-reports?runId=x`), 400, "unknown_field");

    // Exactly 16 KiB of UTF-8 is accepted.
    const full = `${"é".repeat(8191)}xx`;
    const res = await t.api("POST", "/v1/bug-reports", { ...ok, body: full });
    expect(res.status, res.text).toBe(201);
    const listed = (await t.api("GET", `/v1/runs/${runId}/bug-reports`)).json.bugReports;
    expect(listed.map((r: { body: string }) => r.body)).toEqual([full]);
  });
});
