import { and, eq, gt, isNull } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { issueCapability, revokeRunCapabilities } from "../../src/compute/capability";
import { hashApiKey } from "../../src/crypto/api-keys";
import { computeCapabilities } from "../../src/db/schema";
import { call, expectProblem, newTenant, withDb } from "./harness";
import { scanDatabase } from "./leaks";
import { newRun, setRunStatus } from "./run-fixtures";

// The compute API a run's work or orchestrator sandbox calls with its compute-control capability
// (src/routes/compute.ts): who may call it, and that a capability reaches its own run only (case
// C2 for compute control). The runs here have no coordinator running, so environment calls end at
// the coordinator's answer; whole runs that make environments are in test/e2e/compute.test.ts.

async function capabilityFor(runId: string, now?: Date) {
  return withDb((db) => issueCapability(db, runId, "sbx_holder", now));
}

describe("compute API: the capability", () => {
  it("refuses a missing, malformed or unknown capability with one answer (401 unauthorized)", async () => {
    const t = await newTenant();
    for (const token of [null, "bwc_short", `bwc_${"A".repeat(43)}`, t.key]) {
      expectProblem(await call(token, "GET", "/compute/capability"), 401, "unauthorized");
    }
  });

  it("tells the holder its run and expiry, never the token", async () => {
    const run = await newRun(await newTenant(), { status: "running" });
    const cap = await capabilityFor(run.id);
    const res = await call(cap.token, "GET", "/compute/capability");
    expect(res.status).toBe(200);
    expect(res.json).toEqual({ runId: run.id, holder: "sbx_holder", expiresAt: cap.expiresAt.toISOString() });
    expect(res.text).not.toContain(cap.token);
  });

  it("is short-lived: an expired capability is refused", async () => {
    const run = await newRun(await newTenant(), { status: "running" });
    const old = await capabilityFor(run.id, new Date(Date.now() - 16 * 60_000));
    expectProblem(await call(old.token, "GET", "/compute/capability"), 401, "unauthorized");
  });

  it("is revocable, and dies with its run", async () => {
    const run = await newRun(await newTenant(), { status: "running" });
    const a = await capabilityFor(run.id);
    const b = await capabilityFor(run.id);
    expect((await call(a.token, "GET", "/compute/capability")).status).toBe(200);
    await withDb((db) => revokeRunCapabilities(db, run.id));
    expectProblem(await call(a.token, "GET", "/compute/capability"), 401, "unauthorized");
    expectProblem(await call(b.token, "GET", "/compute/capability"), 401, "unauthorized");

    const ended = await newRun(await newTenant(), { status: "running" });
    const c = await capabilityFor(ended.id);
    await setRunStatus(ended.id, "finished");
    expectProblem(await call(c.token, "GET", "/compute/capability"), 401, "unauthorized");
  });

  it("renews: the new one works, the old one stops; neither is stored in clear", async () => {
    const run = await newRun(await newTenant(), { status: "running" });
    const cap = await capabilityFor(run.id);
    const renewed = await call(cap.token, "POST", "/compute/capability/renew");
    expect(renewed.status).toBe(200);
    expect(renewed.headers.get("cache-control")).toBe("no-store");
    expect(renewed.json.token).toMatch(/^bwc_/);
    expect(renewed.json.token).not.toBe(cap.token);
    expect((await call(renewed.json.token, "GET", "/compute/capability")).json.runId).toBe(run.id);
    expectProblem(await call(cap.token, "GET", "/compute/capability"), 401, "unauthorized");
    const scan = await scanDatabase([cap.token, renewed.json.token]);
    expect(scan.columns.length).toBeGreaterThan(10);
    expect(scan.hits).toEqual([]);
  });

  it("is not an API key, and an API key is not a capability", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    const cap = await capabilityFor(run.id);
    expectProblem(await call(cap.token, "GET", "/v1/runs"), 401, "unauthorized");
    expectProblem(await call(t.key, "POST", "/compute/environments", { name: "x" }), 401, "unauthorized");
  });
});

