import {
  AuthenticationError,
  CommandExitError,
  type CommandResult,
  type ConnectionOpts,
  type SandboxInfo as E2bSandboxInfo,
  InvalidArgumentError,
  NotFoundError,
  RateLimitError,
  Sandbox,
  SandboxError,
  type SandboxNetworkOpts,
  TimeoutError,
} from "e2b";
import { z } from "zod";
import { ARTIFACT_DEFAULTS, BUNDLE_DEFAULTS, UNPACK_EXIT, UnpackResult } from "../contract/bundle";
import {
  killArgs,
  lastJson,
  pollArgs,
  RunnerSeal,
  RunnerStatus,
  runnerAnswer,
  sealArgs,
  startInlineArgs,
  toExecInfo,
} from "../contract/exec-runner";
import {
  type ExecInfo,
  ExecRequest,
  type SandboxInfo,
  SandboxKind,
  Seal,
  type SealResult,
} from "../contract/local-agent";
import type { RoutingMode } from "../contract/policy";
import { ReinstallResult } from "../contract/wiring";
import { BackendError, type ComputeBackend, type ExecPoll, type SandboxSpec } from "./backend";
import { BRIDGE_PORT, egressOf, networkDrift, proxyNetwork, workNetwork } from "./e2b/network";
import { runnerCommand } from "./e2b/shell";
import {
  collectArgv,
  EXECUTE_USER,
  reinstallInput,
  resourcesMisfit,
  TRANSFER_DIR,
  unpackArgv,
} from "./e2b/stages";

// The `e2b` backend: one E2B microVM per sandbox, through E2B's `e2b` SDK, from the SandboxBroker
// Durable Object (the SDK runs in workerd with nodejs_compat). docs/e2b.md says what it makes,
// what it guarantees and how to set it up; in short:
//
// - proxy sandbox: the proxy template, public traffic off; `bw-bridge serve` is started in it at
//   create, the only way in for the run's work sandboxes. The proxy process (`bw-proxy`) gets the
//   run's proxy credentials as that one process's environment, never as sandbox settings.
// - work/task/orchestrator: the work template, public traffic off; catch-all routing is E2B's
//   firewall (deny everything but the proxy's bridge host), checked after create. In each, the
//   backend starts `bw-bridge connect` (root) so that 127.0.0.1:443/80 lead to the proxy, and
//   under catch-all installs the redirect of every 80/443 connection to it. Setup-stage execs
//   run as root, execute-stage ones as `user`, who must not be able to become root (checked).
// - the two stages (e2b/stages.ts): setup-stage commands run in the runner's setup cgroup, and
//   seal kills all they left, takes root away again and writes the wiring again from the
//   control plane's copy; bundles go in and artifacts come out through envd's files API, as
//   `user`. A run's resources must fit the template's size; its pids bound every execute command.
// - every exec goes through the templates' runner `bw-exec`, which keeps output and exit status
//   in the sandbox (E2B keeps none) and makes a start idempotent by its exec id.
// - freeze is E2B's pause (memory kept) and connect (resume); destroy is kill; list is by
//   metadata. Sandboxes time out into pause, never into loss.

const setting = (name: string) => z.string({ error: `${name} is not set` }).min(1, `${name} is not set`);
const optionalUrl = (name: string) =>
  z
    .union([z.literal(""), z.url({ protocol: /^https?$/, error: `${name} is not an http(s) URL` })])
    .optional();

export const E2bEnv = z.object({
  E2B_API_KEY: setting("E2B_API_KEY").min(16, "E2B_API_KEY is too short"),
  // The proxy sandbox reaches the control plane there, over the internet.
  PUBLIC_URL: z.url({ protocol: /^https$/, error: "PUBLIC_URL is not an https URL" }),
  E2B_PROXY_TEMPLATE: setting("E2B_PROXY_TEMPLATE"),
  E2B_WORK_TEMPLATE: setting("E2B_WORK_TEMPLATE"),
  /** Empty: E2B's cloud (https://api.<domain>). */
  E2B_API_URL: optionalUrl("E2B_API_URL"),
  E2B_DOMAIN: z
    .union([z.literal(""), z.string().regex(/^[a-z0-9.-]+$/, "E2B_DOMAIN is not a domain")])
    .optional(),
  /** envd's address, for a self-hosted E2B or a contract server (the SDK's `sandboxUrl`). */
  E2B_SANDBOX_URL: optionalUrl("E2B_SANDBOX_URL"),
});
export type E2bEnv = z.infer<typeof E2bEnv>;

