import type { EnvironmentAnswer, EnvironmentRequest, EnvironmentView, Machine } from "../ports";
import type { MachineState, Worker } from "../state";
import { checkpoint, proxyRuns, worker } from "./common";
import { placeholderEnv } from "./output";
import { giveUpBuild } from "./setup-image";
import { ready, workerDone } from "./stages";

// Task environments asked for through the compute API (by the work or orchestrator sandbox's
// capability): made and wired in their turn like late tasks; the holder execs in them.
//
// One asked for with setup of its own (a Harbor task's environment recipe, issue 34) is prepared
// as a spec'd task with that setup is: the bundle, the run's setup, then its own, through its
// setup image (steps/setup-image.ts: the same claim, key, build and use, so a second environment
// of the same setup, in this run or a later one of the environment, starts from the image). One
// asked for without is bare, as before: no bundle, no setup; the holder prepares it.

/** Task environments one run may ask for through the compute API, in all. */
export const MAX_ENVIRONMENTS = 64;

/** Asks for a task environment (made, set up and wired at the next steps). */
export async function addEnvironment(m: Machine, request: EnvironmentRequest): Promise<EnvironmentAnswer> {
  const { name } = request;
  const s = await m.storage.load();
  if (s?.state !== "running" || s.final) {
    return { ok: false, code: "run_ended", why: "the run is not running" };
  }
  if (!proxyRuns(s)) return { ok: false, code: "run_ended", why: "the run has no proxy" };
  if (s.workers.some((w) => w.name === name)) {
    return { ok: false, code: "conflict", why: `the run already has a sandbox named ${name}` };
  }
  if (s.workers.filter((w) => w.environment).length >= MAX_ENVIRONMENTS) {
    return { ok: false, code: "limit", why: `a run may ask for at most ${MAX_ENVIRONMENTS} environments` };
  }
  const setup = request.setup ? [...(s.spec?.setup ?? []), ...request.setup] : [];
  const w = worker(m.ports.newId("sbx_"), "task", null, name, [], setup);
  w.environment = true;
  s.workers.push(w);
  await checkpoint(m, s);
  await m.storage.setAlarm(m.ports.now());
  return { ok: true, environment: environmentView(s, w) };
}

/** A task environment of the run and its exec environment (null env while not ready). */
export async function environment(
  m: Machine,
  id: string,
): Promise<{ view: EnvironmentView; env: Record<string, string> | null } | null> {
  const s = await m.storage.load();
  const w = s?.workers.find((x) => x.environment && x.sandboxId === id);
  if (!s || !w) return null;
  // Halted for review: nothing new starts in any of the run's sandboxes until it resumes.
  const live = s.state === "running" && !w.done && !s.halted;
  // A task sandbox like any other: the holder's execs see the run's placeholders (case N1).
  return { view: environmentView(s, w), env: live && ready(w) ? { ...w.env, ...placeholderEnv(s) } : null };
}

/** Deletes a task environment: its sandbox is destroyed now. Idempotent. */
export async function removeEnvironment(m: Machine, id: string): Promise<EnvironmentAnswer> {
  const s = await m.storage.load();
  const w = s?.workers.find((x) => x.environment && x.sandboxId === id);
  if (!s || !w) return { ok: false, code: "not_found", why: `no environment ${id}` };
  if (!w.done) {
    w.done = true;
    w.exitCode = 0;
  }
  // Deleted during its setup: nothing of it is kept, and this run's others of that setup build it.
  await giveUpBuild(m, s, w);
  if (!w.destroyed && w.proxyAddress !== null) await workerDone(m, s, w);
  w.destroyed = true;
  await checkpoint(m, s);
  return { ok: true, environment: environmentView(s, w) };
}

function environmentView(s: MachineState, w: Worker): EnvironmentView {
  const view: EnvironmentView = {
    id: w.sandboxId,
    name: w.name,
    state: w.destroyed || w.done ? "deleted" : ready(w) ? "ready" : "preparing",
  };
  const image = w.image;
  if (image?.role === "use") {
    const builtBy = image.builtByRunId;
    view.setupImage = { key: image.key, digest: image.digest, builtBy, builtNow: builtBy === s.runId };
  } else if (image?.role === "build" && image.state === "captured" && image.digest !== null) {
    view.setupImage = { key: image.key, digest: image.digest, builtBy: s.runId, builtNow: true };
  }
  return view;
}
