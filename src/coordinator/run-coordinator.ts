import { DurableObject } from "cloudflare:workers";
import type { ExecInfo } from "@benchwright/shared/contract/local-agent";
import { consoleLog, levelOf } from "@benchwright/shared/contract/log";
import { ProxyView } from "@benchwright/shared/contract/proxy-view";
import { type RunSpec, readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { WiringProof } from "@benchwright/shared/contract/wiring";
import { eq, sql } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { BackendError } from "../broker/backend";
import { backendForLaunch } from "../broker/backends";
import { brokerStub } from "../broker/sandbox-broker";
import { issueCapability, revokeRunCapabilities } from "../compute/capability";
import { loadConfig } from "../config";
import { randomId } from "../crypto/api-keys";
import { openDb } from "../db/client";
import { isDatabaseUnavailable, sqlState } from "../db/errors";
import { runs } from "../db/schema";
import type { Db } from "../db/types";
import { unwrap } from "../errors";
import { wakeNotifier } from "../notifications/notifier";
import { revokeEgressToken } from "../runs/egress-token";
import { checkLaunchable } from "../runs/launch";
import { issueProxyCredentials, revokeProxyCredentials } from "../runs/proxy-credentials";
import { runPolicyEnvelope } from "../runs/run-vault";
import * as runsService from "../runs/service";
import type { Transition } from "../runs/types";
import { relayStub } from "../tunnel/relay";
import { previewPolicy } from "../vault/policy";
import {
  type EnvironmentAnswer,
  type MachinePorts,
  type MachineState,
  RunMachine,
  type StopRequest,
} from "./machine";

// One Durable Object per run (named by the run id): it owns the run's state machine. Its state
// lives in the object's storage, so an eviction mid-run loses nothing; its alarm drives every
// step, so a crash mid-step is retried by the runtime, and the steps are idempotent (machine.ts).

const STATE_KEY = "machine";
const CANCEL_KEY = "cancel";
const HALT_KEY = "halt";
const LINGER_KEY = "linger";
/** How long a look at the proxy's view may take, resume included. */
const VIEW_DEADLINE_MS = 15_000;

export type ViewResult =
  | { ok: true; view: ProxyView; resumed: boolean }
  | { ok: false; code: "proxy_gone" | "proxy_unreachable"; detail: string };

export class RunCoordinator extends DurableObject<Env> {
  // The alarm's step and a wake (a look at a lingering proxy) both change the machine's state and
  // await the broker in between: one at a time, so neither saves over the other's change.
  private chain: Promise<unknown> = Promise.resolve();

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.chain.then(fn, fn);
    this.chain = next.catch(() => {});
    return next;
  }

  private machine(db: Db): RunMachine {
    const storage = this.ctx.storage;
    return new RunMachine(
      {
        // A state saved before the spec's camelCase names holds the old keys: read it as a row is.
        load: async () => {
          const state = await storage.get<MachineState>(STATE_KEY);
          return state?.spec ? { ...state, spec: readStoredSpec(state.spec) } : state;
        },
        save: (state) => storage.put(STATE_KEY, state),
        setAlarm: (at) => storage.setAlarm(at),
        requestCancel: (reason) => storage.put(CANCEL_KEY, reason),
        cancelRequested: async () => {
          const asked = await storage.get<StopRequest | true>(CANCEL_KEY);
          return asked === true ? "cancelled" : (asked ?? null);
        },
        requestHalt: (halt) => storage.put(HALT_KEY, halt),
        haltRequested: async () => (await storage.get<boolean>(HALT_KEY)) === true,
        requestLinger: (seconds) => storage.put(LINGER_KEY, seconds),
        lingerRequested: async () => (await storage.get<number>(LINGER_KEY)) ?? null,
      },
      workerPorts(this.env, db),
      { lingerIdleMs: loadConfig(this.env).lingerIdleMs },
    );
  }

  private async withMachine<T>(fn: (m: RunMachine) => Promise<T>): Promise<T> {
    const { db, close } = openDb(loadConfig(this.env));
    try {
      return await fn(this.machine(db));
    } finally {
      await close().catch(() => {});
    }
  }

  async start(runId: string): Promise<void> {
    await this.withMachine((m) => m.start(runId));
  }

  async cancel(reason: StopRequest = "cancelled"): Promise<boolean> {
    return this.withMachine((m) => m.cancel(reason));
  }

  async ensure(runId: string): Promise<"started" | "rearmed" | "alive" | "over"> {
    // After any step in flight: while the alarm's handler runs, no alarm is pending, and a look
    // then would re-arm a run that is moving.
    return this.serial(async () => {
      const pending = (await this.ctx.storage.getAlarm()) !== null;
      return this.withMachine((m) => m.ensure(runId, pending));
    });
  }

  async halt(halt: boolean): Promise<boolean> {
    return this.withMachine((m) => m.halt(halt));
  }

  async linger(seconds: number): Promise<boolean> {
    return this.withMachine((m) => m.linger(seconds));
  }

  /**
   * The proxy's own view (counters, recent decisions, audit), read by running `bw-proxy-view` in
   * the proxy sandbox through the broker. Resumes a paused lingering proxy first.
   */
  async view(): Promise<ViewResult> {
    const woke = await this.serial(() => this.withMachine((m) => m.wake()));
    if (!woke.ok) return { ok: false, code: "proxy_gone", detail: woke.why };
    const broker = brokerStub(this.env, woke.runId);
    const execId = randomId("view_");
    const deadline = Date.now() + VIEW_DEADLINE_MS;
    try {
      let exec = await broker.exec(woke.runId, woke.sandboxId, {
        id: execId,
        argv: ["bw-proxy-view"],
        env: {},
        stage: "setup",
        timeoutMs: VIEW_DEADLINE_MS,
      });
      while (exec.state === "running" && Date.now() < deadline) {
        exec = await broker.poll(woke.runId, woke.sandboxId, execId, {
          waitMs: 1000,
          stdoutFrom: 0,
          stderrFrom: 0,
        });
      }
      if (exec.state === "running" || exec.exitCode !== 0) {
        return { ok: false, code: "proxy_unreachable", detail: "the proxy did not answer in time" };
      }
      const view = lastJsonLine(exec.stdout, ProxyView);
      if (!view) return { ok: false, code: "proxy_unreachable", detail: "the proxy's answer was not a view" };
      return { ok: true, view, resumed: woke.resumed };
    } catch {
      // The backend's message may name its own internals; the caller gets a plain reason.
      return { ok: false, code: "proxy_unreachable", detail: "the proxy sandbox could not be reached" };
    }
  }

  // ---- task environments, asked for through the compute API (src/routes/compute.ts) ----

  async addEnvironment(name: string): Promise<EnvironmentAnswer> {
    return this.serial(() => this.withMachine((m) => m.addEnvironment(name)));
  }

  async environment(id: string): Promise<EnvironmentAnswer> {
    const found = await this.withMachine((m) => m.environment(id));
    return found
      ? { ok: true, environment: found.view }
      : { ok: false, code: "not_found", why: `no environment ${id}` };
  }

  async removeEnvironment(id: string): Promise<EnvironmentAnswer> {
    return this.serial(() => this.withMachine((m) => m.removeEnvironment(id)));
  }

  /**
   * Starts a command in a ready environment, in its execute stage with the environment the wiring
   * proved (the run CA); never a capability. The exec id is the caller's idempotency key.
   */
  async environmentExec(
    runId: string,
    id: string,
    request: { execId: string; argv: string[]; stdin?: string; timeoutMs: number },
  ): Promise<{ ok: true; exec: ExecInfo } | Extract<EnvironmentAnswer, { ok: false }>> {
    const found = await this.withMachine((m) => m.environment(id));
    if (!found) return { ok: false, code: "not_found", why: `no environment ${id}` };
    if (found.env === null) {
      return { ok: false, code: "conflict", why: `environment ${id} is ${found.view.state}` };
    }
    const exec = await brokerStub(this.env, runId).exec(runId, id, {
      id: request.execId,
      argv: request.argv,
      env: found.env,
      stage: "execute",
      ...(request.stdin === undefined ? {} : { stdin: request.stdin }),
      timeoutMs: request.timeoutMs,
    });
    return { ok: true, exec };
  }

  async environmentPoll(
    runId: string,
    id: string,
    execId: string,
    from: { stdoutFrom: number; stderrFrom: number },
  ): Promise<{ ok: true; exec: ExecInfo } | Extract<EnvironmentAnswer, { ok: false }>> {
    const found = await this.withMachine((m) => m.environment(id));
    if (!found || found.view.state === "deleted")
      return { ok: false, code: "not_found", why: `no environment ${id}` };
    try {
      return {
        ok: true,
        exec: await brokerStub(this.env, runId).poll(runId, id, execId, { ...from, waitMs: 0 }),
      };
    } catch {
      return { ok: false, code: "not_found", why: `no exec ${execId} in environment ${id}` };
    }
  }

  async poke(): Promise<void> {
    await this.withMachine((m) => m.poke());
  }

  async snapshot(): Promise<MachineState | undefined> {
    return this.ctx.storage.get<MachineState>(STATE_KEY);
  }

  override async alarm(): Promise<void> {
    await this.serial(() => this.withMachine((m) => m.step()));
  }
}

