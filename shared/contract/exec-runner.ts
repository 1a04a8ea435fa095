import { z } from "zod";
import { ExecInfo } from "./local-agent";

// The wire contract of `bw-exec`, the exec runner (proxy-image/src/exec-runner/exec-runner.ts, shipped as
// exec-runner.cjs) that the sandbox0 backend (Kubernetes pods: copied into each work pod by its
// init container) and the e2b backend (E2B microVMs: in both templates) run every command through.
// Pure zod: workerd loads it too.
//
// Neither transport keeps a command's output for a caller that comes back later (a Kubernetes
// exec lives as long as its WebSocket, E2B's envd streams to whoever is connected), while the
// broker polls across alarms from a Durable Object that may be evicted in between. So every
// command is detached under a supervisor that writes its output and exit status to files, and
// each later look is one short call:
//
//   bw-exec start  <execId>                         ← RunnerStart line        → RunnerStatus
//   bw-exec start  <execId> <timeoutMs|-> <stdinBytes> [--setup] [--pids N] -- <argv...>
//                                                   ← stdin bytes         → RunnerStatus
//   bw-exec poll   <execId> <stdoutFrom> <stderrFrom> [waitMs]                 → RunnerStatus
//   bw-exec kill   <execId>                                                   → RunnerStatus
//   bw-exec freeze | thaw                                                     → RunnerFreeze
//   bw-exec seal   [--sweep] [--dry-run]                                      → RunnerSeal
//   bw-exec hold   (a pod's main process: waits for SIGTERM)
//
// Two forms of start because the transports differ: a Kubernetes exec can set neither env nor cwd
// and cannot close its stdin, so the whole spec travels as one JSON line; envd sets env, cwd and
// user itself, so there the command is in the arguments and stdin is exactly <stdinBytes> bytes.
//
// `--setup` marks a setup-stage command (the E2B backend's root stage): it runs in the setup
// cgroup (cgroup v2, `/sys/fs/cgroup/bw-setup` unless BW_EXEC_SETUP_CGROUP names another), so
// `seal` can kill everything it left behind, double-forked daemons included; after `seal` a
// setup start is refused (`sealed`). `--pids N`: the command and everything it starts run under
// RLIMIT_NPROC N (prlimit), which bounds the processes of its uid (a fork bomb stops there).
//
// Each answer is one JSON line on stdout, exit 0; a refusal is a RunnerError line (and its detail
// on stderr) with RUNNER_EXIT's code for it.

/** The runner's state directory unless BW_EXEC_DIR says otherwise (the E2B templates make it). */
export const EXEC_DIR_DEFAULT = "/var/lib/bw-exec";

/** unsafe: a uid's state directory is not its own private directory (someone planted it). */
export const RUNNER_EXIT = { ok: 0, internal: 1, badRequest: 2, notFound: 3, unsafe: 4, sealed: 5 } as const;

export const RunnerExecId = ExecInfo.shape.execId;

export const RunnerStart = z.strictObject({
  argv: z.array(z.string()).min(1),
  env: z.record(z.string(), z.string()),
  cwd: z.string().optional(),
  /** Written to the command's stdin (from a file), which is then at its end. */
  stdin: z.string().optional(),
  /** SIGKILL to the command's session after this long; null: no limit. */
  timeoutMs: z.number().int().min(1).nullable(),
  /** A setup-stage command (see `--setup` above). */
  setup: z.boolean().optional(),
  /** RLIMIT_NPROC of the command (see `--pids` above). */
  pids: z.number().int().min(1).optional(),
});
export type RunnerStart = z.infer<typeof RunnerStart>;

/** An exec as the runner sees it: ExecInfo without the sandbox id; start adds `created`. */
export const RunnerStatus = z.strictObject({
  ...ExecInfo.omit({ sandboxId: true }).shape,
  /** start only: false when the exec id had been started before (nothing new ran). */
  created: z.boolean().optional(),
});
export type RunnerStatus = z.infer<typeof RunnerStatus>;

