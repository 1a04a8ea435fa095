import type { EnvironmentAnswer, EnvironmentView, Machine } from "../ports";
import type { Worker } from "../state";
import { checkpoint, proxyRuns, worker } from "./common";
import { ready, workerDone } from "./stages";

// Task environments asked for through the compute API (by the work or orchestrator sandbox's
// capability): made and wired in their turn like late tasks; the holder execs in them.

/** Task environments one run may ask for through the compute API, in all. */
export const MAX_ENVIRONMENTS = 64;

/** Asks for a task environment named `name` (made and wired at the next steps). */
export async function addEnvironment(m: Machine, name: string): Promise<EnvironmentAnswer> {
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
  const w = worker(m.ports.newId("sbx_"), "task", null, name, []);
  w.environment = true;
  s.workers.push(w);
  await checkpoint(m, s);
  await m.storage.setAlarm(m.ports.now());
  return { ok: true, environment: environmentView(w) };
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
  return { view: environmentView(w), env: live && ready(w) ? w.env : null };
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
  if (!w.destroyed && w.proxyAddress !== null) await workerDone(m, s, w);
  w.destroyed = true;
  await checkpoint(m, s);
  return { ok: true, environment: environmentView(w) };
}

function environmentView(w: Worker): EnvironmentView {
  return {
    id: w.sandboxId,
    name: w.name,
    state: w.destroyed || w.done ? "deleted" : ready(w) ? "ready" : "preparing",
  };
}