export function coordinatorStub(env: Env, runId: string): DurableObjectStub<RunCoordinator> {
  return env.RUN_COORDINATOR.get(env.RUN_COORDINATOR.idFromName(runId));
}

/**
 * Launches a run (the API's and the runs page's launch): checked, recorded queued, started. If
 * the start call fails the run stays queued; the reaper's sweep starts or stops it. The launch
 * still answers with the run: a 5xx here would invite a retry (an Idempotency-Key keeps no 5xx),
 * and the retry would make a second run beside the queued one.
 */
export async function launchRun(env: Env, db: Db, p: Owner, spec: RunSpec): Promise<runsService.RunRow> {
  const config = loadConfig(env);
  unwrap(await checkLaunchable(db, p.environmentId, spec, config.resourceBounds));
  const run = await runsService.createRun(
    db,
    p,
    spec,
    backendForLaunch(env, spec.backend),
    config.maxActiveRuns,
  );
  try {
    await coordinatorStub(env, run.id).start(run.id);
  } catch (error) {
    consoleLog("error", { event: "run_start_deferred", runId: run.id, error: (error as Error).name });
  }
  return run;
}

/**
 * Cancels a live run through its coordinator; a run whose coordinator never started has nothing
 * to tear down and is stopped here. "asked": it stops at its next step.
 */
