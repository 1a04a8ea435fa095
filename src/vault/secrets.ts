import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import { SecretValue } from "@benchwright/shared/contract/proxy-wire";
import { and, asc, eq } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { randomId } from "../crypto/api-keys";
import { encryptSecret, fingerprintSecret } from "../crypto/vault-crypto";
import { vaultModels, vaultRules, vaultSecrets } from "../db/schema";
import type { Db, Tx } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { change, notFound } from "./change";

// The vault's secrets over Postgres: names and fingerprints out, values in (encrypted to the
// secret's own id and environment) and never read back here. Every query is scoped by the
// owner's environment, so another tenant's ids simply do not exist here (404, never 403).

export interface SecretInfo {
  id: string;
  name: string;
  fingerprint: string;
  createdAt: Date;
  updatedAt: Date;
}

const secretColumns = {
  id: vaultSecrets.id,
  name: vaultSecrets.name,
  fingerprint: vaultSecrets.fingerprint,
  createdAt: vaultSecrets.createdAt,
  updatedAt: vaultSecrets.updatedAt,
};

function checkSecretValue(value: string): Result<null> {
  // The same rule the proxy's contract enforces (printable ASCII, 1 byte to 16 KiB): values are
  // sent in headers or query strings, where CR/LF/NUL would split a request. Refused here, at
  // save time, rather than failing a run later at the proxy.
  if (!SecretValue.safeParse(value).success) {
    return fail(
      "invalid_request",
      "A secret value must be printable ASCII: no control characters (CR, LF, NUL, ...) and no non-ASCII characters.",
    );
  }
  return ok(null);
}

export async function listSecrets(db: Db, p: Owner): Promise<SecretInfo[]> {
  return db
    .select(secretColumns)
    .from(vaultSecrets)
    .where(eq(vaultSecrets.environmentId, p.environmentId))
    .orderBy(asc(vaultSecrets.name));
}

export async function getSecret(db: Db, p: Owner, id: string): Promise<Result<SecretInfo>> {
  const [row] = await db
    .select(secretColumns)
    .from(vaultSecrets)
    .where(and(eq(vaultSecrets.environmentId, p.environmentId), eq(vaultSecrets.id, id)));
  return row ? ok(row) : notFound("secret", id);
}

/** The id of the secret a rule or a model names, in a change; unknown_secret if there is none. */
export async function secretIdByName(tx: Tx, environmentId: string, name: string): Promise<Result<string>> {
  const [secret] = await tx
    .select({ id: vaultSecrets.id })
    .from(vaultSecrets)
    .where(and(eq(vaultSecrets.environmentId, environmentId), eq(vaultSecrets.name, name)));
  return secret ? ok(secret.id) : fail("unknown_secret", `No secret named ${name}; create it first.`);
}

async function sealed(ring: KeyRing, p: Owner, secretId: string, value: string) {
  return {
    ciphertext: await encryptSecret(
      ring,
      { userId: p.userId, environmentId: p.environmentId, secretId },
      value,
    ),
    keyId: ring.currentKeyId,
    fingerprint: await fingerprintSecret(ring, value),
  };
}

export async function createSecret(
  db: Db,
  ring: KeyRing,
  p: Owner,
  input: { name: string; value: string },
): Promise<Result<SecretInfo>> {
  const valid = checkSecretValue(input.value);
  if (!valid.ok) return valid;
  const id = randomId("sec_");
  const seal = await sealed(ring, p, id, input.value);
  return change(db, p.environmentId, async (tx) => {
    const [row] = await tx
      .insert(vaultSecrets)
      .values({ id, environmentId: p.environmentId, name: input.name, ...seal })
      .onConflictDoNothing()
      .returning(secretColumns);
    return row
      ? ok(row)
      : fail("secret_exists", `A secret named ${input.name} exists; replace its value with PUT.`);
  });
}

export async function replaceSecret(
  db: Db,
  ring: KeyRing,
  p: Owner,
  id: string,
  input: { value: string },
): Promise<Result<SecretInfo>> {
  const valid = checkSecretValue(input.value);
  if (!valid.ok) return valid;
  const seal = await sealed(ring, p, id, input.value);
  return change(db, p.environmentId, async (tx) => {
    const [row] = await tx
      .update(vaultSecrets)
      .set({ ...seal, updatedAt: new Date() })
      .where(and(eq(vaultSecrets.environmentId, p.environmentId), eq(vaultSecrets.id, id)))
      .returning(secretColumns);
    return row ? ok(row) : notFound("secret", id);
  });
}

export async function deleteSecret(db: Db, p: Owner, id: string): Promise<Result<null>> {
  return change(db, p.environmentId, async (tx) => {
    const users = await tx
      .select({ id: vaultRules.id })
      .from(vaultRules)
      .where(and(eq(vaultRules.environmentId, p.environmentId), eq(vaultRules.secretId, id)));
    if (users.length > 0) {
      const ids = users.map((r) => r.id).join(", ");
      return fail("secret_in_use", `Rules ${ids} use this secret; delete or change them first.`);
    }
    // The models' foreign key restricts the delete too; say which, as for rules.
    const models = await tx
      .select({ name: vaultModels.name })
      .from(vaultModels)
      .where(and(eq(vaultModels.environmentId, p.environmentId), eq(vaultModels.secretId, id)));
    if (models.length > 0) {
      const names = models.map((m) => m.name).join(", ");
      return fail("secret_in_use", `Models ${names} use this secret; delete or change them first.`);
    }
    const deleted = await tx
      .delete(vaultSecrets)
      .where(and(eq(vaultSecrets.environmentId, p.environmentId), eq(vaultSecrets.id, id)))
      .returning({ id: vaultSecrets.id });
    return deleted.length > 0 ? ok(null) : notFound("secret", id);
  });
}
