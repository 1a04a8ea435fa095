import { ARTIFACT_DEFAULTS, DEFAULT_OUT_DIR, type UnpackResult } from "@benchwright/shared/contract/bundle";
import type { ExecInfo, ResourceLimit } from "@benchwright/shared/contract/local-agent";
import { resourcesFor } from "@benchwright/shared/contract/run-spec";
import { BrokerFailure, type Machine } from "../ports";
import type { MachineState, Worker, WorkerStage } from "../state";
import { checkpoint, stop } from "./common";
import { modelEnv, OUT_ENV, placeholderEnv, recordExit, recordOutput } from "./output";
import { enforced, notBuilt, notSupported, sealSandbox } from "./seal";
import { captureImage } from "./setup-image";
import { rewireSandbox } from "./wiring";

// A work, task or orchestrator sandbox's stages once its wiring is proved:
//
//   bundle (the run's code unpacked into the working directory, as the execute stage's user)
//   → setup (the run's setup commands, then the task's: root of the sandbox, the boundary in force)
//   → seal (only after setup commands: every process they left killed, the wiring's files
//           re-installed from the coordinator's copy)
//   → capture (a setup image's builder only: what setup left kept, steps/setup-image.ts)
//   → rewire (the wiring proved again, from the execute stage, writing nothing)
//   → execute (the commands, steps/commands.ts) → collect ($BW_OUT into the run's artifacts) → done.
//
// Each side effect is checkpointed or idempotent by id (setup execs are `setup-<i>`), so a step
// replayed after a crash never runs a setup command twice. A failed setup command or a sandbox
// killed at its resource limits stops the whole run.

/** Each setup command's time limit. */
export const SETUP_TIMEOUT_MS = 600_000;
/** Where a bundle is unpacked: the sandbox's working directory (the commands' cwd). */
export const WORK_DIR = "/home/sandbox";
/** How much of a command's text a note or a stop's detail quotes. */
const QUOTED_CHARS = 200;

const BEFORE_EXECUTE: ReadonlySet<WorkerStage> = new Set(["bundle", "setup", "seal", "capture", "rewire"]);

/** The worker's commands may run (or ran): every stage before them is behind it. */
export function ready(w: Worker): boolean {
  return w.env !== null && w.stage !== null && !BEFORE_EXECUTE.has(w.stage);
}

/**
 * Whether another sandbox of the run is made but not through its setup yet. A worker's first
 * command waits for it: a failing setup anywhere stops the run before any command (case G6).
 */
export function setupPending(s: MachineState, w: Worker): boolean {
  return s.workers.some(
    (x) => x.sandboxId !== w.sandboxId && !x.done && !x.environment && x.proxyAddress !== null && !ready(x),
  );
}

/**
 * Takes a wired worker through bundle, setup, seal and rewire. "done" once its commands may run,
 * "pending" while a stage waits; a number is the stop's next step.
 */
export async function prepare(m: Machine, s: MachineState, w: Worker): Promise<"done" | "pending" | number> {
  if (ready(w)) return "done";
  if (w.environment && w.setup.length === 0) {
    // Asked for bare: the holder's to prepare; it execs in it (execute stage) once it is wired.
    w.stage = "execute";
    return "done";
  }
  if (w.stage === "bundle") {
    const stopped = await putBundle(m, s, w);
    if (stopped !== null) return stopped;
    w.stage = "setup";
    w.setupIndex = 0;
    w.setupExecId = null;
    // Unpacked before setup-0 starts: a replay must not unpack again over what setup changed.
    if (s.spec?.bundle) await checkpoint(m, s);
  }
  if (w.stage === "setup") {
    const setup = await runSetup(m, s, w);
    if (setup !== "done") return setup;
    w.stage = w.setup.length > 0 ? "seal" : "execute";
  }
  if (w.stage === "seal") {
    const stopped = await sealSandbox(m, s, w);
    if (stopped !== null) return stopped;
    w.stage = w.image?.role === "build" ? "capture" : enforced(s) ? "rewire" : "execute";
    await checkpoint(m, s); // sealed before the re-proof starts: never re-written under it
  }
  if (w.stage === "capture") {
    // Sealed, so nothing of setup runs while it is read; before the re-proof and any command.
    await captureImage(m, s, w);
    w.stage = enforced(s) ? "rewire" : "execute";
  }
  if (w.stage === "rewire") {
    const proved = await rewireSandbox(m, s, w);
    if (proved !== "done") return proved;
    w.stage = "execute";
  }
  return "done";
}

