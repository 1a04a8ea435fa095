import type { SetupImageInputs } from "@benchwright/shared/contract/setup-image";
import { bigint, index, integer, jsonb, pgTable, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";
import { environmentRef } from "./accounts";
import { createdAt } from "./columns";
import { runs } from "./runs";

// Setup images (issue 34): per environment, one row per key (shared/contract/setup-image.ts).
// The row also arbitrates who builds: a claim inserts it `building` with a lease, or takes over a
// lease that lapsed, in one statement; everyone else waits for `built` or starts from it. Only
// the broker writes here, and a sandbox starts only from the digest a `built` row holds (P3).
export const setupImages = pgTable(
  "setup_images",
  {
    id: text("id").primaryKey(),
    environmentId: environmentRef(),
    // sha256 hex of the inputs (setupImageKey).
    key: text("key").notNull(),
    // dropping: asked to go (DELETE, or unused too long); the reaper removes the artifact, then the row.
    status: text("status", { enum: ["building", "built", "dropping"] }).notNull(),
    backend: text("backend", { enum: ["sandbox0", "e2b", "local"] }).notNull(),
    // What the key hashes (shown by GET /v1/setup-images).
    inputs: jsonb("inputs").$type<SetupImageInputs>().notNull(),
    // What a sandbox starts from: local, the layer tar's sha256; a registry, the manifest's digest.
    digest: text("digest"),
    // A registry image's repository (null on local).
    repository: text("repository"),
    sizeBytes: bigint("size_bytes", { mode: "number" }),
    files: integer("files"),
    builtByRunId: text("built_by_run_id").references(() => runs.id, { onDelete: "set null" }),
    builtAt: timestamp("built_at", { withTimezone: true }),
    lastUsedAt: timestamp("last_used_at", { withTimezone: true }),
    // The sandbox building it now (first build, a rebuild, or a lapsed lease taken over) and until
    // when its claim holds; cleared once it is built.
    builderRunId: text("builder_run_id").references(() => runs.id, { onDelete: "set null" }),
    builderSandboxId: text("builder_sandbox_id"),
    leaseUntil: timestamp("lease_until", { withTimezone: true }),
    createdAt: createdAt(),
  },
  (t) => [
    uniqueIndex("setup_images_environment_key").on(t.environmentId, t.key),
    index("setup_images_environment_used").on(t.environmentId, t.lastUsedAt),
  ],
);
