import type { BrokerCode } from "@benchwright/shared/contract/broker";
import type { ArtifactSummary, UnpackResult } from "@benchwright/shared/contract/bundle";
import type {
  ExecInfo,
  ExecRequest,
  Resources,
  SandboxInfo,
  Seal,
  SealResult,
} from "@benchwright/shared/contract/local-agent";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import type {
  CapturedImage,
  SetupImageClaim,
  SetupImageKey,
  SetupImageMode,
} from "@benchwright/shared/contract/setup-image";
import type { ExecPoll } from "./backend";

// The sandbox broker's contract (sandbox-broker.ts implements it): what a run's coordinator and
// the reaper may ask of it, and how it answers. Every call answers a BrokerResult: an error's
// class and fields do not cross the Durable Object RPC boundary, so a failure travels as a value
// with a closed code (shared/contract/broker.ts) that callers compare, never as message text.
// The broker turns what a backend throws (BackendError) into that value, once. Types only.

/** A broker call's answer: its value, or why not (retryable: the same call may succeed later). */
export type BrokerResult<T> =
  | { ok: true; value: T }
  | { ok: false; code: BrokerCode; message: string; retryable: boolean };

export type BrokerFailed = Extract<BrokerResult<unknown>, { ok: false }>;

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
      /** A setup image's builder (its claim said build): its changes can be captured after seal. */
      capture?: true;
      /**
       * Start from the run's environment's built setup image of this key (its claim said use):
       * the broker reads the digest itself; no setup stage. A key the environment has not built
       * is refused (setup_image_not_found); a layer the backend finds missing or not matching its
       * digest is refused (setup_image_missing, setup_image_mismatch) and its row dropped, so
       * that the next claim builds it again (case P6).
       */
      setupImage?: { key: SetupImageKey };
    };

/**
 * A sandbox's setup as the coordinator knows it: the broker adds the backend and the work image's
 * digest and hashes the lot (setupImageKey).
 */
export interface SetupImageRequest {
  /** The run's setup commands, then the task's own (Worker.setup). */
  setup: string[];
  /** The run's bundle (sha256), or null. */
  bundle: string | null;
  /** The sandbox's resources (resourcesFor its kind); memoryMb and pids enter the key. */
  resources: Resources;
  mode: SetupImageMode;
}

/** The run's bundle, named (never carried): the broker reads its bytes from R2 itself. */
export interface BundleRequest {
  environmentId: string;
  sha256: string;
  dir: string;
}

/** What to collect from a sandbox (the commands' $BW_OUT) into the run's artifacts. */
export interface CollectRequest {
  environmentId: string;
  sandboxName: string;
  dir: string;
  maxBytes: number;
  maxFiles: number;
}

/**
 * What the orphan sweep did: sandboxes destroyed, stored setup layers no row names dropped
 * (their digests), what failed; or why it did not look.
 */
export type SweepReport =
  | { destroyed: string[]; errors: string[]; droppedLayers: string[] }
  | { skipped: string };

/**
 * The broker as a Durable Object: one instance per run (`brokerStub`) for every call about that
 * run's sandboxes, which must be the run's own; one of its own for the deployment-wide sweep.
 */
export interface BrokerApi {
  /**
   * Makes a sandbox for the run (idempotent by id). `requestId`: the API request steering the run
   * (its launch), named on the broker's log lines about the run from then on.
   */
  create(runId: string, request: SandboxRequest, requestId?: string): Promise<BrokerResult<SandboxInfo>>;
  exec(runId: string, sandboxId: string, request: ExecRequest): Promise<BrokerResult<ExecInfo>>;
  poll(runId: string, sandboxId: string, execId: string, poll: ExecPoll): Promise<BrokerResult<ExecInfo>>;
  /** Stops an exec; one the backend never started is no failure. */
  kill(runId: string, sandboxId: string, execId: string): Promise<BrokerResult<null>>;
  /**
   * Unpacks the run's bundle into a work or task sandbox (before setup). A bundle the sandbox
   * refuses is a value ({ ok: false, code: BundleCode } inside `value`), not a failure.
   */
  putBundle(runId: string, sandboxId: string, bundle: BundleRequest): Promise<BrokerResult<UnpackResult>>;
  /** Ends a sandbox's setup stage (idempotent). */
  seal(runId: string, sandboxId: string, seal: Seal): Promise<BrokerResult<SealResult>>;
  /** Rewrites a default-routing sandbox's hosts-file redirect; `not_supported` where it cannot. */
  setHosts(runId: string, sandboxId: string, hostsFile: string[]): Promise<BrokerResult<null>>;
  collect(runId: string, sandboxId: string, request: CollectRequest): Promise<BrokerResult<ArtifactSummary>>;
  /** Halts (or resumes) the processes of a sandbox of the run. */
  freeze(runId: string, sandboxId: string, frozen: boolean): Promise<BrokerResult<null>>;
  /** One sandbox of the run (a task that is done). Idempotent. */
  destroySandbox(runId: string, sandboxId: string): Promise<BrokerResult<null>>;
  /**
   * Every sandbox of the run (with keepProxy, all but its proxy sandbox); how many went.
   * `requestId` as for create (a cancel's, when a cancel ended the run).
   */
  destroyRun(
    runId: string,
    options?: { keepProxy?: boolean; requestId?: string },
  ): Promise<BrokerResult<number>>;
  /** Destroys the backends' sandboxes that no live record owns (the sweep's own instance). */
  sweepUnowned(): Promise<BrokerResult<SweepReport>>;
  /**
   * What to do about this sandbox's setup (contract/setup-image.ts SetupImageClaim). Claiming
   * again as the builder renews its lease; `rebuild` makes this sandbox the builder of a built key.
   */
  claimSetupImage(
    runId: string,
    sandboxId: string,
    request: SetupImageRequest,
  ): Promise<BrokerResult<SetupImageClaim>>;
  /**
   * Keeps the builder's filesystem changes as the key's setup image (after seal, before any
   * command) and records its digest; the first builder to finish wins. Past a size bound:
   * setup_image_too_large or setup_images_full, and nothing is kept.
   */
  captureSetupImage(
    runId: string,
    sandboxId: string,
    key: SetupImageKey,
  ): Promise<BrokerResult<CapturedImage>>;
  /** Gives up this sandbox's build of the key (its setup failed): a failed setup is never cached. */
  releaseSetupImage(runId: string, sandboxId: string, key: SetupImageKey): Promise<BrokerResult<null>>;
  /** Removes stored setup images from the backends (the sweep's own instance; the reaper asks). */
  dropSetupImages(
    images: Array<{ backend: string; digest: string; repository: string | null }>,
  ): Promise<BrokerResult<{ dropped: string[]; inUse: string[] }>>;
}
