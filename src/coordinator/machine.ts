import { BackendError } from "../broker/backend";
import type { ExecInfo, SandboxInfo } from "../contract/local-agent";
import { type PolicyDocument, usesTunnel } from "../contract/policy";
import { MODEL_LANE_BASE_URL, MODEL_LANE_PLACEHOLDER_KEY } from "../contract/proxy-wire";
import type { WiringProof } from "../contract/wiring";
import type { RunState } from "../db/schema";
import { commandsOf, type RunSpec } from "../runs/spec";
import type { RunNote, Transition } from "../runs/types";

// The run state machine, as a plain class over a narrow storage interface and ports, so that
// it is testable without workerd and so that every step is idempotent: the Durable Object calls
// step() from its alarm, and a step replayed after a crash or an eviction changes nothing twice.
//
//   queued → fetching_vault → starting_proxy → starting_sandboxes → wiring → running → finishing
//          → [lingering →] finished | stopped | failed
//
// Every way out before `running` goes through `finishing` (which tears down every sandbox the
// broker made for the run) and ends `stopped` with a reason; no benchmark command runs before
// wiring has proved the boundary. A run whose commands ended may keep its proxy sandbox for a
// while (`lingering`, at most 24 h): its work and task sandboxes are gone, the proxy keeps the
// run's credentials and its view, is paused when nobody looked at it for LINGER_IDLE_MS, woken by
// the next look (wake), and torn down when the window lapses (reason `linger_lapsed`).

export const VAULT_ATTEMPTS = 4;
export const VAULT_BACKOFF_MS = 500;
export const PROXY_READY_DEADLINE_MS = 30_000;
export const POLL_MS = 250;
/** How often a run waiting for its egress agent looks again. */
export const TUNNEL_POLL_MS = 1_000;
/** How long a run waits for its egress agent by default (egress_agent_wait_seconds). */
export const DEFAULT_EGRESS_AGENT_WAIT_SECONDS = 600;
export const MAX_FAULTS = 5;
/** How often a running (or halted) run checks that its proxy is still there. */
export const PROXY_CHECK_MS = 2_000;
/** How often a halted run looks for its resume. */
export const HALTED_POLL_MS = 1_000;
/** Longest wait between two attempts at a teardown that keeps failing. */
export const MAX_TEARDOWN_BACKOFF_MS = 60_000;
/** Output kept in the trace per run; the rest is counted, not stored. */
export const MAX_TRACE_OUTPUT = 256 * 1024;
/** Output rows kept in the trace per run (a chatty command polled often makes many small ones). */
export const MAX_OUTPUT_EVENTS = 2000;
/** A lingering proxy nobody looked at for this long is paused (default; see MachineOptions). */
export const LINGER_IDLE_MS = 10 * 60_000;

export type Final = { to: "finished" | "stopped" | "failed"; reason: string; detail?: string };

export interface Worker {
  sandboxId: string;
  kind: "work" | "task" | "orchestrator";
  taskIndex: number | null;
  name: string;
  commands: string[];
  proxyAddress: string | null;
  probeTarget: string | null;
  wiringExecId: string | null;
  env: Record<string, string> | null;
  cmdIndex: number;
  execId: string | null;
  stdoutFrom: number;
  stderrFrom: number;
  exitCode: number | null;
  done: boolean;
  /**
   * The routing and hosts file installed in this sandbox. A task sandbox made late (after
   * max_parallel_tasks others) takes the vault's routing at that moment; unset: the run's.
   */
  routing?: "default" | "catch-all";
  hostsFile?: string[];
  /** What the backend said the wiring program must do differently in this sandbox. */
  wiring?: SandboxInfo["wiring"];
  /**
   * A task environment asked for through the compute API (by the work or orchestrator sandbox's
   * capability): no commands of its own, the holder execs in it; done when the holder deletes it.
   */
  environment?: boolean;
  /** The task's sandbox is destroyed (a task's sandbox goes when the task is done). */
  destroyed?: boolean;
}

/** A lingering proxy: the window (from startedAt), the last time someone looked, and pauses. */
export interface Linger {
  seconds: number;
  startedAt: number;
  lastActivity: number;
  paused: boolean;
  pauses: number;
  /** How the run's commands ended (the run's final state and reason before lingering). */
  outcome: Final;
}

export interface MachineState {
  runId: string;
  state: RunState;
  /** Attempts in the current state (vault retries), and consecutive unexpected faults. */
  attempt: number;
  faults: number;
  enteredAt: number;
  cancel: boolean;
  /** Why: "cancelled" (the user) or "reaped" (the sweeper: stuck past its deadline). */
  cancelReason?: StopRequest;
  final: Final | null;
  spec: RunSpec | null;
  policy:
    | (Pick<PolicyDocument, "version" | "routing" | "enforce" | "hostsFile" | "note"> & {
        /** The declared model's lane (name and provider only), absent in state from before it. */
        model?: { name: string; provider: string } | null;
      })
    | null;
  /**
   * The egress tunnel, for a run that sends traffic through the user's machine: when the machine
   * began waiting for the agent, and whether it was ever there (checked once, before any command).
   */
  tunnel?: { waitingSince: number; ready: boolean };
  /** The router/proxy sandbox of the run, and whether the proxy process runs in it. */
  network: { sandboxId: string; created: boolean } | null;
  /**
   * The proxy process: `launches` counts exec attempts (each with its own exec id, checkpointed
   * before the call), `execId` is set once the backend confirmed the launch.
   */
  proxy: {
    launches: number;
    execId: string | null;
    caCertPem: string | null;
    unfiltered: boolean;
    /** The last liveness check while running, and how much of its output was read by then. */
    checkedAt?: number;
    outEnd?: number;
    errEnd?: number;
  } | null;
  workers: Worker[];
  /** Output kept in the trace so far: characters, and rows. */
  traceBytes: number;
  outputEvents?: number;
  /** Halted for review: the work and task sandboxes' processes are stopped. */
  halted?: boolean;
  /** Halts so far (keys the trace events of each halt and resume). */
  halts?: number;
  /** Set once the run lingers (its commands ended and it asked to keep its proxy). */
  linger?: Linger;
}

/** Who asked the run to stop early. */
export type StopRequest = "cancelled" | "reaped";

export interface MachineStorage {
  load(): Promise<MachineState | undefined>;
  save(state: MachineState): Promise<void>;
  setAlarm(atMs: number): Promise<void>;
  /**
   * The cancel request lives under its own key: a step in flight (between its load and its save)
   * would otherwise overwrite a cancel that arrived meanwhile.
   */
  requestCancel(reason: StopRequest): Promise<void>;
  cancelRequested(): Promise<StopRequest | null>;
  /** Halt for review, under its own key for the same reason as cancel. */
  requestHalt(halt: boolean): Promise<void>;
  haltRequested(): Promise<boolean>;
  /** A linger asked for after launch (seconds), under its own key for the same reason. */
  requestLinger(seconds: number): Promise<void>;
  lingerRequested(): Promise<number | null>;
}

