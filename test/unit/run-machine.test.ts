import { describe, expect, it } from "vitest";
import type { ExecInfo, SandboxInfo } from "../../src/contract/local-agent";
import type { PolicyDocument } from "../../src/contract/policy";
import type { WiringProof } from "../../src/contract/wiring";
import {
  COMPUTE_URL,
  type MachinePorts,
  type MachineState,
  RunMachine,
  VAULT_ATTEMPTS,
} from "../../src/coordinator/machine";
import { compilePolicy } from "../../src/policy/compile";
import type { RunSpec } from "../../src/runs/spec";

// The run state machine over an in-memory world that behaves like the real ports do: creates and
// execs are idempotent by id (as the broker and host agent are), transitions by state (as the
// trace's unique key is). The end-to-end suite (test/e2e) runs the same machine on real parts;
// this one enumerates crash points and faults that are hard to hit there (case E6, E1, E2).

type Policy = PolicyDocument;
const RULE_POLICY: Policy = compilePolicy({
  version: 3,
  default: "allow",
  hosts: [{ pattern: "blocked.example", action: "block" }],
  rules: [{ host: "api.example", secret: "KEY", inject: { scheme: "bearer", name: "authorization" } }],
});
const CATCH_ALL_POLICY: Policy = compilePolicy({ version: 4, default: "block", hosts: [], rules: [] });
const EMPTY_POLICY: Policy = compilePolicy({ version: 1, default: "allow", hosts: [], rules: [] });

const SPEC: RunSpec = { commands: ["echo one", "echo two"], egress: "direct", on_proxy_failure: "stop" };

interface WorldOptions {
  spec?: RunSpec;
  policy?: Policy;
  vaultFailures?: number;
  createFails?: (kind: string) => string | null;
  proxyNeverReady?: boolean;
  proofOk?: boolean;
  exitCodes?: Record<string, number>;
  /** Throw from the named port this many times before behaving. */
  throwOnce?: { port: "create" | "exec" | "transition" | "destroy"; times: number };
  /** The run's status in the database when the coordinator loads it. */
  runStatus?: "queued" | "stopped";
  /** The routing the vault asks for when the run is resumed (default: the run's own). */
  routingNow?: Policy["routing"];
  lingerIdleMs?: number;
  /** Whether the relay has the run's proxy and egress agent paired, per look (default: never). */
  tunnelPaired?: (look: number) => boolean;
  /** Commands that keep running (never exit) while this says so. */
  keepsRunning?: (command: string) => boolean;
  /** Notes and events cannot be written while the vault reads fail (the database is away). */
  databaseAway?: boolean;
  /** The proxy's exec has exited (killed by this signal) from now on, per poll of it. */
  proxyDead?: (poll: number) => string | null;
}

