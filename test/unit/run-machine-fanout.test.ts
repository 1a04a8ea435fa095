import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { compilePolicy } from "@benchwright/shared/policy/compile";
import { describe, expect, it } from "vitest";
import { COMPUTE_URL } from "../../src/coordinator/machine";
import { EMPTY_POLICY, type Policy, SPEC, world } from "./run-machine-world";

// The run state machine's fan-out: compute control and task environments (issue 7), the egress
// tunnel and the model lane (issue 8), over the in-memory world of run-machine-world.ts.

describe("run machine: compute control, task teardown and task environments (issue 7)", () => {
  const TASKS = [
    { name: "t1", commands: ["echo t1"] },
    { name: "t2", commands: ["echo t2"] },
  ];

  it("gives the work sandbox's commands a capability and the compute URL, and task sandboxes neither", async () => {
    const w = world({ spec: { ...SPEC, tasks: TASKS } });
    await w.drive();
    const commands = [...w.execs.entries()].filter(([, e]) => e.argv[0] === "sh");
    const work = commands.filter(([, e]) => ["echo one", "echo two"].includes(e.argv[2] ?? ""));
    const tasks = commands.filter(([, e]) => ["echo t1", "echo t2"].includes(e.argv[2] ?? ""));
    expect(work).toHaveLength(2);
    expect(tasks).toHaveLength(2);
    for (const [, e] of work) {
      expect(e.env.BW_COMPUTE_URL).toBe(COMPUTE_URL);
      expect(e.env.BW_COMPUTE_TOKEN).toMatch(/^bwc_/);
    }
    // Pinned: a task sandbox never holds a compute-control capability (nor its address).
    for (const [, e] of tasks) {
      expect(Object.keys(e.env).filter((k) => k.startsWith("BW_COMPUTE"))).toEqual([]);
      expect(JSON.stringify(e.env)).not.toContain("bwc_");
    }
    // One per command, for the work sandbox only; all revoked when the run ends.
    const workId = w.state()?.workers.find((x) => x.kind === "work")?.sandboxId;
    expect(w.capabilities).toEqual([workId, workId]);
    expect(w.capabilityRevocations()).toBe(1);
    // Never kept in the coordinator's state.
    expect(JSON.stringify(w.state())).not.toContain("bwc_");
  });

  it("gives no capability when the run has no proxy (the lane to the compute API is the proxy)", async () => {
    const w = world({ policy: EMPTY_POLICY });
    await w.drive();
    const commands = [...w.execs.values()].filter((e) => e.argv[0] === "sh");
    expect(commands.every((e) => e.env.BW_COMPUTE_TOKEN === undefined)).toBe(true);
    expect(w.capabilities).toEqual([]);
  });

  it("destroys a task's sandbox when its task is done, before the run ends", async () => {
    const w = world({ spec: { ...SPEC, commands: ["echo slow"], tasks: TASKS } });
    const slowDone = { value: false };
    // The work sandbox's command runs until the tasks are done.
    await w.machine.start("run_1");
    while (!slowDone.value) {
      await w.next();
      const s = w.state();
      const tasks = s?.workers.filter((x) => x.kind === "task") ?? [];
      if (tasks.length > 0 && tasks.every((t) => t.done)) slowDone.value = true;
      if (w.steps() > 100) throw new Error("tasks never finished");
    }
    const s = w.state();
    const taskIds = s?.workers.filter((x) => x.kind === "task").map((x) => x.sandboxId) ?? [];
    expect(taskIds).toHaveLength(2);
    for (const id of taskIds) expect(w.destroyedEarly).toContain(id);
    expect(s?.workers.filter((x) => x.kind === "task").every((x) => x.destroyed)).toBe(true);
  });

  it("makes, wires and deletes a task environment asked for while running; it never holds a capability", async () => {
    const w = world({ spec: { ...SPEC, commands: ["sleep"] }, exitCodes: {} });
    await w.machine.start("run_1");
    for (let i = 0; i < 50 && w.state()?.state !== "running"; i++) await w.next();
    const asked = await w.machine.addEnvironment({ name: "env-1" });
    expect(asked.ok).toBe(true);
    const id = asked.ok ? asked.environment.id : "";
    expect(asked.ok && asked.environment.state).toBe("preparing");
    expect(await w.machine.addEnvironment({ name: "env-1" })).toMatchObject({ ok: false, code: "conflict" });
    // Made and wired at the next steps, with the run's routing.
    for (let i = 0; i < 5 && (await w.machine.environment(id))?.view.state !== "ready"; i++) await w.next();
    const ready = await w.machine.environment(id);
    expect(ready?.view.state).toBe("ready");
    expect(ready?.env?.NODE_EXTRA_CA_CERTS).toBe("/run/benchwright/run-ca.pem");
    expect(Object.keys(ready?.env ?? {}).some((k) => k.startsWith("BW_COMPUTE"))).toBe(false);
    expect(w.created.get(id)).toBe("task");
    expect(w.execs.get(`${id}/wiring`)?.argv).toEqual(["bw-wiring"]);
    // Halted for review: nothing may start in it.
    await w.machine.halt(true);
    await w.next();
    expect((await w.machine.environment(id))?.env).toBeNull();
    await w.machine.halt(false);
    await w.next();
    expect((await w.machine.environment(id))?.env).not.toBeNull();
    // Deleted: destroyed now, idempotently.
    const gone = await w.machine.removeEnvironment(id);
    expect(gone).toMatchObject({ ok: true, environment: { state: "deleted" } });
    expect(w.destroyedEarly).toEqual([id]);
    await w.machine.removeEnvironment(id);
    expect(w.destroyedEarly).toEqual([id]);
    expect((await w.machine.environment(id))?.env).toBeNull();
    expect(await w.machine.removeEnvironment("sbx_nope")).toMatchObject({ ok: false, code: "not_found" });
  });

  it("does not let an environment decide the run's outcome, and refuses environments after the run", async () => {
    const w = world();
    await w.machine.start("run_1");
    for (let i = 0; i < 50 && w.state()?.state !== "running"; i++) await w.next();
    const asked = await w.machine.addEnvironment({ name: "env-1" });
    expect(asked.ok).toBe(true);
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.transitions.at(-1)?.reason).toBe("completed");
    expect(await w.machine.addEnvironment({ name: "env-2" })).toMatchObject({ ok: false, code: "run_ended" });
  });

  it("runs a Harbor run's commands in an orchestrator sandbox with a capability, with a proxy even for an empty vault", async () => {
    const w = world({ spec: { ...SPEC, orchestrator: "harbor" }, policy: EMPTY_POLICY });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    const orchestrator = end?.workers[0];
    expect(orchestrator?.kind).toBe("orchestrator");
    expect(w.created.get(orchestrator?.sandboxId ?? "")).toBe("orchestrator");
    expect(w.starts.some((k) => k.endsWith("/proxy-1"))).toBe(true);
    const commands = [...w.execs.values()].filter((e) => e.argv[0] === "sh");
    expect(commands.every((e) => e.env.BW_COMPUTE_TOKEN?.startsWith("bwc_"))).toBe(true);
    expect(w.notes.some((n) => n.code === "no_proxy")).toBe(false);
  });
});