/** The e2b backend from the Worker's env; the reason it is not configured otherwise. */
export function e2bFromEnv(
  env: Record<
    "PUBLIC_URL" | "E2B_PROXY_TEMPLATE" | "E2B_WORK_TEMPLATE" | "E2B_API_URL" | "E2B_DOMAIN",
    unknown
  > & {
    E2B_API_KEY?: unknown;
    E2B_SANDBOX_URL?: unknown;
  },
): ComputeBackend | string {
  const parsed = E2bEnv.safeParse(env);
  if (!parsed.success) return [...new Set(parsed.error.issues.map((i) => i.message))].join("; ");
  return e2bBackend(parsed.data);
}

/** Metadata on every sandbox: how list() maps E2B's sandboxes back, and whose they are. */
export const META = {
  /** This deployment (PUBLIC_URL's origin): another deployment on the same E2B team is not ours. */
  deployment: "bw-deployment",
  run: "bw-run",
  kind: "bw-kind",
  sandbox: "bw-sandbox",
  /** work/task/orchestrator: the run's proxy sandbox and the routing they were made with. */
  proxy: "bw-proxy",
  routing: "bw-routing",
  /** work/task/orchestrator made with resources: RLIMIT_NPROC of its execute commands. */
  pids: "bw-pids",
} as const;

/** A sandbox's life at a time; it is extended while the run uses it, and it pauses when it ends. */
export const SANDBOX_TTL_MS = 60 * 60_000;
const KEEPALIVE_EVERY_MS = 5 * 60_000;
const MAX_POLL_WAIT_MS = 5_000;
/** Longest a runner call may take beyond its own wait (envd's stream deadline). */
const RUNNER_DEADLINE_MS = 30_000;
const READY_DEADLINE_MS = 15_000;
/** Longest an unpack or a collect may take in the sandbox. */
const TRANSFER_DEADLINE_MS = 10 * 60_000;
/** Longest the wiring's rewrite may take. */
const REINSTALL_DEADLINE_MS = 60_000;
const STDIN_CHUNK = 256 * 1024;
/** The bridge's local end in a work sandbox: what the hosts file and the redirect point at. */
export const WORK_PROXY_ADDRESS = "127.0.0.1";
/** The runner's exec id for the bridge in each sandbox (one per sandbox, idempotent). */
export const BRIDGE_EXEC_ID = "bw-bridge";

type Meta = Record<string, string>;
interface Held {
  e2bId: string;
  meta: Meta;
  sandbox: Sandbox | null;
  touchedAt: number;
}

// Per isolate: which E2B sandbox each of ours is, and a connected SDK handle. The broker is one
// Durable Object, so this is nearly always the only copy; a miss costs one list and one connect.
const held = new Map<string, Held>();

