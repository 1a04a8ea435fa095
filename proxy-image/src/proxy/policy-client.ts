import { logLine } from "@benchwright/shared/contract/log";
import type { PolicyDocument } from "@benchwright/shared/contract/policy";
import {
  bearer,
  describeIssues,
  IF_NONE_MATCH_HEADER,
  PolicyEnvelope,
  policyEtag,
  policyPath,
} from "@benchwright/shared/contract/proxy-wire";
import { buildPolicyIndex, type PolicyIndex } from "@benchwright/shared/policy/compile";

// Keeps the run's policy (and the secret values it names) current by polling the control plane.
// Fail closed (case E4): until a valid document has arrived, and whenever the control plane hands
// over one that does not validate, the state says "deny everything". A transport failure is not
// an answer, so it keeps whatever is in force (a blip must not take the run's egress down).
// Logs carry versions and reasons only, never a secret value.

export type PolicyState =
  | { readonly kind: "none" }
  | { readonly kind: "invalid"; readonly reason: string }
  | {
      readonly kind: "ready";
      readonly policy: PolicyDocument;
      /** Secret name → value: frozen, without a prototype, so no name reaches Object.prototype. */
      readonly secrets: Readonly<Record<string, string>>;
      readonly index: PolicyIndex;
    };

export type LogLevel = "info" | "warn" | "error";
/**
 * How the policy client and the audit reporter log: the line's level, its `event` (the name an
 * operator alerts on: docs/operator-guide.md) and its fields (versions, counts, reasons; no value).
 */
export type LogFn = (level: LogLevel, event: string, fields?: Record<string, string | number | null>) => void;

/** The subset of fetch this client uses (the global, undici-based fetch by default). */
export type FetchFn = (url: string, init: RequestInit) => Promise<Response>;

export interface PolicyClientOptions {
  /** Base URL of the control plane, e.g. `https://api.example` (no trailing path). */
  controlPlaneUrl: string;
  runId: string;
  proxyToken: string;
  /** Poll interval; at most 2000 so that an edit reaches the proxy within seconds. Default 1000. */
  intervalMs?: number;
  /** Per-request timeout. Default 5000. */
  timeoutMs?: number;
  /** Larger bodies are refused (deny all). Default 16 MiB. */
  maxBodyBytes?: number;
  fetch?: FetchFn;
  onChange?: (state: PolicyState) => void;
  log?: LogFn;
}

const NONE: PolicyState = Object.freeze({ kind: "none" });

export const MAX_POLICY_INTERVAL_MS = 2000;

const defaultLog: LogFn = (level, event, fields) => {
  console.error(logLine(level, { event, component: "policy-client", ...fields }));
};

export class PolicyClient {
  private state: PolicyState = NONE;
  private readonly url: string;
  private readonly intervalMs: number;
  private readonly timeoutMs: number;
  private readonly maxBodyBytes: number;
  private readonly fetchFn: FetchFn;
  private readonly log: LogFn;
  private running = false;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private abort = new AbortController();
  // Polls run one after another, never overlapping, so a slow old answer cannot overwrite a newer one.
  private chain: Promise<unknown> = Promise.resolve();
  private reachable = true;

  constructor(private readonly options: PolicyClientOptions) {
    this.intervalMs = options.intervalMs ?? 1000;
    if (
      !Number.isInteger(this.intervalMs) ||
      this.intervalMs < 10 ||
      this.intervalMs > MAX_POLICY_INTERVAL_MS
    ) {
      throw new RangeError(`intervalMs must be an integer in 10..${MAX_POLICY_INTERVAL_MS}`);
    }
    this.timeoutMs = options.timeoutMs ?? 5000;
    this.maxBodyBytes = options.maxBodyBytes ?? 16 * 1024 * 1024;
    this.url = new URL(policyPath(options.runId), options.controlPlaneUrl).toString();
    this.fetchFn = options.fetch ?? ((url, init) => fetch(url, init));
    this.log = options.log ?? defaultLog;
  }

  /** The state in force. Anything but `ready` means: deny everything. */
  current(): PolicyState {
    return this.state;
  }

  /** Starts polling; resolves with the state after the first poll. */
  start(): Promise<PolicyState> {
    if (this.running) return this.refreshNow();
    this.running = true;
    this.abort = new AbortController();
    const first = this.refreshNow();
    const tick = async () => {
      const started = Date.now();
      await this.refreshNow();
      if (this.running) this.timer = setTimeout(tick, Math.max(0, this.intervalMs - (Date.now() - started)));
    };
    void first.then(() => {
      if (this.running) this.timer = setTimeout(tick, this.intervalMs);
    });
    return first;
  }

  /** Stops polling and abandons a request in flight. The state in force stays. */
  async stop(): Promise<void> {
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    this.abort.abort();
    await this.chain;
  }

  /** Polls now (after any poll in flight) and resolves with the resulting state. */
  refreshNow(): Promise<PolicyState> {
    const next = this.chain.then(() => this.poll());
    this.chain = next.catch(() => undefined);
    return next;
  }