/** Unpacks the run's bundle (if it has one). Null when done; else the stop's next step. */
async function putBundle(m: Machine, s: MachineState, w: Worker): Promise<number | null> {
  const sha256 = s.spec?.bundle;
  if (!sha256) return null;
  // A replay after a crash unpacks the same archive into the same place again, before any
  // setup command ran: the same files.
  let unpacked: UnpackResult;
  try {
    unpacked = await m.ports.broker.putBundle(s.runId, w.sandboxId, { sha256, dir: WORK_DIR });
  } catch (error) {
    if (notSupported(error)) return notBuilt(m, s, w, error, "before its setup ran");
    throw error;
  }
  if (!unpacked.ok) {
    await m.ports.note(s.runId, {
      level: "warning",
      code: "bundle_rejected",
      text: `The bundle could not be unpacked in ${w.name} (${unpacked.code}: ${unpacked.message}), so the run stopped before its setup ran.`,
    });
    return stop(m, s, "bundle_rejected", `${w.name}: ${unpacked.code}: ${unpacked.message}`);
  }
  await m.ports.event(s.runId, `bundle:${w.sandboxId}`, "note", {
    sandbox: w.sandboxId,
    name: w.name,
    stage: "bundle",
    files: unpacked.files,
    bytes: unpacked.bytes,
    text: `The bundle was unpacked in ${w.name}: ${unpacked.files} file(s), ${unpacked.bytes} bytes.`,
  });
  return null;
}

async function runSetup(m: Machine, s: MachineState, w: Worker): Promise<"done" | "pending" | number> {
  const commands = w.setup;
  for (let i = w.setupIndex; i < commands.length; i++) {
    const command = commands[i] as string;
    if (!w.setupExecId) {
      w.ran = true;
      const info = await m.ports.broker.exec(s.runId, w.sandboxId, {
        id: `setup-${i}`,
        argv: ["sh", "-c", command],
        env: { ...w.env, ...placeholderEnv(s), ...modelEnv(s), ...OUT_ENV },
        stage: "setup",
        timeoutMs: SETUP_TIMEOUT_MS,
      });
      w.setupExecId = info.execId;
      w.stdoutFrom = 0;
      w.stderrFrom = 0;
      return "pending";
    }
    const exec = await m.ports.broker.poll(s.runId, w.sandboxId, w.setupExecId, {
      stdoutFrom: w.stdoutFrom,
      stderrFrom: w.stderrFrom,
    });
    await recordOutput(m, s, w, exec, "setup", i);
    if (exec.state === "running") return "pending";
    await recordExit(m, s, w, exec, "setup", i);
    if (exec.limit) return exhausted(m, s, w, exec.limit, `setup command ${i + 1}`);
    if (exec.exitCode !== 0) return setupFailed(m, s, w, i, command, exec);
    // The next one starts at once (the loop), under its own exec id.
    w.setupExecId = null;
    w.setupIndex = i + 1;
  }
  return "done";
}

function quoted(command: string): string {
  return command.length > QUOTED_CHARS ? `${command.slice(0, QUOTED_CHARS)}…` : command;
}

