import type { UnpackResult } from "@benchwright/shared/contract/bundle";
import type {
  ExecInfo,
  Resources,
  SandboxInfo,
  Seal,
  SealResult,
} from "@benchwright/shared/contract/local-agent";
import type { PolicyDocument, RoutingMode } from "@benchwright/shared/contract/policy";
import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import { isTerminal, type TerminalState } from "@benchwright/shared/contract/run-states";
import type { WiringProof } from "@benchwright/shared/contract/wiring";
import { BackendError } from "../broker/backend";
import type { RunState } from "../db/schema";
import type { RunNote, Transition } from "../runs/types";
import { run } from "./steps/commands";
import { finish, type Machine } from "./steps/common";
import * as environments from "./steps/environments";
import { LINGER_IDLE_MS, lingerStep, wake } from "./steps/linger";
import { startProxy } from "./steps/proxy";
import { startSandboxes } from "./steps/sandboxes";
import { tearDown } from "./steps/teardown";
import { enterQueued, fetchVault, VAULT_BACKOFF_MS } from "./steps/vault";
import { wire } from "./steps/wiring";

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
//
// Once wired, each work, task and orchestrator sandbox goes through its own stages while the run
// is `running`: bundle → setup → seal → rewire → commands → collect (steps/stages.ts). A failed
// setup command stops the run (`setup_failed`) before any command; a sandbox killed at its
// resource limits stops it too (`resource_exhausted`).
//
// This file holds the state's types, the public class and the dispatch; each phase's steps are
// in steps/ (vault, proxy, sandboxes, wiring, stages, commands, hosts, halt, tunnel, teardown,
// linger, environments), functions over the same state and ports.

export { COMPUTE_URL, HALTED_POLL_MS } from "./steps/commands";
export { POLL_MS } from "./steps/common";
export { MAX_ENVIRONMENTS } from "./steps/environments";
export { HOSTS_CHECK_MS } from "./steps/hosts";
export { LINGER_IDLE_MS } from "./steps/linger";
export { MAX_OUTPUT_EVENTS, MAX_TRACE_OUTPUT, OUT_ENV } from "./steps/output";
export { PROXY_CHECK_MS, PROXY_ENV, PROXY_READY_DEADLINE_MS } from "./steps/proxy";
export { SETUP_TIMEOUT_MS, WORK_DIR } from "./steps/stages";
export { DEFAULT_EGRESS_AGENT_WAIT_SECONDS, TUNNEL_POLL_MS } from "./steps/tunnel";
export { VAULT_ATTEMPTS, VAULT_BACKOFF_MS } from "./steps/vault";

export const MAX_FAULTS = 5;
/** Longest wait between two attempts at a teardown that keeps failing. */
export const MAX_TEARDOWN_BACKOFF_MS = 60_000;

export type Final = { to: TerminalState; reason: string; detail?: string };

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
   * maxParallelTasks others) takes the vault's routing at that moment; unset: the run's.
   */
  routing?: RoutingMode;
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
  /** Setup commands (the run's, then the task's), run in the setup stage before `commands`. */
  setup?: string[];
  /**
   * Where the worker is once its wiring is proved (steps/stages.ts): bundle → setup → seal →
   * rewire → execute (its commands) → collect. Unset in state from before the setup stage, and
   * for an environment: its commands' stage.
   */
  stage?: WorkerStage;
  setupIndex?: number;
  setupExecId?: string | null;
  /** The re-proof after seal (bw-wiring in the execute stage, installed: true). */
  rewireExecId?: string | null;
  /** Something ran in the sandbox (a setup command or a command): its $BW_OUT is collected. */
  ran?: boolean;
  collected?: boolean;
  /** The backend said it cannot rewrite this sandbox's hosts file mid-run (not_supported). */
  hostsFixed?: boolean;
}

export type WorkerStage = "bundle" | "setup" | "seal" | "rewire" | "execute" | "collect";

/**
 * The coordinator's own record of a lingering proxy (the API's view is Linger, runs/service.ts):
 * the window (from startedAt), the last time someone looked, and pauses.
 */
export interface LingerWindow {
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
  linger?: LingerWindow;
  /** Vault edits put onto running sandboxes' hosts files (steps/hosts.ts): the last look, edits so far. */
  hostsCheckedAt?: number;
  hostsEdits?: number;
  /** The run says the vault needs catch-all routing its running sandboxes cannot get. */
  routingNoted?: boolean;
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
      routing: RoutingMode;
      /** default routing: the names the hosts file redirects (a backend may install them). */
      hostsFile: string[];
      /** The run's resources (each unset limit the kind's default); absent: the kind's defaults. */
      resources?: Resources;
      /** The sandbox has setup commands (a setup stage ended by seal). */
      setup?: boolean;
    };