  private async poll(): Promise<PolicyState> {
    const headers: Record<string, string> = {
      authorization: bearer(this.options.proxyToken),
      accept: "application/json",
    };
    // Only a valid copy is worth a 304. After an invalid answer the full document is fetched
    // again, so a body corrupted in transit heals on the next poll without a version bump.
    if (this.state.kind === "ready") headers[IF_NONE_MATCH_HEADER] = policyEtag(this.state.policy.version);

    let response: Response;
    let text: string;
    try {
      const signal = AbortSignal.any([this.abort.signal, AbortSignal.timeout(this.timeoutMs)]);
      // redirect "error": the bearer token must not follow a redirect anywhere.
      response = await this.fetchFn(this.url, { method: "GET", headers, signal, redirect: "error" });
      if (response.status === 304) {
        await response.body?.cancel();
        this.markReachable();
        if (this.state.kind !== "ready") this.log("warn", "policy_not_modified_uncached");
        return this.state;
      }
      // No answer about the policy: keep what is in force.
      if (response.status >= 500 || response.status === 408 || response.status === 429) {
        await response.body?.cancel();
        return this.unreachable(`HTTP ${response.status}`);
      }
      if (response.status !== 200) {
        await response.body?.cancel();
        this.markReachable();
        return this.setInvalid(`the control plane answered HTTP ${response.status}`);
      }
      const body = await readBounded(response, this.maxBodyBytes);
      if (body === null) {
        this.markReachable();
        return this.setInvalid(`the body is larger than ${this.maxBodyBytes} bytes`);
      }
      text = body;
    } catch (error) {
      if (this.abort.signal.aborted) return this.state;
      return this.unreachable(errorName(error));
    }
    this.markReachable();
    return this.accept(text);
  }

  /** Validates a 200 body as a whole and swaps it in, or replaces the state with deny-all. */
  private accept(text: string): PolicyState {
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      // Not the parser's message: it may quote the body, and the body holds secret values.
      return this.setInvalid("the body is not JSON");
    }
    const parsed = PolicyEnvelope.safeParse(json);
    if (!parsed.success) {
      return this.setInvalid(
        `the policy envelope is invalid: ${redact(describeIssues(parsed.error.issues), json)}`,
      );
    }
    const { policy, secrets } = parsed.data;
    const previous = this.state.kind === "ready" ? this.state.policy.version : null;
    const state: PolicyState = Object.freeze({
      kind: "ready",
      policy: deepFreeze(policy),
      secrets: Object.freeze(Object.assign(Object.create(null) as Record<string, string>, secrets)),
      index: buildPolicyIndex(policy),
    });
    this.swap(state);
    this.log("info", "policy_in_force", {
      version: policy.version,
      previousVersion: previous,
      rules: policy.rules.length,
      hosts: policy.hosts.length,
    });
    return state;
  }

  private setInvalid(reason: string): PolicyState {
    const before = this.state;
    if (before.kind === "invalid" && before.reason === reason) return before;
    const state: PolicyState = Object.freeze({ kind: "invalid", reason });
    this.swap(state);
    this.log("error", "policy_refused", {
      reason,
      previousVersion: before.kind === "ready" ? before.policy.version : null,
    });
    return state;
  }

  private swap(state: PolicyState): void {
    this.state = state;
    try {
      this.options.onChange?.(state);
    } catch (error) {
      this.log("error", "policy_listener_failed", { error: errorName(error) });
    }
  }

  private unreachable(reason: string): PolicyState {
    if (this.reachable) {
      this.reachable = false;
      this.log("warn", "control_plane_unreachable", {
        reason,
        state: this.state.kind,
        version: this.state.kind === "ready" ? this.state.policy.version : null,
      });
    }
    return this.state;
  }

  private markReachable(): void {
    if (!this.reachable) {
      this.reachable = true;
      this.log("info", "control_plane_reachable");
    }
  }
}

/** The body as text, or null when it is longer than `max` bytes. */
async function readBounded(response: Response, max: number): Promise<string | null> {
  const declared = Number(response.headers.get("content-length") ?? "0");
  if (declared > max) {
    await response.body?.cancel();
    return null;
  }
  if (!response.body) return "";
  const reader = response.body.getReader();
  const chunks: Uint8Array[] = [];
  let size = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    size += value.byteLength;
    if (size > max) {
      await reader.cancel();
      return null;
    }
    chunks.push(value);
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** Belt and braces: removes any string found among the raw secret values from a log reason. */
function redact(reason: string, json: unknown): string {
  const secrets = (json as { secrets?: unknown } | null)?.secrets;
  if (typeof secrets !== "object" || secrets === null) return reason;
  let out = reason;
  for (const value of Object.values(secrets)) {
    if (typeof value === "string" && value.length >= 4) out = out.split(value).join("[redacted]");
  }
  return out;
}

function errorName(error: unknown): string {
  if (error instanceof Error) {
    const cause = (error as { cause?: { code?: unknown } }).cause;
    return typeof cause?.code === "string" ? `${error.name} (${cause.code})` : error.name;
  }
  return "unknown error";
}

function deepFreeze<T>(value: T): T {
  if (typeof value === "object" && value !== null && !Object.isFrozen(value)) {
    Object.freeze(value);
    for (const inner of Object.values(value)) deepFreeze(inner);
  }
  return value;
}
