import { parseHostPattern } from "@benchwright/shared/policy/host";
import { eq, sql } from "drizzle-orm";
import { vaultSettings } from "../db/schema";
import type { Db, Tx } from "../db/types";
import { type Failure, fail, ok, type Result } from "../errors";

// What every writer of a vault shares (secrets.ts, rules.ts, hosts.ts, models.ts, settings.ts):
// one vault change, made the same way by all, the version bumped first, which locks the vault's
// settings row, so writers of one vault are serialised and a run's compile sees rows and version
// agree; and the not-found and host-pattern answers.

class Abort extends Error {
  constructor(readonly failure: Failure) {
    super(failure.code);
  }
}

/** Runs one vault change: bump the version (locking the vault), apply, commit or roll back. */
export async function change<T>(
  db: Db,
  environmentId: string,
  fn: (tx: Tx) => Promise<Result<T>>,
): Promise<Result<T>> {
  try {
    return await db.transaction(async (tx) => {
      await bumpVersion(tx, environmentId);
      const result = await fn(tx);
      if (!result.ok) throw new Abort(result.error);
      return result;
    });
  } catch (e) {
    if (e instanceof Abort) return { ok: false, error: e.failure };
    throw e;
  }
}

async function bumpVersion(tx: Tx, environmentId: string): Promise<void> {
  // Environments made before settings existed get their row on first write.
  await tx.insert(vaultSettings).values({ environmentId }).onConflictDoNothing();
  await tx
    .update(vaultSettings)
    .set({ version: sql`${vaultSettings.version} + 1`, updatedAt: new Date() })
    .where(eq(vaultSettings.environmentId, environmentId));
}

export const notFound = (what: string, id: string) => fail("not_found", `No ${what} ${id} in this vault.`);

/** A host pattern as the user wrote it, canonical, or invalid_host_pattern quoting it. */
export function checkPattern(input: string, use: "host-entry" | "rule"): Result<string> {
  const parsed = parseHostPattern(input, use);
  return parsed.ok
    ? ok(parsed.pattern)
    : fail("invalid_host_pattern", `${JSON.stringify(input)}: ${parsed.message}`);
}
