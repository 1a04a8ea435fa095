import type {
  ImageDigest,
  SetupImageClaim,
  SetupImageInputs,
  SetupImageKey,
  SetupImageMode,
} from "@benchwright/shared/contract/setup-image";
import { and, eq, inArray, isNull, lt, ne, or, type SQL, sql } from "drizzle-orm";
import { randomId } from "../crypto/api-keys";
import { setupImages } from "../db/schema";
import type { Q } from "../db/types";

// Who builds a setup image, and what is built: the `setup_images` rows arbitrate, with no Durable
// Object of their own. A claim is one statement (insert the key `building` with a lease, or take
// over a lease that lapsed), so of any number of claims at once, from any isolate, Postgres lets
// exactly one through; the others read the row and wait, or use what is built (case P6). Times
// are the database's (`now()`), so every isolate agrees when a lease lapses. Only the broker
// calls these; a sandbox starts only from the digest a `built` row of its own environment holds.

export type SetupImageRow = typeof setupImages.$inferSelect;

export interface Claim {
  environmentId: string;
  key: SetupImageKey;
  inputs: SetupImageInputs;
  backend: SetupImageRow["backend"];
  runId: string;
  sandboxId: string;
  mode: SetupImageMode;
  leaseMs: number;
}

const now = sql`now()`;
const leaseEnd = (ms: number) => sql`now() + (${Math.ceil(ms)}::integer * interval '1 millisecond')`;
const ofKey = (environmentId: string, key: string) =>
  and(eq(setupImages.environmentId, environmentId), eq(setupImages.key, key));

/**
 * Which sandbox may build the key now (the claim's update applies to the existing row only under
 * this): the one already building it (claiming again renews its lease); anyone once a `building`
 * lease lapsed; for `rebuild`, anyone on a `built` row no live builder holds, unless this very run
 * built it (its other sandboxes use its fresh build instead of building it once more each).
 */
function takeable(c: Claim): SQL | undefined {
  const lapsed = lt(setupImages.leaseUntil, now);
  return or(
    and(ne(setupImages.status, "dropping"), eq(setupImages.builderSandboxId, c.sandboxId)),
    and(eq(setupImages.status, "building"), lapsed),
    c.mode === "rebuild"
      ? and(
          eq(setupImages.status, "built"),
          sql`${setupImages.builtByRunId} is distinct from ${c.runId}`,
          or(isNull(setupImages.builderSandboxId), lapsed),
        )
      : undefined,
  );
}

/**
 * The role of one sandbox for the key (contract/setup-image.ts SetupImageClaim): build (the row
 * is now this sandbox's, with a lease of leaseMs), wait (another sandbox builds it), use (built),
 * or none (being dropped).
 */
export async function claim(db: Q, c: Claim): Promise<SetupImageClaim> {
  // A row deleted between the statement and the read (a release, a drop) is claimed afresh.
  for (let attempt = 0; attempt < 3; attempt++) {
    const [won] = await db
      .insert(setupImages)
      .values({
        id: randomId("simg_"),
        environmentId: c.environmentId,
        key: c.key,
        status: "building",
        backend: c.backend,
        inputs: c.inputs,
        builderRunId: c.runId,
        builderSandboxId: c.sandboxId,
        leaseUntil: leaseEnd(c.leaseMs),
      })
      .onConflictDoUpdate({
        target: [setupImages.environmentId, setupImages.key],
        set: { builderRunId: c.runId, builderSandboxId: c.sandboxId, leaseUntil: leaseEnd(c.leaseMs) },
        setWhere: takeable(c),
      })
      .returning({ key: setupImages.key });
    if (won) return { role: "build", key: c.key };
    const seen = await standing(db, c.environmentId, c.key);
    if (seen) return roleOf(seen, c);
  }
  throw new Error(`the setup image row of ${c.key} kept changing`);
}

/** A row as a claim reads it: `leaseLive` by the database's clock. */
interface Standing {
  status: SetupImageRow["status"];
  digest: string | null;
  builtByRunId: string | null;
  builtAt: Date | null;
  builderRunId: string | null;
  builderSandboxId: string | null;
  leaseLive: boolean;
}

