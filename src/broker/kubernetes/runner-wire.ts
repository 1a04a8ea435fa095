import { z } from "zod";

// The wire contract of the exec runner (proxy-image/src/exec-runner.ts, shipped as
// exec-runner.cjs and copied into every sandbox0 work pod by its init container) and of the
// sandbox0 backend that drives it through Kubernetes execs. Pure zod: workerd loads it too.
//
// A Kubernetes exec lives only as long as its WebSocket, and the broker's callers poll a command
// across alarms (the Durable Object may be evicted in between). So every command is detached:
// `bw-exec start <execId>` reads one RunnerStart line on stdin and starts the command under a
// supervisor that writes its output and exit status to files; each later look is one short exec:
//
//   bw-exec start  <execId>                                   ← RunnerStart line → RunnerStatus
//   bw-exec poll   <execId> <stdoutFrom> <stderrFrom> [waitMs] → RunnerStatus
//   bw-exec kill   <execId>                                   → RunnerStatus
//   bw-exec freeze | thaw                                     → RunnerFreeze
//   bw-exec hold   (the pod's main process: waits for SIGTERM)
//
// Each answer is one JSON line on stdout; a refusal is a RunnerError line with RUNNER_EXIT's code.

/** Where the pod spec puts things (the init container's `bw-init tools` fills /bw/tools). */
export const POD_PATHS = {
  /** Read-only in the work container: node, its libraries, the runner, the wiring program. */
  tools: "/bw/tools",
  /** Writable, the sandbox's uid: the run CA (wiring), exec state (runner). */
  state: "/bw/run",
  runner: "/bw/tools/bin/bw-exec",
  execDir: "/bw/run/exec",
  caDir: "/bw/run/ca",
  caBundle: "/bw/run/ca/bundle.crt",
  home: "/home/bw",
} as const;

export const RUNNER_EXIT = { ok: 0, internal: 1, badRequest: 2, notFound: 3 } as const;

const ExecId = z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "1-64 of A-Z a-z 0-9 _ -");
export const RunnerExecId = ExecId;

export const RunnerStart = z.strictObject({
  argv: z.array(z.string()).min(1),
  env: z.record(z.string(), z.string()),
  cwd: z.string().optional(),
  /** Written to the command's stdin (from a file), which is then at its end. */
  stdin: z.string().optional(),
  /** SIGKILL to the command's session after this long; null: no limit. */
  timeoutMs: z.number().int().min(1).nullable(),
});
export type RunnerStart = z.infer<typeof RunnerStart>;

/** An exec as the runner sees it: ExecInfo without the sandbox id. */
export const RunnerStatus = z.strictObject({
  execId: ExecId,
  state: z.enum(["running", "exited"]),
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  stdoutEnd: z.number().int().min(0),
  stderrEnd: z.number().int().min(0),
});
export type RunnerStatus = z.infer<typeof RunnerStatus>;

export const RunnerFreeze = z.strictObject({
  frozen: z.boolean(),
  /** Processes signalled (SIGSTOP or SIGCONT). */
  signalled: z.number().int().min(0),
});
export type RunnerFreeze = z.infer<typeof RunnerFreeze>;

export const RunnerError = z.strictObject({
  error: z.enum(["not_found", "bad_request", "internal"]),
  detail: z.string(),
});
export type RunnerError = z.infer<typeof RunnerError>;
