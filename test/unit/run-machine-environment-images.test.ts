import { type RunSpec, resourcesFor } from "@benchwright/shared/contract/run-spec";
import { describe, expect, it } from "vitest";
import type { EnvironmentRequest } from "../../src/coordinator/ports";
import { ImageTable, imageKey, SPEC, world } from "./run-machine-world";

// Setup images for task environments asked for through the compute API (issue 34 item 7: Harbor's
// per-task prebuild). An environment with setup of its own is prepared as a spec'd task is (the
// bundle, the run's setup, then its own) and goes through the same claim, key, build and use
// (steps/setup-image.ts); over the in-memory world of run-machine-world.ts. The same on real
// parts, with the orchestrator script standing in for the Harbor CLI: test/e2e/compute.test.ts.

const BUNDLE = "cd".repeat(32);
const RUN_SETUP = "pip install harness";
const ENV_SETUP = "apt-get install task-deps";
/** A Harbor run whose orchestrator keeps running while the test asks for environments. */
const HARBOR: RunSpec = {
  ...SPEC,
  orchestrator: "harbor",
  commands: ["harbor run"],
  bundle: BUNDLE,
  setup: [RUN_SETUP],
};
const BUNDLED = `bundle:${BUNDLE.slice(0, 4)}:/home/sandbox`;

type World = ReturnType<typeof world>;

const stagesOf = (w: World, sandboxId: string) =>
  w.order.filter((e) => e.startsWith(`${sandboxId}:`)).map((e) => e.slice(`${sandboxId}:`.length));

const setupStageExecs = (w: World, sandboxId: string) =>
  [...w.execs].filter(([k, e]) => k.startsWith(`${sandboxId}/`) && e.stage === "setup").map(([k]) => k);

const envKey = () =>
  imageKey({ setup: [RUN_SETUP, ENV_SETUP], bundle: BUNDLE, resources: resourcesFor(undefined, "task") });

async function stepUntil(w: World, done: () => Promise<boolean> | boolean, max = 400) {
  for (let i = 0; i < max && !(await done()); i++) await w.next();
  if (!(await done())) throw new Error("never got there");
}

/** A Harbor run of `runId` over `images`, running, its orchestrator's commands still going. */
async function harborRun(images: ImageTable, runId = "run_1") {
  const w = world({ spec: HARBOR, images, runId, keepsRunning: (c) => c === "harbor run" });
  await w.machine.start(runId);
  await stepUntil(w, () => w.state()?.state === "running");
  return w;
}

async function ask(w: World, request: EnvironmentRequest): Promise<string> {
  const asked = await w.machine.addEnvironment(request);
  if (!asked.ok) throw new Error(asked.why);
  expect(asked.environment).toEqual({ id: asked.environment.id, name: request.name, state: "preparing" });
  return asked.environment.id;
}

const viewOf = async (w: World, id: string) => (await w.machine.environment(id))?.view;

