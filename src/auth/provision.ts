import type { ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";
import { and, eq } from "drizzle-orm";
import { generateApiKey, hashApiKey, randomId } from "../crypto/api-keys";
import { apiKeys, environments, users, vaultSettings } from "../db/schema";
import type { Db, Tx } from "../db/types";
import type { Owner } from "./owner";

export interface IssuedKey {
  readonly keyId: string;
  /** The only time the key exists in clear: hand it to the user, never store or log it. */
  readonly key: string;
  readonly prefix: string;
}

/**
 * Makes a new key for an environment and stores its hash and display prefix (never the key).
 * The one place keys are made: create-user, `npm start`, the tests and POST /v1/api-keys.
 */
export async function issueKey(
  tx: Db | Tx,
  owner: Owner,
  input: { name: string; scope?: ApiKeyScope; expiresAt?: Date | null },
): Promise<IssuedKey> {
  const { key, prefix } = generateApiKey();
  const keyId = randomId("key_");
  await tx.insert(apiKeys).values({
    id: keyId,
    userId: owner.userId,
    environmentId: owner.environmentId,
    name: input.name,
    prefix,
    hash: await hashApiKey(key),
    scope: input.scope ?? "full",
    expiresAt: input.expiresAt ?? null,
  });
  return { keyId, key, prefix };
}

export interface ProvisionedKey {
  readonly userId: string;
  readonly environmentId: string;
  readonly keyId: string;
  /** The only time the key exists in clear: hand it to the user, never store it. */
  readonly key: string;
  readonly prefix: string;
}

/**
 * Creates (or reuses) a user and one of their environments, and issues a new API key for it.
 * Used by the create-user command, `npm start` and the test factories.
 */
export async function provisionApiKey(
  db: Db,
  input: { email: string; environment?: string; keyName?: string },
): Promise<ProvisionedKey> {
  const envName = input.environment ?? "default";
  return db.transaction(async (tx) => {
    await tx
      .insert(users)
      .values({ id: randomId("usr_"), email: input.email })
      .onConflictDoNothing({ target: users.email });
    const [user] = await tx.select({ id: users.id }).from(users).where(eq(users.email, input.email));
    if (!user) throw new Error("user row vanished");
    await tx
      .insert(environments)
      .values({ id: randomId("env_"), userId: user.id, name: envName })
      .onConflictDoNothing();
    const [env] = await tx
      .select({ id: environments.id })
      .from(environments)
      .where(and(eq(environments.userId, user.id), eq(environments.name, envName)));
    if (!env) throw new Error("environment row vanished");
    await tx.insert(vaultSettings).values({ environmentId: env.id }).onConflictDoNothing();
    const issued = await issueKey(
      tx,
      { userId: user.id, environmentId: env.id },
      { name: input.keyName ?? "default" },
    );
    return { userId: user.id, environmentId: env.id, ...issued };
  });
}
