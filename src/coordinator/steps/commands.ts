import type { Machine } from "../ports";
import type { MachineState, Worker } from "../state";
import { finish, POLL_MS, proxyRuns } from "./common";
import { applyHalt } from "./halt";
import { syncHosts } from "./hosts";
import { modelEnv, OUT_ENV, placeholderEnv, recordExit, recordOutput } from "./output";
import { checkProxy } from "./proxy";
import { parallelTasks, prepareLateTask } from "./sandboxes";
import { renewBuilds } from "./setup-image";
import { endWorker, exhausted, prepare, ready, setupPending } from "./stages";
import { awaitTunnel } from "./tunnel";

// running: each worker's stages before its commands (steps/stages.ts), then its commands, one
// after the other in its sandbox's execute stage, each under an exec id of its own (`cmd-<i>`)
// so that a step replayed after a crash never starts a command twice; then its $BW_OUT is
// collected. Late tasks are made and wired as slots free up, and go through the same stages.

/** How often a halted run looks for its resume. */
export const HALTED_POLL_MS = 1_000;
/** Where a holder sandbox reaches the compute API: the platform host, through the run's proxy. */
export const COMPUTE_URL = "https://probe.benchwright.invalid/compute";

export async function run(m: Machine, s: MachineState): Promise<number> {
  const wantHalt = await m.storage.haltRequested();
  if (wantHalt !== s.halted) return applyHalt(m, s, wantHalt);
  const lost = await checkProxy(m, s);
  if (lost !== null) return lost;
  await syncHosts(m, s);
  if (s.halted) return m.ports.now() + HALTED_POLL_MS;
  await renewBuilds(m, s);
  const waiting = await awaitTunnel(m, s);
  if (waiting !== null) return waiting;
  let pending = false;
  let slots =
    parallelTasks(s) -
    s.workers.filter((w) => w.kind === "task" && !w.environment && w.proxyAddress !== null && !w.done).length;
  for (const w of s.workers) {
    if (w.done) continue;
    if (w.environment) {
      // Made and wired in its turn like a late task; the holder execs in it once ready.
      if (ready(w)) continue;
      const prepared = w.env === null ? await prepareLateTask(m, s, w) : await prepare(m, s, w);
      if (typeof prepared === "number") return prepared;
      pending = true;
      continue;
    }
    if (w.proxyAddress === null || w.env === null) {
      // A task's sandbox is made in its turn (a free slot); one waiting for its setup image's
      // build takes none, nor does the work sandbox.
      const unmade = w.proxyAddress === null;
      if (unmade && w.kind === "task" && slots <= 0) {
        pending = true;
        continue;
      }
      const made = await prepareLateTask(m, s, w);
      if (typeof made === "number") return made;
      if (unmade && w.proxyAddress !== null && w.kind === "task") slots -= 1;
      pending = true;
      continue;
    }
    if (!ready(w)) {
      const prepared = await prepare(m, s, w);
      if (typeof prepared === "number") return prepared;
      if (prepared === "pending") {
        pending = true;
        continue;
      }
    }
    if (w.stage === "collect") {
      await endWorker(m, s, w); // its commands ended before a crash: collect, then done
      continue;
    }
    if (w.execId === null) {
      const command = w.commands[w.cmdIndex];
      if (command === undefined) {
        await endWorker(m, s, w);
        continue;
      }
      if (w.cmdIndex === 0 && setupPending(s, w)) {
        pending = true; // another sandbox is still in its setup: no command before it is through
        continue;
      }
      w.ran = true;
      const info = await m.ports.broker.exec(s.runId, w.sandboxId, {
        id: `cmd-${w.cmdIndex}`,
        argv: ["sh", "-c", command],
        env: { ...w.env, ...placeholderEnv(s), ...modelEnv(s), ...OUT_ENV, ...(await computeEnv(m, s, w)) },
        stage: "execute",
        timeoutMs: 600_000,
      });
      w.execId = info.execId;
      w.stdoutFrom = 0;
      w.stderrFrom = 0;
      pending = true;
      continue;
    }
    const exec = await m.ports.broker.poll(s.runId, w.sandboxId, w.execId, {
      stdoutFrom: w.stdoutFrom,
      stderrFrom: w.stderrFrom,
    });
    await recordOutput(m, s, w, exec, "execute", w.cmdIndex);
    if (exec.state === "running") {
      pending = true;
      continue;
    }
    await recordExit(m, s, w, exec, "execute", w.cmdIndex);
    if (exec.limit) return exhausted(m, s, w, exec.limit, `command ${w.cmdIndex + 1}`);
    w.execId = null;
    if (exec.exitCode !== 0) {
      w.exitCode = exec.exitCode ?? -1;
      await endWorker(m, s, w);
      continue;
    }
    w.cmdIndex += 1;
    if (w.cmdIndex >= w.commands.length) {
      w.exitCode = 0;
      await endWorker(m, s, w);
    } else {
      pending = true;
    }
  }
  if (pending) return m.ports.now() + POLL_MS;
  const failed = s.workers.filter((w) => !w.environment && w.exitCode !== 0);
  finish(
    m,
    s,
    failed.length === 0
      ? { to: "finished", reason: "completed", detail: "Every command exited 0." }
      : {
          to: "finished",
          reason: "command_failed",
          detail: failed.map((w) => `${w.name}: command ${w.cmdIndex + 1} exited ${w.exitCode}`).join("; "),
        },
  );
  return m.ports.now();
}

/**
 * The compute API's address and a fresh capability, for a command of the work or orchestrator
 * sandbox while the run's proxy (the lane's way out) runs. Task sandboxes get nothing.
 */
async function computeEnv(m: Machine, s: MachineState, w: Worker): Promise<Record<string, string>> {
  if (w.kind === "task" || !proxyRuns(s)) return {};
  const { token } = await m.ports.issueCapability(s.runId, w.sandboxId);
  return { BW_COMPUTE_URL: COMPUTE_URL, BW_COMPUTE_TOKEN: token };
}