describe("compute API: environments", () => {
  it("checks bodies with exact codes", async () => {
    const run = await newRun(await newTenant(), { status: "running" });
    const { token } = await capabilityFor(run.id);
    expectProblem(await call(token, "POST", "/compute/environments", "{"), 400, "invalid_json");
    expectProblem(
      await call(token, "POST", "/compute/environments", { name: "a b" }),
      400,
      "invalid_request",
    );
    expectProblem(
      await call(token, "POST", "/compute/environments", { name: "ok", runId: "run_other" }),
      400,
      "unknown_field",
    );
    // An environment's own setup has a task's bounds: 1 to 100 commands of 1 to 8192 characters.
    for (const setup of [
      [],
      [""],
      "pip install x",
      Array.from({ length: 101 }, () => "true"),
      ["x".repeat(8193)],
    ]) {
      expectProblem(
        await call(token, "POST", "/compute/environments", { name: "ok", setup }),
        400,
        "invalid_request",
      );
    }
    expectProblem(
      await call(token, "POST", "/compute/environments/sbx_x/exec", { id: "e1", argv: [] }),
      400,
      "invalid_request",
    );
  });

  it("answers run_ended for a run whose coordinator is not running it", async () => {
    const run = await newRun(await newTenant(), { status: "running" });
    const { token } = await capabilityFor(run.id);
    expectProblem(await call(token, "POST", "/compute/environments", { name: "env-1" }), 409, "run_ended");
  });

  it("reaches its own run's environments only (C2): another run's or a made-up id is 404", async () => {
    const t = await newTenant();
    const [mine, theirs] = [await newRun(t, { status: "running" }), await newRun(t, { status: "running" })];
    const { token } = await capabilityFor(mine.id);
    // An id of the other run's sandboxes is looked up in this run's coordinator only.
    for (const id of ["sbx_of_theirs", `sbx_${theirs.id}`, "not-an-id"]) {
      expectProblem(await call(token, "GET", `/compute/environments/${id}`), 404, "not_found");
      expectProblem(await call(token, "DELETE", `/compute/environments/${id}`), 404, "not_found");
      expectProblem(
        await call(token, "POST", `/compute/environments/${id}/exec`, { id: "e1", argv: ["true"] }),
        404,
        "not_found",
      );
      expectProblem(await call(token, "GET", `/compute/environments/${id}/exec/e1`), 404, "not_found");
    }
  });
});

describe("compute API: renewal is atomic", () => {
  // case L6: many renewals of one capability at once, each through the real Worker entrypoint
  // with its own database connection (as separate isolates would be), against real Postgres.
  it("case L6: concurrent renewals → exactly one live capability for the holder, the rest refused", async () => {
    const run = await newRun(await newTenant(), { status: "running" });
    const cap = await capabilityFor(run.id);
    const all = await Promise.all(
      Array.from({ length: 12 }, () => call(cap.token, "POST", "/compute/capability/renew")),
    );
    const won = all.filter((r) => r.status === 200);
    expect(won, all.map((r) => `${r.status} ${r.text}`).join("\n")).toHaveLength(1);
    // The others lost the race: the same answer as any revoked token, and no token in it.
    for (const r of all.filter((r) => r.status !== 200)) expectProblem(r, 401, "unauthorized");
    const live = await withDb((db) =>
      db
        .select({ tokenHash: computeCapabilities.tokenHash, renewedFrom: computeCapabilities.renewedFrom })
        .from(computeCapabilities)
        .where(
          and(
            eq(computeCapabilities.runId, run.id),
            eq(computeCapabilities.holderSandboxId, "sbx_holder"),
            isNull(computeCapabilities.revokedAt),
            gt(computeCapabilities.expiresAt, new Date()),
          ),
        ),
    );
    expect(live).toHaveLength(1);
    const token: string = won[0]?.json.token;
    expect(live[0]).toEqual({ tokenHash: await hashApiKey(token), renewedFrom: cap.id });
    expect((await call(token, "GET", "/compute/capability")).json.runId).toBe(run.id);
    expectProblem(await call(cap.token, "GET", "/compute/capability"), 401, "unauthorized");
    // And a renewal of a renewed token stays refused: the old one can never mint again.
    expectProblem(await call(cap.token, "POST", "/compute/capability/renew"), 401, "unauthorized");
  });
});