export async function cancelRun(env: Env, db: Db, runId: string): Promise<"asked" | "stopped"> {
  if (await coordinatorStub(env, runId).cancel()) return "asked";
  await endAware(env, db, runId, {
    to: "stopped",
    reason: "cancelled",
    detail: "Cancelled by the user before it started.",
  });
  return "stopped";
}

/**
 * Records a transition; when it ended the run, wakes the run's notifier, which sends what the
 * end owes (the transaction wrote the outbox rows).
 */
export async function endAware(env: Env, db: Db, runId: string, t: Transition): Promise<void> {
  if ((await runsService.recordTransition(db, runId, t)) && runsService.isTerminal(t.to)) {
    await wakeNotifier(env, runId);
  }
}

/**
 * Why a read failed, for the run's notes: the database's own timeout, a database that could not
 * be reached, or a failed query. Never the driver's message, which may name hosts.
 */
function databaseFault(error: unknown, timeoutMs: number): string {
  const code = sqlState(error);
  if (code === "57014") return `the database did not answer within ${timeoutMs / 1000} s`;
  if (isDatabaseUnavailable(error)) return "the database could not be reached";
  return code ? `the database failed the read (SQLSTATE ${code})` : "the read failed unexpectedly";
}

/**
 * A broker call's failure as the machine tells it apart. An error's class and code do not cross
 * the RPC boundary, only its message: a backend's not_supported (backend.ts notSupported) is
 * known by its words.
 */
function fromBroker(error: unknown): unknown {
  if (error instanceof Error && / is not yet built for the \S+ backend$/.test(error.message)) {
    return new BackendError("not_supported", error.message);
  }
  return error;
}

async function viaBroker<T>(call: () => T): Promise<Awaited<T>> {
  try {
    return await call();
  } catch (error) {
    throw fromBroker(error);
  }
}