export function e2bBackend(config: E2bEnv): ComputeBackend {
  const deployment = new URL(config.PUBLIC_URL).origin;
  const opts: ConnectionOpts = {
    apiKey: config.E2B_API_KEY,
    ...(config.E2B_API_URL ? { apiUrl: config.E2B_API_URL } : {}),
    ...(config.E2B_DOMAIN ? { domain: config.E2B_DOMAIN } : {}),
    ...(config.E2B_SANDBOX_URL ? { sandboxUrl: config.E2B_SANDBOX_URL } : {}),
    requestTimeoutMs: 30_000,
  };
  const cacheKey = (id: string) => `${config.E2B_API_URL ?? ""}|${deployment}|${id}`;

  // ---- errors: never a credential in a message ----

  let hidden: string[] = [config.E2B_API_KEY];
  function scrub(text: string): string {
    let out = text;
    for (const h of hidden) if (h.length >= 8) out = out.replaceAll(h, "[redacted]");
    return out.length > 300 ? `${out.slice(0, 300)}…` : out;
  }
  function asBackendError(e: unknown, what: string): BackendError {
    if (e instanceof BackendError) return e;
    const said = e instanceof Error ? scrub(e.message) : "unknown error";
    if (e instanceof NotFoundError) return new BackendError("not_found", `E2B: ${what}: not found`);
    if (e instanceof AuthenticationError)
      return new BackendError("backend_error", `E2B refused the API key (${what})`);
    if (e instanceof RateLimitError)
      return new BackendError("backend_busy", `E2B: ${what}: rate limited`, true);
    if (e instanceof TimeoutError)
      return new BackendError("backend_unreachable", `E2B: ${what}: ${said}`, true);
    if (e instanceof InvalidArgumentError)
      return new BackendError("invalid_request", `E2B: ${what}: ${said}`);
    if (e instanceof SandboxError && (e.statusCode ?? 500) < 500) {
      return new BackendError("sandbox_failed", `E2B: ${what}: ${said}`);
    }
    if (e instanceof TypeError)
      return new BackendError("backend_unreachable", `E2B does not answer (${what})`, true);
    return new BackendError("backend_error", `E2B: ${what}: ${said}`, true);
  }
  async function call<T>(what: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      throw asBackendError(e, what);
    }
  }

  // ---- which E2B sandbox is ours ----

  async function findAll(id: string): Promise<E2bSandboxInfo[]> {
    const pages = Sandbox.list({
      ...opts,
      query: { metadata: { [META.deployment]: deployment, [META.sandbox]: id } },
      limit: 100,
    });
    const found: E2bSandboxInfo[] = [];
    while (pages.hasNext) found.push(...(await pages.nextItems()));
    return found;
  }

  async function resolve(id: string): Promise<Held> {
    const known = held.get(cacheKey(id));
    if (known) return known;
    const found = await call("find the sandbox", () => findAll(id));
    const pick = found.find((s) => s.state === "running") ?? found[0];
    if (!pick) throw new BackendError("not_found", `no sandbox ${id}`);
    const h: Held = { e2bId: pick.sandboxId, meta: pick.metadata, sandbox: null, touchedAt: 0 };
    held.set(cacheKey(id), h);
    return h;
  }

  /** A connected handle; connecting resumes a paused sandbox and extends its life. */
  async function attach(id: string): Promise<Held & { sandbox: Sandbox }> {
    const h = await resolve(id);
    if (!h.sandbox) {
      h.sandbox = await call("connect to the sandbox", () =>
        Sandbox.connect(h.e2bId, { ...opts, timeoutMs: SANDBOX_TTL_MS }),
      );
      h.touchedAt = Date.now();
    }
    return h as Held & { sandbox: Sandbox };
  }

  /** Runs fn on the sandbox; once more on a fresh connection if the old one found it paused or gone. */
  async function withSandbox<T>(id: string, fn: (s: Sandbox, h: Held) => Promise<T>): Promise<T> {
    const h = await attach(id);
    try {
      return await fn(h.sandbox, h);
    } catch (e) {
      if (!(e instanceof TimeoutError || e instanceof NotFoundError)) throw e;
      held.delete(cacheKey(id));
      const again = await attach(id);
      return fn(again.sandbox, again);
    }
  }

  /** Extends the life of a sandbox in use, and of its run's proxy (best effort, now and then). */
  async function keepAlive(h: Held): Promise<void> {
    if (Date.now() - h.touchedAt < KEEPALIVE_EVERY_MS) return;
    h.touchedAt = Date.now();
    const ids = [h.e2bId];
    const proxy = h.meta[META.proxy];
    if (proxy) ids.push((await resolve(proxy).catch(() => null))?.e2bId ?? "");
    for (const e2bId of ids.filter(Boolean)) {
      await Sandbox.setTimeout(e2bId, SANDBOX_TTL_MS, opts).catch(() => {});
    }
  }

  // ---- commands ----

  async function run(
    sandbox: Sandbox,
    command: string,
    o: { user: string; envs?: Record<string, string>; cwd?: string; stdin?: Uint8Array; timeoutMs: number },
  ): Promise<CommandResult> {
    const base = {
      user: o.user,
      timeoutMs: o.timeoutMs,
      ...(o.envs && Object.keys(o.envs).length > 0 ? { envs: o.envs } : {}),
      ...(o.cwd === undefined ? {} : { cwd: o.cwd }),
    };
    try {
      if (!o.stdin || o.stdin.length === 0) return await sandbox.commands.run(command, base);
      const handle = await sandbox.commands.run(command, { ...base, background: true, stdin: true });
      let sendFailed: unknown = null;
      try {
        for (let at = 0; at < o.stdin.length; at += STDIN_CHUNK) {
          await handle.sendStdin(o.stdin.subarray(at, at + STDIN_CHUNK));
        }
      } catch (e) {
        // An exec that already exists ends without reading its stdin: its answer says so.
        sendFailed = e;
      }
      const result = await handle.wait().catch((e: unknown) => {
        if (e instanceof CommandExitError) return e;
        throw e;
      });
      if (sendFailed !== null && result.exitCode !== 0) throw sendFailed;
      return result;
    } catch (e) {
      if (e instanceof CommandExitError) return e;
      throw e;
    }
  }

  /** One bw-exec call; its answer (a RunnerStatus unless told), or the backend's reason it has none. */
  async function runner<T = RunnerStatus>(
    id: string,
    command: string,
    what: string,
    o: { user: string; envs?: Record<string, string>; cwd?: string; stdin?: Uint8Array; waitMs?: number },
    schema: z.ZodType<T> = RunnerStatus as unknown as z.ZodType<T>,
  ): Promise<T> {
    const result = await call(what, () =>
      withSandbox(id, async (sandbox, h) => {
        const r = await run(sandbox, command, { ...o, timeoutMs: RUNNER_DEADLINE_MS + (o.waitMs ?? 0) });
        await keepAlive(h);
        return r;
      }),
    );
    const answer = runnerAnswer(result.stdout, result.exitCode, schema);
    if (!answer.ok && answer.refusal?.error === "not_found")
      throw new BackendError("not_found", `sandbox ${id}: ${what}: no such exec`);
    if (!answer.ok && answer.refusal?.error === "sealed")
      throw new BackendError("sealed", `sandbox ${id}: ${what}: the setup stage has ended (sealed)`);
    if (!answer.ok) {
      const why = result.stderr.trim().split("\n").at(-1) ?? "";
      throw new BackendError(
        "sandbox_failed",
        `sandbox ${id}: ${what}: the exec runner answered exit ${result.exitCode}${why ? `: ${scrub(why)}` : ""}`,
      );
    }
    return answer.data;
  }

  /** Starts a long-running program (the bridge) under the runner and waits for its first line. */
  async function startService(
    id: string,
    argv: string[],
    envs: Record<string, string>,
    user: string,
    what: string,
  ) {
    const started = await runner(id, runnerCommand(startInlineArgs(BRIDGE_EXEC_ID, argv, null, 0)), what, {
      user,
      envs,
    });
    let status = started;
    const deadline = Date.now() + READY_DEADLINE_MS;
    while (!status.stdout.includes('"listening"')) {
      if (status.state === "exited") {
        const why = status.stderr.trim().split("\n").at(-1) ?? `exit ${status.exitCode}`;
        throw new BackendError("sandbox_failed", `sandbox ${id}: ${what}: it ended: ${scrub(why)}`);
      }
      if (Date.now() >= deadline)
        throw new BackendError("sandbox_starting", `sandbox ${id}: ${what}: not ready`, true);
      status = await runner(id, runnerCommand(pollArgs(BRIDGE_EXEC_ID, 0, 0, 1_000)), what, {
        user: "root",
        waitMs: 1_000,
      });
    }
  }

  /**
   * A command of the backend's own under the runner, to its end: its whole output (the runner
   * keeps the last MiB of each stream; these print a line or two) and how it ended.
   */
  async function runToEnd(
    id: string,
    argv: string[],
    what: string,
    o: { user: string; stdin?: Uint8Array; deadlineMs: number },
  ): Promise<RunnerStatus> {
    const execId = `bw_${crypto.randomUUID().replaceAll("-", "")}`;
    const stdin = o.stdin ?? new Uint8Array();
    let status = await runner(
      id,
      runnerCommand(startInlineArgs(execId, argv, o.deadlineMs, stdin.length)),
      what,
      {
        user: o.user,
        stdin,
      },
    );
    let { stdout, stderr } = status;
    const deadline = Date.now() + o.deadlineMs + RUNNER_DEADLINE_MS;
    while (status.state !== "exited") {
      if (Date.now() >= deadline)
        throw new BackendError("sandbox_failed", `sandbox ${id}: ${what}: it did not end`);
      status = await runner(
        id,
        runnerCommand(pollArgs(execId, status.stdoutEnd, status.stderrEnd, MAX_POLL_WAIT_MS)),
        what,
        { user: o.user, waitMs: MAX_POLL_WAIT_MS },
      );
      stdout += status.stdout;
      stderr += status.stderr;
    }
    return { ...status, stdout, stderr };
  }

  const lastLine = (text: string) => text.trim().split("\n").at(-1) ?? "";

  /** A work sandbox of ours, with its metadata (not a proxy: it has no stages). */
  async function workSandbox(id: string, what: string): Promise<Held> {
    const h = await resolve(id);
    if (h.meta[META.kind] === "proxy") {
      throw new BackendError(
        "invalid_request",
        `sandbox ${id} is a proxy sandbox: ${what} is for work sandboxes`,
      );
    }
    return h;
  }

  /** Takes every way to root away from the execute user, then checks it as that user. */
  async function takeRootAway(id: string): Promise<void> {
    const drop = await call("take root away from the execute user", () =>
      withSandbox(id, (s) => run(s, "bw-drop-root", { user: "root", timeoutMs: RUNNER_DEADLINE_MS })),
    );
    const check =
      drop.exitCode !== 0
        ? drop
        : await call("check the execute user", () =>
            withSandbox(id, (s) =>
              run(s, "bw-check-user", { user: EXECUTE_USER, timeoutMs: RUNNER_DEADLINE_MS }),
            ),
          );
    if (check.exitCode !== 0) {
      throw new BackendError(
        "cannot_isolate",
        `the work template lets its execute user become root (${scrub(check.stdout.trim() || check.stderr.trim())}); rebuild it from proxy-image/e2b-work.Dockerfile`,
      );
    }
  }

  /** catch-all: every 80/443 connection of anyone but root to the bridge's local end. */
  async function installRedirect(id: string): Promise<void> {
    const redirect = await call("install the redirect", () =>
      withSandbox(id, (s) => run(s, "bw-redirect", { user: "root", timeoutMs: RUNNER_DEADLINE_MS })),
    );
    if (redirect.exitCode !== 0) {
      throw new BackendError(
        "redirect_not_installed",
        `the catch-all redirect could not be installed: ${scrub(lastLine(redirect.stderr))}`,
      );
    }
  }

  /** `bw-wiring reinstall` as root: the wiring's files written from the control plane's copy. */
  async function reinstall(
    id: string,
    seal: Parameters<typeof reinstallInput>[0],
    what: string,
  ): Promise<void> {
    const input = new TextEncoder().encode(JSON.stringify(reinstallInput(seal, WORK_PROXY_ADDRESS)));
    const done = await runToEnd(id, ["bw-wiring", "reinstall"], what, {
      user: "root",
      stdin: input,
      deadlineMs: REINSTALL_DEADLINE_MS,
    });
    const result = ReinstallResult.safeParse(lastJson(done.stdout));
    if (done.exitCode !== 0 || !result.success || !result.data.ok) {
      const why =
        (result.success ? result.data.error : null) ?? lastLine(done.stderr) ?? `exit ${done.exitCode}`;
      throw new BackendError(
        "sandbox_failed",
        `sandbox ${id}: ${what}: ${scrub(why || `exit ${done.exitCode}`)}`,
      );
    }
  }

  /** The bridge token of a run's proxy: HMAC of its id under the API key, so no state keeps it. */
  async function bridgeToken(proxyId: string): Promise<string> {
    const key = await crypto.subtle.importKey(
      "raw",
      new TextEncoder().encode(config.E2B_API_KEY),
      { name: "HMAC", hash: "SHA-256" },
      false,
      ["sign"],
    );
    const mac = await crypto.subtle.sign(
      "HMAC",
      key,
      // The label predates the bridge's name; kept, so a run's token is the same across the rename.
      new TextEncoder().encode(`benchwright e2b tunnel v1\0${proxyId}`),
    );
    return [...new Uint8Array(mac)].map((b) => b.toString(16).padStart(2, "0")).join("");
  }

  /** The settings E2B holds are the ones asked for, made so (one whole update) if they are not. */
  async function ensureNetwork(
    id: string,
    e2bId: string,
    wanted: SandboxNetworkOpts,
  ): Promise<E2bSandboxInfo> {
    const heldNow = await call("read the sandbox's network", () => Sandbox.getInfo(e2bId, opts));
    if (networkDrift(wanted, heldNow.network).length === 0) return heldNow;
    // The update replaces the whole egress configuration: it is always sent whole.
    await call("set the sandbox's network", () => Sandbox.updateNetwork(e2bId, egressOf(wanted), opts));
    const after = await call("read the sandbox's network", () => Sandbox.getInfo(e2bId, opts));
    const drift = networkDrift(wanted, after.network);
    if (drift.length > 0) {
      throw new BackendError(
        "cannot_isolate",
        `E2B does not hold the network settings sandbox ${id} needs (${drift.join("; ")})`,
      );
    }
    return after;
  }

  /** null instead of not_found; every other failure stays what it is (a retry may help). */
  const resolveOrNull = (id: string) =>
    resolve(id).catch((e: unknown) => {
      if (e instanceof BackendError && e.code === "not_found") return null;
      throw e;
    });

  async function proxyOf(spec: { runId: string; proxySandboxId: string }) {
    const p = await resolveOrNull(spec.proxySandboxId);
    if (!p || p.meta[META.run] !== spec.runId || p.meta[META.kind] !== "proxy") {
      throw new BackendError("not_found", `run ${spec.runId} has no proxy sandbox ${spec.proxySandboxId}`);
    }
    const proxy = await attach(spec.proxySandboxId);
    return { proxy, host: proxy.sandbox.getHost(BRIDGE_PORT) };
  }

  /** Our sandbox `id` on E2B: the one already there (an earlier, interrupted create), or a new one. */
  async function ensureSandbox(id: string, template: string, meta: Meta, network: SandboxNetworkOpts) {
    if (await resolveOrNull(id)) return attach(id);
    const sandbox = await call("create the sandbox", () =>
      Sandbox.create(template, {
        ...opts,
        metadata: meta,
        network,
        timeoutMs: SANDBOX_TTL_MS,
        // Out of time, a sandbox pauses (kept, resumable) rather than vanishing mid-run.
        lifecycle: { onTimeout: "pause" },
      }),
    );
    const h: Held & { sandbox: Sandbox } = { e2bId: sandbox.sandboxId, meta, sandbox, touchedAt: Date.now() };
    held.set(cacheKey(id), h);
    return h;
  }

  /**
   * A runner call about an exec, as the execute user first (every execute command is theirs, and
   * after seal nothing the backend runs for them needs root), then as root (a setup command).
   */
  async function asOwner<T>(id: string, fn: (user: string) => Promise<T>): Promise<T> {
    const kind = (await resolve(id)).meta[META.kind];
    if (kind === "proxy") return fn(EXECUTE_USER);
    try {
      return await fn(EXECUTE_USER);
    } catch (e) {
      if (!(e instanceof BackendError && e.code === "not_found")) throw e;
      return fn("root");
    }
  }

  function userFor(kind: string, stage: "setup" | "execute"): string {
    // The proxy runs unprivileged; a work sandbox's setup stage is root, its execute stage never.
    if (kind === "proxy") return "user";
    return stage === "setup" ? "root" : "user";
  }

  return {
    name: "e2b",

    async create(spec: SandboxSpec): Promise<SandboxInfo> {
      const meta: Meta = {
        [META.deployment]: deployment,
        [META.run]: spec.runId,
        [META.kind]: spec.kind,
        [META.sandbox]: spec.id,
      };
      if (spec.kind === "proxy") {
        const network = proxyNetwork();
        const h = await ensureSandbox(spec.id, config.E2B_PROXY_TEMPLATE, meta, network);
        const info = await call("read the sandbox", () => Sandbox.getInfo(h.e2bId, opts));
        const drift = networkDrift(network, info.network);
        if (drift.length > 0) {
          throw new BackendError(
            "cannot_isolate",
            `E2B does not keep the proxy sandbox private (${drift.join("; ")})`,
          );
        }
        const token = await bridgeToken(spec.id);
        hidden = [config.E2B_API_KEY, token];
        await startService(
          spec.id,
          ["bw-bridge", "serve"],
          { BW_BRIDGE_TOKEN: token, BW_BRIDGE_PORT: String(BRIDGE_PORT) },
          "user",
          "start the bridge's proxy end",
        );
        return {
          id: spec.id,
          runId: spec.runId,
          kind: "proxy",
          state: "ready",
          address: h.e2bId,
          proxyAddress: null,
          controlPlaneUrl: config.PUBLIC_URL,
          routing: null,
          probeTarget: null,
          wiring: null,
        };
      }

      const { proxy, host } = await proxyOf(spec);
      const network = workNetwork(spec.routing, host);
      const h = await ensureSandbox(
        spec.id,
        config.E2B_WORK_TEMPLATE,
        {
          ...meta,
          [META.proxy]: spec.proxySandboxId,
          [META.routing]: spec.routing,
          ...(spec.resources ? { [META.pids]: String(spec.resources.pids) } : {}),
        },
        network,
      );
      const made = await ensureNetwork(spec.id, h.e2bId, network);
      // E2B sizes a sandbox by its template: a run that needs more is refused, not shrunk.
      const misfit = spec.resources ? resourcesMisfit(spec.resources, made, config.E2B_WORK_TEMPLATE) : null;
      if (misfit) throw new BackendError("resources_unavailable", misfit);
      // The execute stage's user must not become root: root could undo the hosts file. E2B's
      // template build gives `user` sudo after the Dockerfile ran, so it is taken away here, in
      // each sandbox, then checked as that user.
      await takeRootAway(spec.id);
      // The working directory of every backend ($BW_OUT is under it), the execute user's.
      const workdir = await call("make the working directory", () =>
        withSandbox(spec.id, (s) => run(s, "bw-workdir", { user: "root", timeoutMs: RUNNER_DEADLINE_MS })),
      );
      if (workdir.exitCode !== 0) {
        throw new BackendError(
          "sandbox_failed",
          `the working directory could not be made: ${scrub(lastLine(workdir.stderr))}`,
        );
      }
      const token = await bridgeToken(spec.proxySandboxId);
      const edge = proxy.sandbox.trafficAccessToken ?? "";
      hidden = [config.E2B_API_KEY, token, edge];
      await startService(
        spec.id,
        ["bw-bridge", "connect"],
        {
          BW_BRIDGE_URL: `https://${host}`,
          BW_BRIDGE_TOKEN: token,
          ...(edge ? { BW_BRIDGE_EDGE_TOKEN: edge } : {}),
          BW_BRIDGE_LISTEN: WORK_PROXY_ADDRESS,
        },
        "root",
        "start the bridge to the proxy",
      );
      if (spec.routing === "catch-all") await installRedirect(spec.id);
      return {
        id: spec.id,
        runId: spec.runId,
        kind: spec.kind,
        state: "ready",
        address: h.e2bId,
        proxyAddress: WORK_PROXY_ADDRESS,
        controlPlaneUrl: null,
        routing: spec.routing,
        // E2B's firewall accepts a blocked connection before it drops it, so a direct-connect
        // probe cannot tell; catch-all is proved by E2B's own report instead (ensureNetwork).
        probeTarget: null,
        wiring: null,
      };
    },

    async exec(sandboxId: string, input: ExecRequest): Promise<ExecInfo> {
      const parsed = ExecRequest.safeParse(input);
      if (!parsed.success)
        throw new BackendError("invalid_request", "the exec request is outside its contract");
      const request = parsed.data;
      const execId = request.id ?? `x_${crypto.randomUUID().replaceAll("-", "")}`;
      const h = await resolve(sandboxId);
      const kind = h.meta[META.kind] ?? "";
      let envs = request.env;
      if (kind === "proxy" && request.argv[0] === "bw-proxy") {
        // Where the control plane is, and listeners on loopback only: the bridge is the way in.
        envs = { ...envs, BW_CONTROL_PLANE_URL: config.PUBLIC_URL, BW_LISTEN_HOST: "127.0.0.1" };
      }
      hidden = [config.E2B_API_KEY, ...Object.values(request.env)];
      const stdin = new TextEncoder().encode(request.stdin ?? "");
      // A work sandbox's setup commands go into the setup cgroup (seal kills what they leave);
      // its execute commands run under the run's pids limit.
      const pids = Number(h.meta[META.pids] ?? Number.NaN);
      const stageOptions =
        kind === "proxy"
          ? {}
          : request.stage === "setup"
            ? { setup: true }
            : Number.isInteger(pids)
              ? { pids }
              : {};
      const status = await runner(
        sandboxId,
        runnerCommand(startInlineArgs(execId, request.argv, request.timeoutMs, stdin.length, stageOptions)),
        `start ${request.argv[0]}`,
        {
          user: userFor(kind, request.stage),
          envs,
          ...(request.cwd === undefined ? {} : { cwd: request.cwd }),
          stdin,
        },
      );
      return toExecInfo(sandboxId, status);
    },

    async poll(sandboxId: string, execId: string, poll: ExecPoll): Promise<ExecInfo> {
      const waitMs = Math.min(Math.max(poll.waitMs ?? 0, 0), MAX_POLL_WAIT_MS);
      const command = runnerCommand(pollArgs(execId, poll.stdoutFrom ?? 0, poll.stderrFrom ?? 0, waitMs));
      const status = await asOwner(sandboxId, (user) =>
        runner(sandboxId, command, "poll the command", { user, waitMs }),
      );
      return toExecInfo(sandboxId, status);
    },

    async kill(sandboxId: string, execId: string): Promise<ExecInfo> {
      const command = runnerCommand(killArgs(execId));
      const status = await asOwner(sandboxId, (user) =>
        runner(sandboxId, command, "kill the command", { user }),
      );
      return toExecInfo(sandboxId, status);
    },

    async destroy(sandboxId: string): Promise<void> {
      held.delete(cacheKey(sandboxId));
      const found = await call("find the sandbox", () => findAll(sandboxId));
      for (const s of found) {
        await call("kill the sandbox", () => Sandbox.kill(s.sandboxId, opts)); // false: already gone
      }
    },

    async freeze(sandboxId: string, frozen: boolean): Promise<void> {
      const h = await resolve(sandboxId);
      if (frozen) {
        // A pause keeps memory: processes continue where they were on resume.
        await call("pause the sandbox", () => Sandbox.pause(h.e2bId, opts)); // false: already paused
        h.sandbox = null;
        return;
      }
      const proxyId = h.meta[META.proxy];
      const routing = h.meta[META.routing] as RoutingMode | undefined;
      // A work sandbox's network is its proxy: that one runs first (it may have timed out into pause).
      const proxy = proxyId
        ? await proxyOf({ runId: h.meta[META.run] ?? "", proxySandboxId: proxyId })
        : null;
      h.sandbox = null;
      await attach(sandboxId); // connect: resumes
      if (proxy && routing) {
        try {
          await ensureNetwork(sandboxId, h.e2bId, workNetwork(routing, proxy.host));
        } catch (e) {
          // Never leave it running outside its boundary.
          await Sandbox.pause(h.e2bId, opts).catch(() => {});
          h.sandbox = null;
          throw e;
        }
      }
    },

    async list() {
      const pages = Sandbox.list({
        ...opts,
        query: { metadata: { [META.deployment]: deployment } },
        limit: 100,
      });
      const all: E2bSandboxInfo[] = [];
      while (pages.hasNext) all.push(...(await call("list the sandboxes", () => pages.nextItems())));
      const seen = new Map<string, { id: string; runId: string; kind: SandboxKind }>();
      for (const s of all) {
        const id = s.metadata[META.sandbox];
        const runId = s.metadata[META.run];
        const kind = SandboxKind.safeParse(s.metadata[META.kind]);
        if (!id || !runId || !kind.success) continue;
        if (!seen.has(id)) seen.set(id, { id, runId, kind: kind.data });
      }
      return [...seen.values()];
    },

    async putBundle(sandboxId: string, bundle: ReadableStream<Uint8Array>, dir: string) {
      await workSandbox(sandboxId, "a bundle");
      // Written by envd's files API as the execute user, into its home; unpacked by bw-unpack as
      // that user (it re-checks every entry); removed either way.
      const file = `${TRANSFER_DIR}/bundle-${crypto.randomUUID()}.tar.gz`;
      await call("write the bundle into the sandbox", () =>
        withSandbox(sandboxId, (s) =>
          s.files.write(file, bundle, { user: EXECUTE_USER, requestTimeoutMs: TRANSFER_DEADLINE_MS }),
        ),
      );
      const bounds = { maxBytes: BUNDLE_DEFAULTS.maxUnpackedBytes, maxFiles: BUNDLE_DEFAULTS.maxFiles };
      const done = await runToEnd(sandboxId, unpackArgv(dir, file, bounds), "unpack the bundle", {
        user: EXECUTE_USER,
        deadlineMs: TRANSFER_DEADLINE_MS,
      });
      const result = UnpackResult.safeParse(lastJson(done.stdout));
      const expected =
        done.exitCode === UNPACK_EXIT.ok ? true : done.exitCode === UNPACK_EXIT.refused ? false : null;
      if (!result.success || expected === null || result.data.ok !== expected) {
        const why = lastLine(done.stderr) || `exit ${done.exitCode ?? done.signal}`;
        throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: bw-unpack: ${scrub(why)}`);
      }
      return result.data;
    },

    async seal(sandboxId: string, input: Seal): Promise<SealResult> {
      const parsed = Seal.safeParse(input);
      if (!parsed.success) throw new BackendError("invalid_request", "the seal is outside its contract");
      const seal = parsed.data;
      const h = await workSandbox(sandboxId, "seal");
      if (seal.caCertPem === null) {
        throw new BackendError(
          "invalid_request",
          "an E2B work sandbox always has its run's proxy: seal needs its CA",
        );
      }
      if (seal.routing !== h.meta[META.routing]) {
        throw new BackendError(
          "invalid_request",
          `sandbox ${sandboxId} was made for ${h.meta[META.routing]} routing`,
        );
      }
      // 1. What the setup stage left running dies: the setup cgroup, the setup execs' sessions,
      // and every process started since the first setup command (the sweep). Setup starts are
      // refused from now on.
      const sealed = await runner(
        sandboxId,
        runnerCommand(sealArgs({ sweep: true })),
        "end the setup stage",
        { user: "root" },
        RunnerSeal,
      );
      // 2. Root may have given the execute user a way back: take it away again, and check.
      await takeRootAway(sandboxId);
      // 3. The routing and the wiring's files again, from the control plane's copy.
      if (seal.routing === "catch-all") await installRedirect(sandboxId);
      await reinstall(sandboxId, seal, "write the wiring again");
      return { killed: sealed.killed };
    },

    async setHosts(sandboxId: string, hostsFile: string[]): Promise<void> {
      const h = await workSandbox(sandboxId, "setHosts");
      // Under catch-all the redirect takes every host: the hosts block names only the platform's.
      if (h.meta[META.routing] !== "default") return;
      await reinstall(
        sandboxId,
        { routing: "default", hostsFile, caCertPem: null },
        "rewrite the hosts file",
      );
    },

    async collect(sandboxId: string, options: { dir: string; maxBytes: number; maxFiles: number }) {
      await workSandbox(sandboxId, "collect");
      const name = `collect-${crypto.randomUUID()}.tar.gz`;
      const bounds = {
        maxBytes: Math.min(options.maxBytes, ARTIFACT_DEFAULTS.maxBytes),
        maxFiles: Math.min(options.maxFiles, ARTIFACT_DEFAULTS.maxFiles),
      };
      const done = await runToEnd(
        sandboxId,
        collectArgv(options.dir, name, bounds),
        "collect the artifacts",
        {
          user: EXECUTE_USER,
          deadlineMs: TRANSFER_DEADLINE_MS,
        },
      );
      if (done.exitCode !== 0) {
        const why = lastLine(done.stderr) || `exit ${done.exitCode ?? done.signal}`;
        throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: bw-collect: ${scrub(why)}`);
      }
      // Read back as the execute user: the archive is that user's, and nothing more is readable.
      return call("read the artifacts", () =>
        withSandbox(sandboxId, (s) =>
          s.files.read(`${TRANSFER_DIR}/${name}`, {
            format: "stream",
            user: EXECUTE_USER,
            requestTimeoutMs: TRANSFER_DEADLINE_MS,
          }),
        ),
      );
    },
  };
}