export interface MachineOptions {
  /** Pause a lingering proxy nobody looked at for this long. */
  lingerIdleMs?: number;
}

/** Where a look at the run's proxy goes, or why there is none. */
export type WakeResult =
  | { ok: true; runId: string; sandboxId: string; resumed: boolean }
  | { ok: false; why: string };

export interface RunFacts {
  id: string;
  status: RunState;
  spec: RunSpec;
}

export type VaultRead = { ok: true; policy: PolicyDocument } | { ok: false; reason: string };

/** What the coordinator asks the broker to make for its run. */
export type SandboxRequest =
  | { id: string; kind: "proxy" }
  | {
      id: string;
      kind: "work" | "task" | "orchestrator";
      taskIndex: number | null;
      proxySandboxId: string;
      routing: "default" | "catch-all";
      /** default routing: the names the hosts file redirects (a backend may install them). */
      hostsFile: string[];
    };

/** A backend's answer to a create: the sandbox, or why not (retryable: worth another alarm). */
export type CreateResult =
  | { ok: true; info: SandboxInfo }
  | { ok: false; code: string; message: string; retryable: boolean };

export interface MachinePorts {
  now(): number;
  newId(prefix: string): string;
  loadRun(runId: string): Promise<RunFacts | null>;
  transition(runId: string, t: Transition): Promise<void>;
  note(runId: string, note: RunNote): Promise<void>;
  event(runId: string, key: string, kind: "output" | "proxy" | "note", detail: unknown): Promise<void>;
  setRunFields(
    runId: string,
    fields: {
      routing?: "default" | "catch-all";
      policyVersion?: number;
      proof?: unknown;
      lingerSeconds?: number;
      lingerUntil?: Date | null;
      lingerPausedAt?: Date | null;
    },
  ): Promise<void>;
  /** One line for the operator's log (JSON; ids and reasons, never a value). */
  log(event: Record<string, unknown>): void;
  /** Compiles the run's vault now and checks every secret its rules need decrypts (E1). */
  readVault(runId: string): Promise<VaultRead>;
  issueProxyCredentials(runId: string): Promise<{ proxyToken: string; auditKey: string }>;
  revokeProxyCredentials(runId: string): Promise<void>;
  /** The CA the proxy reported ready with, or null while it has not. */
  proxyReady(runId: string): Promise<{ caCertPem: string } | null>;
  broker: {
    create(runId: string, request: SandboxRequest): Promise<CreateResult>;
    exec(
      runId: string,
      sandboxId: string,
      request: {
        id: string;
        argv: string[];
        env: Record<string, string>;
        stage: "setup" | "execute";
        stdin?: string;
        timeoutMs: number | null;
      },
    ): Promise<ExecInfo>;
    kill(runId: string, sandboxId: string, execId: string): Promise<void>;
    freeze(runId: string, sandboxId: string, frozen: boolean): Promise<void>;
    poll(
      runId: string,
      sandboxId: string,
      execId: string,
      from: { stdoutFrom: number; stderrFrom: number },
    ): Promise<ExecInfo>;
    /** Every sandbox of the run; with keepProxy, all but the proxy sandbox (lingering). */
    destroyRun(runId: string, options?: { keepProxy: boolean }): Promise<void>;
    /** One sandbox of the run (a task that is done). Idempotent. */
    destroy(runId: string, sandboxId: string): Promise<void>;
  };
  /**
   * A fresh compute-control capability for a work or orchestrator sandbox (never a task
   * sandbox), handed to it in one exec's environment only: never kept in the coordinator's state.
   */
  issueCapability(runId: string, holderSandboxId: string): Promise<{ token: string }>;
  /** Every capability of the run (its end). Idempotent. */
  revokeCapabilities(runId: string): Promise<void>;
  /** Whether the run's proxy and the user's egress agent are paired in the relay now. */
  tunnelPaired(runId: string): Promise<boolean>;
  /** The run's commands are over: the relay closes both ends, the agent's token stops working. */
  endTunnel(runId: string): Promise<void>;
  /** The routing and hosts file the run's vault asks for now (no secret is read). */
  currentRouting(runId: string): Promise<Pick<PolicyDocument, "routing" | "hostsFile">>;
  /** Parses the wiring program's stdout; null when it is not a proof. */
  parseProof(stdout: string): WiringProof | null;
}

/**
 * The declared model's lane as the benchmark's code sees it: the proxy's fake base URL and a
 * placeholder key (never a credential), in the variables OpenAI-compatible SDKs read.
 */
function modelEnv(s: MachineState): Record<string, string> {
  const model = s.policy?.model;
  if (!model || !s.policy?.enforce || s.proxy?.unfiltered) return {};
  return {
    OPENAI_BASE_URL: MODEL_LANE_BASE_URL,
    OPENAI_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    BENCHWRIGHT_MODEL: model.name,
  };
}

/** Backend answers that mean "no isolated sandbox can be made here at all". */
const NO_SANDBOX_CODES = new Set(["cannot_isolate", "backend_not_configured"]);

/** Proxy listener ports inside the proxy sandbox (see the local-agent contract). */
// The catch-all resolver always listens: a task sandbox made after a vault edit may need
// catch-all routing even when the run started under default routing.
export const PROXY_ENV = {
  BW_LISTEN_HOST: "0.0.0.0",
  BW_TLS_PORT: "8443",
  BW_HTTP_PORT: "8080",
  BW_EXPLICIT_PORT: "3128",
  BW_DNS_PORT: "5353",
  BW_SPOOL_DIR: "/tmp/benchwright-spool",
};

/** Where a holder sandbox reaches the compute API: the platform host, through the run's proxy. */
export const COMPUTE_URL = "https://probe.benchwright.invalid/compute";
/** Task environments one run may ask for through the compute API, in all. */
export const MAX_ENVIRONMENTS = 64;

/** A task environment as the compute API shows it. */
export interface EnvironmentView {
  id: string;
  name: string;
  state: "preparing" | "ready" | "deleted";
}

export type EnvironmentAnswer =
  | { ok: true; environment: EnvironmentView }
  | { ok: false; code: "not_found" | "run_ended" | "conflict" | "limit"; why: string };

export class RunMachine {
  private readonly lingerIdleMs: number;

  constructor(
    private readonly storage: MachineStorage,
    private readonly ports: MachinePorts,
    options: MachineOptions = {},
  ) {
    this.lingerIdleMs = options.lingerIdleMs ?? LINGER_IDLE_MS;
  }

  /** Saves mid-step, before a side effect whose identity must survive a crash (ids). */
  private checkpoint(s: MachineState): Promise<void> {
    return this.storage.save(s);
  }

  /** Begins a run (idempotent: a second call for the same run only re-arms the alarm). */
  async start(runId: string): Promise<void> {
    const existing = await this.storage.load();
    if (!existing) {
      await this.storage.save(newState(runId, this.ports.now()));
    }
    await this.storage.setAlarm(this.ports.now());
  }

