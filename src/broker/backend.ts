import type { BrokerCode } from "@benchwright/shared/contract/broker";
import type { UnpackResult } from "@benchwright/shared/contract/bundle";
import type {
  ExecInfo,
  ExecRequest,
  Resources,
  SandboxInfo,
  SandboxKind,
  Seal,
} from "@benchwright/shared/contract/local-agent";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import type { CapturedImage, ImageDigest, SetupImageKey } from "@benchwright/shared/contract/setup-image";
import { z } from "zod";

// A compute backend as the broker sees it: `sandbox0` (Kubernetes pods on DOKS, the default on
// the platform), `e2b` (microVMs, the fallback) and `local` (Linux namespaces through the host
// agent, for development and tests). Only the broker holds a backend and its credentials.

export const BackendName = z.enum(["sandbox0", "e2b", "local"]);
export type BackendName = z.infer<typeof BackendName>;

/** What the broker asks a backend to make (the broker has checked the run owns every id). */
/**
 * `resources`: the sandbox's limits; the broker always sends them (DEFAULT_RESOURCES of the kind
 * when the run asked for none), so a backend may read an absent one as its kind's default.
 */
export type SandboxSpec =
  | { kind: "proxy"; id: string; runId: string; resources?: Resources }
  | {
      kind: "work" | "task" | "orchestrator";
      id: string;
      runId: string;
      resources?: Resources;
      /** The run's proxy sandbox: the only route out of this one (catch-all). */
      proxySandboxId: string;
      routing: RoutingMode;
      /**
       * default routing: the exact host names the wiring redirects to the proxy. A backend that
       * cannot let the setup stage write the hosts file (no root in the pod) installs them itself
       * and says so in SandboxInfo.wiring.
       */
      hostsFile: string[];
      /**
       * The sandbox has a setup stage (setup commands, ended by seal). A backend whose setup
       * stage needs a place of its own (sandbox0's root container) makes it only then.
       */
      setup?: boolean;
      /** A setup image's builder: its filesystem changes stay capturable (captureLayer) after seal. */
      capture?: true;
      /**
       * Start from this setup image (the digest the broker read from the run's environment's
       * built row, never one a caller named) and skip the setup stage. A layer the backend finds
       * missing or not matching the digest is refused (setup_image_missing, setup_image_mismatch),
       * never started around. `environmentId`: the run's (a registry backend's repository).
       */
      layer?: { digest: ImageDigest; environmentId: string };
    };

/**
 * Where a capture goes and what it must not hold: a registry backend pushes it to the
 * environment's own repository (tagged with the key), and no kept file may hold the run's CA.
 */
export interface LayerTarget {
  environmentId: string;
  key: SetupImageKey;
  runCaPem: string | null;
}

/** A capture as kept: a registry backend also names the repository it pushed to. */
export type KeptLayer = CapturedImage & { repository?: string };

export interface ExecPoll {
  waitMs?: number;
  stdoutFrom?: number;
  stderrFrom?: number;
}

export interface ComputeBackend {
  readonly name: BackendName;
  create(spec: SandboxSpec): Promise<SandboxInfo>;
  exec(sandboxId: string, request: ExecRequest): Promise<ExecInfo>;
  poll(sandboxId: string, execId: string, poll: ExecPoll): Promise<ExecInfo>;
  kill(sandboxId: string, execId: string): Promise<ExecInfo>;
  destroy(sandboxId: string): Promise<void>;
  /**
   * Stops or continues a sandbox: a work/task sandbox (halting a run for review) or a lingering
   * run's proxy sandbox (paused while nobody inspects it; each backend says what pausing costs).
   */
  freeze(sandboxId: string, frozen: boolean): Promise<void>;
  /** Every sandbox the backend holds, whichever run it belongs to (to find those no run owns). */
  list(): Promise<Array<{ id: string; runId: string; kind: SandboxKind }>>;
  /**
   * Unpacks a bundle (.tar.gz) into `dir` of a work or task sandbox, as its execute stage's user,
   * before setup. A refused bundle is `{ ok: false, code }` (a BundleCode), not a throw.
   */
  putBundle(sandboxId: string, bundle: ReadableStream<Uint8Array>, dir: string): Promise<UnpackResult>;
  /**
   * Ends the setup stage: kills every process it left, re-installs the wiring's files from the
   * given copy, refuses setup-stage execs from then on. Idempotent.
   */
  seal(sandboxId: string, seal: Seal): Promise<{ killed: number }>;
  /** Rewrites a default-routing sandbox's hosts-file redirect (a vault edit mid-run). */
  setHosts(sandboxId: string, hostsFile: string[]): Promise<void>;
  /** The files under `dir`, packed by bw-collect as the execute stage's user (contract/bundle.ts). */
  collect(
    sandboxId: string,
    options: { dir: string; maxBytes: number; maxFiles: number },
  ): Promise<ReadableStream<Uint8Array>>;
  /**
   * The work image sandboxes start from, by digest: a setup image's base (part of its key). Null
   * where the backend keeps no setup images (or cannot name its base by digest yet), or
   * `{ none }` saying why not here: every claim then answers none.
   */
  baseImage(): Promise<string | { none: string } | null>;
  /**
   * Keeps a sealed builder's filesystem changes (made with `capture`) as a setup image, bounded
   * by maxBytes (over: setup_image_too_large, nothing kept).
   */
  captureLayer(sandboxId: string, maxBytes: number, target: LayerTarget): Promise<KeptLayer>;
  /**
   * Removes a stored setup image (a registry backend's in the repository its row names); "in_use"
   * while a live sandbox starts from it. Gone is dropped.
   */
  dropLayer(digest: string, repository?: string | null): Promise<"dropped" | "in_use">;
  /** The setup images the backend keeps (for the sweep of those no row names). */
  listLayers(): Promise<Array<{ digest: string; createdAt: string; inUse: number }>>;
}

/** What a backend answers for a capability it does not have yet (see docs/e2b.md, docs/sandbox0.md). */
export function notSupported(backend: BackendName, what: string): BackendError {
  return new BackendError("not_supported", `${what} is not yet built for the ${backend} backend`);
}

/**
 * A backend refused or failed. `code` is the backend's stable reason (e.g. `cannot_isolate`,
 * `sandbox_failed`); `message` says why in plain words and never carries a credential. It stays
 * inside the broker, which answers it as a BrokerResult failure (interface.ts).
 */
export class BackendError extends Error {
  constructor(
    readonly code: BrokerCode,
    message: string,
    readonly retryable = false,
  ) {
    super(message);
    this.name = "BackendError";
  }
}
