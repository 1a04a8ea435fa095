import type { ExecInfo } from "../../contract/local-agent";
import { MODEL_LANE_BASE_URL, MODEL_LANE_PLACEHOLDER_KEY } from "../../contract/proxy-wire";
import type { MachineState, Worker } from "../machine";
import { finish, type Machine, POLL_MS, proxyRuns } from "./common";
import { applyHalt } from "./halt";
import { checkProxy } from "./proxy";
import { parallelTasks, prepareLateTask } from "./sandboxes";
import { workerDone } from "./teardown";
import { awaitTunnel } from "./tunnel";

// running: each worker's commands, one after the other in its sandbox's execute stage, each
// under an exec id of its own (`cmd-<i>`) so that a step replayed after a crash never starts a
// command twice; late tasks are made and wired as slots free up.

/** How often a halted run looks for its resume. */
export const HALTED_POLL_MS = 1_000;
/** Output kept in the trace per run; the rest is counted, not stored. */
export const MAX_TRACE_OUTPUT = 256 * 1024;
/** Output rows kept in the trace per run (a chatty command polled often makes many small ones). */
export const MAX_OUTPUT_EVENTS = 2000;
/** Where a holder sandbox reaches the compute API: the platform host, through the run's proxy. */
export const COMPUTE_URL = "https://probe.benchwright.invalid/compute";

/**
 * The declared model's lane as the benchmark's code sees it: the proxy's fake base URL and a
 * placeholder key (never a credential), in the variables OpenAI-compatible SDKs read.
 */
function modelEnv(s: MachineState): Record<string, string> {
  const model = s.policy?.model;
  if (!model || !s.policy?.enforce || s.proxy?.unfiltered) return {};
  return {
    OPENAI_BASE_URL: MODEL_LANE_BASE_URL,
    OPENAI_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    BENCHWRIGHT_MODEL: model.name,
  };
}

export async function run(m: Machine, s: MachineState): Promise<number> {
  const wantHalt = await m.storage.haltRequested();
  if (wantHalt !== (s.halted ?? false)) return applyHalt(m, s, wantHalt);
  const lost = await checkProxy(m, s);
  if (lost !== null) return lost;
  if (s.halted) return m.ports.now() + HALTED_POLL_MS;
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
      if (w.env !== null) continue;
      const ready = await prepareLateTask(m, s, w);
      if (typeof ready === "number") return ready;
      pending = true;
      continue;
    }
    if (w.proxyAddress === null || w.env === null) {
      if (w.proxyAddress === null) {
        if (slots <= 0) {
          pending = true;
          continue;
        }
        slots -= 1;
      }
      const ready = await prepareLateTask(m, s, w);
      if (typeof ready === "number") return ready;
      pending = true;
      continue;
    }
    if (w.execId === null) {
      const command = w.commands[w.cmdIndex];
      if (command === undefined) {
        await workerDone(m, s, w);
        continue;
      }
      const info = await m.ports.broker.exec(s.runId, w.sandboxId, {
        id: `cmd-${w.cmdIndex}`,
        argv: ["sh", "-c", command],
        env: { ...w.env, ...modelEnv(s), ...(await computeEnv(m, s, w)) },
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
    await recordOutput(m, s, w, exec);
    if (exec.state === "running") {
      pending = true;
      continue;
    }
    await m.ports.event(s.runId, `exit:${w.sandboxId}:${w.cmdIndex}`, "output", {
      sandbox: w.sandboxId,
      name: w.name,
      command: w.cmdIndex,
      exitCode: exec.exitCode,
      signal: exec.signal,
    });
    w.execId = null;
    if (exec.exitCode !== 0) {
      w.exitCode = exec.exitCode ?? -1;
      await workerDone(m, s, w);
      continue;
    }
    w.cmdIndex += 1;
    if (w.cmdIndex >= w.commands.length) {
      w.exitCode = 0;
      await workerDone(m, s, w);
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

async function recordOutput(m: Machine, s: MachineState, w: Worker, exec: ExecInfo): Promise<void> {
  for (const [stream, text, end] of [
    ["stdout", exec.stdout, exec.stdoutEnd],
    ["stderr", exec.stderr, exec.stderrEnd],
  ] as const) {
    if (text.length === 0) continue;
    const room = MAX_TRACE_OUTPUT - s.traceBytes;
    if (room > 0 && (s.outputEvents ?? 0) < MAX_OUTPUT_EVENTS) {
      const kept = text.slice(0, room);
      s.traceBytes += kept.length;
      s.outputEvents = (s.outputEvents ?? 0) + 1;
      await m.ports.event(s.runId, `out:${w.sandboxId}:${w.cmdIndex}:${stream}:${end}`, "output", {
        sandbox: w.sandboxId,
        name: w.name,
        command: w.cmdIndex,
        stream,
        text: kept,
        truncated: kept.length < text.length,
      });
    }
    if (stream === "stdout") w.stdoutFrom = end;
    else w.stderrFrom = end;
  }
}