describe("run machine: setup images for compute-API environments (issue 34, Harbor's prebuild)", () => {
  // case P6: the same setup is built once; case P5: a cached start is proved before any command.
  it("builds the first environment's setup once; a second of the same setup starts from it, proved first (cases P5, P6)", async () => {
    const images = new ImageTable();
    const w = await harborRun(images);
    const [a, b] = [
      await ask(w, { name: "task-a", setup: [ENV_SETUP] }),
      await ask(w, { name: "task-b", setup: [ENV_SETUP] }),
    ];
    const key = await envKey();
    // Neither is ready before it is proved: a holder's exec is refused until then (env null).
    await stepUntil(w, async () => {
      for (const id of [a, b]) {
        const found = await w.machine.environment(id);
        if (found?.env) expect(w.order, id).toContain(`${id}:rewire`);
      }
      return (await viewOf(w, b))?.state === "ready";
    });

    // task-a built it: the bundle, the run's setup then its own, sealed, captured, proved.
    expect(stagesOf(w, a)).toEqual(["wiring", BUNDLED, "setup-0", "setup-1", "seal", "capture", "rewire"]);
    expect(w.execs.get(`${a}/setup-0`)?.argv).toEqual(["sh", "-c", RUN_SETUP]);
    expect(w.execs.get(`${a}/setup-1`)?.argv).toEqual(["sh", "-c", ENV_SETUP]);
    expect(w.createRequests.find((r) => r.id === a)).toMatchObject({
      kind: "task",
      setup: true,
      capture: true,
    });
    // Built once for the two (the orchestrator built the run's setup alone, another key).
    expect(w.captures.filter((id) => id === a || id === b)).toEqual([a]);
    const row = images.rows.get(key);
    expect(row).toMatchObject({ status: "built", builtByRunId: "run_1" });
    const digest = row?.digest;

    // task-b waited without being made, then started from the image: no bundle, no setup stage,
    // no wiring program as its root; sealed from outside and proved from the execute stage.
    expect(w.order.indexOf(`${b}:seal`)).toBeGreaterThan(w.order.indexOf(`${a}:capture`));
    expect(stagesOf(w, b)).toEqual(["seal", "rewire"]);
    expect(setupStageExecs(w, b)).toEqual([]);
    const request = w.createRequests.find((r) => r.id === b);
    expect(request).toMatchObject({ kind: "task", setupImage: { key } });
    expect(request).not.toHaveProperty("setup");
    const proof = w.execs.get(`${b}/rewire`);
    expect(proof?.stage).toBe("execute");
    expect(JSON.parse(proof?.stdin ?? "{}")).toMatchObject({ installed: true });
    expect(w.events.get(`setup-image:${b}`)).toMatchObject({
      digest,
      builtNow: true,
      text: `task-b starts from setup image ${digest}, built now: no setup stage.`,
    });

    // The compute API shows where each came from.
    const made = { key, digest, builtBy: "run_1", builtNow: true };
    expect(await viewOf(w, a)).toEqual({ id: a, name: "task-a", state: "ready", setupImage: made });
    expect(await viewOf(w, b)).toEqual({ id: b, name: "task-b", state: "ready", setupImage: made });
    expect(w.notes).toEqual([]);
  });

  // case P6: a later run of the same environment with the same setup starts from the image.
  it("starts a later run's environment of the same setup from the image, built by the first run (case P6)", async () => {
    const images = new ImageTable();
    const first = await harborRun(images, "run_a");
    const built = await ask(first, { name: "task-a", setup: [ENV_SETUP] });
    await stepUntil(first, async () => (await viewOf(first, built))?.state === "ready");
    const digest = images.rows.get(await envKey())?.digest;

    const w = await harborRun(images, "run_b");
    const id = await ask(w, { name: "task-a", setup: [ENV_SETUP] });
    await stepUntil(w, async () => (await viewOf(w, id))?.state === "ready");
    expect(stagesOf(w, id)).toEqual(["seal", "rewire"]);
    expect(setupStageExecs(w, id)).toEqual([]);
    expect(w.captures.filter((x) => x === id)).toEqual([]);
    expect((await viewOf(w, id))?.setupImage).toEqual({
      key: await envKey(),
      digest,
      builtBy: "run_a",
      builtNow: false,
    });
    expect(w.events.get(`setup-image:${id}`)).toMatchObject({
      text: `task-a starts from setup image ${digest}, built by run run_a: no setup stage.`,
    });
  });

  it("keys an environment's setup: another setup misses; one asked for without setup stays bare", async () => {
    const images = new ImageTable();
    const w = await harborRun(images);
    const other = await ask(w, { name: "other", setup: ["make other"] });
    const bare = await ask(w, { name: "bare" });
    await stepUntil(w, async () => (await viewOf(w, other))?.state === "ready");
    await stepUntil(w, async () => (await viewOf(w, bare))?.state === "ready");
    const otherKey = await imageKey({
      setup: [RUN_SETUP, "make other"],
      bundle: BUNDLE,
      resources: resourcesFor(undefined, "task"),
    });
    expect(otherKey).not.toBe(await envKey());
    expect(w.captures).toContain(other);
    expect(images.rows.get(otherKey)).toMatchObject({ status: "built" });
    // Bare, as before setup images: no claim, no bundle, no setup; the holder prepares it.
    expect(w.claims.filter((c) => c.sandboxId === bare)).toEqual([]);
    expect(stagesOf(w, bare)).toEqual(["wiring"]);
    expect(w.createRequests.find((r) => r.id === bare)).not.toHaveProperty("setup");
    expect((await viewOf(w, bare))?.setupImage).toBeUndefined();
  });

  // case P6: a build that never reached its capture is never kept, and never holds the others up.
  it("gives up the build of an environment deleted during its setup; the one waiting builds it instead (case P6)", async () => {
    const images = new ImageTable();
    let slow = true;
    const w = world({
      spec: HARBOR,
      images,
      keepsRunning: (c) => c === "harbor run" || (c === ENV_SETUP && slow),
    });
    await w.machine.start("run_1");
    await stepUntil(w, () => w.state()?.state === "running");
    const a = await ask(w, { name: "task-a", setup: [ENV_SETUP] });
    const b = await ask(w, { name: "task-b", setup: [ENV_SETUP] });
    await stepUntil(w, () => w.starts.includes(`${a}/setup-1`));
    expect(w.created.has(b)).toBe(false); // waiting for task-a's build

    expect(await w.machine.removeEnvironment(a)).toMatchObject({
      ok: true,
      environment: { state: "deleted" },
    });
    expect(w.releases).toEqual([a]);
    expect(images.rows.has(await envKey())).toBe(false);
    slow = false;
    await stepUntil(w, async () => (await viewOf(w, b))?.state === "ready", 2000);
    expect(w.captures.filter((x) => x === a || x === b)).toEqual([b]);
    expect(stagesOf(w, b)).toContain("capture");
    expect(images.rows.get(await envKey())).toMatchObject({ status: "built", builtByRunId: "run_1" });
  });
});
