import { index, integer, jsonb, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";
import { environmentRef } from "./accounts";
import { createdAt } from "./columns";

// Retries (issue 23).
// An Idempotency-Key of an environment (src/idempotency): the first request's keyed digest
// (method, path, body) and, once it finished, its answer. response_status null: still running.
// The answer's body is sealed with the vault key ring (it can hold a secret shown once); rows go
// after 24 hours (the reaper).
/** The answer headers an Idempotency-Key replays, lower-cased (typed once for the jsonb column). */
export type ReplayHeaders = Record<string, string>;

export const idempotencyKeys = pgTable(
  "idempotency_keys",
  {
    environmentId: environmentRef(),
    key: text("key").notNull(),
    requestDigest: text("request_digest").notNull(),
    responseStatus: integer("response_status"),
    responseHeaders: jsonb("response_headers").$type<ReplayHeaders>(),
    responseCiphertext: text("response_ciphertext"),
    createdAt: createdAt(),
    completedAt: timestamp("completed_at", { withTimezone: true }),
  },
  (t) => [
    primaryKey({ columns: [t.environmentId, t.key] }),
    index("idempotency_keys_created").on(t.createdAt),
  ],
);
