import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { demoVault, type E2e, lastJson, newUser, SKIP_REASON, startE2e, waitForEnd } from "./harness";

// Whole runs on the local backend: the public API launches a run, the coordinator asks the
// broker for namespaces from the real host agent, the real proxy runs in the proxy sandbox and
// fetches its policy from the real Worker, the wiring program proves the redirect, and the
// benchmark's commands run as an unprivileged user. Upstreams live in a namespace this suite made.

if (SKIP_REASON) console.warn(`end-to-end runs skipped: ${SKIP_REASON} (CI runs them as root)`);

describe.skipIf(SKIP_REASON !== null)("runs on the local backend", () => {
  let e: E2e;
  beforeAll(async () => {
    e = await startE2e({ name: "bwt-e2e", index: 91 });
  });
  afterAll(async () => {
    await e?.stop();
  });

  it("default routing: injects the key for the API host, refuses and records the blocked host", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const launched = await api.call("POST", "/v1/runs", { benchmark: "demo" });
    expect(launched.status).toBe(202);
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      reason: "completed",
      routing: "default",
    });
    const out = lastJson(run);
    // The API host got the key (the sandbox sent none); the blocked host was refused by the proxy.
    expect(out.api).toMatchObject({ status: 200, body: { keyPresent: true, keyMatches: true } });
    expect(out.blocked.status).toBe(403);
    expect(e.upstream.seen.filter((s) => s.host === "blocked.demo.test")).toEqual([]);
    // The proof of the boundary is on the run.
    expect(run.proof).toMatchObject({ enforced: true, routing: "default" });
    expect(JSON.stringify(run)).not.toContain(e.canary);
    const blocked = await api.call("GET", `/v1/runs/${run.id}/blocked-hosts`);
    expect(blocked.json.blockedHosts).toEqual([
      expect.objectContaining({ host: "blocked.demo.test", seenCount: 1, source: "proxy" }),
    ]);
    const routes = await api.call("GET", `/v1/runs/${run.id}/egress-routes`);
    expect(routes.json.egressRoutes).toContainEqual(
      expect.objectContaining({ host: "api.demo.test", route: "direct", count: 1 }),
    );
    expect(run.sandboxes.every((s: { status: string }) => s.status === "destroyed")).toBe(true);
  });
});
