import type { Machine } from "../ports";
import type { MachineState } from "../state";
import { retrofitCheck } from "./hosts";

// Halted for review: the work and task sandboxes' processes are stopped (frozen) while the proxy
// keeps running and picks up policy edits; resumed where they were.

/** Stops or continues every unfinished work and task sandbox, and says so in the trace. */
export async function applyHalt(m: Machine, s: MachineState, halt: boolean): Promise<number> {
  const cycle = halt ? s.halts + 1 : s.halts;
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
