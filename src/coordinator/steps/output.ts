import { DEFAULT_OUT_DIR } from "@benchwright/shared/contract/bundle";
import type { ExecInfo } from "@benchwright/shared/contract/local-agent";
import { placeholderValue } from "@benchwright/shared/contract/placeholder";
import {
  MODEL_LANE_ANTHROPIC_BASE_URL,
  MODEL_LANE_BASE_URL,
  MODEL_LANE_PLACEHOLDER_KEY,
} from "@benchwright/shared/contract/proxy-wire";
import type { Machine } from "../ports";
import type { MachineState, Worker } from "../state";

// What the benchmark's own code (setup and commands alike) sees of the run, and what of its
// output the trace keeps.

/** Output kept in the trace per run; the rest is counted, not stored. */
export const MAX_TRACE_OUTPUT = 256 * 1024;
/** Output rows kept in the trace per run (a chatty command polled often makes many small ones). */
export const MAX_OUTPUT_EVENTS = 2000;

/** Where the commands leave the files the run collects (made by the backend with the sandbox). */
export const OUT_ENV = { BW_OUT: DEFAULT_OUT_DIR };

/**
 * The declared model's lane as the benchmark's code sees it: the proxy's fake base URLs and a
 * placeholder key (never a credential), in the variables OpenAI's and Anthropic's SDKs read, so
 * `new OpenAI()` and `new Anthropic()` reach the lane unmodified, whatever the provider speaks.
 */
export function modelEnv(s: MachineState): Record<string, string> {
  const model = s.policy?.model;
  if (!model || !s.policy?.enforce || s.proxy?.unfiltered) return {};
  return {
    OPENAI_BASE_URL: MODEL_LANE_BASE_URL,
    OPENAI_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    ANTHROPIC_BASE_URL: MODEL_LANE_ANTHROPIC_BASE_URL,
    ANTHROPIC_API_KEY: MODEL_LANE_PLACEHOLDER_KEY,
    BENCHWRIGHT_MODEL: model.name,
  };
}

/**
 * Every secret the run's rules inject, as its placeholder (never the value) under the rule's
 * variable (case N1): code that reads its key from the environment starts and sends it, and the
 * run's proxy swaps it for the secret on that rule's hosts only. Only while that proxy runs; the
 * model lane's variables are never among them (placeholderEnvs leaves those names out).
 */
export function placeholderEnv(s: MachineState): Record<string, string> {
  const nonce = s.placeholderNonce;
  if (!nonce || !s.policy?.enforce || s.proxy?.unfiltered) return {};
  return Object.fromEntries(s.policy.placeholders.map((p) => [p.env, placeholderValue(p.secret, nonce)]));
}

/**
 * Keeps a polled exec's new output in the trace (within the run's budget) and moves the worker's
 * read offsets past it. Setup commands' rows are keyed `setup:…`, commands' `out:…`.
 */
export async function recordOutput(
  m: Machine,
  s: MachineState,
  w: Worker,
  exec: ExecInfo,
  stage: "setup" | "execute",
  index: number,
): Promise<void> {
  for (const [stream, text, end] of [
    ["stdout", exec.stdout, exec.stdoutEnd],
    ["stderr", exec.stderr, exec.stderrEnd],
  ] as const) {
    if (text.length === 0) continue;
    const room = MAX_TRACE_OUTPUT - s.traceBytes;
    if (room > 0 && s.outputEvents < MAX_OUTPUT_EVENTS) {
      const kept = text.slice(0, room);
      s.traceBytes += kept.length;
      s.outputEvents += 1;
      const prefix = stage === "setup" ? "setup" : "out";
      await m.ports.event(s.runId, `${prefix}:${w.sandboxId}:${index}:${stream}:${end}`, "output", {
        sandbox: w.sandboxId,
        name: w.name,
        stage,
        command: index,
        stream,
        text: kept,
        truncated: kept.length < text.length,
      });
    }
    if (stream === "stdout") w.stdoutFrom = end;
    else w.stderrFrom = end;
  }
}

/** The exit of a setup command or a command, in the trace (`exit-setup:…` / `exit:…`). */
export async function recordExit(
  m: Machine,
  s: MachineState,
  w: Worker,
  exec: ExecInfo,
  stage: "setup" | "execute",
  index: number,
): Promise<void> {
  const key = stage === "setup" ? `exit-setup:${w.sandboxId}:${index}` : `exit:${w.sandboxId}:${index}`;
  await m.ports.event(s.runId, key, "output", {
    sandbox: w.sandboxId,
    name: w.name,
    stage,
    command: index,
    exitCode: exec.exitCode,
    signal: exec.signal,
    ...(exec.limit ? { limit: exec.limit } : {}),
  });
}