  async cancel(reason: StopRequest = "cancelled"): Promise<boolean> {
    const s = await this.storage.load();
    if (!s || isOver(s.state)) return false;
    await this.storage.requestCancel(reason);
    await this.storage.setAlarm(this.ports.now());
    return true;
  }

  /**
   * The sweeper's nudge for a run whose row has not moved for a while: a run whose coordinator
   * never got its start (the launch's call was lost) is started; a live one whose alarm is gone
   * is re-armed. Never stops anything. Returns what it did.
   */
  async ensure(runId: string, alarmPending: boolean): Promise<"started" | "rearmed" | "alive" | "over"> {
    const s = await this.storage.load();
    if (!s) {
      await this.start(runId);
      return "started";
    }
    if (isOver(s.state)) return "over";
    if (alarmPending) return "alive";
    await this.storage.setAlarm(this.ports.now());
    return "rearmed";
  }

  /**
   * Halts the run for review (its commands' processes stop; the proxy keeps running and picks up
   * policy edits) or resumes it. False when the run has ended.
   */
  async halt(halt: boolean): Promise<boolean> {
    const s = await this.storage.load();
    if (s && (isOver(s.state) || s.state === "finishing" || s.state === "lingering")) return false;
    // Kept even before the run has started: it halts when its commands are about to run.
    await this.storage.requestHalt(halt);
    if (s) await this.storage.setAlarm(this.ports.now());
    return true;
  }

  /**
   * Asks for (or changes) the linger window: `seconds` counted from when the commands end. False
   * once the run has ended. While lingering, a window that has already passed ends it now.
   */
  async linger(seconds: number): Promise<boolean> {
    const s = await this.storage.load();
    if (s && (isOver(s.state) || s.state === "finishing")) return false;
    await this.storage.requestLinger(seconds);
    if (s?.state === "lingering") await this.storage.setAlarm(this.ports.now());
    return true;
  }

  /**
   * Someone looks at the run's proxy (through the control plane): a paused lingering proxy is
   * resumed first, and its idle clock restarts. Answers which sandbox to talk to.
   */
  async wake(): Promise<WakeResult> {
    const s = await this.storage.load();
    if (!s || isOver(s.state) || s.state === "finishing")
      return { ok: false, why: `the run is ${s?.state ?? "unknown"}` };
    if (!this.proxyRuns(s)) return { ok: false, why: `no proxy runs for this run (it is ${s.state})` };
    const sandboxId = must(s.network).sandboxId;
    if (s.state !== "lingering" || !s.linger) return { ok: true, runId: s.runId, sandboxId, resumed: false };
    const resumed = s.linger.paused;
    if (resumed) {
      await this.ports.broker.freeze(s.runId, sandboxId, false);
      s.linger.paused = false;
      await this.ports.setRunFields(s.runId, { lingerPausedAt: null });
      await this.ports.event(s.runId, `linger:resume:${s.linger.pauses}`, "note", {
        text: "The lingering proxy was resumed: someone looked at it.",
        lingerPaused: false,
      });
    }
    s.linger.lastActivity = this.ports.now();
    await this.storage.save(s);
    await this.storage.setAlarm(this.lingerAlarm(s.linger));
    return { ok: true, runId: s.runId, sandboxId, resumed };
  }

  /** The proxy said it is ready: look now instead of at the next poll. */
  async poke(): Promise<void> {
    const s = await this.storage.load();
    if (s && !isOver(s.state)) await this.storage.setAlarm(this.ports.now());
  }

  async state(): Promise<MachineState | undefined> {
    return this.storage.load();
  }

  /** One step. Called by the alarm; schedules the next alarm itself unless the run is over. */
  async step(): Promise<void> {
    const s = await this.storage.load();
    if (!s || isOver(s.state)) return;
    if (!s.cancel) {
      const asked = await this.storage.cancelRequested();
      if (asked) {
        s.cancel = true;
        s.cancelReason = asked;
      }
    }
    let next: number | null;
    try {
      next = await this.advance(s);
      s.faults = 0;
    } catch (error) {
      // An unexpected fault (database away, broker unreachable): keep the state, retry with
      // backoff; after MAX_FAULTS in a row, tear down and fail rather than hang.
      s.faults += 1;
      const retryable = !(error instanceof BackendError) || error.retryable;
      if (s.state === "finishing") {
        // Teardown itself failing: it must still end, and the runtime gives up on an alarm after
        // a few retries, so retry without end (backoff capped). Past MAX_FAULTS, revoke the proxy
        // credentials now, not after the proxy sandbox is gone: a proxy that outlives a failed
        // teardown then gets no more policy (nor secrets), at the cost of its last audit flush.
        if (s.faults >= MAX_FAULTS) await this.ports.revokeProxyCredentials(s.runId).catch(() => {});
        next = this.ports.now() + Math.min(VAULT_BACKOFF_MS * 2 ** (s.faults - 1), MAX_TEARDOWN_BACKOFF_MS);
      } else if (s.faults >= MAX_FAULTS || !retryable) {
        const detail = error instanceof BackendError ? error.message : "internal error";
        if (s.state === "lingering") s.final = null; // not the commands' outcome: this failure
        this.finish(s, { to: "failed", reason: "internal_error", detail });
        next = this.ports.now();
      } else {
        next = this.ports.now() + VAULT_BACKOFF_MS * 2 ** (s.faults - 1);
      }
    }
    await this.storage.save(s);
    if (next !== null) await this.storage.setAlarm(next);
  }

  // ---- steps: each returns when to run the next one (null: done) ----

  private async advance(s: MachineState): Promise<number | null> {
    const now = this.ports.now();
    if (s.cancel && s.state !== "finishing" && !s.final) {
      this.finish(
        s,
        s.cancelReason === "reaped"
          ? {
              to: "stopped",
              reason: "reaped",
              detail: `Stopped by the sweeper: the run stayed in ${s.state} past its deadline.`,
            }
          : { to: "stopped", reason: "cancelled", detail: "Cancelled by the user." },
      );
    }
    switch (s.state) {
      case "queued":
        return this.enterQueued(s);
      case "fetching_vault":
        return this.fetchVault(s);
      case "starting_proxy":
        return this.startProxy(s);
      case "starting_sandboxes":
        return this.startSandboxes(s);
      case "wiring":
        return this.wire(s);
      case "running":
        return this.run(s);
      case "finishing":
        return this.tearDown(s);
      case "lingering":
        return this.lingerStep(s);
      default:
        return now;
    }
  }

  private async enterQueued(s: MachineState): Promise<number> {
    const run = await this.ports.loadRun(s.runId);
    if (!run) {
      s.state = "failed"; // no row: nothing to record it on
      return this.ports.now();
    }
    if (isOver(run.status)) {
      s.state = run.status; // ended before it started (cancelled): never start it now
      return this.ports.now();
    }
    s.spec = run.spec;
    await this.move(s, "fetching_vault", "started");
    return this.ports.now();
  }

