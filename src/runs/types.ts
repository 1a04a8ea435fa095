import type { RunState } from "../db/schema";

// Plain types shared by the runs service (Postgres) and the coordinator's state machine (pure).

/** A line under "Network the platform changed" on the run. */
export interface RunNote {
  level: "note" | "warning";
  code: string;
  text: string;
}

export interface Transition {
  to: RunState;
  reason: string;
  detail?: string | undefined;
}
