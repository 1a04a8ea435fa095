import { type SetupImageInputs, setupImageKey } from "@benchwright/shared/contract/setup-image";
import { describe, expect, it } from "vitest";

// Case P1: a setup image is keyed by everything that shapes it; a change to any input misses,
// the same inputs hit, and what does not shape it (named here) is not in it at all.

const BASE: SetupImageInputs = {
  format: 1,
  backend: "local",
  base: `sha256:${"a".repeat(64)}`,
  bundle: "b".repeat(64),
  setup: ["python3 -m venv .venv", ".venv/bin/pip install qa-helpers"],
  resources: { memoryMb: 2048, pids: 1024 },
};

describe("setup image key (case P1)", () => {
  it("is the same for the same inputs, however their keys are ordered", async () => {
    const reordered = Object.fromEntries(Object.entries(BASE).reverse()) as SetupImageInputs;
    expect(await setupImageKey(reordered)).toBe(await setupImageKey(BASE));
    expect(await setupImageKey(BASE)).toMatch(/^[0-9a-f]{64}$/);
  });

  const changes: Array<[string, Partial<SetupImageInputs>]> = [
    ["the capture rules' version", { format: 2 }],
    ["the backend", { backend: "sandbox0" }],
    ["the base image's digest", { base: `sha256:${"c".repeat(64)}` }],
    ["the bundle", { bundle: "d".repeat(64) }],
    ["no bundle", { bundle: null }],
    ["a setup command", { setup: ["python3 -m venv .venv", ".venv/bin/pip install qa-helpers==2"] }],
    ["the setup commands' order", { setup: [...BASE.setup].reverse() }],
    ["one more setup command", { setup: [...BASE.setup, "true"] }],
    ["commands joined differently", { setup: ["python3 -m venv .venv .venv/bin/pip install qa-helpers"] }],
    ["memory", { resources: { memoryMb: 4096, pids: 1024 } }],
    ["pids", { resources: { memoryMb: 2048, pids: 2048 } }],
  ];
  for (const [what, change] of changes) {
    it(`misses when ${what} changes`, async () => {
      expect(await setupImageKey({ ...BASE, ...change })).not.toBe(await setupImageKey(BASE));
    });
  }

  it("refuses inputs outside the contract (a run id, a vault, cpus) rather than ignoring them", async () => {
    await expect(setupImageKey({ ...BASE, runId: "run_1" } as SetupImageInputs)).rejects.toThrow();
    await expect(
      setupImageKey({ ...BASE, resources: { ...BASE.resources, cpus: 2 } } as SetupImageInputs),
    ).rejects.toThrow();
  });
});
