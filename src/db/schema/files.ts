import type { CutReason } from "@benchwright/shared/contract/bundle";
import { sql } from "drizzle-orm";
import { bigint, check, integer, pgTable, primaryKey, text, uniqueIndex } from "drizzle-orm/pg-core";
import { environmentRef } from "./accounts";
import { createdAt } from "./columns";
import { runs } from "./runs";

// Bundles and artifacts (issue 20; the bytes are in R2, the FILES binding).
// A bundle: a .tar.gz of benchmark code uploaded to an environment, named by its sha256 and
// stored in R2 at `bundles/<environment_id>/<sha256>`. Checked entry by entry at upload (what
// it unpacks to: files, unpacked_bytes). Another environment's same bytes are its own row.
export const bundles = pgTable(
  "bundles",
  {
    environmentId: environmentRef(),
    sha256: text("sha256").notNull(),
    size: bigint("size", { mode: "number" }).notNull(),
    files: integer("files").notNull(),
    unpackedBytes: bigint("unpacked_bytes", { mode: "number" }).notNull(),
    createdAt: createdAt(),
  },
  (t) => [
    primaryKey({ columns: [t.environmentId, t.sha256] }),
    check("bundles_sha256", sql`${t.sha256} ~ '^[0-9a-f]{64}$'`),
  ],
);

// The files a run's commands left in $BW_OUT of each work and task sandbox (artifacts), and the
// ones bw-collect cut (cut_reason set: over a bound, a symlink, a special or unreadable file;
// then no sha256, no R2 object, and the size only when it was known). An artifact's bytes are in
// R2 at `artifacts/<run_id>/<id>`. One row per (run, sandbox, path): storing again is a no-op.
export const runArtifacts = pgTable(
  "run_artifacts",
  {
    id: text("id").primaryKey(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    environmentId: environmentRef(),
    sandboxId: text("sandbox_id").notNull(),
    // The sandbox as the run names it: "work", or the task's name.
    sandboxName: text("sandbox_name").notNull(),
    // Relative to $BW_OUT, `/`-separated.
    path: text("path").notNull(),
    size: bigint("size", { mode: "number" }),
    sha256: text("sha256"),
    cutReason: text("cut_reason").$type<CutReason>(),
    createdAt: createdAt(),
  },
  (t) => [
    uniqueIndex("run_artifacts_run_sandbox_path").on(t.runId, t.sandboxId, t.path),
    check(
      "run_artifacts_kept_or_cut",
      sql`(${t.cutReason} is null and ${t.sha256} is not null and ${t.size} is not null) or (${t.cutReason} is not null and ${t.sha256} is null)`,
    ),
  ],
);
