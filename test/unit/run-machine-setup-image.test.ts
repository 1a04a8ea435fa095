import { type RunSpec, resourcesFor } from "@benchwright/shared/contract/run-spec";
import { describe, expect, it } from "vitest";
import { LEASE_RENEW_MS, WAIT_POLL_MS } from "../../src/coordinator/machine";
import type { MachineState } from "../../src/coordinator/state";
import {
  EMPTY_POLICY,
  type ImageRow,
  ImageTable,
  imageKey,
  LEASE_MS,
  RULE_POLICY,
  SPEC,
  world,
} from "./run-machine-world";

// Setup images in the run machine (issue 34, steps/setup-image.ts): each distinct setup runs once
// per key, in the sandbox the broker names its builder; the run's other sandboxes of that setup
// wait for the build (taking no slot) and start from it, sealed from outside and proved before
// any command. Over the in-memory world of run-machine-world.ts, whose broker keeps a small key
// table the way the real one's does. The layers themselves on real namespaces are test/local's
// and test/e2e's.

const BUNDLE = "ab".repeat(32);
const SETUP = "pip install thing";
const SHARED: RunSpec = {
  ...SPEC,
  commands: ["echo work"],
  bundle: BUNDLE,
  setup: [SETUP],
  tasks: ["t1", "t2", "t3"].map((name) => ({ name, commands: [`echo ${name}`] })),
};
const BUNDLED = `bundle:${BUNDLE.slice(0, 4)}:/home/sandbox`;
/** A sandbox that runs its own setup (no image, or building one). */
const OWN_SETUP = ["wiring", BUNDLED, "setup-0", "seal", "rewire", "cmd-0", "collect"];
/** A task started from a setup image: sealed, proved, then its command. */
const FROM_IMAGE = ["seal", "rewire", "cmd-0", "collect", "destroy"];

type World = ReturnType<typeof world>;

const stagesOf = (w: World, sandboxId: string | undefined) =>
  w.order.filter((e) => e.startsWith(`${sandboxId}:`)).map((e) => e.slice(`${sandboxId}:`.length));

const workerIds = (end: MachineState | undefined) =>
  Object.fromEntries((end?.workers ?? []).map((x) => [x.name, x.sandboxId])) as Record<string, string>;

const requestOf = (w: World, sandboxId: string | undefined) =>
  w.createRequests.find((r) => r.id === sandboxId);

/** Setup-stage execs in a sandbox (bw-wiring's first pass included). */
const setupStageExecs = (w: World, sandboxId: string) =>
  [...w.execs].filter(([k, e]) => k.startsWith(`${sandboxId}/`) && e.stage === "setup").map(([k]) => k);

const keyOf = (setup: string[]) =>
  imageKey({ setup, bundle: BUNDLE, resources: resourcesFor(undefined, "task") });

async function stepUntil(w: World, done: () => boolean, max = 400) {
  for (let i = 0; i < max && !done(); i++) await w.next();
  if (!done()) throw new Error("never got there");
}

/** Another run is building the key (its lease never lapses while the test says so). */
function buildingElsewhere(images: ImageTable, key: string): ImageRow {
  const row: ImageRow = {
    status: "building",
    builderRunId: "run_0",
    builderSandboxId: "sbx_elsewhere",
    leaseUntil: Number.POSITIVE_INFINITY,
    digest: null,
    builtByRunId: null,
  };
  images.rows.set(key, row);
  return row;
}

const OTHER_DIGEST = `sha256:${"c".repeat(64)}` as const;

