import type { BrokerCode } from "@benchwright/shared/contract/broker";
import type { RunState } from "@benchwright/shared/contract/run-states";
import type { Machine } from "../ports";
import type { Final, MachineState, Worker, WorkerStage } from "../state";

// What every phase of the run machine shares: the moves between states, and a new worker.

export const POLL_MS = 250;

/** Backend answers that mean "no isolated sandbox can be made here at all". */
export const NO_SANDBOX_CODES: ReadonlySet<BrokerCode> = new Set([
  "cannot_isolate",
  "backend_not_configured",
]);

/** Saves mid-step, before a side effect whose identity must survive a crash (ids). */
export function checkpoint(m: Machine, s: MachineState): Promise<void> {
  return m.storage.save(s);
}

export function finish(m: Machine, s: MachineState, final: Final): void {
  s.final ??= final;
  if (s.state !== "finishing") {
    s.state = "finishing";
    s.attempt = 0;
    s.enteredAt = m.ports.now();
  }
}

export async function stop(m: Machine, s: MachineState, reason: string, detail: string): Promise<number> {
  finish(m, s, { to: "stopped", reason, detail });
  return m.ports.now();
}

export async function move(
  m: Machine,
  s: MachineState,
  to: RunState,
  reason: string,
  detail?: string,
): Promise<void> {
  await m.ports.transition(s.runId, { to, reason, ...(detail === undefined ? {} : { detail }) });
  s.state = to;
  s.attempt = 0;
  s.enteredAt = m.ports.now();
}

/** The backend cannot make an isolated sandbox here: never run unisolated. */
export async function cannotIsolate(m: Machine, s: MachineState, code: string, why: string): Promise<number> {
  await m.ports.note(s.runId, {
    level: "warning",
    code,
    text: `No isolated sandbox can be made (${why}), so the run stopped before any benchmark code ran.`,
  });
  return stop(m, s, code, why);
}

export function proxyRuns(s: MachineState): boolean {
  return Boolean(s.policy?.enforce && s.network?.created && s.proxy?.execId && !s.proxy.unfiltered);
}

export function worker(
  sandboxId: string,
  kind: "work" | "task" | "orchestrator",
  taskIndex: number | null,
  name: string,
  commands: string[],
  setup: string[] = [],
): Worker {
  return {
    sandboxId,
    kind,
    taskIndex,
    name,
    commands,
    setup,
    proxyAddress: null,
    probeTarget: null,
    wiringExecId: null,
    env: null,
    cmdIndex: 0,
    execId: null,
    stdoutFrom: 0,
    stderrFrom: 0,
    exitCode: null,
    done: false,
    wiring: null,
    environment: false,
    destroyed: false,
    stage: null,
    setupIndex: 0,
    setupExecId: null,
    rewireExecId: null,
    ran: false,
    collected: false,
    hostsFixed: false,
    image: null,
  };
}

/**
 * A wired worker's first stage: its bundle, or, started from a setup image (no bundle, no setup
 * stage), its seal.
 */
export const firstStage = (w: Worker): WorkerStage => (w.image?.role === "use" ? "seal" : "bundle");

export function must<T>(value: T | null | undefined): T {
  if (value === null || value === undefined) throw new Error("coordinator state is missing a field");
  return value;
}

export function lastLine(text: string): string {
  return text.trim().split("\n").at(-1)?.slice(0, 300) ?? "";
}
