import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { describe, expect, it } from "vitest";
import { HOSTS_CHECK_MS } from "../../src/coordinator/machine";
import type { MachineState } from "../../src/coordinator/state";
import { CATCH_ALL_POLICY, EMPTY_POLICY, RULE_POLICY, SPEC, world } from "./run-machine-world";

// Each sandbox's stages once wired (issue 20): bundle → setup → seal → rewire → commands →
// collect, over the in-memory world of run-machine-world.ts; and vault edits that reach running
// sandboxes' hosts files. The stages on real namespaces are test/local's and test/e2e's.

const BUNDLE = "ab".repeat(32);
const STAGED: RunSpec = {
  ...SPEC,
  commands: ["echo one"],
  bundle: BUNDLE,
  setup: ["pip install thing"],
  tasks: [
    { name: "t1", commands: ["echo t1"], setup: ["make t1"] },
    { name: "t2", commands: ["echo t2"] },
  ],
};

type World = ReturnType<typeof world>;

/** The stage calls the broker saw for one sandbox, in order, without the sandbox's id. */
const stagesOf = (w: World, sandboxId: string) =>
  w.order.filter((e) => e.startsWith(`${sandboxId}:`)).map((e) => e.slice(sandboxId.length + 1));

const workerIds = (end: MachineState | undefined) =>
  Object.fromEntries((end?.workers ?? []).map((x) => [x.name, x.sandboxId]));

const commandStarts = (w: World) => w.starts.filter((k) => /\/cmd-/.test(k));

/** Steps until the predicate holds (each step advances the clock to its alarm). */
async function stepUntil(w: World, done: () => boolean, max = 200) {
  for (let i = 0; i < max && !done(); i++) await w.next();
  if (!done()) throw new Error("never got there");
}

