import { env } from "cloudflare:workers";
import { describe, expect, it } from "vitest";
import { bundles } from "../../src/db/schema";
import { callWith, expectProblem, newTenant, type Tenant, withDb } from "./harness";

// What a launch is checked for beyond its schema (src/runs/launch.ts checkLaunchable), through the
// API: setup commands, resources within the deployment's bounds, and a bundle of the caller's
// own environment (case H3). The bundle routes themselves are in bundles.test.ts.

const hash = (n: number) => n.toString(16).padStart(64, "0");

/** A bundle row of the tenant's environment (the launch check reads the row only). */
async function bundleRow(t: Tenant, sha256: string) {
  await withDb((db) =>
    db
      .insert(bundles)
      .values({ environmentId: t.environmentId, sha256, size: 10, files: 1, unpackedBytes: 5 }),
  );
}

describe("launch: setup and resources", () => {
  it("takes setup commands (the run's and a task's) and resources, and stores them as asked", async () => {
    const t = await newTenant();
    const spec = {
      commands: ["python task_impl.py"],
      setup: ["pip install -r requirements.txt"],
      tasks: [{ name: "t1", commands: ["true"], setup: ["apt-get install -y jq"] }],
      resources: { memoryMb: 4096, pids: 2048, cpus: 2 },
    };
    const res = await t.api("POST", "/v1/runs", spec);
    expect(res.status, res.text).toBe(202);
    const run = await t.api("GET", `/v1/runs/${res.json.id}`);
    expect(run.json.spec).toMatchObject(spec);
    // One field alone is fine: the others take the kind's defaults.
    expect(
      (await t.api("POST", "/v1/runs", { commands: ["true"], resources: { memoryMb: 512 } })).status,
    ).toBe(202);
  });

  it("refuses empty or unknown setup and resources fields with exact codes", async () => {
    const t = await newTenant();
    expectProblem(await t.api("POST", "/v1/runs", { commands: ["a"], setup: [] }), 400, "invalid_request");
    expectProblem(await t.api("POST", "/v1/runs", { commands: ["a"], setup: [""] }), 400, "invalid_request");
    expectProblem(
      await t.api("POST", "/v1/runs", {
        commands: ["a"],
        tasks: [{ name: "x", commands: ["a"], setup: [] }],
      }),
      400,
      "invalid_request",
    );
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], resources: { memory: 4096 } }),
      400,
      "unknown_field",
    );
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], resources: { memoryMb: 1.5 } }),
      400,
      "invalid_request",
    );
    expectProblem(
      await t.api("POST", "/v1/runs", { commands: ["a"], resources: { cpus: 0 } }),
      400,
      "invalid_request",
    );
  });

  it("refuses resources past the deployment's bounds (defaults: 8192 MiB, 4096 pids, 4 CPUs) or under the floor", async () => {
    const t = await newTenant();
    for (const resources of [
      { memoryMb: 8193 },
      { pids: 4097 },
      { cpus: 4.5 },
      { memoryMb: 32 },
      { pids: 8 },
      { cpus: 0.05 },
    ]) {
      const res = expectProblem(
        await t.api("POST", "/v1/runs", { commands: ["a"], resources }),
        422,
        "resources_out_of_bounds",
      );
      expect(res.json.detail).toContain(`resources.${Object.keys(resources)[0]}`);
    }
    // At the bounds: accepted.
    const at = await t.api("POST", "/v1/runs", {
      commands: ["a"],
      resources: { memoryMb: 8192, pids: 4096, cpus: 4 },
    });
    expect(at.status, at.text).toBe(202);
    expect((await t.api("GET", "/v1/runs")).json.runs).toHaveLength(1);
  });

  it("uses the operator's bounds (RESOURCES_MAX_*) when set", async () => {
    const t = await newTenant();
    const tight = {
      ...env,
      RESOURCES_MAX_MEMORY_MB: "1024",
      RESOURCES_MAX_PIDS: "256",
      RESOURCES_MAX_CPUS: "0.5",
    };
    const launch = (resources: object) =>
      callWith(tight, t.key, "POST", "/v1/runs", { commands: ["a"], resources });
    expectProblem(await launch({ memoryMb: 2048 }), 422, "resources_out_of_bounds");
    expectProblem(await launch({ pids: 257 }), 422, "resources_out_of_bounds");
    expectProblem(await launch({ cpus: 1 }), 422, "resources_out_of_bounds");
    expect((await launch({ memoryMb: 1024, pids: 256, cpus: 0.5 })).status).toBe(202);
  });
});

// case H3
describe("H3 a run cannot name another environment's bundle", () => {
  it("a launch naming a bundle not stored in the caller's environment → 404 bundle_not_found; its own → 202", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const theirs = hash(0xb0b);
    const mine = hash(0xa11ce);
    await bundleRow(b, theirs);
    await bundleRow(a, mine);
    const res = expectProblem(
      await a.api("POST", "/v1/runs", { commands: ["ls"], bundle: theirs }),
      404,
      "bundle_not_found",
    );
    expect(res.json.detail).not.toContain(b.environmentId);
    expectProblem(
      await a.api("POST", "/v1/runs", { commands: ["ls"], bundle: hash(1) }),
      404,
      "bundle_not_found",
    );
    // Nothing was recorded for the refused launches.
    expect((await a.api("GET", "/v1/runs")).json.runs).toEqual([]);
    const ok = await a.api("POST", "/v1/runs", { commands: ["ls"], bundle: mine });
    expect(ok.status, ok.text).toBe(202);
    expect((await a.api("GET", `/v1/runs/${ok.json.id}`)).json.spec.bundle).toBe(mine);
    // B can launch with its own.
    expect((await b.api("POST", "/v1/runs", { commands: ["ls"], bundle: theirs })).status).toBe(202);
    // Not a hash at all: the schema's refusal.
    expectProblem(
      await a.api("POST", "/v1/runs", { commands: ["ls"], bundle: "ABC" }),
      400,
      "invalid_request",
    );
  });

  it("a webhook template naming another environment's bundle is refused at registration", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const theirs = hash(0xbeef);
    await bundleRow(b, theirs);
    expectProblem(
      await a.api("POST", "/v1/webhooks", { name: "h", run: { commands: ["ls"], bundle: theirs } }),
      404,
      "bundle_not_found",
    );
    expect((await a.api("GET", "/v1/webhooks")).json.webhooks).toEqual([]);
    expect(
      (await b.api("POST", "/v1/webhooks", { name: "h", run: { commands: ["ls"], bundle: theirs } })).status,
    ).toBe(201);
  });
});
