import type { BrokerCode } from "@benchwright/shared/contract/broker";
import type { UnpackResult } from "@benchwright/shared/contract/bundle";
import type { ExecInfo, SandboxInfo, Seal, SealResult } from "@benchwright/shared/contract/local-agent";
import type { LogRecord } from "@benchwright/shared/contract/log";
import type { PolicyDocument, RoutingMode } from "@benchwright/shared/contract/policy";
import type { RunSpec } from "@benchwright/shared/contract/run-spec";
import type { RunState } from "@benchwright/shared/contract/run-states";
import type { ImageDigest, SetupImageKey } from "@benchwright/shared/contract/setup-image";
import type { WiringProof } from "@benchwright/shared/contract/wiring";
import type { BrokerApi, BrokerFailed, BrokerResult, SandboxRequest } from "../broker/interface";
import type { RunNote, Transition } from "../runs/types";
import type { MachineState, StopRequest } from "./state";

// What the run machine's steps need from outside it, as narrow interfaces: its storage (the
// Durable Object's, worker-ports.ts and run-coordinator.ts) and its ports (Postgres, the vault,
// the broker, the relay). The unit tests give it in-memory ones (test/unit/run-machine-world.ts).

export interface MachineStorage {
  /** The run's state, as this version's (an older stored state is migrated: state.ts). */
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

export interface RunFacts {
  id: string;
  status: RunState;
  spec: RunSpec;
}

export type VaultRead = { ok: true; policy: PolicyDocument } | { ok: false; reason: string };

/** What a collect stored: files kept, their bytes, and files cut (over a bound, links, ...). */
export interface CollectResult {
  files: number;
  bytes: number;
  cut: number;
}

/**
 * The run's broker as the steps use it. `create`, `claimSetupImage` and `captureSetupImage` answer
 * a failure as a value (a step tells "cannot isolate here" from "try again", or "keep nothing", by
 * its code). Every other call resolves with its value
 * or throws a BrokerFailure (below) with the broker's code: a step compares the
 * code where a failure means something (not_supported, setup_not_sealed); the machine takes any
 * other as a fault (retried with backoff when retryable).
 */
/**
 * claimSetupImage: what to do about a sandbox's setup (use, build, wait or none), the builder's
 * renewal too; captureSetupImage: keeps the sealed builder's changes (before any command). As
 * the broker answers them.
 */
export interface MachineBroker extends Pick<BrokerApi, "claimSetupImage" | "captureSetupImage"> {
  create(runId: string, request: SandboxRequest): Promise<BrokerResult<SandboxInfo>>;
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
  putBundle(runId: string, sandboxId: string, bundle: { sha256: string; dir: string }): Promise<UnpackResult>;
  /**
   * Ends the sandbox's setup stage: every process it left killed, the wiring's files
   * re-installed from this copy, setup-stage execs refused from then on. Idempotent.
   */
  seal(runId: string, sandboxId: string, seal: Seal): Promise<SealResult>;
  /**
   * Rewrites a default-routing sandbox's hosts-file redirect while it runs (a vault edit).
   * Throws a BrokerFailure `not_supported` where the backend cannot.
   */
  setHosts(runId: string, sandboxId: string, hostsFile: string[]): Promise<void>;
  /** Collects the files under `dir` (the commands' $BW_OUT) into the run's artifacts. */
  collect(
    runId: string,
    sandboxId: string,
    options: { sandboxName: string; dir: string; maxBytes: number; maxFiles: number },
  ): Promise<CollectResult>;
  /** Gives up the sandbox's build of the key: nothing of it is kept. Idempotent. */
  releaseSetupImage(runId: string, sandboxId: string, key: SetupImageKey): Promise<void>;
}

/**
 * A broker failure as the steps get it (MachineBroker): an exception, since to a step every
 * failure of most calls is a fault; the code and retryable flag stay with it, in this isolate.
 */
export class BrokerFailure extends Error {
  readonly code: BrokerCode;
  readonly retryable: boolean;

  constructor(failed: BrokerFailed) {
    super(failed.message);
    this.name = "BrokerFailure";
    this.code = failed.code;
    this.retryable = failed.retryable;
  }
}

/** The answer's value; a failure is thrown as a BrokerFailure. */
export function brokerValue<T>(result: BrokerResult<T>): T {
  if (result.ok) return result.value;
  throw new BrokerFailure(result);
}

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
  log(event: LogRecord): void;
  /** Compiles the run's vault now and checks every secret its rules need decrypts (E1). */
  readVault(runId: string): Promise<VaultRead>;
  issueProxyCredentials(runId: string): Promise<{ proxyToken: string; auditKey: string }>;
  revokeProxyCredentials(runId: string): Promise<void>;
  /** The CA the proxy reported ready with, or null while it has not. */
  proxyReady(runId: string): Promise<{ caCertPem: string } | null>;
  broker: MachineBroker;
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

/** The run machine as its steps see it: its storage and ports (the step functions take it as `m`). */
export interface Machine {
  readonly ports: MachinePorts;
  readonly storage: MachineStorage;
  /** Pause a lingering proxy nobody looked at for this long. */
  readonly lingerIdleMs: number;
  /** How long a sandbox waits for another run's build of its setup image, then runs its own. */
  readonly setupImageWaitMs: number;
}

// ---- what the machine answers its callers (the Durable Object, the compute API) ----

/** Where a look at the run's proxy goes, or why there is none. */
export type WakeResult =
  | { ok: true; runId: string; sandboxId: string; resumed: boolean }
  | { ok: false; why: string };

/** A task environment asked for through the compute API: its name, and setup of its own if any. */
export interface EnvironmentRequest {
  name: string;
  /** Run after the run's own setup, as a spec'd task's is (absent: no bundle, no setup at all). */
  setup?: string[];
}

/** A task environment as the compute API shows it. */
export interface EnvironmentView {
  id: string;
  name: string;
  state: "preparing" | "ready" | "deleted";
  /** The setup image it started from, or built, once it did (absent: none, or not yet). */
  setupImage?: { key: SetupImageKey; digest: ImageDigest; builtBy: string | null; builtNow: boolean };
}

export type EnvironmentAnswer =
  | { ok: true; environment: EnvironmentView }
  | { ok: false; code: "not_found" | "run_ended" | "conflict" | "limit"; why: string };