  private async fetchVault(s: MachineState): Promise<number> {
    const read = await this.ports.readVault(s.runId);
    if (!read.ok) {
      s.attempt += 1;
      const text = `Vault read attempt ${s.attempt} of ${VAULT_ATTEMPTS} failed: ${read.reason}`;
      // The database may be the very thing that is away: the attempt counts even when its note
      // cannot be written, and the Worker's log has it either way.
      this.ports.log({
        event: "vault_read_failed",
        runId: s.runId,
        attempt: s.attempt,
        of: VAULT_ATTEMPTS,
        reason: read.reason,
      });
      await this.ports.event(s.runId, `vault:${s.attempt}`, "note", { text }).catch(() => {});
      if (s.attempt >= VAULT_ATTEMPTS) {
        await this.ports
          .note(s.runId, {
            level: "warning",
            code: "vault_unreadable",
            text: `The vault could not be read after ${VAULT_ATTEMPTS} tries (${read.reason}), so the run stopped before any sandbox was made and no benchmark code ran.`,
          })
          .catch(() => {});
        // The stop is recorded by the teardown, which retries until the database answers.
        return this.stop(
          s,
          "vault_unreadable",
          `The vault could not be read (${read.reason}); no benchmark code ran.`,
        );
      }
      return this.ports.now() + VAULT_BACKOFF_MS * 2 ** (s.attempt - 1);
    }
    // The Harbor bridge's orchestrator reaches the compute API through the run's proxy, so a
    // Harbor run always has one, even when the vault gives it nothing to enforce.
    const p =
      s.spec?.orchestrator === "harbor" && !read.policy.enforce
        ? { ...read.policy, enforce: true, note: null }
        : read.policy;
    s.policy = {
      version: p.version,
      routing: p.routing,
      enforce: p.enforce,
      hostsFile: p.hostsFile,
      note: p.note,
      model: p.model ? { name: p.model.name, provider: p.model.provider } : null,
    };
    await this.ports.setRunFields(s.runId, { routing: p.routing.mode, policyVersion: p.version });
    if (p.routing.mode === "catch-all") {
      await this.ports.note(s.runId, {
        level: "note",
        code: "catch_all_routing",
        text: `Every connection on ports 80 and 443 goes through the run's proxy and nothing else leaves (${p.routing.reasons.join(", ")}).`,
      });
    }
    if (!p.enforce) {
      await this.ports.note(s.runId, {
        level: "note",
        code: "no_proxy",
        text: p.note ?? "This run goes without a proxy.",
      });
    }
    await this.move(s, "starting_proxy", p.enforce ? "vault_read" : "nothing_to_enforce");
    return this.ports.now();
  }

  private async startProxy(s: MachineState): Promise<number> {
    const policy = must(s.policy);
    if (!s.network) {
      s.network = { sandboxId: this.ports.newId("sbx_"), created: false };
      await this.checkpoint(s);
    }
    if (!s.network.created) {
      const made = await this.ports.broker.create(s.runId, { id: s.network.sandboxId, kind: "proxy" });
      if (!made.ok) {
        if (made.retryable) throw new Error(made.message);
        if (NO_SANDBOX_CODES.has(made.code)) return this.cannotIsolate(s, made.code, made.message);
        return this.proxyFailed(s, new Error(made.message));
      }
      s.network.created = true;
    }
    if (!policy.enforce) {
      await this.move(s, "starting_sandboxes", "no_proxy_needed");
      return this.ports.now();
    }
    if (!s.proxy) {
      s.proxy = { launches: 0, execId: null, caCertPem: null, unfiltered: false };
    }
    if (s.proxy.execId === null) {
      // A launch that may have started before a crash holds credentials we are about to
      // replace: stop it first, then launch under a new exec id with fresh credentials.
      if (s.proxy.launches > 0) {
        await this.ports.broker.kill(s.runId, s.network.sandboxId, `proxy-${s.proxy.launches}`);
      }
      s.proxy.launches += 1;
      await this.checkpoint(s);
      const { proxyToken, auditKey } = await this.ports.issueProxyCredentials(s.runId);
      const info = await this.ports.broker.exec(s.runId, s.network.sandboxId, {
        id: `proxy-${s.proxy.launches}`,
        argv: ["bw-proxy"],
        env: {
          ...PROXY_ENV,
          BW_RUN_ID: s.runId,
          BW_PROXY_TOKEN: proxyToken,
          BW_AUDIT_KEY: auditKey,
        },
        stage: "setup",
        timeoutMs: null,
      });
      s.proxy.execId = info.execId;
      return this.ports.now() + POLL_MS;
    }
    const ready = await this.ports.proxyReady(s.runId);
    if (ready) {
      s.proxy.caCertPem = ready.caCertPem;
      await this.move(s, "starting_sandboxes", "proxy_ready");
      return this.ports.now();
    }
    const exec = await this.ports.broker.poll(s.runId, s.network.sandboxId, s.proxy.execId, {
      stdoutFrom: 0,
      stderrFrom: 0,
    });
    if (exec.state === "exited") {
      const last = lastLine(exec.stderr) || lastLine(exec.stdout) || `exit code ${exec.exitCode}`;
      return this.proxyFailed(s, new Error(`the proxy exited during setup: ${last}`));
    }
    if (this.ports.now() - s.enteredAt > PROXY_READY_DEADLINE_MS) {
      return this.proxyFailed(
        s,
        new Error(`the proxy did not report ready within ${PROXY_READY_DEADLINE_MS / 1000} s`),
      );
    }
    return this.ports.now() + POLL_MS;
  }

  /**
   * The proxy is the run's only way out and the keeper of its credentials: if it dies mid-run
   * (crash, OOM kill, a kill from outside), nothing the commands do reaches an upstream, and a
   * run that went on would fail in ways nobody could read. Stop it, tear everything down, and
   * say why. Checked every PROXY_CHECK_MS through the broker (every backend reports its execs);
   * only the output since the last check is read. Null while the proxy runs.
   */
  private async checkProxy(s: MachineState): Promise<number | null> {
    const p = s.proxy;
    if (!p || p.unfiltered || p.execId === null || !s.network) return null;
    const now = this.ports.now();
    if (p.checkedAt !== undefined && now - p.checkedAt < PROXY_CHECK_MS) return null;
    p.checkedAt = now;
    const exec = await this.ports.broker.poll(s.runId, s.network.sandboxId, p.execId, {
      stdoutFrom: p.outEnd ?? 0,
      stderrFrom: p.errEnd ?? 0,
    });
    p.outEnd = exec.stdoutEnd;
    p.errEnd = exec.stderrEnd;
    if (exec.state === "running") return null;
    const how = exec.signal ? `killed by ${exec.signal}` : `exit code ${exec.exitCode}`;
    const last = lastLine(exec.stderr) || lastLine(exec.stdout);
    const why = `the proxy stopped mid-run (${how}${last ? `: ${last}` : ""})`;
    await this.ports.note(s.runId, {
      level: "warning",
      code: "proxy_lost",
      text: `The run's proxy stopped while the run was going (${how}). Nothing could leave through it from then on, so the run was stopped: its commands were ended and its sandboxes removed.`,
    });
    return this.stop(s, "proxy_lost", `${why}; the commands were ended and the sandboxes removed`);
  }