export const RunnerFreeze = z.strictObject({
  frozen: z.boolean(),
  /** Processes signalled (SIGSTOP or SIGCONT). */
  signalled: z.number().int().min(0),
});
export type RunnerFreeze = z.infer<typeof RunnerFreeze>;

/**
 * What `seal` did: the setup stage's processes it killed, and how it found them. `cgroup`: the
 * setup cgroup's members (false: there was none, the host has no writable cgroup v2);
 * `sessions`: the sessions of the setup execs still running; `swept`: with --sweep, every other
 * process started since the first setup command that is not the seal call's own ancestry.
 * `already`: sealed before, nothing was killed this time. `candidates`: --dry-run only, the pids
 * the sweep would kill (nothing is killed).
 */
export const RunnerSeal = z.strictObject({
  killed: z.number().int().min(0),
  cgroup: z.boolean(),
  sessions: z.number().int().min(0),
  swept: z.number().int().min(0),
  already: z.boolean(),
  candidates: z.array(z.number().int()).optional(),
});
export type RunnerSeal = z.infer<typeof RunnerSeal>;

export const RunnerError = z.strictObject({
  error: z.enum(["not_found", "bad_request", "unsafe", "internal", "sealed"]),
  detail: z.string(),
});
export type RunnerError = z.infer<typeof RunnerError>;

export const RUNNER_EXIT_OF: Record<RunnerError["error"], number> = {
  not_found: RUNNER_EXIT.notFound,
  bad_request: RUNNER_EXIT.badRequest,
  unsafe: RUNNER_EXIT.unsafe,
  internal: RUNNER_EXIT.internal,
  sealed: RUNNER_EXIT.sealed,
};

// ---- the calls, as argument lists after the program's name ----

/** Start with the spec as one RunnerStart line on stdin. */
export const startArgs = (execId: string) => ["start", execId];

/** Start with the command in the arguments; stdin carries exactly `stdinBytes` bytes. */
export const startInlineArgs = (
  execId: string,
  argv: readonly string[],
  timeoutMs: number | null,
  stdinBytes: number,
  options: { setup?: boolean; pids?: number } = {},
) => [
  "start",
  execId,
  timeoutMs === null ? "-" : String(timeoutMs),
  String(stdinBytes),
  ...(options.setup ? ["--setup"] : []),
  ...(options.pids === undefined ? [] : ["--pids", String(options.pids)]),
  "--",
  ...argv,
];

export const pollArgs = (execId: string, stdoutFrom: number, stderrFrom: number, waitMs: number) => [
  "poll",
  execId,
  String(stdoutFrom),
  String(stderrFrom),
  String(waitMs),
];

export const killArgs = (execId: string) => ["kill", execId];

export const freezeArgs = (frozen: boolean) => [frozen ? "freeze" : "thaw"];

export const sealArgs = (options: { sweep?: boolean; dryRun?: boolean } = {}) => [
  "seal",
  ...(options.sweep ? ["--sweep"] : []),
  ...(options.dryRun ? ["--dry-run"] : []),
];

// ---- the answers ----

/** The last line of a program's stdout, parsed as JSON; null when it is not JSON. */
export function lastJson(stdout: string): unknown {
  const line = stdout.trimEnd().split("\n").at(-1) ?? "";
  try {
    return JSON.parse(line);
  } catch {
    return null;
  }
}

/**
 * One call's answer: its data, the runner's refusal, or neither (the answer is outside this
 * contract: the caller says why in its own terms).
 */
export function runnerAnswer<T>(
  stdout: string,
  exitCode: number | null,
  schema: z.ZodType<T>,
): { ok: true; data: T } | { ok: false; refusal: RunnerError | null } {
  const json = lastJson(stdout);
  const refused = RunnerError.safeParse(json);
  if (refused.success) return { ok: false, refusal: refused.data };
  const parsed = schema.safeParse(json);
  if (exitCode !== 0 || !parsed.success) return { ok: false, refusal: null };
  return { ok: true, data: parsed.data };
}

/** The broker's ExecInfo of a runner status. */
export function toExecInfo(sandboxId: string, status: RunnerStatus): ExecInfo {
  const { created: _created, ...rest } = status;
  return ExecInfo.parse({ ...rest, sandboxId });
}
