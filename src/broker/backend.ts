import type { CreateSandbox, ExecInfo, ExecRequest, SandboxInfo, SandboxKind } from "../contract/local-agent";

// A compute backend as the broker sees it. `local` (Linux namespaces through the host agent) is
// the one built; sandbox0 and E2B implement the same interface. Only the broker holds a backend.

export interface ExecPoll {
  waitMs?: number;
  stdoutFrom?: number;
  stderrFrom?: number;
}

export interface ComputeBackend {
  readonly name: string;
  create(request: CreateSandbox): Promise<SandboxInfo>;
  exec(sandboxId: string, request: ExecRequest): Promise<ExecInfo>;
  poll(sandboxId: string, execId: string, poll: ExecPoll): Promise<ExecInfo>;
  kill(sandboxId: string, execId: string): Promise<ExecInfo>;
  destroy(sandboxId: string): Promise<void>;
  /**
   * Stops or continues every process of a sandbox: a work/task sandbox (halting a run for review)
   * or a lingering run's proxy sandbox (paused while nobody inspects it).
   */
  freeze(sandboxId: string, frozen: boolean): Promise<void>;
  /** Every sandbox the backend holds, whichever run it belongs to (to find those no run owns). */
  list(): Promise<Array<{ id: string; runId: string; kind: SandboxKind }>>;
}

/**
 * A backend refused or failed. `code` is the backend's stable reason (e.g. `cannot_isolate`,
 * `sandbox_failed`); `message` says why in plain words and never carries a credential.
 */
export class BackendError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly retryable = false,
  ) {
    super(message);
    this.name = "BackendError";
  }
}