  private async proxyFailed(s: MachineState, error: unknown): Promise<number> {
    const why = error instanceof Error ? error.message : String(error);
    const policy = must(s.policy);
    const mayContinue =
      s.spec?.on_proxy_failure === "continue" &&
      policy.routing.mode === "default" &&
      s.network?.created === true;
    if (mayContinue) {
      // A proxy that failed its setup may still run, holding the run's credentials and a copy of
      // the vault: stop it and revoke them, so no boundary that is not enforced keeps them.
      const network = must(s.network);
      if (s.proxy && s.proxy.launches > 0) {
        await this.ports.broker.kill(s.runId, network.sandboxId, `proxy-${s.proxy.launches}`);
      }
      await this.ports.revokeProxyCredentials(s.runId);
      await this.ports.note(s.runId, {
        level: "warning",
        code: "proxy_failed_unfiltered",
        text: `The proxy could not be set up (${why}). The run was launched with on_proxy_failure "continue", so it goes on and its traffic leaves UNFILTERED: no credential is injected and no host is blocked.`,
      });
      s.proxy = {
        launches: s.proxy?.launches ?? 0,
        execId: s.proxy?.execId ?? null,
        caCertPem: null,
        unfiltered: true,
      };
      await this.move(s, "starting_sandboxes", "proxy_failed_continue");
      return this.ports.now();
    }
    await this.ports.note(s.runId, {
      level: "warning",
      code: "proxy_failed",
      text: `The proxy could not be set up (${why}), so the run stopped before any benchmark code ran.`,
    });
    return this.stop(s, "proxy_setup_failed", why);
  }

  /** The backend cannot make an isolated sandbox here: never run unisolated. */
  private async cannotIsolate(s: MachineState, code: string, why: string): Promise<number> {
    await this.ports.note(s.runId, {
      level: "warning",
      code,
      text: `No isolated sandbox can be made (${why}), so the run stopped before any benchmark code ran.`,
    });
    return this.stop(s, code, why);
  }

  private async startSandboxes(s: MachineState): Promise<number> {
    const spec = must(s.spec);
    if (s.workers.length === 0) {
      s.workers = [
        spec.orchestrator === "harbor"
          ? worker(this.ports.newId("sbx_"), "orchestrator", null, "orchestrator", [...commandsOf(spec)])
          : worker(this.ports.newId("sbx_"), "work", null, "work", [...commandsOf(spec)]),
        ...(spec.tasks ?? []).map((t, i) => worker(this.ports.newId("sbx_"), "task", i, t.name, t.commands)),
      ];
      await this.checkpoint(s);
    }
    // The work sandbox and the first max_parallel_tasks tasks now; the rest when a slot frees.
    for (const w of s.workers.slice(0, 1 + this.parallelTasks(s))) {
      const stopped = await this.createSandbox(s, w);
      if (stopped !== null) return stopped;
    }
    await this.move(s, "wiring", "sandboxes_ready");
    return this.ports.now();
  }

  private parallelTasks(s: MachineState): number {
    const tasks = s.workers.length - 1;
    return Math.min(tasks, s.spec?.max_parallel_tasks ?? tasks);
  }

  /** Makes a worker's sandbox (idempotent by its id). Null when made; else the stop's next step. */
  private async createSandbox(s: MachineState, w: Worker): Promise<number | null> {
    if (w.proxyAddress !== null) return null;
    const policy = must(s.policy);
    const made = await this.ports.broker.create(s.runId, {
      id: w.sandboxId,
      kind: w.kind,
      taskIndex: w.taskIndex,
      proxySandboxId: must(s.network).sandboxId,
      routing: w.routing ?? policy.routing.mode,
      hostsFile: (w.routing ?? policy.routing.mode) === "default" ? (w.hostsFile ?? policy.hostsFile) : [],
    });
    if (made.ok) {
      w.proxyAddress = made.info.proxyAddress ?? "";
      w.probeTarget = made.info.probeTarget ?? null;
      if (made.info.wiring) w.wiring = made.info.wiring;
      return null;
    }
    if (made.retryable) throw new Error(made.message);
    const why = made.message;
    if (NO_SANDBOX_CODES.has(made.code)) return this.cannotIsolate(s, made.code, why);
    if ((w.routing ?? policy.routing.mode) === "catch-all") {
      await this.ports.note(s.runId, {
        level: "warning",
        code: "redirect_not_installed",
        text: `The catch-all redirect could not be installed in ${w.name} (${why}), so the run stopped before its benchmark code ran there.`,
      });
      return this.stop(s, "redirect_not_installed", why);
    }
    return this.stop(s, "sandbox_failed", why);
  }

  private async wire(s: MachineState): Promise<number> {
    const policy = must(s.policy);
    if (!policy.enforce || s.proxy?.unfiltered) {
      // Nothing to wire: no proxy runs. The run proof says so.
      for (const w of s.workers) if (w.proxyAddress !== null) w.env = {};
      await this.ports.setRunFields(s.runId, {
        proof: { enforced: false, reason: policy.enforce ? "proxy_failed_unfiltered" : "nothing_to_enforce" },
      });
      await this.move(s, "running", "no_wiring_needed");
      return this.ports.now();
    }
    let pending = false;
    for (const w of s.workers) {
      if (w.proxyAddress === null) continue; // a task whose turn has not come
      const wired = await this.wireSandbox(s, w);
      if (typeof wired === "number") return wired;
      if (wired === "pending") pending = true;
    }
    if (pending) return this.ports.now() + POLL_MS;
    await this.ports.setRunFields(s.runId, {
      proof: {
        enforced: true,
        routing: policy.routing.mode,
        sandboxes: s.workers.filter((w) => w.env !== null).map((w) => w.sandboxId),
      },
    });
    await this.move(s, "running", "boundary_proved");
    return this.ports.now();
  }

