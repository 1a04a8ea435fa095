import type { Machine } from "../ports";
import type { MachineState } from "../state";
import { proxyRuns } from "./common";
import { startLinger } from "./linger";
import { releaseBuilds } from "./setup-image";
import { collect } from "./stages";

// finishing: every way out ends here. Setup-image builds not captured are released; capabilities,
// the tunnel and the run's sandboxes go, then the proxy's credentials; or, for a run that asked
// to linger, everything but the proxy sandbox.

export async function tearDown(m: Machine, s: MachineState): Promise<number | null> {
  const final = s.final ?? {
    to: "failed" as const,
    reason: "internal_error",
    detail: "ended without a reason",
  };
  await m.ports.transition(s.runId, { to: "finishing", reason: final.reason, detail: final.detail });
  await collectLeft(m, s);
  // A setup image whose build did not reach its capture (a failed setup, a stop) is never kept.
  await releaseBuilds(m, s);
  const seconds = s.linger ? 0 : ((await m.storage.lingerRequested()) ?? s.spec?.lingerSeconds ?? 0);
  if (seconds > 0 && final.to === "finished" && proxyRuns(s)) return startLinger(m, s, final, seconds);
  await m.ports.revokeCapabilities(s.runId);
  await m.ports.endTunnel(s.runId);
  await m.ports.broker.destroyRun(s.runId);
  await m.ports.revokeProxyCredentials(s.runId);
  await m.ports.transition(s.runId, { to: final.to, reason: final.reason, detail: final.detail });
  s.state = final.to;
  return null;
}

/**
 * A run that stopped (a failed setup, a limit, a cancel, ...) still gives what its sandboxes left
 * under $BW_OUT, before they go. Not while halted: their processes are frozen, bw-collect's too.
 */
async function collectLeft(m: Machine, s: MachineState): Promise<void> {
  const left = s.workers.filter((w) => w.ran && !w.collected && !w.destroyed && !w.environment);
  if (left.length === 0) return;
  if (!s.halted) {
    for (const w of left) await collect(m, s, w);
    return;
  }
  await m.ports.note(s.runId, {
    level: "warning",
    code: "artifacts_not_collected",
    text: `The run ended while halted, so the files under $BW_OUT in ${left.map((w) => w.name).join(", ")} were not collected (their processes were stopped).`,
  });
}