function world(o: WorldOptions = {}) {
  let now = 1_000_000;
  let ids = 0;
  const saved: { state: MachineState | undefined } = { state: undefined };
  let alarm: number | null = null;
  let cancelKey: "cancelled" | "reaped" | null = null;
  let haltKey = false;
  let lingerKey: number | null = null;
  const routingOf = new Map<string, string | null>();
  const events = new Map<string, unknown>();
  const fields: Record<string, unknown>[] = [];
  const freezes: string[] = [];
  const transitions: { to: string; reason: string }[] = [];
  const notes: { level: string; code: string }[] = [];
  const created = new Map<string, string>();
  const destroyed = new Set<string>();
  const execs = new Map<string, { argv: string[]; stage: string; env: Record<string, string> }>();
  const starts: string[] = [];
  const kills: string[] = [];
  let revocations = 0;
  const capabilities: string[] = [];
  const destroyedEarly: string[] = [];
  let capabilityRevocations = 0;
  let tunnelLooks = 0;
  let tunnelEnds = 0;
  let vaultReads = 0;
  let proxyStarted = false;
  let proxyPolls = 0;
  const proxyPollRanges: { stdoutFrom?: number; stderrFrom?: number }[] = [];
  let throws = o.throwOnce?.times ?? 0;
  const maybeThrow = (port: string) => {
    if (o.throwOnce?.port === port && throws > 0) {
      throws -= 1;
      throw new Error(`${port} unavailable`);
    }
  };
  const info = (sandboxId: string, execId: string, exitCode: number | null, stdout = ""): ExecInfo => ({
    execId,
    sandboxId,
    state: exitCode === null ? "running" : "exited",
    exitCode,
    signal: null,
    stdout,
    stderr: "",
    stdoutEnd: stdout.length,
    stderrEnd: 0,
  });
  const proof = (ok: boolean): WiringProof => ({
    ok,
    mode: "default",
    caFingerprint256: "a".repeat(64),
    hostsEntries: ["10.0.0.1 api.example"],
    probes: [{ name: "tls_probe", expected: "403", observed: ok ? "403" : "200", ok }],
    env: {
      NODE_EXTRA_CA_CERTS: "/run/benchwright/run-ca.pem",
      REQUESTS_CA_BUNDLE: "/etc/ssl/certs/ca-certificates.crt",
      SSL_CERT_FILE: "/etc/ssl/certs/ca-certificates.crt",
      CURL_CA_BUNDLE: "/etc/ssl/certs/ca-certificates.crt",
    },
  });
  const logs: Record<string, unknown>[] = [];
  const away = () => o.databaseAway === true && vaultReads <= (o.vaultFailures ?? 0);
  const ports: MachinePorts = {
    now: () => now,
    log: (event) => logs.push(event),
    newId: (prefix) => `${prefix}${++ids}`,
    loadRun: async (id) => ({ id, status: o.runStatus ?? "queued", spec: o.spec ?? SPEC }),
    transition: async (_runId, t) => {
      maybeThrow("transition");
      if (!transitions.some((x) => x.to === t.to)) transitions.push({ to: t.to, reason: t.reason });
    },
    note: async (_runId, note) => {
      if (away()) throw new Error("database away");
      if (!notes.some((n) => n.code === note.code)) notes.push(note);
    },
    event: async (_runId, key, _kind, detail) => {
      if (away()) throw new Error("database away");
      if (!events.has(key)) events.set(key, detail);
    },
    setRunFields: async (_runId, f) => {
      fields.push(f);
    },
    readVault: async () => {
      vaultReads += 1;
      if (vaultReads <= (o.vaultFailures ?? 0)) return { ok: false, reason: "the database did not answer" };
      return { ok: true, policy: o.policy ?? RULE_POLICY };
    },
    issueProxyCredentials: async () => ({ proxyToken: "t".repeat(40), auditKey: "whsec_x" }),
    revokeProxyCredentials: async () => {
      revocations += 1;
    },
    proxyReady: async () => (proxyStarted && !o.proxyNeverReady ? { caCertPem: "CA" } : null),
    broker: {
      create: async (_runId, req) => {
        maybeThrow("create");
        const failure = o.createFails?.(req.kind === "proxy" ? "proxy" : `${req.kind}:${req.routing}`);
        if (failure) return { ok: false, code: "sandbox_failed", message: failure, retryable: false };
        created.set(req.id, req.kind);
        routingOf.set(req.id, req.kind === "proxy" ? null : req.routing);
        const sandbox: SandboxInfo = {
          id: req.id,
          runId: "run_1",
          kind: req.kind,
          state: "ready",
          address: "10.0.0.2",
          proxyAddress: req.kind === "proxy" ? null : "10.0.0.1",
          controlPlaneUrl: null,
          routing: req.kind === "proxy" ? null : req.routing,
          probeTarget: req.kind === "proxy" ? null : "10.9.0.1:9",
          wiring: null,
        };
        return { ok: true, info: sandbox };
      },
      exec: async (_runId, sandboxId, req) => {
        maybeThrow("exec");
        const key = `${sandboxId}/${req.id}`;
        if (!execs.has(key)) {
          execs.set(key, { argv: req.argv, stage: req.stage, env: req.env });
          starts.push(key);
          if (req.argv[0] === "bw-proxy") proxyStarted = true;
        }
        return info(sandboxId, req.id, null);
      },
      poll: async (_runId, sandboxId, execId, range) => {
        const e = execs.get(`${sandboxId}/${execId}`);
        if (!e) throw new Error("no such exec");
        if (e.argv[0] === "bw-proxy") {
          proxyPolls += 1;
          proxyPollRanges.push({ stdoutFrom: range?.stdoutFrom, stderrFrom: range?.stderrFrom });
          const signal = o.proxyDead?.(proxyPolls) ?? null;
          const base = info(sandboxId, execId, null, "proxy: listening\n");
          return signal
            ? { ...base, state: "exited", signal, stderr: "proxy: out of memory\n", stderrEnd: 21 }
            : base;
        }
        if (e.argv[0] === "bw-wiring")
          return info(sandboxId, execId, 0, JSON.stringify(proof(o.proofOk ?? true)));
        if (e.argv[0] === "sh" && o.keepsRunning?.(e.argv[2] ?? "")) return info(sandboxId, execId, null);
        return info(sandboxId, execId, o.exitCodes?.[e.argv[2] ?? ""] ?? 0, `${e.argv[2]}\n`);
      },
      kill: async (_runId, sandboxId, execId) => {
        kills.push(`${sandboxId}/${execId}`);
      },
      freeze: async (_runId, sandboxId, frozen) => {
        freezes.push(`${frozen ? "stop" : "cont"}:${sandboxId}`);
      },
      destroyRun: async (_runId, options) => {
        maybeThrow("destroy");
        for (const [id, kind] of created) if (!(options?.keepProxy && kind === "proxy")) destroyed.add(id);
      },
      destroy: async (_runId, sandboxId) => {
        maybeThrow("destroy");
        destroyed.add(sandboxId);
        destroyedEarly.push(sandboxId);
      },
    },
    issueCapability: async (_runId, holder) => {
      capabilities.push(holder);
      return { token: `bwc_${holder}_${capabilities.length}` };
    },
    revokeCapabilities: async () => {
      capabilityRevocations += 1;
    },
    tunnelPaired: async () => {
      tunnelLooks += 1;
      return o.tunnelPaired?.(tunnelLooks) ?? false;
    },
    endTunnel: async () => {
      tunnelEnds += 1;
    },
    parseProof: (stdout) => JSON.parse(stdout) as WiringProof,
    currentRouting: async () => ({
      routing: o.routingNow ?? (o.policy ?? RULE_POLICY).routing,
      hostsFile: (o.policy ?? RULE_POLICY).hostsFile,
    }),
  };
  /** `crashAt`: drop the end-of-step save of the n-th step (as if the isolate died there). */
  let crashAt = new Set<number>();
  let steps = 0;
  const storage = {
    load: async () => (saved.state ? structuredClone(saved.state) : undefined),
    save: async (state: MachineState) => {
      saved.state = structuredClone(state);
    },
    setAlarm: async (at: number) => {
      alarm = at;
    },
    requestCancel: async (reason: "cancelled" | "reaped") => {
      cancelKey = reason;
    },
    cancelRequested: async () => cancelKey,
    requestHalt: async (halt: boolean) => {
      haltKey = halt;
    },
    haltRequested: async () => haltKey,
    requestLinger: async (seconds: number) => {
      lingerKey = seconds;
    },
    lingerRequested: async () => lingerKey,
  };
  const machine = new RunMachine(storage, ports, { lingerIdleMs: o.lingerIdleMs ?? 60_000 });
  return {
    machine,
    transitions,
    notes,
    created,
    destroyed,
    execs,
    starts,
    kills,
    freezes,
    routingOf,
    events,
    fields,
    logs,
    revocations: () => revocations,
    capabilities,
    destroyedEarly,
    capabilityRevocations: () => capabilityRevocations,
    tunnelLooks: () => tunnelLooks,
    tunnelEnds: () => tunnelEnds,
    proxyPolls: () => proxyPolls,
    proxyPollRanges,
    now: () => now,
    alarm: () => alarm,
    /** The vault is edited: from now on it asks for this routing. */
    setRouting: (routing: Policy["routing"]) => {
      o.routingNow = routing;
    },
    crashAt: (...n: number[]) => {
      crashAt = new Set(n);
    },
    state: () => saved.state,
    steps: () => steps,
    /** Fires the pending alarm once, the clock advanced to it (never slept). */
    async next() {
      if (alarm === null) throw new Error("no alarm pending");
      now = Math.max(now, alarm);
      alarm = null;
      steps += 1;
      await machine.step();
    },
    /** Runs alarms until the run is over (or `max` steps), advancing the clock to each alarm. */
    async drive(max = 200) {
      await machine.start("run_1");
      while (alarm !== null && steps < max) {
        now = Math.max(now, alarm);
        alarm = null;
        steps += 1;
        if (crashAt.has(steps)) {
          const before = saved.state ? structuredClone(saved.state) : undefined;
          const checkpointsKept = { value: before };
          const realSave = storage.save;
          // Mid-step checkpoints are kept; only the final save and the alarm are lost.
          let last: MachineState | undefined;
          storage.save = async (s) => {
            if (last) checkpointsKept.value = last;
            last = structuredClone(s);
          };
          await machine.step();
          storage.save = realSave;
          saved.state = checkpointsKept.value;
          alarm = now + 1; // the runtime retries the alarm
          continue;
        }
        await machine.step();
      }
      return saved.state;
    },
  };
}