  /**
   * Runs the wiring program in a worker's sandbox and checks its proof. "done" once proved (the
   * worker's env is set), "pending" while it runs; a number is the stop's next step.
   */
  private async wireSandbox(s: MachineState, w: Worker): Promise<"done" | "pending" | number> {
    if (w.env !== null) return "done";
    const policy = must(s.policy);
    const ca = s.proxy?.caCertPem ?? null;
    if (ca === null) {
      // A proxy that should enforce but gave no CA: never run as if unenforced (fail closed).
      return this.stop(s, "internal_error", "the run's proxy CA is missing, so no benchmark code ran");
    }
    const mode = w.routing ?? policy.routing.mode;
    if (w.wiringExecId === null) {
      const info = await this.ports.broker.exec(s.runId, w.sandboxId, {
        id: "wiring",
        argv: ["bw-wiring"],
        env: {},
        stage: "setup",
        stdin: JSON.stringify({
          mode,
          caCertPem: ca,
          proxyAddress: w.proxyAddress,
          hostsFile: w.hostsFile ?? policy.hostsFile,
          probe: { directTarget: mode === "catch-all" ? w.probeTarget : null },
          ...w.wiring,
        }),
        timeoutMs: 60_000,
      });
      w.wiringExecId = info.execId;
      return "pending";
    }
    const exec = await this.ports.broker.poll(s.runId, w.sandboxId, w.wiringExecId, {
      stdoutFrom: 0,
      stderrFrom: 0,
    });
    if (exec.state === "running") return "pending";
    const proof = this.ports.parseProof(exec.stdout);
    await this.ports.event(s.runId, `wiring:${w.sandboxId}`, "proxy", {
      sandbox: w.sandboxId,
      name: w.name,
      routing: mode,
      proof: proof ?? { ok: false, error: lastLine(exec.stderr) || `exit code ${exec.exitCode}` },
    });
    if (!proof?.ok || exec.exitCode !== 0) {
      const why = proof
        ? `probe failed: ${proof.probes
            .filter((p) => !p.ok)
            .map((p) => `${p.name} (${p.observed})`)
            .join(", ")}`
        : `the wiring program failed: ${lastLine(exec.stderr) || `exit code ${exec.exitCode}`}`;
      await this.ports.note(s.runId, {
        level: "warning",
        code: "redirect_not_installed",
        text: `The redirect to the proxy could not be installed or proved in ${w.name} (${why}), so the run stopped before its benchmark code ran there.`,
      });
      await this.ports.setRunFields(s.runId, { proof: { enforced: false, sandbox: w.sandboxId, proof } });
      return this.stop(s, "redirect_not_installed", why);
    }
    w.env = proof.env;
    return "done";
  }

  /**
   * A task whose turn came while the run is running: its sandbox is made with the routing the
   * vault asks for now (an edit made since the run started applies to it), then wired.
   */
  private async prepareLateTask(s: MachineState, w: Worker): Promise<"done" | "pending" | number> {
    if (w.proxyAddress === null) {
      if (this.proxyRuns(s) && w.routing === undefined) {
        const now = await this.ports.currentRouting(s.runId);
        w.routing = now.routing.mode;
        w.hostsFile = now.hostsFile;
        await this.checkpoint(s);
      }
      const stopped = await this.createSandbox(s, w);
      if (stopped !== null) return stopped;
      if (!this.proxyRuns(s)) w.env = {}; // like its siblings: no proxy, nothing to wire
      return "pending";
    }
    return this.wireSandbox(s, w);
  }

  private async run(s: MachineState): Promise<number> {
    const wantHalt = await this.storage.haltRequested();
    if (wantHalt !== (s.halted ?? false)) return this.applyHalt(s, wantHalt);
    const lost = await this.checkProxy(s);
    if (lost !== null) return lost;
    if (s.halted) return this.ports.now() + HALTED_POLL_MS;
    const waiting = await this.awaitTunnel(s);
    if (waiting !== null) return waiting;
    let pending = false;
    let slots =
      this.parallelTasks(s) -
      s.workers.filter((w) => w.kind === "task" && !w.environment && w.proxyAddress !== null && !w.done)
        .length;
    for (const w of s.workers) {
      if (w.done) continue;
      if (w.environment) {
        // Made and wired in its turn like a late task; the holder execs in it once ready.
        if (w.env !== null) continue;
        const ready = await this.prepareLateTask(s, w);
        if (typeof ready === "number") return ready;
        pending = true;
        continue;
      }
      if (w.proxyAddress === null || w.env === null) {
        if (w.proxyAddress === null) {
          if (slots <= 0) {
            pending = true;
            continue;
          }
          slots -= 1;
        }
        const ready = await this.prepareLateTask(s, w);
        if (typeof ready === "number") return ready;
        pending = true;
        continue;
      }
      if (w.execId === null) {
        const command = w.commands[w.cmdIndex];
        if (command === undefined) {
          await this.done(s, w);
          continue;
        }
        const info = await this.ports.broker.exec(s.runId, w.sandboxId, {
          id: `cmd-${w.cmdIndex}`,
          argv: ["sh", "-c", command],
          env: { ...w.env, ...modelEnv(s), ...(await this.computeEnv(s, w)) },
          stage: "execute",
          timeoutMs: 600_000,
        });
        w.execId = info.execId;
        w.stdoutFrom = 0;
        w.stderrFrom = 0;
        pending = true;
        continue;
      }
      const exec = await this.ports.broker.poll(s.runId, w.sandboxId, w.execId, {
        stdoutFrom: w.stdoutFrom,
        stderrFrom: w.stderrFrom,
      });
      await this.recordOutput(s, w, exec);
      if (exec.state === "running") {
        pending = true;
        continue;
      }
      await this.ports.event(s.runId, `exit:${w.sandboxId}:${w.cmdIndex}`, "output", {
        sandbox: w.sandboxId,
        name: w.name,
        command: w.cmdIndex,
        exitCode: exec.exitCode,
        signal: exec.signal,
      });
      w.execId = null;
      if (exec.exitCode !== 0) {
        w.exitCode = exec.exitCode ?? -1;
        await this.done(s, w);
        continue;
      }
      w.cmdIndex += 1;
      if (w.cmdIndex >= w.commands.length) {
        w.exitCode = 0;
        await this.done(s, w);
      } else {
        pending = true;
      }
    }
    if (pending) return this.ports.now() + POLL_MS;
    const failed = s.workers.filter((w) => !w.environment && w.exitCode !== 0);
    this.finish(
      s,
      failed.length === 0
        ? { to: "finished", reason: "completed", detail: "Every command exited 0." }
        : {
            to: "finished",
            reason: "command_failed",
            detail: failed.map((w) => `${w.name}: command ${w.cmdIndex + 1} exited ${w.exitCode}`).join("; "),
          },
    );
    return this.ports.now();
  }

