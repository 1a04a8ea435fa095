import { isTerminal } from "@benchwright/shared/contract/run-states";
import { eq } from "drizzle-orm";
import type { PgColumn } from "drizzle-orm/pg-core";
import { hashApiKey, timingSafeEqualHex } from "../crypto/api-keys";
import { runs } from "../db/schema";
import type { Db } from "../db/types";

// A run's bearer tokens (the proxy's bwp_, the egress agent's bwe_) are kept as their SHA-256
// only, each in a unique column of the run, and resolved here, one way for both: looked up by
// hash, then compared again in constant time, so no timing depends on the token. Callers check
// the token's shape first (cheaper than a hash and a query).

const RUN = { id: runs.id, userId: runs.userId, environmentId: runs.environmentId, status: runs.status };

/**
 * The run whose `column` holds the token's hash, with the `extra` columns asked for and whether
 * it has ended; null when no run does (unknown, replaced or revoked). It does not judge the run's
 * state: callers decide what an ended run may still do.
 */
export async function findRunByTokenHash<Extra extends Record<string, PgColumn>>(
  db: Db,
  column: typeof runs.proxyTokenHash | typeof runs.egressTokenHash,
  token: string,
  extra: Extra,
) {
  const hash = await hashApiKey(token);
  const [row] = await db
    .select({ ...extra, ...RUN, hash: column })
    .from(runs)
    .where(eq(column, hash));
  if (!row?.hash || !timingSafeEqualHex(row.hash, hash)) return null;
  const { hash: _, ...run } = row;
  return { ...run, ended: isTerminal(row.status) };
}
