import { index, pgTable, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";
import { environmentRef } from "./accounts";
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

// The image build cache: per environment, a content hash of a task's image recipe and the digest
// the broker read from the registry after the one push it allowed. A later run uses the image
// by that digest, and only while the registry's tag still names it.
export const imageBuilds = pgTable(
  "image_builds",
  {
    id: text("id").primaryKey(),
    environmentId: environmentRef(),
    // sha256 hex of the recipe (Dockerfile and context), as the requester computed it.
    contentHash: text("content_hash").notNull(),
    repository: text("repository").notNull(),
    tag: text("tag").notNull(),
    status: text("status", { enum: ["pending", "built"] })
      .notNull()
      .default("pending"),
    // sha256:... read from the registry (Docker-Content-Digest) when the push was confirmed.
    digest: text("digest"),
    // The run whose push is allowed (pending), and until when its push credential is valid.
    pushRunId: text("push_run_id").references(() => runs.id, { onDelete: "set null" }),
    pushExpiresAt: timestamp("push_expires_at", { withTimezone: true }),
    createdAt: createdAt(),
    builtAt: timestamp("built_at", { withTimezone: true }),
  },
  (t) => [uniqueIndex("image_builds_environment_hash").on(t.environmentId, t.contentHash)],
);