  /**
   * A run that egresses through the user's machine starts its commands only once the user's
   * egress agent is there (paired with the proxy in the relay): otherwise its first requests
   * would be refused for no reason the user could see. Null when the commands may go on; else
   * when to look again, or the stop's next step once the wait is over.
   */
  private async awaitTunnel(s: MachineState): Promise<number | null> {
    const policy = must(s.policy);
    const needs = policy.enforce && !s.proxy?.unfiltered && usesTunnel(policy.routing);
    if (!needs || s.tunnel?.ready) return null;
    const now = this.ports.now();
    if (!s.tunnel) {
      s.tunnel = { waitingSince: now, ready: false };
      await this.ports.note(s.runId, {
        level: "note",
        code: "egress_agent_awaited",
        text: "This run egresses through your machine: its commands start once your egress agent is connected (the launch answer, or POST /v1/runs/{id}/egress-agent-token, gives the command to run).",
      });
    }
    if (await this.ports.tunnelPaired(s.runId)) {
      s.tunnel.ready = true;
      await this.ports.event(s.runId, "tunnel:ready", "note", {
        text: "The egress agent connected; the commands start.",
        waitedMs: now - s.tunnel.waitingSince,
      });
      return null;
    }
    const waitMs = (s.spec?.egress_agent_wait_seconds ?? DEFAULT_EGRESS_AGENT_WAIT_SECONDS) * 1000;
    if (now - s.tunnel.waitingSince >= waitMs) {
      await this.ports.note(s.runId, {
        level: "warning",
        code: "egress_agent_absent",
        text: `The egress agent did not connect within ${waitMs / 1000} s, so the run stopped before any benchmark code ran (its traffic is never sent direct instead).`,
      });
      return this.stop(s, "egress_agent_absent", "the egress agent never connected; no benchmark code ran");
    }
    return now + TUNNEL_POLL_MS;
  }

  /** A worker whose commands ended; a task's sandbox goes with its task (the rest at the run's end). */
  private async done(s: MachineState, w: Worker): Promise<void> {
    w.done = true;
    if (w.kind === "task" && !w.destroyed) {
      await this.checkpoint(s); // done before destroyed: a replay never runs its commands again
      await this.ports.broker.destroy(s.runId, w.sandboxId);
      w.destroyed = true;
    }
  }

  /**
   * The compute API's address and a fresh capability, for a command of the work or orchestrator
   * sandbox while the run's proxy (the lane's way out) runs. Task sandboxes get nothing.
   */
  private async computeEnv(s: MachineState, w: Worker): Promise<Record<string, string>> {
    if (w.kind === "task" || !this.proxyRuns(s)) return {};
    const { token } = await this.ports.issueCapability(s.runId, w.sandboxId);
    return { BW_COMPUTE_URL: COMPUTE_URL, BW_COMPUTE_TOKEN: token };
  }

  /** Asks for a task environment named `name` (made and wired at the next steps). */
  async addEnvironment(name: string): Promise<EnvironmentAnswer> {
    const s = await this.storage.load();
    if (s?.state !== "running" || s.final) {
      return { ok: false, code: "run_ended", why: "the run is not running" };
    }
    if (!this.proxyRuns(s)) return { ok: false, code: "run_ended", why: "the run has no proxy" };
    if (s.workers.some((w) => w.name === name)) {
      return { ok: false, code: "conflict", why: `the run already has a sandbox named ${name}` };
    }
    if (s.workers.filter((w) => w.environment).length >= MAX_ENVIRONMENTS) {
      return { ok: false, code: "limit", why: `a run may ask for at most ${MAX_ENVIRONMENTS} environments` };
    }
    const w = worker(this.ports.newId("sbx_"), "task", null, name, []);
    w.environment = true;
    s.workers.push(w);
    await this.checkpoint(s);
    await this.storage.setAlarm(this.ports.now());
    return { ok: true, environment: environmentView(w) };
  }

  /** A task environment of the run and its exec environment (null env while not ready). */
  async environment(
    id: string,
  ): Promise<{ view: EnvironmentView; env: Record<string, string> | null } | null> {
    const s = await this.storage.load();
    const w = s?.workers.find((x) => x.environment && x.sandboxId === id);
    if (!s || !w) return null;
    // Halted for review: nothing new starts in any of the run's sandboxes until it resumes.
    const live = s.state === "running" && !w.done && !s.halted;
    return { view: environmentView(w), env: live ? w.env : null };
  }

  /** Deletes a task environment: its sandbox is destroyed now. Idempotent. */
  async removeEnvironment(id: string): Promise<EnvironmentAnswer> {
    const s = await this.storage.load();
    const w = s?.workers.find((x) => x.environment && x.sandboxId === id);
    if (!s || !w) return { ok: false, code: "not_found", why: `no environment ${id}` };
    if (!w.done) {
      w.done = true;
      w.exitCode = 0;
    }
    if (!w.destroyed && w.proxyAddress !== null) await this.done(s, w);
    w.destroyed = true;
    await this.checkpoint(s);
    return { ok: true, environment: environmentView(w) };
  }

  /** Stops or continues every unfinished work and task sandbox, and says so in the trace. */
  private async applyHalt(s: MachineState, halt: boolean): Promise<number> {
    const cycle = halt ? (s.halts ?? 0) + 1 : (s.halts ?? 0);
    for (const w of s.workers) {
      if (!w.done && w.proxyAddress !== null) await this.ports.broker.freeze(s.runId, w.sandboxId, halt);
    }
    if (halt) {
      s.halts = cycle;
      await this.ports.event(s.runId, `halt:${cycle}`, "note", {
        text: "Halted for review: the run's commands are stopped; the proxy keeps running and picks up host policy edits within seconds.",
        halted: true,
      });
    } else {
      await this.retrofitCheck(s);
      await this.ports.event(s.runId, `resume:${cycle}`, "note", { text: "Resumed.", halted: false });
    }
    s.halted = halt;
    return this.ports.now();
  }

  /**
   * Routing is installed when a sandbox is made; an edit that needs catch-all (a block default,
   * a wildcard block, ...) cannot be put onto sandboxes that run under default routing. Say so.
   */
  private async retrofitCheck(s: MachineState): Promise<void> {
    const installed = s.policy?.routing.mode;
    if (installed !== "default") return;
    const now = (await this.ports.currentRouting(s.runId)).routing;
    if (now.mode !== "catch-all") return;
    const later = s.workers.some((w) => w.proxyAddress === null)
      ? " Task sandboxes made from now on (tasks still waiting for their turn) get catch-all routing."
      : "";
    await this.ports.note(s.runId, {
      level: "warning",
      code: "routing_change_not_retrofitted",
      text: `The vault now needs catch-all routing (${now.reasons.join(", ")}), which cannot be installed on this run's running sandboxes: they keep default routing, so only the hosts in their hosts file go through the proxy. Relaunch the run to get catch-all routing.${later}`,
    });
  }

  private async recordOutput(s: MachineState, w: Worker, exec: ExecInfo): Promise<void> {
    for (const [stream, text, end] of [
      ["stdout", exec.stdout, exec.stdoutEnd],
      ["stderr", exec.stderr, exec.stderrEnd],
    ] as const) {
      if (text.length === 0) continue;
      const room = MAX_TRACE_OUTPUT - s.traceBytes;
      if (room > 0 && (s.outputEvents ?? 0) < MAX_OUTPUT_EVENTS) {
        const kept = text.slice(0, room);
        s.traceBytes += kept.length;
        s.outputEvents = (s.outputEvents ?? 0) + 1;
        await this.ports.event(s.runId, `out:${w.sandboxId}:${w.cmdIndex}:${stream}:${end}`, "output", {
          sandbox: w.sandboxId,
          name: w.name,
          command: w.cmdIndex,
          stream,
          text: kept,
          truncated: kept.length < text.length,
        });
      }
      if (stream === "stdout") w.stdoutFrom = end;
      else w.stderrFrom = end;
    }
  }

