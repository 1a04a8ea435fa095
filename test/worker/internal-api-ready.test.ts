import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { createApp } from "../../src/app";
import { runEvents, runs } from "../../src/db/schema";
import { BASE, expectProblem, newTenant, withDb } from "./harness";
import { newRun, paths, readyBody } from "./run-fixtures";

// POST /internal/runs/{runId}/ready, the report a run's proxy sends once it listens: the CA it
// intercepts with is stored, the run's trace gets one row, and the app's onProxyReady hook is
// told; a bad body stores nothing.

describe("POST /internal/runs/{runId}/ready", { timeout: 60_000 }, () => {
  it("stores the CA and the ready time, appends one trace row even when called twice, then tells the hook", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    const body = readyBody();
    const first = await run.proxy("POST", paths.ready(run), body);
    expect(first.status, first.text).toBe(204);
    const [stored] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect(stored?.caCertPem).toBe(body.caCertPem);
    expect(stored?.caFingerprint).toBe(body.caFingerprint256);
    expect(stored?.proxyReadyAt).toBeInstanceOf(Date);
    expect((await run.proxy("POST", paths.ready(run), body)).status).toBe(204);
    const [again] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect(again?.proxyReadyAt).toEqual(stored?.proxyReadyAt);
    const events = await withDb((db) => db.select().from(runEvents).where(eq(runEvents.runId, run.id)));
    expect(events.map((e) => [e.kind, e.key])).toEqual([["proxy", "proxy_ready"]]);
    expect(events[0]?.detail).toMatchObject({ caFingerprint256: body.caFingerprint256, policyVersion: 1 });

    // The injection point: an app built with onProxyReady is told after the CA is stored.
    const told: { runId: string; ca: string | null | undefined }[] = [];
    const app = createApp({
      onProxyReady: async (_env, runId) => {
        const [row] = await withDb((db) =>
          db.select({ ca: runs.caCertPem }).from(runs).where(eq(runs.id, runId)),
        );
        told.push({ runId, ca: row?.ca });
      },
    });
    const other = await newRun(t);
    const otherBody = readyBody();
    const ctx = createExecutionContext();
    const res = await app.fetch(
      new Request(`${BASE}${paths.ready(other)}`, {
        method: "POST",
        headers: { authorization: `Bearer ${other.proxyToken}`, "content-type": "application/json" },
        body: JSON.stringify(otherBody),
      }),
      env,
      ctx,
    );
    await waitOnExecutionContext(ctx);
    expect(res.status).toBe(204);
    expect(told).toEqual([{ runId: other.id, ca: otherBody.caCertPem }]);
  });

  it("a bad body → 400 with the exact code; nothing stored", async () => {
    const run = await newRun(await newTenant());
    expectProblem(await run.proxy("POST", paths.ready(run), "{not json"), 400, "invalid_json");
    expectProblem(
      await run.proxy("POST", paths.ready(run), readyBody({ runId: "run_other" })),
      400,
      "unknown_field",
    );
    expectProblem(
      await run.proxy("POST", paths.ready(run), readyBody({ caFingerprint256: "not-hex" })),
      400,
      "invalid_request",
    );
    expectProblem(
      await run.proxy("POST", paths.ready(run), readyBody({ caCertPem: "x".repeat(70 * 1024) })),
      413,
      "payload_too_large",
    );
    const [row] = await withDb((db) => db.select().from(runs).where(eq(runs.id, run.id)));
    expect(row?.caCertPem).toBeNull();
    expect(await withDb((db) => db.select().from(runEvents).where(eq(runEvents.runId, run.id)))).toEqual([]);
  });
});