const states = (w: ReturnType<typeof world>) => w.transitions.map((t) => t.to);

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
    const spec: RunSpec = { ...SPEC, on_proxy_failure: "continue" };
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
    const spec: RunSpec = { ...SPEC, on_proxy_failure: "continue" };
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
      const w = world({ spec: { ...SPEC, linger_seconds: HOUR }, lingerIdleMs: 60_000 });
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
      const w = world({ spec: { ...SPEC, linger_seconds: HOUR } });
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
        const w = world({ spec: { ...SPEC, linger_seconds: HOUR } });
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
      const cancelled = world({ spec: { ...SPEC, linger_seconds: HOUR } });
      await cancelled.machine.start("run_1");
      await cancelled.drive(5);
      await cancelled.machine.cancel();
      expect((await cancelled.drive())?.state).toBe("stopped");
      expect(states(cancelled)).not.toContain("lingering");
      const unproxied = world({ spec: { ...SPEC, linger_seconds: HOUR }, policy: EMPTY_POLICY });
      expect((await unproxied.drive())?.state).toBe("finished");
      expect(states(unproxied)).not.toContain("lingering");
      expect(await unproxied.machine.wake()).toMatchObject({ ok: false });
    });

    it("refuses halts while lingering and has nothing to halt", async () => {
      const w = world({ spec: { ...SPEC, linger_seconds: HOUR } });
      await lingering(w);
      expect(await w.machine.halt(true)).toBe(false);
    });

    it("ends the same way when any lingering step is replayed after a crash (E6)", async () => {
      const clean = world({ spec: { ...SPEC, linger_seconds: HOUR }, lingerIdleMs: 60_000 });
      await clean.drive();
      const total = clean.steps();
      for (let n = total - 4; n <= total; n++) {
        const w = world({ spec: { ...SPEC, linger_seconds: HOUR }, lingerIdleMs: 60_000 });
        w.crashAt(n);
        const end = await w.drive();
        expect(end?.state).toBe("finished");
        expect(w.transitions).toEqual(clean.transitions);
        expect([...w.created.keys()].every((id) => w.destroyed.has(id))).toBe(true);
      }
    });
  });

  describe("tasks made in their turn (max_parallel_tasks)", () => {
    const tasks = ["a", "b", "c"].map((name) => ({ name, commands: [`echo ${name}`] }));

    it("runs at most N task sandboxes at once, each made when its turn comes", async () => {
      const w = world({ spec: { ...SPEC, tasks, max_parallel_tasks: 1 } });
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
      const w = world({ spec: { ...SPEC, commands: ["echo slow"], tasks, max_parallel_tasks: 1 } });
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
    const asked = await w.machine.addEnvironment("env-1");
    expect(asked.ok).toBe(true);
    const id = asked.ok ? asked.environment.id : "";
    expect(asked.ok && asked.environment.state).toBe("preparing");
    expect(await w.machine.addEnvironment("env-1")).toMatchObject({ ok: false, code: "conflict" });
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
    const asked = await w.machine.addEnvironment("env-1");
    expect(asked.ok).toBe(true);
    const end = await w.drive();
    expect(end?.state).toBe("finished");
    expect(w.transitions.at(-1)?.reason).toBe("completed");
    expect(await w.machine.addEnvironment("env-2")).toMatchObject({ ok: false, code: "run_ended" });
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
    const w = world({ spec: { ...LOCAL, egress_agent_wait_seconds: 5 }, policy: LOCAL_POLICY });
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

  it("gives the commands the model lane's base URL and a placeholder key, never a credential", async () => {
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
        BENCHWRIGHT_MODEL: "eval-model",
      });
    }
    const plain = world();
    await plain.drive();
    expect(commandsRun(plain).every((e) => e.env.OPENAI_BASE_URL === undefined)).toBe(true);
  });
});
