import type { NeonDatabase } from "drizzle-orm/neon-serverless";
import type * as schema from "./schema";

/** A drizzle handle over the Neon driver; the same type in the Worker and in Node scripts. */
export type Db = NeonDatabase<typeof schema>;
