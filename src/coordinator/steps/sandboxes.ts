import { resourcesFor } from "@benchwright/shared/contract/run-spec";
import type { SandboxRequest } from "../../broker/interface";
import { commandsOf } from "../../runs/benchmarks";
import type { Machine } from "../ports";
import type { MachineState, Worker } from "../state";
import {
  cannotIsolate,
  checkpoint,
  firstStage,
  move,
  must,
  NO_SANDBOX_CODES,
  proxyRuns,
  stop,
  worker,
} from "./common";
import { claimImage, createFields, imageMissing, rebuildMissing, traceUse } from "./setup-image";
import { wireSandbox } from "./wiring";

// starting_sandboxes: the work (or orchestrator) sandbox and the first maxParallelTasks task
// sandboxes are made; the other tasks' sandboxes are made while running, each in its turn. A
// sandbox with setup commands first claims its setup image (steps/setup-image.ts): one that waits
// for a build is made while running too, once the build is done.

export async function startSandboxes(m: Machine, s: MachineState): Promise<number> {
  const spec = must(s.spec);
  if (s.workers.length === 0) {
    // The run's setup runs in every sandbox of the run's code; a task's own after it.
    const setup = spec.setup ?? [];
    s.workers = [
      spec.orchestrator === "harbor"
        ? worker(
            m.ports.newId("sbx_"),
            "orchestrator",
            null,
            "orchestrator",
            [...commandsOf(spec)],
            [...setup],
          )
        : worker(m.ports.newId("sbx_"), "work", null, "work", [...commandsOf(spec)], [...setup]),
      ...(spec.tasks ?? []).map((t, i) =>
        worker(m.ports.newId("sbx_"), "task", i, t.name, t.commands, [...setup, ...(t.setup ?? [])]),
      ),
    ];
    await checkpoint(m, s);
  }
  // The work sandbox and the first maxParallelTasks tasks now; the rest when a slot frees.
  for (const w of s.workers.slice(0, 1 + parallelTasks(s))) {
    const stopped = await createSandbox(m, s, w);
    if (typeof stopped === "number") return stopped;
  }
  await move(m, s, "wiring", "sandboxes_ready");
  return m.ports.now();
}

export function parallelTasks(s: MachineState): number {
  const tasks = s.workers.length - 1;
  return Math.min(tasks, s.spec?.maxParallelTasks ?? tasks);
}

/**
 * Makes a worker's sandbox (idempotent by its id). Null when made, "waiting" while it waits for
 * its setup image's build; else the stop's next step.
 */
async function createSandbox(m: Machine, s: MachineState, w: Worker): Promise<number | null | "waiting"> {
  if (w.proxyAddress !== null) return null;
  if ((await claimImage(m, s, w)) === "wait") return "waiting";
  let made = await m.ports.broker.create(s.runId, sandboxRequest(s, w));
  if (!made.ok && imageMissing(w, made)) {
    if ((await rebuildMissing(m, s, w, made)) === "wait") return "waiting";
    made = await m.ports.broker.create(s.runId, sandboxRequest(s, w));
  }
  if (made.ok) {
    w.proxyAddress = made.value.proxyAddress ?? "";
    w.probeTarget = made.value.probeTarget ?? null;
    if (made.value.wiring) w.wiring = made.value.wiring;
    await traceUse(m, s, w);
    return null;
  }
  if (made.retryable) throw new Error(made.message);
  const policy = must(s.policy);
  const why = made.message;
  if (NO_SANDBOX_CODES.has(made.code)) return cannotIsolate(m, s, made.code, why);
  if ((w.routing ?? policy.routing.mode) === "catch-all") {
    await m.ports.note(s.runId, {
      level: "warning",
      code: "redirect_not_installed",
      text: `The catch-all redirect could not be installed in ${w.name} (${why}), so the run stopped before its benchmark code ran there.`,
    });
    return stop(m, s, "redirect_not_installed", why);
  }
  return stop(m, s, "sandbox_failed", why);
}

function sandboxRequest(s: MachineState, w: Worker): SandboxRequest {
  const policy = must(s.policy);
  // A run that asks for no limits leaves them to the broker (the kind's defaults).
  const asked = s.spec?.resources;
  return {
    id: w.sandboxId,
    kind: w.kind,
    taskIndex: w.taskIndex,
    proxySandboxId: must(s.network).sandboxId,
    routing: w.routing ?? policy.routing.mode,
    hostsFile: (w.routing ?? policy.routing.mode) === "default" ? (w.hostsFile ?? policy.hostsFile) : [],
    ...(asked ? { resources: resourcesFor(asked, w.kind) } : {}),
    ...createFields(w),
  };
}

/**
 * A task whose turn came while the run is running (or a sandbox that waited for its setup image):
 * its sandbox is made with the routing the vault asks for now (an edit made since the run started
 * applies to it), then wired; its other stages (bundle, setup, seal, re-proof) follow in
 * steps/stages.ts.
 */
export async function prepareLateTask(
  m: Machine,
  s: MachineState,
  w: Worker,
): Promise<"done" | "pending" | number> {
  if (w.proxyAddress === null) {
    if (proxyRuns(s) && w.routing === undefined) {
      const now = await m.ports.currentRouting(s.runId);
      w.routing = now.routing.mode;
      w.hostsFile = now.hostsFile;
      await checkpoint(m, s);
    }
    const made = await createSandbox(m, s, w);
    if (made === "waiting") return "pending";
    if (made !== null) return made;
    if (!proxyRuns(s)) {
      // Like its siblings: no proxy, nothing to wire; its own stages (bundle, setup) follow.
      w.env = {};
      w.stage = firstStage(w);
    }
    return "pending";
  }
  return wireSandbox(m, s, w);
}