/** What a collect stored: files kept, their bytes, and files cut (over a bound, links, ...). */
export interface CollectResult {
  files: number;
  bytes: number;
  cut: number;
}

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
      routing?: RoutingMode;
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
    /**
     * Unpacks the run's bundle into `dir` of a work or task sandbox (before setup). A refused
     * bundle is an answer ({ ok: false, code }), not a throw.
     */
    putBundle(
      runId: string,
      sandboxId: string,
      bundle: { sha256: string; dir: string },
    ): Promise<UnpackResult>;
    /**
     * Ends the sandbox's setup stage: every process it left killed, the wiring's files
     * re-installed from this copy, setup-stage execs refused from then on. Idempotent.
     */
    seal(runId: string, sandboxId: string, seal: Seal): Promise<SealResult>;
    /**
     * Rewrites a default-routing sandbox's hosts-file redirect while it runs (a vault edit).
     * Throws BackendError `not_supported` where the backend cannot.
     */
    setHosts(runId: string, sandboxId: string, hostsFile: string[]): Promise<void>;
    /** Collects the files under `dir` (the commands' $BW_OUT) into the run's artifacts. */
    collect(
      runId: string,
      sandboxId: string,
      options: { sandboxName: string; dir: string; maxBytes: number; maxFiles: number },
    ): Promise<CollectResult>;
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
  /** What the steps see: the same ports and storage objects. */
  private readonly m: Machine;

  constructor(
    private readonly storage: MachineStorage,
    private readonly ports: MachinePorts,
    options: MachineOptions = {},
  ) {
    this.m = { storage, ports, lingerIdleMs: options.lingerIdleMs ?? LINGER_IDLE_MS };
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
    if (!s || isTerminal(s.state)) return false;
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
    if (isTerminal(s.state)) return "over";
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
    if (s && (isTerminal(s.state) || s.state === "finishing" || s.state === "lingering")) return false;
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
    if (s && (isTerminal(s.state) || s.state === "finishing")) return false;
    await this.storage.requestLinger(seconds);
    if (s?.state === "lingering") await this.storage.setAlarm(this.ports.now());
    return true;
  }

  /**
   * Someone looks at the run's proxy (through the control plane): a paused lingering proxy is
   * resumed first, and its idle clock restarts. Answers which sandbox to talk to.
   */
  wake(): Promise<WakeResult> {
    return wake(this.m);
  }

  /** The proxy said it is ready: look now instead of at the next poll. */
  async poke(): Promise<void> {
    const s = await this.storage.load();
    if (s && !isTerminal(s.state)) await this.storage.setAlarm(this.ports.now());
  }

  async state(): Promise<MachineState | undefined> {
    return this.storage.load();
  }

  /** Asks for a task environment named `name` (made and wired at the next steps). */
  addEnvironment(name: string): Promise<EnvironmentAnswer> {
    return environments.addEnvironment(this.m, name);
  }

  /** A task environment of the run and its exec environment (null env while not ready). */
  environment(id: string): Promise<{ view: EnvironmentView; env: Record<string, string> | null } | null> {
    return environments.environment(this.m, id);
  }

  /** Deletes a task environment: its sandbox is destroyed now. Idempotent. */
  removeEnvironment(id: string): Promise<EnvironmentAnswer> {
    return environments.removeEnvironment(this.m, id);
  }

  /** One step. Called by the alarm; schedules the next alarm itself unless the run is over. */
  async step(): Promise<void> {
    const s = await this.storage.load();
    if (!s || isTerminal(s.state)) return;
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
        finish(this.m, s, { to: "failed", reason: "internal_error", detail });
        next = this.ports.now();
      } else {
        next = this.ports.now() + VAULT_BACKOFF_MS * 2 ** (s.faults - 1);
      }
    }
    await this.storage.save(s);
    if (next !== null) await this.storage.setAlarm(next);
  }

  // ---- the dispatch: each step returns when to run the next one (null: done) ----

  private async advance(s: MachineState): Promise<number | null> {
    const m = this.m;
    if (s.cancel && s.state !== "finishing" && !s.final) {
      finish(
        m,
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
        return enterQueued(m, s);
      case "fetching_vault":
        return fetchVault(m, s);
      case "starting_proxy":
        return startProxy(m, s);
      case "starting_sandboxes":
        return startSandboxes(m, s);
      case "wiring":
        return wire(m, s);
      case "running":
        return run(m, s);
      case "finishing":
        return tearDown(m, s);
      case "lingering":
        return lingerStep(m, s);
      default:
        return this.ports.now();
    }
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