describe("run machine: the egress tunnel and the model lane (issue 8)", () => {
  const LOCAL: RunSpec = { ...SPEC, egress: "local" };
  const LOCAL_POLICY: Policy = compilePolicy(
    { version: 2, default: "allow", hosts: [], rules: [] },
    { egress: "local" },
  );
  const TUNNEL_HOST_POLICY: Policy = compilePolicy({
    version: 2,
    default: "allow",
    hosts: [{ pattern: "lan.example", action: "allow", via: "tunnel" }],
    rules: [],
  });
  const commandsRun = (w: ReturnType<typeof world>) =>
    [...w.execs.values()].filter((e) => e.argv[0] === "sh");

  it("starts no command until the egress agent is paired, then runs, and ends the tunnel with the run", async () => {
    const w = world({ spec: LOCAL, policy: LOCAL_POLICY, tunnelPaired: (look) => look >= 3 });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.notes.map((n) => n.code)).toContain("egress_agent_awaited");
    expect(w.tunnelLooks()).toBe(3);
    expect(commandsRun(w).map((e) => e.argv[2])).toEqual(["echo one", "echo two"]);
    expect(w.events.has("tunnel:ready")).toBe(true);
    expect(w.tunnelEnds()).toBe(1);
  });

  it("waits for the agent when only some hosts go via the tunnel, too", async () => {
    const w = world({ policy: TUNNEL_HOST_POLICY, tunnelPaired: (look) => look >= 2 });
    expect((await w.drive())?.state).toBe("finished");
    expect(w.tunnelLooks()).toBe(2);
  });

  it("stops before any benchmark code when the agent never connects within the wait", async () => {
    const w = world({ spec: { ...LOCAL, egressAgentWaitSeconds: 5 }, policy: LOCAL_POLICY });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)?.reason).toBe("egress_agent_absent");
    expect(w.notes.map((n) => n.code)).toContain("egress_agent_absent");
    expect(commandsRun(w)).toEqual([]);
    // It looked about once a second for the 5 s, not in a hot loop.
    expect(w.tunnelLooks()).toBeGreaterThanOrEqual(5);
    expect(w.tunnelLooks()).toBeLessThanOrEqual(7);
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
    expect(w.tunnelEnds()).toBe(1);
  });

  it("never asks for the agent when the run sends nothing through the tunnel", async () => {
    const w = world();
    expect((await w.drive())?.state).toBe("finished");
    expect(w.tunnelLooks()).toBe(0);
    expect(w.notes.map((n) => n.code)).not.toContain("egress_agent_awaited");
  });

  it("gives the commands the model lane's base URLs (OpenAI's and Anthropic's) and a placeholder key, never a credential", async () => {
    const withModel: Policy = compilePolicy(
      { version: 5, default: "allow", hosts: [], rules: [] },
      {
        egress: "direct",
        model: {
          name: "eval-model",
          provider: "openai",
          baseUrl: "https://api.openai.example/v1",
          upstreamModel: "gpt-x",
          secret: "MODEL_KEY",
          budget: null,
        },
      },
    );
    expect(withModel.enforce).toBe(true);
    const w = world({ spec: { ...SPEC, tasks: [{ name: "t1", commands: ["echo t1"] }] }, policy: withModel });
    expect((await w.drive())?.state).toBe("finished");
    const commands = commandsRun(w);
    expect(commands.length).toBe(3);
    for (const e of commands) {
      expect(e.env).toMatchObject({
        OPENAI_BASE_URL: "http://model.benchwright.invalid/v1",
        OPENAI_API_KEY: "bw-model-lane-placeholder",
        // The Anthropic SDK appends /v1/messages itself.
        ANTHROPIC_BASE_URL: "http://model.benchwright.invalid",
        ANTHROPIC_API_KEY: "bw-model-lane-placeholder",
        BENCHWRIGHT_MODEL: "eval-model",
      });
    }
    const plain = world();
    await plain.drive();
    expect(
      commandsRun(plain).every(
        (e) => e.env.OPENAI_BASE_URL === undefined && e.env.ANTHROPIC_BASE_URL === undefined,
      ),
    ).toBe(true);
  });
});
