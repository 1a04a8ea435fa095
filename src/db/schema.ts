import { sql } from "drizzle-orm";
import {
  bigint,
  boolean,
  check,
  index,
  integer,
  pgTable,
  text,
  timestamp,
  uniqueIndex,
} from "drizzle-orm/pg-core";

// Ids are opaque prefixed strings (usr_..., env_..., sec_...) made by randomId().
const createdAt = () => timestamp("created_at", { withTimezone: true }).notNull().defaultNow();
const updatedAt = () => timestamp("updated_at", { withTimezone: true }).notNull().defaultNow();

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
    lastUsedAt: timestamp("last_used_at", { withTimezone: true }),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
  },
  (t) => [index("api_keys_environment").on(t.environmentId)],
);

export const vaultSettings = pgTable(
  "vault_settings",
  {
    environmentId: text("environment_id")
      .primaryKey()
      .references(() => environments.id, { onDelete: "cascade" }),
    defaultAction: text("default_action", { enum: ["allow", "block"] })
      .notNull()
      .default("allow"),
    // Bumped in the same transaction as every vault change; the policy document's version.
    version: bigint("version", { mode: "number" }).notNull().default(0),
    updatedAt: updatedAt(),
  },
  (t) => [check("vault_settings_default", sql`${t.defaultAction} in ('allow', 'block')`)],
);

export const vaultSecrets = pgTable(
  "vault_secrets",
  {
    id: text("id").primaryKey(),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    // Envelope-encrypted value (see src/crypto/vault-crypto.ts); bound to owner and id.
    ciphertext: text("ciphertext").notNull(),
    keyId: text("key_id").notNull(),
    fingerprint: text("fingerprint").notNull(),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (t) => [uniqueIndex("vault_secrets_environment_name").on(t.environmentId, t.name)],
);

export const vaultRules = pgTable(
  "vault_rules",
  {
    id: text("id").primaryKey(),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    // The user's order; first matching rule wins.
    position: integer("position").notNull(),
    hostPattern: text("host_pattern").notNull(),
    secretId: text("secret_id")
      .notNull()
      .references(() => vaultSecrets.id, { onDelete: "restrict" }),
    scheme: text("scheme", { enum: ["bearer", "basic", "raw", "query"] }).notNull(),
    // Header name, or query parameter name for scheme "query".
    target: text("target").notNull(),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (t) => [
    index("vault_rules_environment_position").on(t.environmentId, t.position),
    check("vault_rules_scheme", sql`${t.scheme} in ('bearer', 'basic', 'raw', 'query')`),
  ],
);

export const vaultHosts = pgTable(
  "vault_hosts",
  {
    id: text("id").primaryKey(),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    pattern: text("pattern").notNull(),
    action: text("action", { enum: ["allow", "block"] }).notNull(),
    // Added because a rule names this host; removed with the last such rule unless the user
    // saves the entry themselves, which makes it explicit.
    implicit: boolean("implicit").notNull().default(false),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (t) => [
    uniqueIndex("vault_hosts_environment_pattern").on(t.environmentId, t.pattern),
    check("vault_hosts_action", sql`${t.action} in ('allow', 'block')`),
  ],
);
