import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { brokerStub, SandboxBroker } from "../../src/broker/sandbox-broker";
import { randomId } from "../../src/crypto/api-keys";
import { sandboxes } from "../../src/db/schema";
import { newTenant, withDb } from "./harness";
import { newRun } from "./run-fixtures";

// The sandbox broker addresses a run's own sandboxes only (case C2 for the compute side). The
// backend it is given is a loopback port nothing listens on: a refusal must come before any call.

const BACKEND = {
  COMPUTE_BACKEND: "local",
  COMPUTE_BACKEND_URL: "http://127.0.0.1:9",
  COMPUTE_BACKEND_SECRET: "s".repeat(32),
};

describe("sandbox broker", () => {
  it("refuses a work sandbox on another run's proxy sandbox → not_found, not retryable", async () => {
    const t = await newTenant();
    const [a, b] = [await newRun(t), await newRun(t)];
    const theirs = randomId("sbx_");
    await withDb((db) =>
      db
        .insert(sandboxes)
        .values({ id: theirs, runId: b.id, kind: "proxy", backend: "local", status: "ready" }),
    );
    const mine = randomId("sbx_");
    const result = await runInDurableObject(brokerStub(env), (_instance, state) =>
      new SandboxBroker(state, { ...env, ...BACKEND }).create(a.id, {
        id: mine,
        kind: "work",
        taskIndex: null,
        proxySandboxId: theirs,
        routing: "default",
        hostsFile: [],
      }),
    );
    expect(result).toMatchObject({ ok: false, code: "not_found", retryable: false });
    const [row] = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.id, theirs)));
    expect(row?.status).toBe("ready");
  });
});
