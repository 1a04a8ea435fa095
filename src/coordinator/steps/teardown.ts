import type { MachineState, Worker } from "../machine";
import { checkpoint, type Machine, proxyRuns } from "./common";
import { startLinger } from "./linger";

// finishing: every way out ends here. Capabilities, the tunnel and the run's sandboxes go, then
// the proxy's credentials; or, for a run that asked to linger, everything but the proxy sandbox.

export async function tearDown(m: Machine, s: MachineState): Promise<number | null> {
  const final = s.final ?? {
    to: "failed" as const,
    reason: "internal_error",
    detail: "ended without a reason",
  };
  await m.ports.transition(s.runId, { to: "finishing", reason: final.reason, detail: final.detail });
  const seconds = s.linger ? 0 : ((await m.storage.lingerRequested()) ?? s.spec?.linger_seconds ?? 0);
  if (seconds > 0 && final.to === "finished" && proxyRuns(s)) return startLinger(m, s, final, seconds);
  await m.ports.revokeCapabilities(s.runId);
  await m.ports.endTunnel(s.runId);
  await m.ports.broker.destroyRun(s.runId);
  await m.ports.revokeProxyCredentials(s.runId);
  await m.ports.transition(s.runId, { to: final.to, reason: final.reason, detail: final.detail });
  s.state = final.to;
  return null;
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
