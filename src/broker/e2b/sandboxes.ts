import {
  lastJson,
  pollArgs,
  RunnerStatus,
  runnerAnswer,
  startInlineArgs,
} from "@benchwright/shared/contract/exec-runner";
import { ReinstallResult } from "@benchwright/shared/contract/wiring";
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
import type { z } from "zod";
import { hmacSha256Hex } from "../../crypto/hmac";
import { BackendError } from "../backend";
import {
  BRIDGE_EXEC_ID,
  type E2bEnv,
  KEEPALIVE_EVERY_MS,
  MAX_POLL_WAIT_MS,
  META,
  READY_DEADLINE_MS,
  REINSTALL_DEADLINE_MS,
  RUNNER_DEADLINE_MS,
  SANDBOX_TTL_MS,
  STDIN_CHUNK,
  WORK_PROXY_ADDRESS,
} from "./config";
import { BRIDGE_PORT, egressOf, networkDrift } from "./network";
import { runnerCommand } from "./shell";
import { EXECUTE_USER, reinstallInput } from "./stages";

// The e2b backend's E2B side; its calls are in backend.ts (docs/e2b.md).

export type Meta = Record<string, string>;
interface Held {
  e2bId: string;
  meta: Meta;
  sandbox: Sandbox | null;
  touchedAt: number;
}

// Per isolate: which E2B sandbox each of ours is, and a connected SDK handle. Every call about a
// run goes to that run's broker instance, so its isolate nearly always holds the only copy for
// the run's sandboxes; a miss costs one list and one connect.
export const held = new Map<string, Held>();

/**
 * The backend's E2B side: its SDK errors turned into BackendErrors (never a credential in a
 * message), which E2B sandbox is ours, the runner, the bridge and the network, as the calls of
 * e2bBackend (backend.ts) use them.
 */
export function e2bSandboxes(config: E2bEnv) {
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
  function bridgeToken(proxyId: string): Promise<string> {
    // The label predates the bridge's name; kept, so a run's token is the same across the rename.
    return hmacSha256Hex(config.E2B_API_KEY, `benchwright e2b tunnel v1\0${proxyId}`);
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
      }).catch((e) => {
        // E2B answers 404 to a create only for a template it does not have.
        if (e instanceof SandboxError && e.statusCode === 404) {
          throw new BackendError("not_found", `E2B has no template ${template}`);
        }
        throw e;
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

  /** The values kept out of every error message from now on (the API key always among them). */
  const hide = (values: string[]) => {
    hidden = values;
  };

  return {
    deployment,
    opts,
    cacheKey,
    scrub,
    call,
    findAll,
    resolve,
    attach,
    withSandbox,
    run,
    runner,
    startService,
    runToEnd,
    lastLine,
    workSandbox,
    takeRootAway,
    installRedirect,
    reinstall,
    bridgeToken,
    ensureNetwork,
    proxyOf,
    ensureSandbox,
    asOwner,
    userFor,
    hide,
  };
}