  private async tearDown(s: MachineState): Promise<number | null> {
    const final = s.final ?? {
      to: "failed" as const,
      reason: "internal_error",
      detail: "ended without a reason",
    };
    await this.ports.transition(s.runId, { to: "finishing", reason: final.reason, detail: final.detail });
    const seconds = s.linger ? 0 : ((await this.storage.lingerRequested()) ?? s.spec?.linger_seconds ?? 0);
    if (seconds > 0 && final.to === "finished" && this.proxyRuns(s))
      return this.startLinger(s, final, seconds);
    await this.ports.revokeCapabilities(s.runId);
    await this.ports.endTunnel(s.runId);
    await this.ports.broker.destroyRun(s.runId);
    await this.ports.revokeProxyCredentials(s.runId);
    await this.ports.transition(s.runId, { to: final.to, reason: final.reason, detail: final.detail });
    s.state = final.to;
    return null;
  }

  /**
   * The commands ended and the run asked to linger: everything but the proxy sandbox goes now;
   * the proxy keeps its credentials (they are revoked when the linger ends).
   */
  private async startLinger(s: MachineState, outcome: Final, seconds: number): Promise<number> {
    await this.ports.revokeCapabilities(s.runId);
    await this.ports.endTunnel(s.runId);
    await this.ports.broker.destroyRun(s.runId, { keepProxy: true });
    const now = this.ports.now();
    s.linger = { seconds, startedAt: now, lastActivity: now, paused: false, pauses: 0, outcome };
    await this.ports.setRunFields(s.runId, {
      lingerSeconds: seconds,
      lingerUntil: new Date(now + seconds * 1000),
      lingerPausedAt: null,
    });
    await this.move(s, "lingering", outcome.reason, outcome.detail);
    return this.lingerAlarm(s.linger);
  }

  /** A lingering run: a changed window, a cancel, the window's end, or idleness (pause). */
  private async lingerStep(s: MachineState): Promise<number> {
    const linger = must(s.linger);
    const asked = await this.storage.lingerRequested();
    if (asked !== null && asked !== linger.seconds) {
      linger.seconds = asked;
      await this.ports.setRunFields(s.runId, {
        lingerSeconds: asked,
        lingerUntil: new Date(linger.startedAt + asked * 1000),
      });
    }
    const now = this.ports.now();
    const ended =
      `The run's commands had ended (${linger.outcome.reason}): ${linger.outcome.detail ?? ""}`.trim();
    if (s.cancel) {
      return this.endLinger(
        s,
        s.cancelReason === "reaped"
          ? { reason: "linger_lapsed", detail: `The linger window lapsed and the sweeper ended it. ${ended}` }
          : { reason: "cancelled", detail: `The user ended the linger. ${ended}` },
      );
    }
    if (now >= lingerUntil(linger)) {
      return this.endLinger(s, {
        reason: "linger_lapsed",
        detail: `The proxy's linger window (${linger.seconds} s) lapsed. ${ended}`,
      });
    }
    if (!linger.paused && now >= linger.lastActivity + this.lingerIdleMs) {
      await this.ports.broker.freeze(s.runId, must(s.network).sandboxId, true);
      linger.paused = true;
      linger.pauses += 1;
      await this.ports.setRunFields(s.runId, { lingerPausedAt: new Date(now) });
      await this.ports.event(s.runId, `linger:pause:${linger.pauses}`, "note", {
        text: `The lingering proxy was paused: nobody looked at it for ${Math.round(this.lingerIdleMs / 1000)} s. The next look resumes it.`,
        lingerPaused: true,
      });
    }
    return this.lingerAlarm(linger);
  }

  /** The linger ends: the run ends as its commands did (finished), with the linger's reason. */
  private endLinger(s: MachineState, why: { reason: string; detail: string }): number {
    // Replaces the commands' outcome as the run's end (finish keeps a final already set).
    s.final = { to: must(s.linger).outcome.to, reason: why.reason, detail: why.detail };
    this.finish(s, s.final);
    return this.ports.now();
  }

  /** When a lingering run next needs a step: its window's end, or its pause when awake. */
  private lingerAlarm(linger: Linger): number {
    const until = lingerUntil(linger);
    return linger.paused ? until : Math.min(until, linger.lastActivity + this.lingerIdleMs);
  }

  private proxyRuns(s: MachineState): boolean {
    return Boolean(s.policy?.enforce && s.network?.created && s.proxy?.execId && !s.proxy.unfiltered);
  }

  // ---- helpers ----

  private finish(s: MachineState, final: Final): void {
    s.final ??= final;
    if (s.state !== "finishing") {
      s.state = "finishing";
      s.attempt = 0;
      s.enteredAt = this.ports.now();
    }
  }

  private async stop(s: MachineState, reason: string, detail: string): Promise<number> {
    this.finish(s, { to: "stopped", reason, detail });
    return this.ports.now();
  }

  private async move(s: MachineState, to: RunState, reason: string, detail?: string): Promise<void> {
    await this.ports.transition(s.runId, { to, reason, ...(detail === undefined ? {} : { detail }) });
    s.state = to;
    s.attempt = 0;
    s.enteredAt = this.ports.now();
  }
}

function newState(runId: string, now: number): MachineState {
  return {
    runId,
    state: "queued",
    attempt: 0,
    faults: 0,
    enteredAt: now,
    cancel: false,
    final: null,
    spec: null,
    policy: null,
    network: null,
    proxy: null,
    workers: [],
    traceBytes: 0,
  };
}

function environmentView(w: Worker): EnvironmentView {
  return {
    id: w.sandboxId,
    name: w.name,
    state: w.destroyed || w.done ? "deleted" : w.env !== null ? "ready" : "preparing",
  };
}

function worker(
  sandboxId: string,
  kind: "work" | "task" | "orchestrator",
  taskIndex: number | null,
  name: string,
  commands: string[],
): Worker {
  return {
    sandboxId,
    kind,
    taskIndex,
    name,
    commands,
    proxyAddress: null,
    probeTarget: null,
    wiringExecId: null,
    env: null,
    cmdIndex: 0,
    execId: null,
    stdoutFrom: 0,
    stderrFrom: 0,
    exitCode: null,
    done: false,
  };
}

const lingerUntil = (l: Linger) => l.startedAt + l.seconds * 1000;

const isOver = (state: RunState) => state === "finished" || state === "stopped" || state === "failed";

function must<T>(value: T | null | undefined): T {
  if (value === null || value === undefined) throw new Error("coordinator state is missing a field");
  return value;
}

function lastLine(text: string): string {
  return text.trim().split("\n").at(-1)?.slice(0, 300) ?? "";
}
