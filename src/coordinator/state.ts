import type { SandboxInfo } from "@benchwright/shared/contract/local-agent";
import { newPlaceholderNonce, type PlaceholderEnv } from "@benchwright/shared/contract/placeholder";
import type { PolicyDocument, RoutingMode } from "@benchwright/shared/contract/policy";
import { type RunSpec, readStoredSpec, type StoredRunSpec } from "@benchwright/shared/contract/run-spec";
import type { RunState, TerminalState } from "@benchwright/shared/contract/run-states";
import type { ImageDigest, SetupImageKey } from "@benchwright/shared/contract/setup-image";

// The run machine's state, as the Durable Object stores it between steps (one record per run).
// It is versioned: a state stored by an older version is brought to this one when the object
// loads it (migrateState), once, so the steps read every field as set; an absent field means
// "not yet" only where the type says so.

export const STATE_VERSION = 4;

export type Final = { to: TerminalState; reason: string; detail?: string };

/** Who asked the run to stop early. */
export type StopRequest = "cancelled" | "reaped";

/**
 * Where a worker is once its wiring is proved (steps/stages.ts): bundle → setup → seal → capture
 * (a setup image's builder only) → rewire → execute (its commands) → collect. Null before its
 * wiring is proved; a sandbox started from a setup image goes seal → rewire → execute.
 */
export type WorkerStage = "bundle" | "setup" | "seal" | "capture" | "rewire" | "execute" | "collect";

/**
 * What a worker with setup commands does about them (steps/setup-image.ts), from the broker's
 * claim (contract/setup-image.ts SetupImageClaim) and what became of it:
 * - use: its sandbox starts from the environment's built image of the key (no setup stage);
 * - build: it runs setup and keeps the result (building → captured), or it did not keep it
 *   (failed: the capture was refused, or another sandbox took the lease over);
 * - wait: its sandbox is not made yet; it asks again (`claimedAt`) since `since`;
 * - none: it runs its own setup and keeps nothing, for `reason`.
 */
export type WorkerImage =
  | { role: "use"; key: SetupImageKey; digest: ImageDigest; builtByRunId: string | null }
  | {
      role: "build";
      key: SetupImageKey;
      claimedAt: number;
      state: "building" | "captured" | "failed";
      digest: ImageDigest | null;
    }
  | { role: "wait"; key: SetupImageKey; builderRunId: string | null; since: number; claimedAt: number }
  | { role: "none"; reason: string };

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
  wiring: SandboxInfo["wiring"];
  /**
   * A task environment asked for through the compute API (by the work or orchestrator sandbox's
   * capability): no commands of its own, the holder execs in it; done when the holder deletes it.
   */
  environment: boolean;
  /** The task's sandbox is destroyed (a task's sandbox goes when the task is done). */
  destroyed: boolean;
  /** Setup commands (the run's, then the task's), run in the setup stage before `commands`. */
  setup: string[];
  /** For an environment: its commands' stage once wired (the holder prepares it). */
  stage: WorkerStage | null;
  setupIndex: number;
  setupExecId: string | null;
  /** The re-proof after seal (bw-wiring in the execute stage, installed: true). */
  rewireExecId: string | null;
  /** Something ran in the sandbox (a setup command or a command): its $BW_OUT is collected. */
  ran: boolean;
  collected: boolean;
  /** The backend said it cannot rewrite this sandbox's hosts file mid-run (not_supported). */
  hostsFixed: boolean;
  /** Its setup image (null: no setup commands, or not claimed yet). */
  image: WorkerImage | null;
}

/**
 * The coordinator's own record of a lingering proxy (the API's view is Linger, runs/linger.ts):
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

/** The proxy process of the run. */
export interface ProxyProcess {
  /** Exec attempts, each with its own exec id, checkpointed before the call. */
  launches: number;
  /** Set once the backend confirmed the launch. */
  execId: string | null;
  caCertPem: string | null;
  unfiltered: boolean;
  /** The last liveness check while running (null: none yet), and how much output it had read. */
  checkedAt: number | null;
  outEnd: number;
  errEnd: number;
}

export interface MachineState {
  version: typeof STATE_VERSION;
  runId: string;
  state: RunState;
  /** Attempts in the current state (vault retries), and consecutive unexpected faults. */
  attempt: number;
  faults: number;
  enteredAt: number;
  cancel: boolean;
  /** Why: "cancelled" (the user) or "reaped" (the sweeper: stuck past its deadline). */
  cancelReason: StopRequest | null;
  final: Final | null;
  spec: RunSpec | null;
  policy:
    | (Pick<PolicyDocument, "version" | "routing" | "enforce" | "hostsFile" | "note"> & {
        /** The declared model's lane (name and provider only). */
        model: { name: string; provider: string } | null;
        /** The sandboxes' placeholder variables (name and secret name, never a value; case N1). */
        placeholders: PlaceholderEnv[];
      })
    | null;
  /**
   * The run's placeholder nonce (contract/placeholder.ts), made with the state: the proxy gets it
   * (every launch the same) and the sandboxes' placeholders carry it. Null for a run that was in
   * flight when placeholders came: its proxy was launched without one, so it goes on without.
   */
  placeholderNonce: string | null;
  /**
   * The egress tunnel, for a run that sends traffic through the user's machine: when the machine
   * began waiting for the agent, and whether it was ever there (checked once, before any command).
   */
  tunnel: { waitingSince: number; ready: boolean } | null;
  /** The router/proxy sandbox of the run, and whether the proxy process runs in it. */
  network: { sandboxId: string; created: boolean } | null;
  proxy: ProxyProcess | null;
  workers: Worker[];
  /** Output kept in the trace so far: characters, and rows. */
  traceBytes: number;
  outputEvents: number;
  /** Halted for review: the work and task sandboxes' processes are stopped. */
  halted: boolean;
  /** Halts so far (keys the trace events of each halt and resume). */
  halts: number;
  /** Set once the run lingers (its commands ended and it asked to keep its proxy). */
  linger: LingerWindow | null;
  /** Vault edits put onto running sandboxes' hosts files (steps/hosts.ts): the last look, edits so far. */
  hostsCheckedAt: number | null;
  hostsEdits: number;
  /** The run says the vault needs catch-all routing its running sandboxes cannot get. */
  routingNoted: boolean;
}

