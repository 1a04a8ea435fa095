import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { describe, expect, it } from "vitest";
import { VAULT_ATTEMPTS } from "../../src/coordinator/machine";
import type { MachinePorts } from "../../src/coordinator/ports";
import { CATCH_ALL_POLICY, EMPTY_POLICY, SPEC, states, world } from "./run-machine-world";

// The run state machine over the in-memory world of run-machine-world.ts: the walk through its
// states, crash points and faults (case E6, E1, E2), halts, lingering and tasks in their turn.

describe("run machine", () => {
  it("walks the happy path in order and tears everything down", async () => {
    const w = world();
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(states(w)).toEqual([
      "fetching_vault",
      "starting_proxy",
      "starting_sandboxes",
      "wiring",
      "running",
      "finishing",
      "finished",
    ]);
    expect(w.transitions.at(-1)?.reason).toBe("completed");
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
    // The proxy runs in the proxy sandbox; benchmark commands only in the execute stage.
    const commands = [...w.execs.values()].filter((e) => e.argv[0] === "sh");
    expect(commands.map((e) => e.argv[2])).toEqual(["echo one", "echo two"]);
    expect(commands.every((e) => e.stage === "execute")).toBe(true);
    expect(commands[0]?.env.NODE_EXTRA_CA_CERTS).toBe("/run/benchwright/run-ca.pem");
  });

  // case E6: a step that dies after its side effects and before its save is replayed by the
  // alarm retry; the world must look exactly as if it had not died.
  it("is idempotent when any step is replayed after a crash (E6)", async () => {
    const clean = world();
    await clean.drive();
    const total = clean.starts.length + 12;
    for (let crash = 1; crash <= total; crash++) {
      const w = world();
      w.crashAt(crash);
      const end = await w.drive();
      expect(end?.state, `crash at step ${crash}`).toBe("finished");
      expect(states(w), `crash at step ${crash}`).toEqual(states(clean));
      expect(w.created.size, `crash at step ${crash}`).toBe(clean.created.size);
      // Commands never run twice: a replayed exec carries the same id.
      const commandStarts = w.starts.filter((k) => /\/cmd-/.test(k));
      expect(new Set(commandStarts).size).toBe(commandStarts.length);
      expect(commandStarts.length).toBe(clean.starts.filter((k) => /\/cmd-/.test(k)).length);
      expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
    }
  });

  it("relaunches the proxy under a new id after a crash mid-launch, stopping the old one (E6)", async () => {
    const w = world();
    w.crashAt(3); // the step that launches the proxy
    await w.drive();
    expect(w.starts.filter((k) => k.endsWith("/proxy-1") || k.endsWith("/proxy-2")).length).toBe(2);
    expect(w.kills.some((k) => k.endsWith("/proxy-1"))).toBe(true);
  });

  it("retries a port that throws, then goes on (E6)", async () => {
    const w = world({ throwOnce: { port: "create", times: 2 } });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(end?.faults).toBe(0);
  });

  it("fails (and tears down) after too many faults in a row", async () => {
    const w = world({ throwOnce: { port: "exec", times: 99 } });
    const end = await w.drive();
    expect(end?.state).toBe("failed");
    expect(w.transitions.at(-1)).toMatchObject({ to: "failed", reason: "internal_error" });
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
  });

  it("keeps retrying a failing teardown past MAX_FAULTS, revoking the proxy credentials meanwhile", async () => {
    const w = world({ throwOnce: { port: "destroy", times: 8 } });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
    // Early (once the teardown has failed MAX_FAULTS times), and again when it succeeds.
    expect(w.revocations()).toBeGreaterThanOrEqual(2);
  });

  it("never starts a run that ended before its coordinator did (cancelled while queued)", async () => {
    const w = world({ runStatus: "stopped" });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions).toEqual([]);
    expect(w.created.size).toBe(0);
  });

  // case E1
  it("retries an unreadable vault, then stops before any sandbox or command", async () => {
    const w = world({ vaultFailures: VAULT_ATTEMPTS });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "vault_unreadable" });
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "vault_unreadable" }));
    expect(w.created.size).toBe(0);
    expect(w.starts).toEqual([]);
  });

  it("counts the attempts when the database is away and cannot take their notes, then stops (E1)", async () => {
    // The teardown's record of the stop fails too, a few times, before the database is back.
    const w = world({
      vaultFailures: VAULT_ATTEMPTS,
      databaseAway: true,
      throwOnce: { port: "transition", times: 3 },
    });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "vault_unreadable" });
    expect(w.logs.map((l) => [l.event, l.attempt])).toEqual(
      Array.from({ length: VAULT_ATTEMPTS }, (_, i) => ["vault_read_failed", i + 1]),
    );
    expect(w.created.size).toBe(0);
    expect(w.starts).toEqual([]);
  });

  it("goes on when the vault reads on a retry (E1)", async () => {
    const w = world({ vaultFailures: VAULT_ATTEMPTS - 1 });
    expect((await w.drive())?.state).toBe("finished");
  });

  // case E2
  it("stops when the catch-all redirect cannot be installed", async () => {
    const w = world({
      policy: CATCH_ALL_POLICY,
      createFails: (k) => (k === "work:catch-all" ? "could not install the redirect: nft failed" : null),
    });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "redirect_not_installed" });
    expect(w.notes).toContainEqual(
      expect.objectContaining({ level: "warning", code: "redirect_not_installed" }),
    );
    expect(w.starts.some((k) => /\/cmd-/.test(k))).toBe(false);
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
  });

  it("stops when the wiring probe fails, before any command (E2)", async () => {
    const w = world({ policy: CATCH_ALL_POLICY, proofOk: false });
    await w.drive();
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "redirect_not_installed" });
    expect(w.starts.some((k) => /\/cmd-/.test(k))).toBe(false);
  });

  it("runs without a proxy, with a plain note, when the vault has nothing to enforce", async () => {
    const w = world({ policy: EMPTY_POLICY });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "note", code: "no_proxy" }));
    expect(w.starts.some((k) => k.includes("proxy-") || k.endsWith("/wiring"))).toBe(false);
  });

  it("stops with the reason when the backend cannot isolate, and never runs a command", async () => {
    const w = world({ createFails: () => null });
    const ports = (w.machine as unknown as { ports: MachinePorts }).ports;
    ports.broker.create = async () => ({
      ok: false,
      code: "cannot_isolate",
      message: "not root: namespaces need root",
      retryable: false,
    });
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "cannot_isolate" });
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "cannot_isolate" }));
    expect(w.starts).toEqual([]);
  });

  it("stops with a warning when the proxy does not come up", async () => {
    const w = world({ proxyNeverReady: true });
    const end = await w.drive(1000);
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "proxy_setup_failed" });
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "proxy_failed" }));
    expect(w.starts.some((k) => /\/cmd-/.test(k))).toBe(false);
  });

  // Fault injection, the proxy crashing mid-run: it must fail closed. The run stops, its
  // sandboxes go, and the run says why.
  it("stops, tears down and says why when the proxy dies mid-run", async () => {
    let dead = false;
    const w = world({
      spec: { ...SPEC, commands: ["sleep forever"] },
      keepsRunning: () => true,
      proxyDead: () => (dead ? "SIGKILL" : null),
    });
    await w.machine.start("run_1");
    for (let i = 0; i < 50 && w.state()?.state !== "running"; i++) await w.next();
    for (let i = 0; i < 10; i++) await w.next();
    expect(w.state()?.state).toBe("running");
    const pollsWhileAlive = w.proxyPolls();
    dead = true;
    const end = await w.drive(1000);
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "proxy_lost" });
    expect(w.notes).toContainEqual(expect.objectContaining({ level: "warning", code: "proxy_lost" }));
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
    // Looked at every PROXY_CHECK_MS, not on every step; only output not read before.
    expect(pollsWhileAlive).toBeLessThan(10);
    expect(w.proxyPollRanges.at(-1)?.stdoutFrom).toBe("proxy: listening\n".length);
  });

  it("notices a dead proxy while the run is halted for review, too", async () => {
    let dead = false;
    const w = world({
      spec: { ...SPEC, commands: ["sleep forever"] },
      keepsRunning: () => true,
      proxyDead: () => (dead ? "SIGKILL" : null),
    });
    await w.machine.start("run_1");
    for (let i = 0; i < 50 && w.state()?.state !== "running"; i++) await w.next();
    await w.machine.halt(true);
    for (let i = 0; i < 5; i++) await w.next();
    expect(w.state()?.halted).toBe(true);
    dead = true;
    const end = await w.drive(1000);
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "proxy_lost" });
  });

  it("goes on unfiltered, with a warning, only when asked and only under default routing", async () => {
    const spec: RunSpec = { ...SPEC, onProxyFailure: "continue" };
    const fine = world({ proxyNeverReady: true, spec });
    expect((await fine.drive(1000))?.state).toBe("finished");
    expect(fine.notes).toContainEqual(
      expect.objectContaining({ level: "warning", code: "proxy_failed_unfiltered" }),
    );

    const strict = world({ proxyNeverReady: true, spec, policy: CATCH_ALL_POLICY });
    expect((await strict.drive(1000))?.state).toBe("stopped");
    expect(strict.starts.some((k) => /\/cmd-/.test(k))).toBe(false);
  });

  it("stops the failed proxy and revokes its credentials before going on unfiltered", async () => {
    const spec: RunSpec = { ...SPEC, onProxyFailure: "continue" };
    const w = world({ proxyNeverReady: true, spec });
    await w.drive(1000);
    expect(w.kills.some((k) => k.endsWith("/proxy-1"))).toBe(true);
    // Once when it goes on unfiltered, once more (idempotent) at teardown.
    expect(w.revocations()).toBe(2);
  });

  it("stops, never runs unenforced, when an enforcing run reaches wiring without the proxy's CA", async () => {
    const w = world();
    await w.drive(5); // through starting_sandboxes: the next step wires
    const saved = w.state();
    expect(saved?.state).toBe("wiring");
    if (saved?.proxy) saved.proxy.caCertPem = null;
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "internal_error" });
    expect(w.starts.some((k) => /\/cmd-|\/wiring/.test(k))).toBe(false);
  });

  it("gives every task its own sandbox and finishes with command_failed when one fails", async () => {
    const spec: RunSpec = {
      ...SPEC,
      tasks: [
        { name: "a", commands: ["echo a"] },
        { name: "b", commands: ["exit 3"] },
      ],
    };
    const w = world({ spec, exitCodes: { "exit 3": 3 } });
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.transitions.at(-1)?.reason).toBe("command_failed");
    expect([...w.created.values()].sort()).toEqual(["proxy", "task", "task", "work"]);
  });

  it("keeps a cancel that arrives while a step is in flight", async () => {
    const w = world();
    await w.machine.start("run_1");
    await w.drive(3); // into starting_proxy
    const ports = (w.machine as unknown as { ports: MachinePorts }).ports;
    const readVault = ports.proxyReady;
    // The cancel lands between the step's load and its save.
    ports.proxyReady = async (id) => {
      await w.machine.cancel();
      return readVault(id);
    };
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ reason: "cancelled" });
    expect(w.starts.some((k) => /\/cmd-/.test(k))).toBe(false);
  });

  it("cancels: stops with the reason and tears down", async () => {
    const w = world();
    await w.machine.start("run_1");
    await w.machine.cancel();
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "cancelled" });
    expect(w.starts.some((k) => /\/cmd-/.test(k))).toBe(false);
  });

  it("halts for review: stops the commands' sandboxes, starts nothing, and resumes where it was", async () => {
    const w = world({ spec: { ...SPEC, commands: ["echo one", "echo two", "echo three"] } });
    await w.machine.start("run_1");
    // Drive until the first command has started, then halt.
    while (!w.starts.some((k) => k.endsWith("/cmd-0"))) await w.drive(w.steps() + 1);
    expect(await w.machine.halt(true)).toBe(true);
    await w.drive(w.steps() + 6);
    expect(w.state()?.halted).toBe(true);
    expect(w.freezes).toEqual([expect.stringMatching(/^stop:sbx_/)]);
    const started = w.starts.filter((k) => /\/cmd-/.test(k)).length;
    await w.drive(w.steps() + 10);
    expect(w.starts.filter((k) => /\/cmd-/.test(k)).length).toBe(started);
    await w.machine.halt(false);
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.freezes).toEqual([expect.stringMatching(/^stop:/), expect.stringMatching(/^cont:/)]);
    expect(w.starts.filter((k) => /\/cmd-/.test(k))).toHaveLength(3);
    expect(w.notes.some((n) => n.code === "routing_change_not_retrofitted")).toBe(false);
  });

  it("says a policy edit that needs catch-all is not retrofitted onto running sandboxes", async () => {
    const w = world({ routingNow: { mode: "catch-all", reasons: ["block_default"] } });
    await w.machine.start("run_1");
    while (!w.starts.some((k) => k.endsWith("/cmd-0"))) await w.drive(w.steps() + 1);
    await w.machine.halt(true);
    await w.drive(w.steps() + 3);
    await w.machine.halt(false);
    await w.drive();
    expect(w.notes).toContainEqual(
      expect.objectContaining({ level: "warning", code: "routing_change_not_retrofitted" }),
    );
  });

  it("refuses to halt a run that has ended", async () => {
    const w = world();
    await w.drive();
    expect(await w.machine.halt(true)).toBe(false);
  });

  it("stops with the reason reaped when the sweeper asks, and tears down", async () => {
    const w = world();
    await w.machine.start("run_1");
    await w.drive(4);
    expect(await w.machine.cancel("reaped")).toBe(true);
    const end = await w.drive();
    expect(end?.state).toBe("stopped");
    expect(w.transitions.at(-1)).toMatchObject({ to: "stopped", reason: "reaped" });
    expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
  });

  describe("linger", () => {
    const HOUR = 3600;
    const lingering = async (w: ReturnType<typeof world>) => {
      await w.machine.start("run_1");
      while (w.state()?.state !== "lingering") await w.drive(w.steps() + 1);
    };
    const proxyId = (w: ReturnType<typeof world>) =>
      [...w.created].find(([, kind]) => kind === "proxy")?.[0] ?? "";

    it("keeps only the proxy after the commands end, pauses it when idle, wakes it on a look, and ends when the window lapses", async () => {
      const w = world({ spec: { ...SPEC, lingerSeconds: HOUR }, lingerIdleMs: 60_000 });
      await lingering(w);
      const start = w.now();
      expect(w.transitions.at(-1)).toEqual({ to: "lingering", reason: "completed" });
      // Work sandbox gone, proxy kept with its credentials.
      const work = [...w.created].filter(([, k]) => k !== "proxy").map(([id]) => id);
      expect(work.every((id) => w.destroyed.has(id))).toBe(true);
      expect(w.destroyed.has(proxyId(w))).toBe(false);
      expect(w.revocations()).toBe(0);
      expect(w.fields).toContainEqual(
        expect.objectContaining({ lingerSeconds: HOUR, lingerUntil: new Date(start + HOUR * 1000) }),
      );
      // The next alarm is the idle deadline; at it the proxy is paused (clock advanced, not slept).
      expect(w.alarm()).toBe(start + 60_000);
      await w.next();
      expect(w.now()).toBe(start + 60_000);
      expect(w.freezes).toEqual([`stop:${proxyId(w)}`]);
      expect(w.state()?.linger?.paused).toBe(true);
      expect(w.alarm()).toBe(start + HOUR * 1000); // paused: nothing to do until the window ends
      // A look resumes it and restarts the idle clock.
      const woke = await w.machine.wake();
      expect(woke).toEqual({ ok: true, runId: "run_1", sandboxId: proxyId(w), resumed: true });
      expect(w.freezes).toEqual([`stop:${proxyId(w)}`, `cont:${proxyId(w)}`]);
      expect(w.state()?.linger?.paused).toBe(false);
      expect(w.alarm()).toBe(w.now() + 60_000);
      expect(await w.machine.wake()).toMatchObject({ ok: true, resumed: false });
      // Then to the end of the window: everything goes, credentials revoked, reason linger_lapsed.
      const end = await w.drive();
      expect(end?.state).toBe("finished");
      expect(w.now()).toBe(start + HOUR * 1000);
      expect(w.transitions.at(-1)).toEqual({ to: "finished", reason: "linger_lapsed" });
      expect(w.destroyed.has(proxyId(w))).toBe(true);
      expect(w.revocations()).toBe(1);
      expect(await w.machine.wake()).toMatchObject({ ok: false });
      expect(w.events.has("linger:pause:1")).toBe(true);
      expect(w.events.has("linger:resume:1")).toBe(true);
    });

    it("takes a linger asked for after launch, and a change of window while lingering", async () => {
      const w = world();
      await w.machine.start("run_1");
      await w.drive(3);
      expect(await w.machine.linger(2 * HOUR)).toBe(true);
      await lingering(w);
      const start = w.now();
      expect(w.state()?.linger?.seconds).toBe(2 * HOUR);
      // Shortened to 10 minutes: applied at once (the alarm is re-armed now).
      expect(await w.machine.linger(600)).toBe(true);
      expect(w.alarm()).toBe(w.now());
      const end = await w.drive();
      expect(end?.state).toBe("finished");
      expect(w.now()).toBe(start + 600_000);
      expect(w.transitions.at(-1)).toEqual({ to: "finished", reason: "linger_lapsed" });
      expect(await w.machine.linger(60)).toBe(false); // over
    });

    it("a window shortened to one already past ends the linger at once", async () => {
      const w = world({ spec: { ...SPEC, lingerSeconds: HOUR } });
      await lingering(w);
      const start = w.now();
      await w.machine.linger(0);
      await w.drive();
      expect(w.now()).toBe(start);
      expect(w.transitions.at(-1)).toEqual({ to: "finished", reason: "linger_lapsed" });
    });

    it("ends on a cancel (cancelled) or the sweeper's reap of a lapsed linger (linger_lapsed)", async () => {
      for (const [who, reason] of [
        ["cancelled", "cancelled"],
        ["reaped", "linger_lapsed"],
      ] as const) {
        const w = world({ spec: { ...SPEC, lingerSeconds: HOUR } });
        await lingering(w);
        expect(await w.machine.cancel(who)).toBe(true);
        const at = w.now();
        const end = await w.drive();
        expect(end?.state).toBe("finished");
        expect(w.now()).toBe(at);
        expect(w.transitions.at(-1)).toEqual({ to: "finished", reason });
        expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
      }
    });

    it("never lingers a run that did not run its commands to an end, nor one without a proxy", async () => {
      const cancelled = world({ spec: { ...SPEC, lingerSeconds: HOUR } });
      await cancelled.machine.start("run_1");
      await cancelled.drive(5);
      await cancelled.machine.cancel();
      expect((await cancelled.drive())?.state).toBe("stopped");
      expect(states(cancelled)).not.toContain("lingering");
      const unproxied = world({ spec: { ...SPEC, lingerSeconds: HOUR }, policy: EMPTY_POLICY });
      expect((await unproxied.drive())?.state).toBe("finished");
      expect(states(unproxied)).not.toContain("lingering");
      expect(await unproxied.machine.wake()).toMatchObject({ ok: false });
    });

    it("refuses halts while lingering and has nothing to halt", async () => {
      const w = world({ spec: { ...SPEC, lingerSeconds: HOUR } });
      await lingering(w);
      expect(await w.machine.halt(true)).toBe(false);
    });

    it("ends the same way when any lingering step is replayed after a crash (E6)", async () => {
      const clean = world({ spec: { ...SPEC, lingerSeconds: HOUR }, lingerIdleMs: 60_000 });
      await clean.drive();
      const total = clean.steps();
      for (let n = total - 4; n <= total; n++) {
        const w = world({ spec: { ...SPEC, lingerSeconds: HOUR }, lingerIdleMs: 60_000 });
        w.crashAt(n);
        const end = await w.drive();
        expect(end?.state).toBe("finished");
        expect(w.transitions).toEqual(clean.transitions);
        expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
      }
    });
  });

  describe("tasks made in their turn (maxParallelTasks)", () => {
    const tasks = ["a", "b", "c"].map((name) => ({ name, commands: [`echo ${name}`] }));

    it("runs at most N task sandboxes at once, each made when its turn comes", async () => {
      const w = world({ spec: { ...SPEC, tasks, maxParallelTasks: 1 } });
      await w.machine.start("run_1");
      let most = 0;
      while (w.state()?.state !== "finished" && w.steps() < 300) {
        await w.drive(w.steps() + 1);
        const live = (w.state()?.workers ?? []).filter(
          (x) => x.kind === "task" && x.proxyAddress !== null && !x.done,
        );
        most = Math.max(most, live.length);
      }
      expect(w.state()?.state).toBe("finished");
      expect(most).toBe(1);
      expect([...w.created.values()].filter((k) => k === "task")).toHaveLength(3);
      expect(w.starts.filter((k) => /\/cmd-0$/.test(k))).toHaveLength(4);
    });

    it("gives a task sandbox made after a vault edit the new routing; earlier ones keep theirs", async () => {
      const w = world({ spec: { ...SPEC, commands: ["echo slow"], tasks, maxParallelTasks: 1 } });
      await w.machine.start("run_1");
      // Until the first task's sandbox exists, then the vault starts asking for catch-all.
      while (![...w.created.values()].includes("task")) await w.drive(w.steps() + 1);
      await w.machine.halt(true);
      await w.drive(w.steps() + 3);
      w.setRouting({ mode: "catch-all", reasons: ["block_default"] });
      await w.machine.halt(false);
      expect((await w.drive())?.state).toBe("finished");
      const taskRouting = [...w.created].filter(([, k]) => k === "task").map(([id]) => w.routingOf.get(id));
      expect(taskRouting).toEqual(["default", "catch-all", "catch-all"]);
      expect(w.notes).toContainEqual(expect.objectContaining({ code: "routing_change_not_retrofitted" }));
      // Each late task proved its own boundary under its routing before its command ran.
      const wired = [...w.events]
        .filter(([k]) => k.startsWith("wiring:"))
        .map(([, d]) => (d as { routing: string }).routing);
      expect(wired).toEqual(["default", "default", "catch-all", "catch-all"]);
    });
  });
});
