import { isTerminal } from "@benchwright/shared/contract/run-states";
import type { Machine, WakeResult } from "../ports";
import type { Final, LingerWindow, MachineState } from "../state";
import { finish, move, must, proxyRuns } from "./common";

// lingering: a run whose commands ended may keep its proxy sandbox for a while (at most 24 h):
// its work and task sandboxes are gone, the proxy keeps the run's credentials and its view, is
// paused when nobody looked at it for a while, woken by the next look, and torn down when the
// window lapses (reason `linger_lapsed`).

/** A lingering proxy nobody looked at for this long is paused (default; see MachineOptions). */
export const LINGER_IDLE_MS = 10 * 60_000;

/**
 * The commands ended and the run asked to linger: everything but the proxy sandbox goes now;
 * the proxy keeps its credentials (they are revoked when the linger ends).
 */
export async function startLinger(
  m: Machine,
  s: MachineState,
  outcome: Final,
  seconds: number,
): Promise<number> {
  await m.ports.revokeCapabilities(s.runId);
  await m.ports.endTunnel(s.runId);
  await m.ports.broker.destroyRun(s.runId, { keepProxy: true });
  const now = m.ports.now();
  s.linger = { seconds, startedAt: now, lastActivity: now, paused: false, pauses: 0, outcome };
  await m.ports.setRunFields(s.runId, {
    lingerSeconds: seconds,
    lingerUntil: new Date(now + seconds * 1000),
    lingerPausedAt: null,
  });
  await move(m, s, "lingering", outcome.reason, outcome.detail);
  return lingerAlarm(m, s.linger);
}

/** A lingering run: a changed window, a cancel, the window's end, or idleness (pause). */
export async function lingerStep(m: Machine, s: MachineState): Promise<number> {
  const linger = must(s.linger);
  const asked = await m.storage.lingerRequested();
  if (asked !== null && asked !== linger.seconds) {
    linger.seconds = asked;
    await m.ports.setRunFields(s.runId, {
      lingerSeconds: asked,
      lingerUntil: new Date(linger.startedAt + asked * 1000),
    });
  }
  const now = m.ports.now();
  const ended =
    `The run's commands had ended (${linger.outcome.reason}): ${linger.outcome.detail ?? ""}`.trim();
  if (s.cancel) {
    return endLinger(
      m,
      s,
      s.cancelReason === "reaped"
        ? { reason: "linger_lapsed", detail: `The linger window lapsed and the sweeper ended it. ${ended}` }
        : { reason: "cancelled", detail: `The user ended the linger. ${ended}` },
    );
  }
  if (now >= lingerUntil(linger)) {
    return endLinger(m, s, {
      reason: "linger_lapsed",
      detail: `The proxy's linger window (${linger.seconds} s) lapsed. ${ended}`,
    });
  }
  if (!linger.paused && now >= linger.lastActivity + m.lingerIdleMs) {
    await m.ports.broker.freeze(s.runId, must(s.network).sandboxId, true);
    linger.paused = true;
    linger.pauses += 1;
    await m.ports.setRunFields(s.runId, { lingerPausedAt: new Date(now) });
    await m.ports.event(s.runId, `linger:pause:${linger.pauses}`, "note", {
      text: `The lingering proxy was paused: nobody looked at it for ${Math.round(m.lingerIdleMs / 1000)} s. The next look resumes it.`,
      lingerPaused: true,
    });
  }
  return lingerAlarm(m, linger);
}

/**
 * Someone looks at the run's proxy (through the control plane): a paused lingering proxy is
 * resumed first, and its idle clock restarts. Answers which sandbox to talk to.
 */
export async function wake(m: Machine): Promise<WakeResult> {
  const s = await m.storage.load();
  if (!s || isTerminal(s.state) || s.state === "finishing")
    return { ok: false, why: `the run is ${s?.state ?? "unknown"}` };
  if (!proxyRuns(s)) return { ok: false, why: `no proxy runs for this run (it is ${s.state})` };
  const sandboxId = must(s.network).sandboxId;
  if (s.state !== "lingering" || !s.linger) return { ok: true, runId: s.runId, sandboxId, resumed: false };
  const resumed = s.linger.paused;
  if (resumed) {
    await m.ports.broker.freeze(s.runId, sandboxId, false);
    s.linger.paused = false;
    await m.ports.setRunFields(s.runId, { lingerPausedAt: null });
    await m.ports.event(s.runId, `linger:resume:${s.linger.pauses}`, "note", {
      text: "The lingering proxy was resumed: someone looked at it.",
      lingerPaused: false,
    });
  }
  s.linger.lastActivity = m.ports.now();
  await m.storage.save(s);
  await m.storage.setAlarm(lingerAlarm(m, s.linger));
  return { ok: true, runId: s.runId, sandboxId, resumed };
}

/** The linger ends: the run ends as its commands did (finished), with the linger's reason. */
function endLinger(m: Machine, s: MachineState, why: { reason: string; detail: string }): number {
  // Replaces the commands' outcome as the run's end (finish keeps a final already set).
  s.final = { to: must(s.linger).outcome.to, reason: why.reason, detail: why.detail };
  finish(m, s, s.final);
  return m.ports.now();
}

/** When a lingering run next needs a step: its window's end, or its pause when awake. */
function lingerAlarm(m: Machine, linger: LingerWindow): number {
  const until = lingerUntil(linger);
  return linger.paused ? until : Math.min(until, linger.lastActivity + m.lingerIdleMs);
}

const lingerUntil = (l: LingerWindow) => l.startedAt + l.seconds * 1000;