export function newState(runId: string, now: number): MachineState {
  return {
    version: STATE_VERSION,
    runId,
    state: "queued",
    attempt: 0,
    faults: 0,
    enteredAt: now,
    cancel: false,
    cancelReason: null,
    final: null,
    spec: null,
    policy: null,
    placeholderNonce: newPlaceholderNonce(),
    tunnel: null,
    network: null,
    proxy: null,
    workers: [],
    traceBytes: 0,
    outputEvents: 0,
    halted: false,
    halts: 0,
    linger: null,
    hostsCheckedAt: null,
    hostsEdits: 0,
    routingNoted: false,
  };
}

export function newProxy(): ProxyProcess {
  return {
    launches: 0,
    execId: null,
    caCertPem: null,
    unfiltered: false,
    checkedAt: null,
    outEnd: 0,
    errEnd: 0,
  };
}

/** T with the fields K added since an older version, which a state stored then may lack. */
type Before<T, K extends keyof T> = Omit<T, K> & Partial<Pick<T, K>>;
type Policy = NonNullable<MachineState["policy"]>;

/**
 * A state stored before it had a version (version 1): the fields added since may be missing
 * (undefined where this version has null), and its spec may hold the keys from before camelCase.
 */
type StoredV1 = Omit<
  Before<
    MachineState,
    | "cancelReason"
    | "tunnel"
    | "outputEvents"
    | "halted"
    | "halts"
    | "linger"
    | "hostsCheckedAt"
    | "hostsEdits"
    | "routingNoted"
  >,
  "version" | "spec" | "policy" | "placeholderNonce" | "proxy" | "workers"
> & {
  version?: undefined;
  spec: StoredRunSpec | null;
  policy: Before<Policy, "model" | "placeholders"> | null;
  proxy: Before<ProxyProcess, "checkedAt" | "outEnd" | "errEnd"> | null;
  workers: Before<
    Worker,
    | "wiring"
    | "environment"
    | "destroyed"
    | "setup"
    | "stage"
    | "setupIndex"
    | "setupExecId"
    | "rewireExecId"
    | "ran"
    | "collected"
    | "hostsFixed"
    | "image"
  >[];
};

/** A state stored by version 3: no placeholders (no nonce, none in its policy). */
type StoredV3 = Omit<MachineState, "version" | "policy" | "placeholderNonce"> & {
  version: 3;
  policy: Before<Policy, "placeholders"> | null;
};

/** A state stored by version 2: its workers have no setup image. */
type StoredV2 = Omit<StoredV3, "version" | "workers"> & {
  version: 2;
  workers: Before<Worker, "image">[];
};

/** What the object's storage may hold: this version's state or an older one. */
export type StoredState = MachineState | StoredV3 | StoredV2 | StoredV1;

/** A stored state as this version's (older states are filled in on load). */
export function migrateState(stored: StoredState | undefined): MachineState | undefined {
  if (stored === undefined || stored.version === STATE_VERSION) return stored;
  const v3 = stored.version === 3 ? stored : fromV2(stored.version === 2 ? stored : fromV1(stored));
  // A run in flight before placeholders: its proxy swaps none, so its sandboxes get none.
  const { policy } = v3;
  return {
    ...v3,
    version: STATE_VERSION,
    policy: policy ? { ...policy, placeholders: policy.placeholders ?? [] } : null,
    placeholderNonce: null,
  };
}

function fromV2(stored: StoredV2): StoredV3 {
  // A run in flight before setup images: every sandbox of it runs its own setup, as then.
  return { ...stored, version: 3, workers: stored.workers.map((w) => ({ ...w, image: w.image ?? null })) };
}

function fromV1(stored: StoredV1): StoredV2 {
  const { policy, proxy } = stored;
  return {
    ...stored,
    version: 2,
    cancelReason: stored.cancelReason ?? null,
    spec: stored.spec ? readStoredSpec(stored.spec) : null,
    policy: policy ? { ...policy, model: policy.model ?? null } : null,
    tunnel: stored.tunnel ?? null,
    proxy: proxy
      ? { ...proxy, checkedAt: proxy.checkedAt ?? null, outEnd: proxy.outEnd ?? 0, errEnd: proxy.errEnd ?? 0 }
      : null,
    workers: stored.workers.map((w) => ({
      ...w,
      wiring: w.wiring ?? null,
      environment: w.environment ?? false,
      destroyed: w.destroyed ?? false,
      setup: w.setup ?? [],
      // A state from before the stages: a wired worker was at its commands.
      stage: w.stage ?? (w.env !== null ? "execute" : null),
      setupIndex: w.setupIndex ?? 0,
      setupExecId: w.setupExecId ?? null,
      rewireExecId: w.rewireExecId ?? null,
      ran: w.ran ?? false,
      collected: w.collected ?? false,
      hostsFixed: w.hostsFixed ?? false,
    })),
    outputEvents: stored.outputEvents ?? 0,
    halted: stored.halted ?? false,
    halts: stored.halts ?? 0,
    linger: stored.linger ?? null,
    hostsCheckedAt: stored.hostsCheckedAt ?? null,
    hostsEdits: stored.hostsEdits ?? 0,
    routingNoted: stored.routingNoted ?? false,
  };
}
