import { describe, expect, it, vi } from "vitest";
import { loggedIn } from "./browser";
import { newTenant, tenantWithUnreadableVault } from "./harness";
import { newCanary } from "./leaks";
import { expectPage, flashOf, has, lacks, launch, stored } from "./pages-fixtures";
import { driveToEnd, newRun } from "./run-fixtures";

// The run page's forms (linger, halt, resume, cancel, bug reports) through a logged-in browser:
// each reaches the run's coordinator Durable Object as the API would, and a refusal comes back
// as the API's words in a flash. Another tenant's posts and forged CSRF are in pages-run-isolation.

// Each test logs in and reads several pages over the real database; a few drive a run's alarms.
vi.setConfig({ testTimeout: 60_000 });

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
