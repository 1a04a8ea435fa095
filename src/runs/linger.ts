import { readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { z } from "@hono/zod-openapi";
import type { RunRow } from "./service";

// A run's linger, as the API and the run page show it: the one view of it. (The coordinator keeps
// its own running record of the window, LingerWindow in coordinator/state.ts.)

export const Linger = z
  .object({
    seconds: z
      .number()
      .int()
      .nullable()
      .openapi({ description: "Asked for; null: the proxy does not linger" }),
    until: z
      .string()
      .datetime()
      .nullable()
      .openapi({ description: "When the window lapses (set once the run lingers)" }),
    paused: z.boolean().openapi({ description: "Paused for idleness; the next look resumes it" }),
  })
  .openapi("Linger");
export type Linger = z.infer<typeof Linger>;

export function lingerOf(run: RunRow): Linger {
  return {
    seconds: run.lingerSeconds ?? readStoredSpec(run.spec).lingerSeconds ?? null,
    until: run.lingerUntil?.toISOString() ?? null,
    paused: run.status === "lingering" && run.lingerPausedAt !== null,
  };
}
