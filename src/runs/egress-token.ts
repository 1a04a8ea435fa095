import type { StoredRunSpec } from "@benchwright/shared/contract/run-spec";
import { isTerminal } from "@benchwright/shared/contract/run-states";
import { EGRESS_TOKEN_PREFIX, EgressToken } from "@benchwright/shared/contract/tunnel";
import { eq } from "drizzle-orm";
import { encodeBase64Url, hashApiKey } from "../crypto/api-keys";
import { runs } from "../db/schema";
import type { Db } from "../db/types";
import type { ProxyRun } from "./proxy-credentials";
import { findRunByTokenHash } from "./token-lookup";

// A run's egress agent token (bwe_): what the user's local egress agent authenticates with, to the
// run's relay and to its copy of the run's host policy. One live token per run: minting another
// replaces it (the old one stops working at once), and the run's end clears it. Only its SHA-256
// is stored; the plaintext is returned once, to the user who asked for it. The token unlocks no
// credential and no compute: only the far end of this run's tunnel.

const TOKEN_RANDOM_BYTES = 32;

/** What a valid egress token says about its run. */
export interface EgressRun extends ProxyRun {
  spec: StoredRunSpec;
}

/** Mints a fresh token for the run, replacing any earlier one. Null when the run has ended. */
export async function issueEgressToken(db: Db, runId: string): Promise<string | null> {
  const token =
    EGRESS_TOKEN_PREFIX + encodeBase64Url(crypto.getRandomValues(new Uint8Array(TOKEN_RANDOM_BYTES)));
  const [row] = await db.select({ status: runs.status }).from(runs).where(eq(runs.id, runId));
  if (!row || isTerminal(row.status)) return null;
  await db
    .update(runs)
    .set({ egressTokenHash: await hashApiKey(token), updatedAt: new Date() })
    .where(eq(runs.id, runId));
  return token;
}

/** The run an egress token belongs to, or null (malformed, unknown, replaced, or cleared). */
export async function findRunByEgressToken(db: Db, token: string): Promise<EgressRun | null> {
  if (!EgressToken.safeParse(token).success) return null;
  return findRunByTokenHash(db, runs.egressTokenHash, token, { spec: runs.spec });
}

/** Clears the run's token (its end). Idempotent. */
export async function revokeEgressToken(db: Db, runId: string): Promise<void> {
  await db.update(runs).set({ egressTokenHash: null, updatedAt: new Date() }).where(eq(runs.id, runId));
}
