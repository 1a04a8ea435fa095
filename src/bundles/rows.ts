import { and, eq } from "drizzle-orm";
import { bundles } from "../db/schema";
import type { Q } from "../db/types";

// A bundle's row and where its bytes are: what the launch check, the broker and the upload share.
// Every read is scoped to one environment, so another environment's hash is not found (case H3).

export type BundleRow = typeof bundles.$inferSelect;

/** Where a bundle's bytes are in R2 (the FILES binding). */
export const bundleKey = (environmentId: string, sha256: string) => `bundles/${environmentId}/${sha256}`;

/** The environment's bundle with this hash, or null (none, or another environment's). */
export async function findBundle(db: Q, environmentId: string, sha256: string): Promise<BundleRow | null> {
  const [row] = await db
    .select()
    .from(bundles)
    .where(and(eq(bundles.environmentId, environmentId), eq(bundles.sha256, sha256)));
  return row ?? null;
}
