import { and, eq } from "drizzle-orm";
import { generateApiKey, hashApiKey, randomId } from "../crypto/api-keys";
import { apiKeys, environments, users, vaultSettings } from "../db/schema";
import type { Db } from "../db/types";

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
  const { key, prefix } = generateApiKey();
  const hash = await hashApiKey(key);
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
    const keyId = randomId("key_");
    await tx.insert(apiKeys).values({
      id: keyId,
      userId: user.id,
      environmentId: env.id,
      name: input.keyName ?? "default",
      prefix,
      hash,
    });
    return { userId: user.id, environmentId: env.id, keyId, key, prefix };
  });
}
