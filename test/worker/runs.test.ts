import { runDurableObjectAlarm } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { coordinatorStub } from "../../src/coordinator/client";
import { VAULT_ATTEMPTS } from "../../src/coordinator/machine";
import { runs, sandboxes } from "../../src/db/schema";
import { expectProblem, newTenant, tenantWithUnreadableVault, withDb } from "./harness";
import { driveToEnd } from "./run-fixtures";

// The runs API inside workerd, against real Postgres and the real coordinator Durable Object.
// No compute backend is configured here (COMPUTE_BACKEND_URL is empty), so a run that gets as far as
// asking for a sandbox stops with the reason; the end-to-end suite (test/e2e) runs them for real.

/** A tenant whose one rule's secret does not decrypt: its ciphertext names a key the ring lacks. */

describe("runs API", () => {
  it("launches a run: 202, queued, then visible with its trace", async () => {
    const t = await newTenant();
    const res = await t.api("POST", "/v1/runs", { commands: ["echo hi"] });
    expect(res.status).toBe(202);
    expect(res.json).toMatchObject({ status: "queued", backend: "local" });
    expect(res.json.id).toMatch(/^run_/);
    const run = await t.api("GET", `/v1/runs/${res.json.id}`);
    expect(run.status).toBe(200);
    expect(run.json.spec).toEqual({
      commands: ["echo hi"],
      egress: "direct",
      onProxyFailure: "stop",
    });
    expect(run.json.trace[0]).toMatchObject({ kind: "transition", state: "queued", reason: "launched" });
  });

  it("refuses bad launch bodies with exact codes", async () => {
    const t = await newTenant();
    expectProblem(await t.api("POST", "/v1/runs", {}), 400, "invalid_request");
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], benchmark: "demo" }),
      400,
      "invalid_request",
    );
    // case C3: a body cannot name the user or the run.
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], userId: "usr_x" }),
      400,
      "unknown_field",
    );
    expectProblem(await t.api("POST", "/v1/runs", { benchmark: "nope" }), 400, "unknown_benchmark");
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], egress: "moon" }),
      400,
      "invalid_request",
    );
    expectProblem(await t.api("POST", "/v1/runs", { commands: [] }), 400, "invalid_request");
    expectProblem(
      await t.api("POST", "/v1/runs", {
        commands: ["a"],
        tasks: [
          { name: "x", commands: ["a"] },
          { name: "x", commands: ["b"] },
        ],
      }),
      400,
      "invalid_request",
    );
    expectProblem(await t.api("GET", "/v1/runs?limit=0"), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/runs?cursor=zzz"), 400, "invalid_cursor");
  });

  it("lists newest first, paged, only the caller's runs (C1)", async () => {
    const a = await newTenant();
    const b = await newTenant();
    const ids: string[] = [];
    for (let i = 0; i < 3; i++)
      ids.push((await a.api("POST", "/v1/runs", { commands: [`echo ${i}`] })).json.id);
    const other = (await b.api("POST", "/v1/runs", { commands: ["echo b"] })).json.id;
    const first = await a.api("GET", "/v1/runs?limit=2");
    expect(first.json.runs.map((r: { id: string }) => r.id)).toEqual([ids[2], ids[1]]);
    const second = await a.api("GET", `/v1/runs?limit=2&cursor=${encodeURIComponent(first.json.nextCursor)}`);
    expect(second.json.runs.map((r: { id: string }) => r.id)).toEqual([ids[0]]);
    expect(second.json.nextCursor).toBeNull();
    expectProblem(await a.api("GET", `/v1/runs/${other}`), 404, "not_found");
    expectProblem(await a.api("POST", `/v1/runs/${other}/cancel`), 404, "not_found");
    expect((await b.api("GET", `/v1/runs/${other}`)).json.status).not.toBe("stopped");
  });

  // case E1: the vault cannot be read at run start (a key missing from the ring, a ciphertext
  // that fails to decrypt) → retries, then stop before any sandbox.
  it.each(["missing_key", "tampered"] as const)(
    "stops a run whose vault cannot be decrypted (%s), after retries, before any sandbox (E1)",
    async (how) => {
      const t = await tenantWithUnreadableVault("canary-e1-value", how);
      const id = (await t.api("POST", "/v1/runs", { commands: ["echo never"] })).json.id;
      const run = await driveToEnd(t, id);
      expect(run.json).toMatchObject({ status: "stopped", reason: "vault_unreadable" });
      expect(run.json.reasonDetail).toContain("no benchmark code ran");
      const attempts = run.json.trace.filter((e: { kind: string; detail: { text?: string } | null }) =>
        e.detail?.text?.startsWith("Vault read attempt"),
      );
      expect(attempts).toHaveLength(VAULT_ATTEMPTS);
      const states = run.json.trace
        .filter((e: { kind: string }) => e.kind === "transition")
        .map((e: { state: string }) => e.state);
      expect(states).toEqual(["queued", "fetching_vault", "finishing", "stopped"]);
      const made = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.runId, id)));
      expect(made).toEqual([]);
      expect(run.text).not.toContain("canary-e1-value");
    },
    30_000, // each vault retry is a real decrypt and a real alarm: seconds on a loaded 2-core machine
  );

  it("stops with the reason when no compute backend can make a sandbox", async () => {
    const t = await newTenant();
    const id = (await t.api("POST", "/v1/runs", { commands: ["echo never"] })).json.id;
    const run = await driveToEnd(t, id);
    expect(run.json.status).toBe("stopped");
    expect(run.json.reasonDetail).toContain("COMPUTE_BACKEND_URL");
    expect(run.json.notes).toContainEqual(expect.objectContaining({ level: "note", code: "no_proxy" }));
    expect(run.json.notes.some((n: { level: string }) => n.level === "warning")).toBe(true);
  });

  it("takes the backend a launch names only where it is configured; the default otherwise", async () => {
    const t = await newTenant();
    // Nothing of sandbox0 or e2b is configured here: refused at launch, no run recorded.
    for (const backend of ["sandbox0", "e2b"]) {
      const refused = expectProblem(
        await t.api("POST", "/v1/runs", { commands: ["echo x"], backend }),
        400,
        "backend_not_configured",
      );
      expect(refused.json.detail).toContain(backend);
    }
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["echo x"], backend: "k8s" }),
      400,
      "invalid_request",
    );
    expect((await t.api("GET", "/v1/runs")).json.runs).toEqual([]);
    // The default backend is recorded as it is (its missing settings stop the run, as above).
    const launched = await t.api("POST", "/v1/runs", { commands: ["echo x"] });
    expect(launched.json.backend).toBe("local");
  });

  it("refuses tasks on a Harbor run (the orchestrator asks for its environments itself)", async () => {
    const t = await newTenant();
    expectProblem(
      await t.api("POST", "/v1/runs", {
        orchestrator: "harbor",
        commands: ["x"],
        tasks: [{ name: "a", commands: ["y"] }],
      }),
      400,
      "invalid_request",
    );
    expectProblem(
      await t.api("POST", "/v1/runs", { orchestrator: "other", commands: ["x"] }),
      400,
      "invalid_request",
    );
  });

  it("cancels a live run: stopped with the reason; cancelling again changes nothing", async () => {
    // A vault that does not decrypt keeps the run retrying (alive) for a few seconds.
    const t = await tenantWithUnreadableVault("canary-cancel-value");
    const id = (await t.api("POST", "/v1/runs", { commands: ["echo never"] })).json.id;
    expect((await t.api("POST", `/v1/runs/${id}/cancel`)).status).toBe(202);
    const run = await driveToEnd(t, id);
    expect(run.json).toMatchObject({ status: "stopped", reason: "cancelled" });
    expect((await t.api("POST", `/v1/runs/${id}/cancel`)).status).toBe(202);
    expectProblem(await t.api("POST", `/v1/runs/${id}/cancel`, { force: true }), 400, "unknown_field");
    const [row] = await withDb((db) => db.select().from(runs).where(eq(runs.id, id)));
    expect(row?.reason).toBe("cancelled");
  });

  it("takes a linger of at most 24 h, at launch or later; refuses it once the run has ended", async () => {
    // A vault that does not decrypt keeps the run retrying (alive) for a few seconds.
    const t = await tenantWithUnreadableVault("canary-linger-value");
    const over = await t.api("POST", "/v1/runs", { commands: ["a"], lingerSeconds: 86_401 });
    expectProblem(over, 400, "linger_too_long");
    expect(over.json.detail).toContain("86401");
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], lingerSeconds: -1 }),
      400,
      "invalid_request",
    );
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], lingerSeconds: 1.5 }),
      400,
      "invalid_request",
    );
    const made = await t.api("POST", "/v1/runs", { commands: ["echo never"], lingerSeconds: 86_400 });
    expect(made.status).toBe(202);
    const id = made.json.id;
    expect((await t.api("GET", `/v1/runs/${id}`)).json.linger).toEqual({
      seconds: 86_400,
      until: null,
      paused: false,
    });
    expectProblem(await t.api("POST", `/v1/runs/${id}/linger`, { seconds: 90_000 }), 400, "linger_too_long");
    expectProblem(await t.api("POST", `/v1/runs/${id}/linger`, {}), 400, "invalid_request");
    expectProblem(
      await t.api("POST", `/v1/runs/${id}/linger`, { seconds: 60, extra: 1 }),
      400,
      "unknown_field",
    );
    expect((await t.api("POST", `/v1/runs/${id}/linger`, { seconds: 3600 })).status).toBe(202);
    // Its vault never reads: the run stops before its commands, so it never lingers.
    const run = await driveToEnd(t, id);
    expect(run.json.status).toBe("stopped");
    expect(run.json.trace.some((e: { state: string | null }) => e.state === "lingering")).toBe(false);
    expectProblem(await t.api("POST", `/v1/runs/${id}/linger`, { seconds: 60 }), 409, "run_ended");
    expectProblem(await t.api("GET", `/v1/runs/${id}/proxy`), 409, "proxy_gone");
  });

  it("answers proxy_gone for a look at a run whose proxy is not running", async () => {
    const t = await tenantWithUnreadableVault("canary-view-value");
    const id = (await t.api("POST", "/v1/runs", { commands: ["echo never"] })).json.id;
    await runDurableObjectAlarm(coordinatorStub(env, id));
    const look = await t.api("GET", `/v1/runs/${id}/proxy`);
    expectProblem(look, 409, "proxy_gone");
    expect(look.text).not.toContain("canary-view-value");
    await t.api("POST", `/v1/runs/${id}/cancel`);
    await driveToEnd(t, id);
  });
});
