import { afterEach, describe, expect, it, vi } from "vitest";
import { newTenant, tenantWithUnreadableVault } from "./harness";
import { captureLogs } from "./leaks";
import { driveToEnd } from "./run-fixtures";

// Logs an operator can follow (issue 36): the request id an answer carries (x-request-id) is on
// the lines the run's coordinator and its broker log later, in their own Durable Objects and
// alarms, so one id leads from the API call to what became of it.

/** The JSON records among captured console lines (`level: {...}`). */
function records(lines: readonly string[]): Array<Record<string, unknown>> {
  return lines.flatMap((line) => {
    try {
      return [JSON.parse(line.slice(line.indexOf("{")))];
    } catch {
      return [];
    }
  });
}

describe("the launching request's id on the coordinator's and the broker's lines", {
  timeout: 120_000,
}, () => {
  afterEach(() => vi.restoreAllMocks());

  it("is on each coordinator line about the run (a vault that no longer decrypts)", async () => {
    const t = await tenantWithUnreadableVault("canary-request-id", "tampered");
    const lines = captureLogs();
    const launched = await t.api("POST", "/v1/runs", { commands: ["echo never"] });
    const requestId = launched.headers.get("x-request-id");
    expect(requestId).toMatch(/^req_[0-9a-f]{32}$/);
    const run = await driveToEnd(t, launched.json.id);
    expect(run.json).toMatchObject({ status: "stopped", reason: "vault_unreadable" });
    const retries = records(lines).filter(
      (r) => r.event === "vault_read_failed" && r.runId === launched.json.id,
    );
    expect(retries.length).toBeGreaterThan(1);
    for (const r of retries) expect(r.requestId).toBe(requestId);
  });

  it("is on the broker's line for a call that failed (no backend is configured here)", async () => {
    const t = await newTenant();
    const lines = captureLogs();
    const launched = await t.api("POST", "/v1/runs", { commands: ["echo never"] });
    const requestId = launched.headers.get("x-request-id");
    const run = await driveToEnd(t, launched.json.id);
    expect(run.json.status).toBe("stopped");
    const failures = records(lines).filter(
      (r) => r.event === "broker_call_failed" && r.runId === launched.json.id,
    );
    expect(failures).toContainEqual(
      expect.objectContaining({ call: "create", code: "backend_not_configured", level: "error", requestId }),
    );
    // Another request's run is not named by this one.
    const other = await t.api("POST", "/v1/runs", { commands: ["echo never"] });
    await driveToEnd(t, other.json.id);
    const theirs = records(lines).filter(
      (r) => r.event === "broker_call_failed" && r.runId === other.json.id,
    );
    expect(theirs.length).toBeGreaterThan(0);
    for (const r of theirs) expect(r.requestId).toBe(other.headers.get("x-request-id"));
  });
});