async function standing(db: Q, environmentId: string, key: string): Promise<Standing | null> {
  const [row] = await db
    .select({
      status: setupImages.status,
      digest: setupImages.digest,
      builtByRunId: setupImages.builtByRunId,
      builtAt: setupImages.builtAt,
      builderRunId: setupImages.builderRunId,
      builderSandboxId: setupImages.builderSandboxId,
      leaseLive: sql<boolean>`coalesce(${setupImages.leaseUntil} >= now(), false)`,
    })
    .from(setupImages)
    .where(ofKey(environmentId, key));
  return row ?? null;
}

/** Whom a role is for: the key, and the run and mode of the claim. */
type Claimant = Pick<Claim, "key" | "runId" | "mode">;

/**
 * What a sandbox that did not get the key does. A `rebuild` waits for a live rebuild (its run
 * wants a fresh setup, not the old one) unless its own run built the image; a `use` takes the
 * built image meanwhile.
 */
function roleOf(row: Standing, { key, runId, mode }: Claimant): SetupImageClaim {
  if (row.status === "dropping") return { role: "none", reason: `setup image ${key} is being dropped` };
  const rebuilding =
    mode === "rebuild" && row.builtByRunId !== runId && row.builderSandboxId !== null && row.leaseLive;
  if (row.status === "building" || rebuilding) return { role: "wait", key, builderRunId: row.builderRunId };
  return {
    role: "use",
    key,
    digest: row.digest as ImageDigest,
    builtByRunId: row.builtByRunId,
    builtAt: (row.builtAt ?? new Date(0)).toISOString(),
  };
}

/**
 * The role when the environment has no room for another image: what is built or being built is
 * still used or waited for; nothing new is built (and a rebuild runs its setup uncached).
 */
export async function claimWithoutBuilding(
  db: Q,
  environmentId: string,
  c: Claimant,
  reason: string,
): Promise<SetupImageClaim> {
  const seen = await standing(db, environmentId, c.key);
  const wantsFresh = c.mode === "rebuild" && seen?.status === "built" && seen.builtByRunId !== c.runId;
  if (!seen || wantsFresh) return { role: "none", reason };
  return roleOf(seen, c);
}

/**
 * Extends the builder's lease (before a capture, which may outlast a claim's); false when this
 * sandbox no longer builds the key (released, taken over, dropped).
 */
export async function renew(
  db: Q,
  b: { environmentId: string; key: string; sandboxId: string; leaseMs: number },
): Promise<boolean> {
  const renewed = await db
    .update(setupImages)
    .set({ leaseUntil: leaseEnd(b.leaseMs) })
    .where(
      and(
        ofKey(b.environmentId, b.key),
        eq(setupImages.builderSandboxId, b.sandboxId),
        ne(setupImages.status, "dropping"),
      ),
    )
    .returning({ id: setupImages.id });
  return renewed.length === 1;
}

/**
 * Records the builder's capture: the first writer wins (only the sandbox that holds the key may
 * write it; one whose lease was taken over writes nothing), and a rebuild replaces the digest.
 * Clears the builder. False when this sandbox was not (or no longer) the builder.
 */
export async function markBuilt(
  db: Q,
  b: {
    environmentId: string;
    key: string;
    sandboxId: string;
    runId: string;
    digest: ImageDigest;
    /** A registry image's repository (null on local). */
    repository?: string | null;
    sizeBytes: number;
    files: number;
  },
): Promise<boolean> {
  const built = await db
    .update(setupImages)
    .set({
      status: "built",
      digest: b.digest,
      repository: b.repository ?? null,
      sizeBytes: b.sizeBytes,
      files: b.files,
      builtByRunId: b.runId,
      builtAt: now,
      lastUsedAt: null,
      builderRunId: null,
      builderSandboxId: null,
      leaseUntil: null,
    })
    .where(
      and(
        ofKey(b.environmentId, b.key),
        eq(setupImages.builderSandboxId, b.sandboxId),
        ne(setupImages.status, "dropping"),
      ),
    )
    .returning({ id: setupImages.id });
  return built.length === 1;
}

