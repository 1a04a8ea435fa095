// A run's states, in the order a run moves through them, and the three it ends in. The database
// enum (db/schema/runs.ts), the API and the coordinator read them from here.

export const RUN_STATES = [
  "queued",
  "fetching_vault",
  "starting_proxy",
  "starting_sandboxes",
  "wiring",
  "running",
  "finishing",
  "lingering",
  "finished",
  "stopped",
  "failed",
] as const;
export type RunState = (typeof RUN_STATES)[number];

/** The states a run ends in: nothing moves it on, and its proxy token is no longer valid. */
export const TERMINAL_STATES = ["finished", "stopped", "failed"] as const satisfies readonly RunState[];
export type TerminalState = (typeof TERMINAL_STATES)[number];

export const isTerminal = (s: RunState): s is TerminalState =>
  (TERMINAL_STATES as readonly RunState[]).includes(s);
