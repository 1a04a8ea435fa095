import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import { newAuditKey } from "@benchwright/shared/contract/proxy-wire";
import type { RunState } from "@benchwright/shared/contract/run-states";
import { eq } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { encodeBase64Url, hashApiKey } from "../crypto/api-keys";
import { decryptSecret, encryptSecret, type SecretAad } from "../crypto/vault-crypto";
import { runs } from "../db/schema";
import type { Db } from "../db/types";
import { findRunByTokenHash } from "./token-lookup";

// A run's two proxy credentials. The proxy token authenticates every internal API call of the
// run's proxy (only its SHA-256 is stored); the audit key signs its audit batches (stored
// encrypted with the vault key ring, because the control plane must verify with it). Both
// plaintexts exist once, in the return value of issueProxyCredentials, which the coordinator
// hands to the proxy sandbox only: never stored in clear, never logged.

const TOKEN_PREFIX = "bwp_";
const TOKEN_RANDOM_BYTES = 32;
// 32 bytes = 43 base64url characters; the last one carries 4 bits, so its low 2 bits are zero.
const TOKEN_PATTERN = /^bwp_[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$/;

/** A run, by its id and its owner. */
export interface RunOwner extends Owner {
  id: string;
}

export interface ProxyCredentials {
  /** `bwp_` + 32 random bytes, base64url: the proxy's bearer token for the internal API. */
  proxyToken: string;
  /** `whsec_` + base64 of 32 random bytes: signs the proxy's audit batches. */
  auditKey: string;
}

/** What a valid proxy token says about its run. */
export interface ProxyRun extends RunOwner {
  status: RunState;
  ended: boolean;
}

/** The audit key's AAD: bound to the run's owner and id, so a copied ciphertext does not decrypt. */
const auditKeyAad = (run: RunOwner): SecretAad => ({
  userId: run.userId,
  environmentId: run.environmentId,
  secretId: `audit:${run.id}`,
});

/**
 * Issues fresh credentials for a run, replacing any earlier ones (a re-issued token makes the old
 * one invalid at once). Returns the plaintexts; the database keeps a hash and a ciphertext. The
 * previous launch's ready report (its CA) is cleared too: only the proxy holding these credentials
 * can report the run ready again, so a relaunch is never taken as ready with an old CA.
 */
export async function issueProxyCredentials(
  db: Db,
  keyRing: KeyRing,
  run: RunOwner,
): Promise<ProxyCredentials> {
  const proxyToken =
    TOKEN_PREFIX + encodeBase64Url(crypto.getRandomValues(new Uint8Array(TOKEN_RANDOM_BYTES)));
  const auditKey = newAuditKey();
  const [row] = await db
    .update(runs)
    .set({
      proxyTokenHash: await hashApiKey(proxyToken),
      auditKeyCiphertext: await encryptSecret(keyRing, auditKeyAad(run), auditKey),
      caCertPem: null,
      caFingerprint: null,
      proxyReadyAt: null,
      updatedAt: new Date(),
    })
    .where(eq(runs.id, run.id))
    .returning({ id: runs.id });
  if (!row) throw new Error(`no run ${run.id} to issue proxy credentials for`);
  return { proxyToken, auditKey };
}

/** Whether text has the shape of a proxy token (cheap check before hashing and a lookup). */
export function looksLikeProxyToken(text: unknown): text is string {
  return typeof text === "string" && TOKEN_PATTERN.test(text);
}

/**
 * The run a proxy token belongs to, or null (unknown, malformed or revoked). It does not judge
 * the run's state: callers decide what an ended run may still do (see routes/internal.ts).
 */
export async function findRunByProxyToken(db: Db, token: string): Promise<ProxyRun | null> {
  if (!looksLikeProxyToken(token)) return null;
  return findRunByTokenHash(db, runs.proxyTokenHash, token, {});
}

/** The run's audit key in clear; throws VaultDecryptError (or Error when none was issued). */
export async function readAuditKey(db: Db, keyRing: KeyRing, run: RunOwner): Promise<string> {
  const [row] = await db
    .select({ ciphertext: runs.auditKeyCiphertext })
    .from(runs)
    .where(eq(runs.id, run.id));
  if (!row?.ciphertext) throw new Error(`run ${run.id} has no audit key`);
  return decryptSecret(keyRing, auditKeyAad(run), row.ciphertext);
}

/**
 * Makes the run's proxy credentials invalid: the token's hash and the audit key's ciphertext are
 * dropped. Called when the run ends, after the proxy sandbox is gone (so its shutdown flush of
 * audit batches has landed). Idempotent.
 */
export async function revokeProxyCredentials(db: Db, runId: string): Promise<void> {
  await db
    .update(runs)
    .set({ proxyTokenHash: null, auditKeyCiphertext: null, updatedAt: new Date() })
    .where(eq(runs.id, runId));
}
