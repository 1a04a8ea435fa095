import { and, eq, inArray, isNull, lt, lte, ne, or, sql } from "drizzle-orm";
import type { BrokerApi } from "../broker/interface";
import { setupImages } from "../db/schema";
import type { Q } from "../db/types";

// The reaper's part of setup images (called once per sweep from src/reaper/reconcile.ts):
//   - a `building` row whose lease lapsed LAPSED_BUILD_MS ago: its builder is gone (the run
//     ended, crashed or was reaped without releasing it): deleted, so a failed or abandoned
//     build is never kept (case P6), and the key is free for the next run to build;
//   - a `built` row nobody started from for `unusedMs` (since its last use, else its build):
//     marked `dropping`, as DELETE /v1/setup-images/{key} marks one;
//   - `dropping` rows: the stored artifacts go first (the drop port: the sweep broker's
//     dropSetupImages), then the rows whose artifacts went. One a live sandbox still mounts
//     (in use) stays and is tried again next sweep. An artifact another live row names (the
//     local store is by content, so two environments can hold the same layer) is left alone:
//     only the row goes.
// Each step sees only rows that existed at `now` (a sweep "as of" a time, as the tests drive it).

/** As long as a run may sit in a setup state before it is reaped (reconcile's STUCK_MS). */
export const LAPSED_BUILD_MS = 15 * 60_000;
const BATCH = 100;

export type DropPort = BrokerApi["dropSetupImages"];
type Artifact = Parameters<DropPort>[0][number];

export interface SetupImageReap {
  /** Rows of abandoned builds, deleted. */
  lapsed: string[];
  /** Rows unused too long, marked dropping this sweep. */
  unused: string[];
  /** Dropping rows deleted (their artifacts removed, or never stored, or still another's). */
  dropped: string[];
  /** Dropping rows kept: a live sandbox still starts from their artifact (tried next sweep). */
  inUse: string[];
  /** The drop port's failure code (its rows stay for the next sweep). */
  error?: string;
}

const sameArtifact = (a: Artifact, b: Artifact) =>
  a.backend === b.backend && a.digest === b.digest && a.repository === b.repository;

export async function reapSetupImages(
  db: Q,
  drop: DropPort,
  unusedMs: number,
  now: number,
): Promise<SetupImageReap> {
  const at = new Date(now);
  const existed = lte(setupImages.createdAt, at);
  const lapsed = await db
    .delete(setupImages)
    .where(
      and(
        existed,
        eq(setupImages.status, "building"),
        lt(setupImages.leaseUntil, new Date(now - LAPSED_BUILD_MS)),
      ),
    )
    .returning({ id: setupImages.id });
  const unused = await db
    .update(setupImages)
    .set({ status: "dropping" })
    .where(
      and(
        existed,
        eq(setupImages.status, "built"),
        lt(sql`coalesce(${setupImages.lastUsedAt}, ${setupImages.builtAt})`, new Date(now - unusedMs)),
        // A rebuild under way keeps it (it will be new when done).
        or(isNull(setupImages.leaseUntil), lte(setupImages.leaseUntil, at)),
      ),
    )
    .returning({ id: setupImages.id });
  const report: SetupImageReap = {
    lapsed: lapsed.map((r) => r.id),
    unused: unused.map((r) => r.id),
    dropped: [],
    inUse: [],
  };

  const dropping = await db
    .select({
      id: setupImages.id,
      backend: setupImages.backend,
      digest: setupImages.digest,
      repository: setupImages.repository,
    })
    .from(setupImages)
    .where(and(existed, eq(setupImages.status, "dropping")))
    .limit(BATCH);
  if (dropping.length === 0) return report;

  const stored = dropping.filter((r): r is typeof r & Artifact => r.digest !== null);
  const kept =
    stored.length === 0
      ? []
      : await db
          .select({
            backend: setupImages.backend,
            digest: setupImages.digest,
            repository: setupImages.repository,
          })
          .from(setupImages)
          .where(
            and(
              ne(setupImages.status, "dropping"),
              inArray(
                setupImages.digest,
                stored.map((r) => r.digest),
              ),
            ),
          );
  const toDrop: Artifact[] = [];
  for (const r of stored) {
    const artifact = { backend: r.backend, digest: r.digest, repository: r.repository };
    if (kept.some((k) => sameArtifact(k as Artifact, artifact))) continue;
    if (!toDrop.some((a) => sameArtifact(a, artifact))) toDrop.push(artifact);
  }

  let gone = new Set<string>();
  let inUse = new Set<string>();
  if (toDrop.length > 0) {
    const answer = await drop(toDrop).catch((e: unknown) => ({
      ok: false as const,
      code: e instanceof Error ? e.name : "thrown",
    }));
    if (answer.ok) {
      gone = new Set(answer.value.dropped);
      inUse = new Set(answer.value.inUse);
    } else report.error = answer.code;
  }
  // A row goes when it stored nothing, when its artifact stays for another row, or when the
  // port dropped it; the rest stay for the next sweep.
  const deletable = dropping.filter(
    (r) => r.digest === null || !toDrop.some((a) => sameArtifact(a, r as Artifact)) || gone.has(r.digest),
  );
  report.inUse = dropping.filter((r) => r.digest !== null && inUse.has(r.digest)).map((r) => r.id);
  if (deletable.length > 0) {
    const deleted = await db
      .delete(setupImages)
      .where(
        and(
          inArray(
            setupImages.id,
            deletable.map((r) => r.id),
          ),
          // A row a claim took back meanwhile is no longer ours to delete.
          eq(setupImages.status, "dropping"),
        ),
      )
      .returning({ id: setupImages.id });
    report.dropped = deleted.map((r) => r.id);
  }
  return report;
}