async function setupFailed(
  m: Machine,
  s: MachineState,
  w: Worker,
  index: number,
  command: string,
  exec: ExecInfo,
): Promise<number> {
  const how =
    exec.exitCode === null ? `was killed (${exec.signal ?? "no exit code"})` : `exited ${exec.exitCode}`;
  await m.ports.note(s.runId, {
    level: "warning",
    code: "setup_failed",
    text: `Setup command ${index + 1} in ${w.name} (${quoted(command)}) ${how}, so the run stopped: no command runs after a failed setup.`,
  });
  return stop(
    m,
    s,
    "setup_failed",
    `${w.name} (${w.sandboxId}): setup command ${index + 1} ${how}: ${quoted(command)}`,
  );
}

/** A sandbox's process was killed at its memory or process limit: the run stops (case G7). */
export async function exhausted(
  m: Machine,
  s: MachineState,
  w: Worker,
  limit: ResourceLimit,
  what: string,
): Promise<number> {
  const r = resourcesFor(s.spec?.resources, w.kind);
  const named =
    limit === "memory"
      ? `memory limit (${r.memoryMb} MiB)`
      : `process limit (${r.pids} processes and threads)`;
  await m.ports.note(s.runId, {
    level: "warning",
    code: "resource_exhausted",
    text: `${w.name} hit its ${named} in ${what} and was held there, so the run stopped. A run that needs more asks for it in resources.${limit === "memory" ? "memoryMb" : "pids"}.`,
  });
  return stop(m, s, "resource_exhausted", `${w.name} (${w.sandboxId}) hit its ${named} in ${what}`);
}

/**
 * A worker whose commands ended (or never could start): its $BW_OUT is collected, then it is
 * done (a task's sandbox goes). The stage is recorded first, so a replay picks up the collect.
 */
export async function endWorker(m: Machine, s: MachineState, w: Worker): Promise<void> {
  w.stage = "collect";
  await collect(m, s, w);
  await workerDone(m, s, w);
}

/**
 * Collects the files the worker's sandbox left under $BW_OUT, once, if anything ran in it. A
 * failure is a warning on the run, never its outcome.
 */
export async function collect(m: Machine, s: MachineState, w: Worker): Promise<void> {
  if (w.collected || !w.ran || w.environment || w.destroyed) return;
  const at = { sandbox: w.sandboxId, name: w.name, stage: "collect" };
  try {
    const got = await m.ports.broker.collect(s.runId, w.sandboxId, {
      sandboxName: w.name,
      dir: DEFAULT_OUT_DIR,
      maxBytes: ARTIFACT_DEFAULTS.maxBytes,
      maxFiles: ARTIFACT_DEFAULTS.maxFiles,
    });
    await m.ports.event(s.runId, `collect:${w.sandboxId}`, "note", {
      ...at,
      ok: true,
      ...got,
      text: `Collected ${got.files} file(s), ${got.bytes} bytes, from ${w.name}'s ${DEFAULT_OUT_DIR}${got.cut > 0 ? `; ${got.cut} cut (see the run's artifacts)` : ""}.`,
    });
  } catch (error) {
    // The backend's message may name its internals: the run gets its code only.
    const code = error instanceof BrokerFailure ? error.code : "collect_failed";
    m.ports.log({ event: "collect_failed", runId: s.runId, sandboxId: w.sandboxId, code });
    const text = `The files under ${DEFAULT_OUT_DIR} in ${w.name} could not be collected (${code}); the run's outcome does not change.`;
    await m.ports.event(s.runId, `collect:${w.sandboxId}`, "note", { ...at, ok: false, error: code, text });
    await m.ports.note(s.runId, { level: "warning", code: "artifacts_not_collected", text });
  }
  w.collected = true;
  await checkpoint(m, s);
}

/** A worker whose commands ended; a task's sandbox goes with its task (the rest at the run's end). */
export async function workerDone(m: Machine, s: MachineState, w: Worker): Promise<void> {
  w.done = true;
  if (w.kind === "task" && !w.destroyed) {
    await checkpoint(m, s); // done before destroyed: a replay never runs its commands again
    await m.ports.broker.destroy(s.runId, w.sandboxId);
    w.destroyed = true;
  }
}
