import type { MachineState } from "../machine";
import type { Machine } from "./common";

// Halted for review: the work and task sandboxes' processes are stopped (frozen) while the proxy
// keeps running and picks up policy edits; resumed where they were.

/** Stops or continues every unfinished work and task sandbox, and says so in the trace. */
export async function applyHalt(m: Machine, s: MachineState, halt: boolean): Promise<number> {
  const cycle = halt ? (s.halts ?? 0) + 1 : (s.halts ?? 0);
  for (const w of s.workers) {
    if (!w.done && w.proxyAddress !== null) await m.ports.broker.freeze(s.runId, w.sandboxId, halt);
  }
  if (halt) {
    s.halts = cycle;
    await m.ports.event(s.runId, `halt:${cycle}`, "note", {
      text: "Halted for review: the run's commands are stopped; the proxy keeps running and picks up host policy edits within seconds.",
      halted: true,
    });
  } else {
    await retrofitCheck(m, s);
    await m.ports.event(s.runId, `resume:${cycle}`, "note", { text: "Resumed.", halted: false });
  }
  s.halted = halt;
  return m.ports.now();
}

/**
 * Routing is installed when a sandbox is made; an edit that needs catch-all (a block default,
 * a wildcard block, ...) cannot be put onto sandboxes that run under default routing. Say so.
 */
async function retrofitCheck(m: Machine, s: MachineState): Promise<void> {
  const installed = s.policy?.routing.mode;
  if (installed !== "default") return;
  const now = (await m.ports.currentRouting(s.runId)).routing;
  if (now.mode !== "catch-all") return;
  const later = s.workers.some((w) => w.proxyAddress === null)
    ? " Task sandboxes made from now on (tasks still waiting for their turn) get catch-all routing."
    : "";
  await m.ports.note(s.runId, {
    level: "warning",
    code: "routing_change_not_retrofitted",
    text: `The vault now needs catch-all routing (${now.reasons.join(", ")}), which cannot be installed on this run's running sandboxes: they keep default routing, so only the hosts in their hosts file go through the proxy. Relaunch the run to get catch-all routing.${later}`,
  });
}
