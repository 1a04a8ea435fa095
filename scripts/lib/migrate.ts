import { fileURLToPath } from "node:url";
import { migrate } from "drizzle-orm/neon-serverless/migrator";
import { nodeDb } from "./neon-node";

export const MIGRATIONS = fileURLToPath(new URL("../../migrations", import.meta.url));

/** Applies the committed drizzle-kit migrations. The one migration path for dev, tests and CI. */
export async function applyMigrations(databaseUrl: string): Promise<void> {
  const { db, pool } = nodeDb(databaseUrl);
  try {
    await migrate(db, { migrationsFolder: MIGRATIONS });
  } finally {
    await pool.end();
  }
}
