import { API_KEY_SCOPES } from "@benchwright/shared/contract/api-key-scope";
import { sql } from "drizzle-orm";
import { check, index, pgTable, text, timestamp, uniqueIndex } from "drizzle-orm/pg-core";
import { createdAt } from "./columns";

// Accounts: users, their environments, API keys and page sessions.

export const users = pgTable("users", {
  id: text("id").primaryKey(),
  email: text("email").notNull().unique(),
  createdAt: createdAt(),
});

// An environment is one user's isolated space (vault, later runs): every API key belongs to
// exactly one, and everything a key can reach is scoped to it.
export const environments = pgTable(
  "environments",
  {
    id: text("id").primaryKey(),
    userId: text("user_id")
      .notNull()
      .references(() => users.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    createdAt: createdAt(),
  },
  (t) => [uniqueIndex("environments_user_name").on(t.userId, t.name)],
);

export const apiKeys = pgTable(
  "api_keys",
  {
    id: text("id").primaryKey(),
    userId: text("user_id")
      .notNull()
      .references(() => users.id, { onDelete: "cascade" }),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    // Shown to the user so they can recognise a key; never enough to use it.
    prefix: text("prefix").notNull(),
    // SHA-256 of the whole key; the key itself is never stored.
    hash: text("hash").notNull().unique(),
    createdAt: createdAt(),
    // Written at most once a minute per key (src/auth/middleware.ts): a hint, not an audit log.
    lastUsedAt: timestamp("last_used_at", { withTimezone: true }),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
    // Null: never expires. From then on the key is refused like a revoked one (case K3).
    expiresAt: timestamp("expires_at", { withTimezone: true }),
    scope: text("scope", { enum: API_KEY_SCOPES }).notNull().default("full"),
  },
  (t) => [
    index("api_keys_environment").on(t.environmentId),
    check("api_keys_scope", sql`${t.scope} in ('read', 'full')`),
  ],
);

// A browser session for the pages (/manage, /runs), opened by logging in with an API key: it
// speaks for that key's user and environment and ends with it (revoking the key ends it too).
// The cookie carries a random token; only its SHA-256 is stored.
export const sessions = pgTable(
  "sessions",
  {
    id: text("id").primaryKey(),
    tokenHash: text("token_hash").notNull().unique(),
    apiKeyId: text("api_key_id")
      .notNull()
      .references(() => apiKeys.id, { onDelete: "cascade" }),
    createdAt: createdAt(),
    expiresAt: timestamp("expires_at", { withTimezone: true }).notNull(),
    endedAt: timestamp("ended_at", { withTimezone: true }),
  },
  (t) => [index("sessions_api_key").on(t.apiKeyId)],
);

/** An owner column: the environment a row belongs to; the row goes with the environment. */
export const environmentRef = () =>
  text("environment_id")
    .notNull()
    .references(() => environments.id, { onDelete: "cascade" });

/** An owner column: the user a row belongs to; the row goes with the user. */
export const userRef = () =>
  text("user_id")
    .notNull()
    .references(() => users.id, { onDelete: "cascade" });
