import type { NeonDatabase } from "drizzle-orm/neon-serverless";
import type * as schema from "./schema";

/** A drizzle handle over the Neon driver; the same type in the Worker and in Node scripts. */
export type Db = NeonDatabase<typeof schema>;

/** A transaction on a Db (drizzle's own type, named once). */
export type Tx = Parameters<Parameters<Db["transaction"]>[0]>[0];
/** Either: for reads that run alone or inside a caller's transaction. */
export type Q = Db | Tx;
