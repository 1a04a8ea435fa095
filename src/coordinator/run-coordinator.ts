import { DurableObject } from "cloudflare:workers";
import type { ExecInfo } from "@benchwright/shared/contract/local-agent";
import { ProxyView } from "@benchwright/shared/contract/proxy-view";
import { brokerStub } from "../broker/sandbox-broker";
import { loadConfig } from "../config";
import { randomId } from "../crypto/api-keys";
import { openDb } from "../db/client";
import type { Db } from "../db/types";
import { RunMachine } from "./machine";
import type { EnvironmentAnswer, EnvironmentRequest } from "./ports";
import { type MachineState, migrateState, type StopRequest, type StoredState } from "./state";
import { lastJsonLine, workerPorts } from "./worker-ports";

// One Durable Object per run (named by the run id): it owns the run's state machine. Its state
// lives in the object's storage, so an eviction mid-run loses nothing; its alarm drives every
// step, so a crash mid-step is retried by the runtime, and the steps are idempotent (machine.ts).
// Other parts reach it through client.ts.

const STATE_KEY = "machine";
const CANCEL_KEY = "cancel";
const HALT_KEY = "halt";
const LINGER_KEY = "linger";
/** The id of the API request steering the run (its launch; a cancel's once one came). */
const REQUEST_KEY = "request";
/** How long a look at the proxy's view may take, resume included. */
const VIEW_DEADLINE_MS = 15_000;
const UNREACHABLE = {
  ok: false,
  code: "proxy_unreachable",
  detail: "the proxy sandbox could not be reached",
} as const satisfies ViewResult;

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

  private machine(db: Db, requestId: string | undefined): RunMachine {
    const storage = this.ctx.storage;
    return new RunMachine(
      {
        // A state stored by an older version is read as this version's (state.ts).
        load: async () => migrateState(await storage.get<StoredState>(STATE_KEY)),
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
      workerPorts(this.env, db, requestId),
      {
        lingerIdleMs: loadConfig(this.env).lingerIdleMs,
        setupImageWaitMs: loadConfig(this.env).setupImages.waitMs,
      },
    );
  }

  /** `requestId`: the request this call came with, kept for every later step's lines. */
  private async withMachine<T>(fn: (m: RunMachine) => Promise<T>, requestId?: string): Promise<T> {
    if (requestId) await this.ctx.storage.put(REQUEST_KEY, requestId);
    const steering = requestId ?? (await this.ctx.storage.get<string>(REQUEST_KEY));
    const { db, close } = openDb(loadConfig(this.env));
    try {
      return await fn(this.machine(db, steering));
    } finally {
      await close().catch(() => {});
    }
  }

  /** `requestId`: the launching request's (x-request-id), named on the run's log lines. */
  async start(runId: string, requestId?: string): Promise<void> {
    await this.withMachine((m) => m.start(runId), requestId);
  }

  /** `requestId`: the cancelling request's; the reaper's stop has none and keeps the launch's. */
  async cancel(reason: StopRequest = "cancelled", requestId?: string): Promise<boolean> {
    return this.withMachine((m) => m.cancel(reason), requestId);
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
      while (exec.ok && exec.value.state === "running" && Date.now() < deadline) {
        exec = await broker.poll(woke.runId, woke.sandboxId, execId, {
          waitMs: 1000,
          stdoutFrom: 0,
          stderrFrom: 0,
        });
      }
      // The broker's message may name the backend's internals: the caller gets a plain reason.
      if (!exec.ok) return UNREACHABLE;
      if (exec.value.state === "running" || exec.value.exitCode !== 0) {
        return { ok: false, code: "proxy_unreachable", detail: "the proxy did not answer in time" };
      }
      const view = lastJsonLine(exec.value.stdout, ProxyView);
      if (!view) return { ok: false, code: "proxy_unreachable", detail: "the proxy's answer was not a view" };
      return { ok: true, view, resumed: woke.resumed };
    } catch {
      return UNREACHABLE; // the broker itself could not be reached
    }
  }

  // ---- task environments, asked for through the compute API (src/routes/compute.ts) ----

  async addEnvironment(request: EnvironmentRequest): Promise<EnvironmentAnswer> {
    return this.serial(() => this.withMachine((m) => m.addEnvironment(request)));
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
    // A failure here is the platform's, not the caller's: the compute API answers it 500.
    if (!exec.ok) throw new Error(`the broker could not start the exec (${exec.code})`);
    return { ok: true, exec: exec.value };
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
    const notFound = { ok: false, code: "not_found", why: `no exec ${execId} in environment ${id}` } as const;
    try {
      const exec = await brokerStub(this.env, runId).poll(runId, id, execId, { ...from, waitMs: 0 });
      return exec.ok ? { ok: true, exec: exec.value } : notFound;
    } catch {
      return notFound;
    }
  }

  async poke(): Promise<void> {
    await this.withMachine((m) => m.poke());
  }

  async snapshot(): Promise<MachineState | undefined> {
    return migrateState(await this.ctx.storage.get<StoredState>(STATE_KEY));
  }

  override async alarm(): Promise<void> {
    await this.serial(() => this.withMachine((m) => m.step()));
  }
}
