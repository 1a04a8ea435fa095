import { index, pgTable, text, timestamp } from "drizzle-orm/pg-core";
import { createdAt } from "./columns";
import { runs } from "./runs";

// Compute control (issue 7).
// A run's compute-control capabilities: what a work or orchestrator sandbox presents to ask the
// broker for sandbox lifecycle (task environments) for its own run, instead of ever holding a
// backend credential. Short-lived, one random token each (stored hashed), revocable; all of a
// run's are revoked when it ends. Task sandboxes get none.
export const computeCapabilities = pgTable(
  "compute_capabilities",
  {
    id: text("id").primaryKey(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    // The sandbox it was handed to (work or orchestrator).
    holderSandboxId: text("holder_sandbox_id").notNull(),
    // SHA-256 of the token; the token itself only reaches the holder sandbox.
    tokenHash: text("token_hash").notNull().unique(),
    expiresAt: timestamp("expires_at", { withTimezone: true }).notNull(),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
    // The capability this one renewed (revoked in the same statement). Unique: a capability has
    // at most one successor, however many renewals of it race (case L6).
    renewedFrom: text("renewed_from").unique(),
    createdAt: createdAt(),
  },
  (t) => [index("compute_capabilities_run").on(t.runId)],
);