describe("run machine: a sandbox's stages (issue 20)", () => {
  it("takes every sandbox through bundle, setup, seal, rewire, commands and collect, in order (case G3)", async () => {
    const w = world({ spec: STAGED });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.transitions.at(-1)?.reason).toBe("completed");
    const ids = workerIds(end);
    const bundle = `bundle:${BUNDLE.slice(0, 4)}:/home/sandbox`;
    expect(stagesOf(w, ids.work as string)).toEqual([
      "wiring",
      bundle,
      "setup-0",
      "seal",
      "rewire",
      "cmd-0",
      "collect",
    ]);
    // The run's setup, then the task's own; a task's sandbox goes after its collect.
    expect(stagesOf(w, ids.t1 as string)).toEqual([
      "wiring",
      bundle,
      "setup-0",
      "setup-1",
      "seal",
      "rewire",
      "cmd-0",
      "collect",
      "destroy",
    ]);
    expect(w.execs.get(`${ids.t1}/setup-1`)?.argv).toEqual(["sh", "-c", "make t1"]);
    // Setup runs as the sandbox's root, with the wiring's env, BW_OUT, and never a capability.
    const setup = w.execs.get(`${ids.work}/setup-0`);
    expect(setup?.stage).toBe("setup");
    expect(setup?.env).toMatchObject({
      NODE_EXTRA_CA_CERTS: "/run/benchwright/run-ca.pem",
      BW_OUT: "/home/sandbox/out",
    });
    expect(Object.keys(setup?.env ?? {}).some((k) => k.startsWith("BW_COMPUTE"))).toBe(false);
    expect(w.execs.get(`${ids.work}/cmd-0`)?.env.BW_OUT).toBe("/home/sandbox/out");
    // The setup stage's leftovers are killed at seal, before any command, and the trace says so.
    expect(w.events.get(`seal:${ids.work}`)).toMatchObject({ killed: 2, stage: "seal" });
    expect(w.events.get(`exit-setup:${ids.work}:0`)).toMatchObject({ stage: "setup", exitCode: 0 });
    expect([...w.events.keys()].some((k) => k.startsWith(`setup:${ids.work}:0:stdout:`))).toBe(true);
    expect(w.events.get(`collect:${ids.t1}`)).toMatchObject({ files: 1, bytes: 10, cut: 0 });
    expect(w.events.get(`bundle:${ids.t2}`)).toMatchObject({ files: 3, bytes: 120 });
  });

  it("skips seal and the re-proof where no setup command ran, and bundles only when asked", async () => {
    const w = world({ spec: { ...SPEC, commands: ["echo one"] } });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(stagesOf(w, workerIds(end).work as string)).toEqual(["wiring", "cmd-0", "collect"]);
    expect(w.seals).toEqual([]);
  });

  // case G2 (machine level): seal re-installs the coordinator's copy of the wiring, and the
  // wiring is proved again from the execute stage, writing nothing, before any command.
  it("seals with the coordinator's copy and proves the wiring again in the execute stage (case G2)", async () => {
    const w = world({ spec: STAGED });
    const end = await w.drive();
    const ids = workerIds(end);
    expect(w.seals).toHaveLength(3);
    for (const { seal } of w.seals) {
      expect(seal).toEqual({ routing: "default", hostsFile: RULE_POLICY.hostsFile, caCertPem: "CA" });
    }
    const first = JSON.parse(w.execs.get(`${ids.work}/wiring`)?.stdin ?? "{}");
    const again = w.execs.get(`${ids.work}/rewire`);
    expect(again?.argv).toEqual(["bw-wiring"]);
    expect(again?.stage).toBe("execute");
    expect(JSON.parse(again?.stdin ?? "{}")).toEqual({ ...first, installed: true });
    expect(first.installed).toBeUndefined();
    expect(w.events.get(`rewire:${ids.work}`)).toMatchObject({ stage: "execute", installed: true });

    const catchAll = world({ spec: STAGED, policy: CATCH_ALL_POLICY });
    await catchAll.drive();
    expect(catchAll.seals.map((x) => x.seal)).toEqual(
      Array(3).fill({ routing: "catch-all", hostsFile: [], caCertPem: "CA" }),
    );
  });

  it("stops redirect_not_installed when the re-proof after setup fails; no command runs (case G2)", async () => {
    const w = world({ spec: STAGED, proofOkFor: (id) => id !== "rewire" });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "redirect_not_installed" });
    expect(w.notes).toContainEqual(expect.objectContaining({ code: "redirect_not_installed" }));
    expect(commandStarts(w)).toEqual([]);
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
  });

  it("seals a run without a proxy back to the image's files, and proves nothing again", async () => {
    const w = world({ spec: { ...SPEC, setup: ["true"] }, policy: EMPTY_POLICY });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.seals.map((x) => x.seal)).toEqual([{ routing: "default", hostsFile: [], caCertPem: null }]);
    expect(w.starts.some((k) => k.endsWith("/rewire") || k.endsWith("/wiring"))).toBe(false);
  });

  // case G6 (machine level): one failing setup command, and no command starts in any sandbox.
  it("stops setup_failed naming the sandbox, the command and its exit; no command runs anywhere (case G6)", async () => {
    const long = `exit 7 # ${"x".repeat(300)}`;
    const spec: RunSpec = {
      ...STAGED,
      tasks: [
        { name: "t1", commands: ["echo t1"], setup: ["make t1"] },
        { name: "t2", commands: ["echo t2"], setup: ["true", long] },
      ],
    };
    const w = world({ spec, exitCodes: { [long]: 7 } });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    const stop = w.transitions.at(-1);
    expect(stop).toMatchObject({ to: "stopped", reason: "setup_failed" });
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "setup_failed" }));
    const detail = end?.final?.detail ?? "";
    expect(detail).toContain("t2");
    expect(detail).toContain("setup command 3"); // the run's one, then the task's two
    expect(detail).toContain("exited 7");
    expect(detail).toContain(long.slice(0, 200));
    expect(detail).not.toContain(long); // truncated
    expect(commandStarts(w)).toEqual([]);
    expect(w.events.get(`exit-setup:${workerIds(end).t2}:2`)).toMatchObject({ exitCode: 7 });
    // What setup left under $BW_OUT is still collected, before every sandbox goes.
    expect(new Set(w.collects)).toEqual(new Set(Object.values(workerIds(end))));
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
  });

  it("stops stage_not_supported where the backend cannot seal a setup stage; no command runs (case G3)", async () => {
    const w = world({ spec: STAGED, sealUnsupported: true });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "stage_not_supported" });
    expect(end?.final?.detail).toMatch(/: seal is not yet built for the e2b backend$/);
    expect(w.notes).toContainEqual(
      expect.objectContaining({ level: "warning", code: "stage_not_supported" }),
    );
    expect(commandStarts(w)).toEqual([]);
  });

  // case L7 (machine level): a seal that cannot empty the setup stage stops the run.
  it("stops setup_not_sealed where the seal could not end the setup stage; no command runs (case L7)", async () => {
    const w = world({ spec: STAGED, sealFails: true });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "setup_not_sealed" });
    expect(end?.final?.detail).toMatch(/: 3 process\(es\) of the setup stage are still running$/);
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "setup_not_sealed" }));
    expect(commandStarts(w)).toEqual([]);
    expect(w.starts.some((k) => /\/rewire$/.test(k))).toBe(false);
  });

  it("stops bundle_rejected with the code and message, before any setup or command", async () => {
    const w = world({
      spec: STAGED,
      bundleRefused: { code: "bundle_path_traversal", message: "../etc/passwd leaves the tree" },
    });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "bundle_rejected" });
    expect(end?.final?.detail).toContain("bundle_path_traversal: ../etc/passwd leaves the tree");
    expect(w.notes).toContainEqual(expect.objectContaining({ code: "bundle_rejected" }));
    expect(w.starts.some((k) => /\/(setup|cmd)-/.test(k))).toBe(false);
  });

  // case G7 (machine level): a sandbox killed at its limit stops the run, naming the limit.
  it("stops resource_exhausted naming the sandbox and the limit the run asked for (case G7)", async () => {
    const spec: RunSpec = { ...STAGED, resources: { memoryMb: 512 } };
    const w = world({ spec, limits: { "echo t1": "memory" }, keepsRunning: (c) => c === "echo one" });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "resource_exhausted" });
    const t1 = workerIds(end).t1 as string;
    expect(end?.final?.detail).toBe(`t1 (${t1}) hit its memory limit (512 MiB) in command 1`);
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "resource_exhausted" }));
    expect(w.events.get(`exit:${t1}:0`)).toMatchObject({ limit: "memory", signal: "SIGKILL" });
    // The limits the sandboxes were made with: the run's, the rest the kind's defaults.
    const asked = w.createRequests.flatMap((r) => (r.kind === "proxy" ? [] : [r.resources]));
    expect(asked).toEqual(Array(3).fill({ memoryMb: 512, pids: 1024, cpus: 1 }));
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
  });

  it("stops resource_exhausted at the process limit in a setup command, before any command (case G7)", async () => {
    const w = world({ spec: { ...STAGED, setup: [":(){ :|:& };:"] }, limits: { ":(){ :|:& };:": "pids" } });
    const end = await w.drive();
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "resource_exhausted" });
    expect(end?.final?.detail).toMatch(
      /hit its process limit \(1024 processes and threads\) in setup command 1$/,
    );
    expect(commandStarts(w)).toEqual([]);
    // No resources asked for: the broker's defaults.
    expect(w.createRequests.every((r) => r.kind === "proxy" || r.resources === undefined)).toBe(true);
  });

  it("collects after a failed command, before the task's sandbox goes; a failed collect is only a warning", async () => {
    const spec: RunSpec = { ...SPEC, commands: ["echo one"], tasks: [{ name: "t1", commands: ["exit 3"] }] };
    const w = world({ spec, exitCodes: { "exit 3": 3 } });
    const end = await w.drive();
    expect(w.transitions.at(-1)).toMatchObject({ to: "finished", reason: "command_failed" });
    const t1 = workerIds(end).t1 as string;
    expect(stagesOf(w, t1)).toEqual(["wiring", "cmd-0", "collect", "destroy"]);

    const failing = world({ spec, collectFails: true });
    const after = await failing.drive();
    expect(failing.transitions.at(-1)).toMatchObject({ to: "finished", reason: "completed" });
    expect(failing.notes).toContainEqual(
      expect.objectContaining({ level: "warning", code: "artifacts_not_collected" }),
    );
    expect(failing.events.get(`collect:${workerIds(after).t1}`)).toMatchObject({ ok: false });
    expect(failing.collects).toHaveLength(2); // tried once each, not again at teardown
  });

  // case E6 for the stages: a step that dies after its side effects and before its save.
  it("never runs a setup command twice when any step is replayed after a crash (case E6)", async () => {
    const clean = world({ spec: STAGED });
    await clean.drive();
    const setupStarts = (w: World) => w.starts.filter((k) => /\/setup-/.test(k));
    const total = clean.steps() + 4;
    for (let crash = 1; crash <= total; crash++) {
      const w = world({ spec: STAGED });
      w.crashAt(crash);
      const end = await w.drive(400);
      expect(end?.state, `crash at step ${crash}`).toBe("finished");
      expect(setupStarts(w), `crash at step ${crash}`).toEqual(setupStarts(clean));
      expect(new Set(commandStarts(w)).size).toBe(commandStarts(clean).length);
      // Every stage still happened, in order, for each sandbox (seal and collect at least once).
      for (const id of Object.values(workerIds(end))) {
        const calls = stagesOf(w, id);
        expect([...new Set(calls)], `crash at step ${crash}`).toEqual([...new Set(stagesOf(clean, id))]);
        // Never unpacked again once setup began, nor sealed again once the re-proof began.
        expect(calls.findLastIndex((c) => c.startsWith("bundle:"))).toBeLessThan(calls.indexOf("setup-0"));
        expect(calls.lastIndexOf("seal")).toBeLessThan(calls.indexOf("rewire"));
      }
      expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
    }
  });

  it("takes late tasks (maxParallelTasks) through the same stages, one at a time", async () => {
    const tasks = ["a", "b", "c"].map((name) => ({
      name,
      commands: [`echo ${name}`],
      setup: [`prep ${name}`],
    }));
    const w = world({ spec: { ...STAGED, tasks, maxParallelTasks: 1, resources: { pids: 64 } } });
    const end = await w.drive(400);
    expect(end?.state).toBe("finished");
    const ids = workerIds(end);
    for (const name of ["a", "b", "c"]) {
      expect(stagesOf(w, ids[name] as string)).toEqual([
        "wiring",
        `bundle:${BUNDLE.slice(0, 4)}:/home/sandbox`,
        "setup-0",
        "setup-1",
        "seal",
        "rewire",
        "cmd-0",
        "collect",
        "destroy",
      ]);
    }
    // b is made only once a is done.
    expect(w.order.indexOf(`${ids.b}:wiring`)).toBeGreaterThan(w.order.indexOf(`${ids.a}:destroy`));
    expect(w.createRequests.filter((r) => r.kind === "task")).toHaveLength(3);
    for (const r of w.createRequests) if (r.kind === "task") expect(r.resources?.pids).toBe(64);
  });
});

