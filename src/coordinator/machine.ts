import { isTerminal } from "@benchwright/shared/contract/run-states";
import {
  BrokerFailure,
  type EnvironmentAnswer,
  type EnvironmentRequest,
  type EnvironmentView,
  type Machine,
  type MachinePorts,
  type MachineStorage,
  type WakeResult,
} from "./ports";
import { type MachineState, newState, type StopRequest } from "./state";
import { run } from "./steps/commands";
import { finish } from "./steps/common";
import * as environments from "./steps/environments";
import { LINGER_IDLE_MS, lingerStep, wake } from "./steps/linger";
import { startProxy } from "./steps/proxy";
import { startSandboxes } from "./steps/sandboxes";
import { SETUP_IMAGE_WAIT_MS } from "./steps/setup-image";
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
// resource limits stops it too (`resource_exhausted`). Each distinct setup runs once per setup
// image (steps/setup-image.ts): its builder captures it between seal and rewire, and the run's
// other sandboxes of that setup wait for it, then start from it: seal → rewire → commands.
//
// This file holds the public class and the dispatch; the state's types are in state.ts, what the
// machine needs from outside in ports.ts, and each phase's steps in steps/ (vault, proxy,
// sandboxes, setup-image, wiring, seal, stages, commands, hosts, halt, tunnel, teardown, linger,
// environments), functions over the same state and ports that import nothing but those two (and
// each other).

export { COMPUTE_URL, HALTED_POLL_MS } from "./steps/commands";
export { POLL_MS } from "./steps/common";
export { MAX_ENVIRONMENTS } from "./steps/environments";
export { HOSTS_CHECK_MS } from "./steps/hosts";
export { LINGER_IDLE_MS } from "./steps/linger";
export { MAX_OUTPUT_EVENTS, MAX_TRACE_OUTPUT, OUT_ENV } from "./steps/output";
export { PROXY_CHECK_MS, PROXY_ENV, PROXY_READY_DEADLINE_MS } from "./steps/proxy";
export { LEASE_RENEW_MS, SETUP_IMAGE_WAIT_MS, WAIT_POLL_MS } from "./steps/setup-image";
export { SETUP_TIMEOUT_MS, WORK_DIR } from "./steps/stages";
export { DEFAULT_EGRESS_AGENT_WAIT_SECONDS, TUNNEL_POLL_MS } from "./steps/tunnel";
export { VAULT_ATTEMPTS, VAULT_BACKOFF_MS } from "./steps/vault";

export const MAX_FAULTS = 5;
/** Longest wait between two attempts at a teardown that keeps failing. */
export const MAX_TEARDOWN_BACKOFF_MS = 60_000;

export interface MachineOptions {
  /** Pause a lingering proxy nobody looked at for this long. */
  lingerIdleMs?: number;
  /** How long a sandbox waits for another run's build of its setup image (Config.setupImages). */
  setupImageWaitMs?: number;
}

export class RunMachine {
  /** What the steps see: the same ports and storage objects. */
  private readonly m: Machine;

  constructor(
    private readonly storage: MachineStorage,
    private readonly ports: MachinePorts,
    options: MachineOptions = {},
  ) {
    this.m = {
      storage,
      ports,
      lingerIdleMs: options.lingerIdleMs ?? LINGER_IDLE_MS,
      setupImageWaitMs: options.setupImageWaitMs ?? SETUP_IMAGE_WAIT_MS,
    };
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

  /** Asks for a task environment (made, set up and wired at the next steps). */
  addEnvironment(request: EnvironmentRequest): Promise<EnvironmentAnswer> {
    return environments.addEnvironment(this.m, request);
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
      const retryable = !(error instanceof BrokerFailure) || error.retryable;
      if (s.state === "finishing") {
        // Teardown itself failing: it must still end, and the runtime gives up on an alarm after
        // a few retries, so retry without end (backoff capped). Past MAX_FAULTS, revoke the proxy
        // credentials now, not after the proxy sandbox is gone: a proxy that outlives a failed
        // teardown then gets no more policy (nor secrets), at the cost of its last audit flush.
        if (s.faults >= MAX_FAULTS) await this.ports.revokeProxyCredentials(s.runId).catch(() => {});
        next = this.ports.now() + Math.min(VAULT_BACKOFF_MS * 2 ** (s.faults - 1), MAX_TEARDOWN_BACKOFF_MS);
      } else if (s.faults >= MAX_FAULTS || !retryable) {
        const detail = error instanceof BrokerFailure ? error.message : "internal error";
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