/** The machine's ports over Postgres, the vault and the broker. */
function workerPorts(env: Env, db: Db): MachinePorts {
  const config = loadConfig(env);
  // The run's own broker instance for each call (a coordinator only ever asks about its run).
  const broker = (runId: string) => brokerStub(env, runId);
  const environments = new Map<string, string>();
  const environmentOf = async (runId: string): Promise<string> => {
    const known = environments.get(runId);
    if (known) return known;
    const row = await runsService.loadRun(db, runId);
    if (!row) throw new Error(`no run ${runId}`);
    environments.set(runId, row.environmentId);
    return row.environmentId;
  };
  return {
    now: () => Date.now(),
    newId: (prefix) => randomId(prefix),
    loadRun: async (runId) => {
      const row = await runsService.loadRun(db, runId);
      return row ? { id: row.id, status: row.status, spec: readStoredSpec(row.spec) } : null;
    },
    transition: (runId, t) => endAware(env, db, runId, t),
    note: (runId, note) => runsService.addNote(db, runId, note),
    event: (runId, key, kind, detail) => runsService.addEvent(db, runId, key, kind, detail),
    setRunFields: (runId, fields) => runsService.setRunFields(db, runId, fields),
    log: (event) => consoleLog(levelOf(event) === "info" ? "warn" : levelOf(event), event),
    readVault: async (runId) => {
      try {
        // Bounded by the database itself: a read that waits longer (a lock, a slow compute) is
        // cancelled, the attempt fails and is retried, and the connection stays usable.
        return await db.transaction(async (tx) => {
          await tx.execute(
            sql`select set_config('statement_timeout', ${String(config.vaultReadTimeoutMs)}, true)`,
          );
          const row = await runsService.loadRun(tx, runId);
          if (!row) return { ok: false, reason: `no run ${runId}` };
          const read = await runPolicyEnvelope(tx, config.keyRing, row);
          return read.ok ? { ok: true, policy: read.value.policy } : { ok: false, reason: read.error.detail };
        });
      } catch (error) {
        return { ok: false, reason: databaseFault(error, config.vaultReadTimeoutMs) };
      }
    },
    issueProxyCredentials: async (runId) => {
      const row = await runsService.loadRun(db, runId);
      if (!row) throw new Error(`no run ${runId}`);
      return issueProxyCredentials(db, config.keyRing, row);
    },
    revokeProxyCredentials: (runId) => revokeProxyCredentials(db, runId),
    proxyReady: async (runId) => {
      const [row] = await db
        .select({ ca: runs.caCertPem, at: runs.proxyReadyAt })
        .from(runs)
        .where(eq(runs.id, runId));
      return row?.ca && row.at ? { caCertPem: row.ca } : null;
    },
    broker: {
      create: (runId, request) => broker(runId).create(runId, request),
      exec: (runId, sandboxId, request) => broker(runId).exec(runId, sandboxId, request),
      poll: (runId, sandboxId, execId, from) => broker(runId).poll(runId, sandboxId, execId, from),
      kill: (runId, sandboxId, execId) => broker(runId).kill(runId, sandboxId, execId),
      freeze: (runId, sandboxId, frozen) => broker(runId).freeze(runId, sandboxId, frozen),
      destroyRun: async (runId, options) => {
        await broker(runId).destroyRun(runId, options);
      },
      destroy: (runId, sandboxId) => broker(runId).destroySandbox(runId, sandboxId),
      putBundle: async (runId, sandboxId, bundle) => {
        const environmentId = await environmentOf(runId);
        return viaBroker(() => broker(runId).putBundle(runId, sandboxId, { environmentId, ...bundle }));
      },
      seal: (runId, sandboxId, seal) => viaBroker(() => broker(runId).seal(runId, sandboxId, seal)),
      setHosts: (runId, sandboxId, hostsFile) =>
        viaBroker(() => broker(runId).setHosts(runId, sandboxId, hostsFile)),
      collect: async (runId, sandboxId, options) => {
        const environmentId = await environmentOf(runId);
        return viaBroker(() => broker(runId).collect(runId, sandboxId, { environmentId, ...options }));
      },
    },
    issueCapability: (runId, holderSandboxId) => issueCapability(db, runId, holderSandboxId),
    revokeCapabilities: (runId) => revokeRunCapabilities(db, runId),
    tunnelPaired: async (runId) => (await relayStub(env, runId).status()).paired,
    endTunnel: async (runId) => {
      await relayStub(env, runId).endRun();
      await revokeEgressToken(db, runId);
    },
    currentRouting: async (runId) => {
      const row = await runsService.loadRun(db, runId);
      if (!row) throw new Error(`no run ${runId}`);
      const { egress } = readStoredSpec(row.spec);
      const { routing, hostsFile } = await previewPolicy(db, row, { egress });
      return { routing, hostsFile };
    },
    parseProof: (stdout) => lastJsonLine(stdout, WiringProof),
  };
}

/** The last line a program printed, parsed as JSON with `shape`; null when it is not one. */
function lastJsonLine<T>(
  stdout: string,
  shape: { safeParse(v: unknown): { success: true; data: T } | { success: false } },
): T | null {
  try {
    const parsed = shape.safeParse(JSON.parse(stdout.trim().split("\n").at(-1) ?? ""));
    return parsed.success ? parsed.data : null;
  } catch {
    return null;
  }
}