/**
 * Gives builds up (a failed setup is never cached): a `building` row one of them holds is
 * deleted; a `built` row it was rebuilding keeps its image and loses its builder.
 */
async function releaseWhere(db: Q, held: SQL | undefined): Promise<void> {
  await db.delete(setupImages).where(and(held, eq(setupImages.status, "building")));
  await db
    .update(setupImages)
    .set({ builderRunId: null, builderSandboxId: null, leaseUntil: null })
    .where(and(held, ne(setupImages.status, "building")));
}

/** This sandbox's build of the key (the run's own sandbox: no run gives up another's build). */
export function release(
  db: Q,
  b: { environmentId: string; key: string; runId: string; sandboxId: string },
): Promise<void> {
  return releaseWhere(
    db,
    and(
      ofKey(b.environmentId, b.key),
      eq(setupImages.builderRunId, b.runId),
      eq(setupImages.builderSandboxId, b.sandboxId),
    ),
  );
}

/** Every build a sandbox holds (it is destroyed: it can never capture). */
export function releaseSandbox(db: Q, sandboxId: string): Promise<void> {
  return releaseWhere(db, eq(setupImages.builderSandboxId, sandboxId));
}

/** Every build the run's sandboxes hold (the run is torn down). */
export function releaseRun(db: Q, runId: string): Promise<void> {
  return releaseWhere(db, eq(setupImages.builderRunId, runId));
}

/** The digest (and backend) of the environment's built image of the key, or null. */
export async function builtDigest(
  db: Q,
  environmentId: string,
  key: string,
): Promise<{ digest: ImageDigest; backend: SetupImageRow["backend"]; builtByRunId: string | null } | null> {
  const [row] = await db
    .select({
      digest: setupImages.digest,
      backend: setupImages.backend,
      builtByRunId: setupImages.builtByRunId,
    })
    .from(setupImages)
    .where(and(ofKey(environmentId, key), eq(setupImages.status, "built")));
  return row?.digest
    ? { digest: row.digest as ImageDigest, backend: row.backend, builtByRunId: row.builtByRunId }
    : null;
}

/** A sandbox started from the image (the reaper drops images unused for long). */
export async function touch(db: Q, environmentId: string, key: string): Promise<void> {
  await db.update(setupImages).set({ lastUsedAt: now }).where(ofKey(environmentId, key));
}

/**
 * Forgets an image whose layer the backend found missing or not matching its digest, so the
 * next claim builds it again; a row that names another digest by now (rebuilt) stays.
 */
export async function dropRow(
  db: Q,
  b: { environmentId: string; key: string; digest: string },
): Promise<void> {
  await db.delete(setupImages).where(and(ofKey(b.environmentId, b.key), eq(setupImages.digest, b.digest)));
}

/** The bytes of the environment's built images (but the key's own, which a rebuild replaces). */
export async function environmentBytes(db: Q, environmentId: string, exceptKey?: string): Promise<number> {
  const [row] = await db
    .select({ bytes: sql<string>`coalesce(sum(${setupImages.sizeBytes}), 0)` })
    .from(setupImages)
    .where(
      and(
        eq(setupImages.environmentId, environmentId),
        eq(setupImages.status, "built"),
        exceptKey === undefined ? undefined : ne(setupImages.key, exceptKey),
      ),
    );
  return Number(row?.bytes ?? 0);
}

/**
 * Which of these digests a row of the backend names (layers are stored by content, so rows of
 * several environments may name one). `keptOnly`: only rows not being dropped.
 */
export async function namedDigests(
  db: Q,
  backend: string,
  digests: string[],
  options: { keptOnly: boolean },
): Promise<Set<string>> {
  if (digests.length === 0) return new Set();
  const rows = await db
    .selectDistinct({ digest: setupImages.digest })
    .from(setupImages)
    .where(
      and(
        eq(setupImages.backend, backend as SetupImageRow["backend"]),
        inArray(setupImages.digest, digests),
        options.keptOnly ? ne(setupImages.status, "dropping") : undefined,
      ),
    );
  return new Set(rows.flatMap((r) => (r.digest ? [r.digest] : [])));
}