describe("run machine: vault edits reach running sandboxes (issue 20, item 7)", () => {
  const RUNNING: RunSpec = { ...SPEC, commands: ["sleep"], tasks: [{ name: "t1", commands: ["sleep"] }] };
  const EDITED = [...RULE_POLICY.hostsFile, "new-block.example"].sort();

  async function running(w: World) {
    await w.machine.start("run_1");
    await stepUntil(w, () => w.starts.filter((k) => k.endsWith("/cmd-0")).length === 2);
  }

  /** Steps on for a while of the fake clock (each alarm advances it). */
  async function wait(w: World, ms: number) {
    const until = w.now() + ms;
    await stepUntil(w, () => w.now() >= until, 500);
  }

  it("rewrites every running sandbox's hosts file after an edit, once, and says so in the trace", async () => {
    const w = world({ spec: RUNNING, keepsRunning: () => true });
    await running(w);
    await wait(w, HOSTS_CHECK_MS * 2);
    expect(w.hostsSet).toEqual([]); // nothing changed: nothing rewritten
    w.setVaultHosts(EDITED);
    await wait(w, HOSTS_CHECK_MS + 1000);
    const ids = workerIds(w.state());
    expect(w.hostsSet).toEqual([
      { sandboxId: ids.work, hostsFile: EDITED },
      { sandboxId: ids.t1, hostsFile: EDITED },
    ]);
    expect(w.events.get(`hosts:1:${ids.work}`)).toMatchObject({ reached: true, hostsFile: EDITED });
    expect(w.state()?.workers.every((x) => x.hostsFile?.join() === EDITED.join())).toBe(true);
    await wait(w, HOSTS_CHECK_MS * 3);
    expect(w.hostsSet).toHaveLength(2);
    expect(w.notes.some((n) => n.code === "hosts_edit_not_applied")).toBe(false);
  });

  it("rewrites them while the run is halted for review, too", async () => {
    const w = world({ spec: RUNNING, keepsRunning: () => true });
    await running(w);
    await w.machine.halt(true);
    await stepUntil(w, () => w.state()?.halted === true);
    w.setVaultHosts(EDITED);
    await wait(w, HOSTS_CHECK_MS + 1000);
    expect(w.state()?.halted).toBe(true);
    expect(w.hostsSet.map((x) => x.hostsFile)).toEqual([EDITED, EDITED]);
  });

  it("puts a warning on the run naming the edit and the sandboxes a backend cannot rewrite", async () => {
    const w = world({ spec: RUNNING, keepsRunning: () => true, setHostsUnsupported: true });
    await running(w);
    w.setVaultHosts(EDITED);
    await wait(w, HOSTS_CHECK_MS * 3);
    const note = w.notes.find((n) => n.code === "hosts_edit_not_applied");
    expect(note?.level).toBe("warning");
    expect(note?.text).toContain("added new-block.example");
    expect(note?.text).toContain("work, t1");
    const ids = workerIds(w.state());
    expect(w.events.get(`hosts:1:${ids.t1}`)).toMatchObject({ reached: false });
    // Tried once per sandbox, not at every look.
    expect(w.events.has(`hosts:2:${ids.t1}`)).toBe(false);
    expect(w.state()?.workers.every((x) => x.hostsFile === undefined)).toBe(true);
  });

  it("says a routing mode change cannot reach running sandboxes, without waiting for a resume", async () => {
    const w = world({ spec: RUNNING, keepsRunning: () => true });
    await running(w);
    w.setRouting({ mode: "catch-all", reasons: ["block_default"] });
    await wait(w, HOSTS_CHECK_MS + 1000);
    expect(w.notes).toContainEqual(
      expect.objectContaining({ level: "warning", code: "routing_change_not_retrofitted" }),
    );
    expect(w.hostsSet).toEqual([]); // their hosts files stay as they are
  });
});