describe("run machine: setup images (issue 34)", () => {
  // case P5 (machine level): a cached start is wired from outside and proved before any command.
  it("builds in the work sandbox; the tasks wait, then start from its image, sealed and proved first (case P5)", async () => {
    const images = new ImageTable();
    const w = world({ spec: SHARED, images });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    expect(w.transitions.at(-1)?.reason).toBe("completed");
    const ids = workerIds(end);
    const key = await keyOf([SETUP]);

    // The builder: its stages as always, and the capture between its seal and its re-proof.
    expect(stagesOf(w, ids.work)).toEqual([
      "wiring",
      BUNDLED,
      "setup-0",
      "seal",
      "capture",
      "rewire",
      "cmd-0",
      "collect",
    ]);
    expect(requestOf(w, ids.work)).toMatchObject({ setup: true, capture: true });
    expect(requestOf(w, ids.work)).not.toHaveProperty("setupImage");
    expect(w.captures).toEqual([ids.work]);
    const row = images.rows.get(key);
    expect(row).toMatchObject({ status: "built", builtByRunId: "run_1" });
    const digest = row?.digest;
    expect(w.events.get(`setup-image:${ids.work}`)).toMatchObject({
      stage: "setup_image",
      digest,
      builtNow: true,
      text: expect.stringMatching(/^Setup image sha256:[0-9a-f]{64} built now \(3\.0 MiB, 42 files\)/),
    });

    for (const name of ["t1", "t2", "t3"]) {
      const id = ids[name] as string;
      // No bundle, no setup command, no wiring program as its root: seal, proof, then commands.
      expect(stagesOf(w, id), name).toEqual(FROM_IMAGE);
      expect(setupStageExecs(w, id), name).toEqual([]);
      const request = requestOf(w, id);
      expect(request, name).toMatchObject({ setupImage: { key } });
      expect(request, name).not.toHaveProperty("setup");
      expect(request, name).not.toHaveProperty("capture");
      // The proof (clean root, writing nothing) comes from the execute stage, before cmd-0.
      const proof = w.execs.get(`${id}/rewire`);
      expect(proof?.stage).toBe("execute");
      expect(JSON.parse(proof?.stdin ?? "{}")).toMatchObject({ installed: true, caCertPem: "CA" });
      expect(w.seals.find((x) => x.sandboxId === id)?.seal).toEqual({
        routing: "default",
        hostsFile: RULE_POLICY.hostsFile,
        caCertPem: "CA",
      });
      // Made only once the image was kept; the command runs with the proof's env.
      expect(w.order.indexOf(`${id}:seal`)).toBeGreaterThan(w.order.indexOf(`${ids.work}:capture`));
      expect(w.execs.get(`${id}/cmd-0`)?.env.NODE_EXTRA_CA_CERTS).toBe("/run/benchwright/run-ca.pem");
      expect(w.events.get(`setup-image:${id}`)).toMatchObject({
        digest,
        builtNow: true,
        text: `${name} starts from setup image ${digest}, built now: no setup stage.`,
      });
    }
    expect(w.releases).toEqual([]);
    expect(w.notes).toEqual([]);
  });

  it("starts from the image in a run no proxy enforces: sealed back to the image's files, nothing to prove", async () => {
    const w = world({ spec: SHARED, images: new ImageTable(), policy: EMPTY_POLICY });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    expect(stagesOf(w, ids.work)).toEqual([BUNDLED, "setup-0", "seal", "capture", "cmd-0", "collect"]);
    for (const name of ["t1", "t2", "t3"]) {
      expect(stagesOf(w, ids[name]), name).toEqual(["seal", "cmd-0", "collect", "destroy"]);
      expect(w.seals.find((x) => x.sandboxId === ids[name])?.seal).toEqual({
        routing: "default",
        hostsFile: [],
        caCertPem: null,
      });
    }
  });

  it("gives a task with its own setup its own key; a waiting sandbox takes no maxParallelTasks slot", async () => {
    const images = new ImageTable();
    const spec: RunSpec = {
      ...SHARED,
      tasks: [
        { name: "a", commands: ["echo a"] },
        { name: "b", commands: ["echo b"], setup: ["make b"] },
      ],
      maxParallelTasks: 1,
    };
    const w = world({ spec, images });
    await w.machine.start("run_1");
    await stepUntil(w, () => w.createRequests.some((r) => r.kind === "task"));
    // a waits for the work sandbox's build without its slot: b is made meanwhile, as its builder.
    expect(w.createRequests.filter((r) => r.kind === "task")).toEqual([
      expect.objectContaining({ taskIndex: 1, capture: true }),
    ]);
    expect(w.captures).toEqual([]);
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    const [shared, own] = [await keyOf([SETUP]), await keyOf([SETUP, "make b"])];
    expect(own).not.toBe(shared);
    expect(w.captures.sort()).toEqual([ids.work, ids.b].sort());
    expect(images.rows.get(own)).toMatchObject({ status: "built", builtByRunId: "run_1" });
    expect(requestOf(w, ids.b)).toMatchObject({ setup: true, capture: true });
    expect(stagesOf(w, ids.b)).toEqual([
      ...OWN_SETUP.slice(0, 3),
      "setup-1",
      "seal",
      "capture",
      "rewire",
      "cmd-0",
      "collect",
      "destroy",
    ]);
    expect(requestOf(w, ids.a)).toMatchObject({ setupImage: { key: shared } });
    expect(stagesOf(w, ids.a)).toEqual(FROM_IMAGE);
    // Once built, a is made in its turn (b's slot freed).
    expect(w.order.indexOf(`${ids.a}:seal`)).toBeGreaterThan(w.order.indexOf(`${ids.b}:destroy`));
  });

  it("goes on uncached when the capture is refused: a note with the code, the build released, the others run their own setup", async () => {
    const images = new ImageTable();
    const message = "the layer is 2100 MiB, over SETUP_IMAGE_MAX_LAYER_MB (2048)";
    const w = world({ spec: SHARED, images, captureFails: { code: "setup_image_too_large", message } });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    expect(w.transitions.at(-1)?.reason).toBe("completed");
    const ids = workerIds(end);
    const note = w.notes.find((n) => n.code === "setup_image_not_kept");
    expect(note?.level).toBe("warning");
    expect(note?.text).toContain(`setup_image_too_large: ${message}`);
    expect(w.releases).toEqual([ids.work]);
    expect(images.rows.size).toBe(0);
    expect(w.captures).toEqual([]);
    for (const name of ["t1", "t2", "t3"]) {
      const id = ids[name] as string;
      expect(stagesOf(w, id), name).toEqual([...OWN_SETUP, "destroy"]);
      expect(requestOf(w, id), name).toMatchObject({ setup: true });
      expect(requestOf(w, id), name).not.toHaveProperty("capture");
      expect(requestOf(w, id), name).not.toHaveProperty("setupImage");
    }
  });

  // case P6 (machine level): a failed setup is never cached.
  it("releases the build when its setup fails or cannot be sealed; nothing is captured (case P6)", async () => {
    for (const fault of [{ exitCodes: { [SETUP]: 1 } }, { sealFails: true }]) {
      const images = new ImageTable();
      const w = world({ spec: SHARED, images, ...fault });
      const end = await w.drive(400);
      expect(end?.state).toBe("stopped");
      expect(w.transitions.at(-1)?.reason).toBe("exitCodes" in fault ? "setup_failed" : "setup_not_sealed");
      const ids = workerIds(end);
      expect(w.order.some((e) => e.endsWith(":capture"))).toBe(false);
      expect(w.releases).toEqual([ids.work]);
      expect(images.rows.size).toBe(0);
      // The waiting tasks were never made, and no command ran anywhere.
      expect(w.createRequests.filter((r) => r.kind === "task")).toEqual([]);
      expect(w.starts.filter((k) => /\/cmd-/.test(k))).toEqual([]);
    }
  });

  // case P6 (machine level): a missing layer is rebuilt, never started around.
  it("rebuilds an image whose layer is missing at create, and says why (case P6)", async () => {
    const images = new ImageTable();
    await world({ spec: SHARED, images, runId: "run_a" }).drive(400);
    const key = await keyOf([SETUP]);
    const old = images.rows.get(key)?.digest as string;
    images.missing.add(old);

    const w = world({ spec: SHARED, images, runId: "run_b" });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    const note = w.notes.find((n) => n.code === "setup_image_rebuilt");
    expect(note?.level).toBe("warning");
    expect(note?.text).toContain(`setup image ${old}`);
    expect(note?.text).toContain("setup_image_missing");
    // The refused sandbox was never started; the work sandbox was made anew as the builder.
    const refused = w.claims[0]?.sandboxId;
    expect(w.claims[0]?.claim).toMatchObject({ role: "use", digest: old });
    expect(refused).not.toBe(ids.work);
    expect(w.order.some((e) => e.startsWith(`${refused}:`))).toBe(false);
    expect(requestOf(w, ids.work)).toMatchObject({ capture: true });
    expect(stagesOf(w, ids.work)).toContain("capture");
    const fresh = images.rows.get(key);
    expect(fresh).toMatchObject({ status: "built", builtByRunId: "run_b" });
    expect(fresh?.digest).not.toBe(old);
    for (const name of ["t1", "t2", "t3"]) {
      expect(w.events.get(`setup-image:${ids[name]}`)).toMatchObject({
        digest: fresh?.digest,
        builtNow: true,
      });
    }
  });

  it("waits for another run's build, then starts every sandbox from it", async () => {
    const images = new ImageTable();
    const key = await keyOf([SETUP]);
    const row = buildingElsewhere(images, key);
    const w = world({ spec: SHARED, images });
    await w.machine.start("run_1");
    const since = w.now();
    await stepUntil(w, () => w.state()?.state === "running" && w.now() >= since + 4 * WAIT_POLL_MS);
    // Nothing made but the proxy sandbox; every sandbox waits for run_0 and asked again.
    expect(w.createRequests.map((r) => r.kind)).toEqual(["proxy"]);
    expect(w.state()?.workers.map((x) => x.image)).toEqual(
      Array(4).fill(expect.objectContaining({ role: "wait", builderRunId: "run_0" })),
    );
    expect(w.claims.length).toBeGreaterThan(4 * 3);

    Object.assign(row, {
      status: "built",
      digest: OTHER_DIGEST,
      builtByRunId: "run_0",
      builderSandboxId: null,
    });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    expect(stagesOf(w, ids.work)).toEqual(["seal", "rewire", "cmd-0", "collect"]);
    for (const name of ["work", "t1", "t2", "t3"]) {
      expect(setupStageExecs(w, ids[name] as string), name).toEqual([]);
      expect(w.events.get(`setup-image:${ids[name]}`)).toMatchObject({
        digest: OTHER_DIGEST,
        builtByRunId: "run_0",
        builtNow: false,
        text: `${name} starts from setup image ${OTHER_DIGEST}, built by run run_0: no setup stage.`,
      });
    }
    expect(w.captures).toEqual([]);
  });

  it("runs its own setup after waiting SETUP_IMAGE_WAIT_SECONDS for another run's build, and notes it", async () => {
    const images = new ImageTable();
    buildingElsewhere(images, await keyOf([SETUP]));
    const waitMs = 30_000;
    const w = world({ spec: SHARED, images, setupImageWaitMs: waitMs });
    const end = await w.drive(600);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    const note = w.notes.find((n) => n.code === "setup_image_wait_expired");
    expect(note?.text).toMatch(/^work waited 3\d s for run run_0's build of its setup image/);
    expect(w.claims.filter((c) => c.sandboxId === ids.work).length).toBeGreaterThanOrEqual(
      waitMs / WAIT_POLL_MS,
    );
    for (const name of ["work", "t1", "t2", "t3"]) {
      expect(stagesOf(w, ids[name]).slice(0, OWN_SETUP.length), name).toEqual(OWN_SETUP);
      expect(requestOf(w, ids[name] as string), name).not.toHaveProperty("capture");
    }
    expect(w.captures).toEqual([]);
    expect(images.rows.get(await keyOf([SETUP]))?.status).toBe("building"); // still run_0's
  });

  it("rebuilds a built key with setupImage rebuild; the run's other sandboxes start from the fresh build", async () => {
    const images = new ImageTable();
    await world({ spec: SHARED, images, runId: "run_a" }).drive(400);
    const key = await keyOf([SETUP]);
    const old = images.rows.get(key)?.digest;

    const w = world({ spec: { ...SHARED, setupImage: "rebuild" }, images, runId: "run_b" });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    expect(w.captures).toEqual([ids.work]);
    const fresh = images.rows.get(key);
    expect(fresh).toMatchObject({ status: "built", builtByRunId: "run_b" });
    expect(fresh?.digest).not.toBe(old);
    // One rebuild per key: the work sandbox's; the tasks claim use and wait for it.
    expect(w.claims.filter((c) => c.mode === "rebuild").map((c) => c.sandboxId)).toEqual([ids.work]);
    for (const name of ["t1", "t2", "t3"]) {
      expect(stagesOf(w, ids[name]), name).toEqual(FROM_IMAGE);
      expect(w.events.get(`setup-image:${ids[name]}`)).toMatchObject({
        digest: fresh?.digest,
        builtNow: true,
      });
    }
  });

  it("behaves as before setup images where the broker answers none: the reason in the trace once", async () => {
    const spec: RunSpec = { ...SHARED, tasks: [{ name: "t1", commands: ["echo t1"], setup: ["make t1"] }] };
    const w = world({ spec });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    expect(stagesOf(w, ids.work)).toEqual(OWN_SETUP);
    expect(stagesOf(w, ids.t1)).toEqual([
      ...OWN_SETUP.slice(0, 3),
      "setup-1",
      ...OWN_SETUP.slice(3),
      "destroy",
    ]);
    for (const r of w.createRequests) {
      if (r.kind === "proxy") continue;
      expect(r.setup).toBe(true);
      expect(r).not.toHaveProperty("capture");
      expect(r).not.toHaveProperty("setupImage");
    }
    expect(w.claims.map((c) => [c.sandboxId, c.mode, c.claim.role])).toEqual([
      [ids.work, "use", "none"],
      [ids.t1, "use", "none"],
    ]);
    const traced = [...w.events.keys()].filter((k) => k.startsWith("setup-image:"));
    expect(traced).toEqual(["setup-image:none"]);
    expect(w.events.get("setup-image:none")).toMatchObject({
      text: "Setup runs in each sandbox and nothing of it is kept as a setup image: setup images are not kept here.",
    });
    expect(w.captures).toEqual([]);
    expect(w.releases).toEqual([]);
    expect(w.notes).toEqual([]);
  });

  it("renews the builder's lease while its setup runs; a lease taken over means it keeps nothing", async () => {
    const images = new ImageTable();
    const key = await keyOf([SETUP]);
    let slow = true;
    const w = world({ spec: SHARED, images, keepsRunning: (c) => c === SETUP && slow });
    await w.machine.start("run_1");
    await stepUntil(w, () => w.starts.some((k) => k.endsWith("/setup-0")));
    const since = w.now();
    await stepUntil(w, () => w.now() >= since + 3 * LEASE_MS, 5000);
    const work = workerIds(w.state()).work;
    expect(w.claims.filter((c) => c.sandboxId === work).length).toBeGreaterThanOrEqual(
      (3 * LEASE_MS) / LEASE_RENEW_MS,
    );
    const row = images.rows.get(key) as ImageRow;
    expect(row).toMatchObject({ status: "building", builderSandboxId: work });
    expect(row.leaseUntil).toBeGreaterThan(w.now());
    expect(w.createRequests.filter((r) => r.kind === "task")).toEqual([]); // the tasks still wait

    // Its lease lapsed meanwhile (a halt, say) and run_0 took the build over, then finished it.
    Object.assign(row, {
      builderRunId: "run_0",
      builderSandboxId: "sbx_elsewhere",
      leaseUntil: Number.POSITIVE_INFINITY,
    });
    await stepUntil(w, () => w.events.has(`setup-image:${work}`), 5000);
    expect(w.events.get(`setup-image:${work}`)).toMatchObject({
      text: expect.stringContaining("lost its build"),
    });
    Object.assign(row, {
      status: "built",
      digest: OTHER_DIGEST,
      builtByRunId: "run_0",
      builderSandboxId: null,
    });
    slow = false;
    const end = await w.drive(5000);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    expect(stagesOf(w, ids.work)).toEqual(OWN_SETUP); // its setup ran to the end, nothing captured
    expect(w.captures).toEqual([]);
    expect(w.releases).toEqual([]); // not its build any more: nothing of run_0's released
    for (const name of ["t1", "t2", "t3"]) {
      expect(w.events.get(`setup-image:${ids[name]}`)).toMatchObject({
        digest: OTHER_DIGEST,
        builtByRunId: "run_0",
      });
    }
  });

  // case E6 for setup images: a step that dies after its side effects and before its save.
  it("never runs setup twice nor in a cached sandbox when any step is replayed after a crash", async () => {
    const clean = world({ spec: SHARED, images: new ImageTable() });
    await clean.drive(400);
    const total = clean.steps() + 4;
    for (let crash = 1; crash <= total; crash++) {
      const w = world({ spec: SHARED, images: new ImageTable() });
      w.crashAt(crash);
      const end = await w.drive(600);
      expect(end?.state, `crash at step ${crash}`).toBe("finished");
      const ids = workerIds(end);
      expect(
        w.starts.filter((k) => /\/setup-/.test(k)),
        `crash at step ${crash}`,
      ).toEqual([`${ids.work}/setup-0`]);
      expect(w.captures, `crash at step ${crash}`).toEqual([ids.work]);
      for (const name of ["t1", "t2", "t3"]) {
        expect(setupStageExecs(w, ids[name] as string), `crash at step ${crash}`).toEqual([]);
        const calls = stagesOf(w, ids[name]);
        expect(calls.indexOf("rewire"), `crash at step ${crash}`).toBeLessThan(calls.indexOf("cmd-0"));
      }
    }
  });
});
