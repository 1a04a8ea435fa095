import { MODEL_PROVIDERS } from "@benchwright/shared/contract/model-lane";
import { sql } from "drizzle-orm";
import { bigint, boolean, check, index, integer, pgTable, text, uniqueIndex } from "drizzle-orm/pg-core";
import { environmentRef, environments } from "./accounts";
import { createdAt, updatedAt } from "./columns";

// The vault: settings, secrets, rules, host entries and models, per environment.

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
    environmentId: environmentRef(),
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
    environmentId: environmentRef(),
    // The user's order; first matching rule wins.
    position: integer("position").notNull(),
    hostPattern: text("host_pattern").notNull(),
    secretId: text("secret_id")
      .notNull()
      .references(() => vaultSecrets.id, { onDelete: "restrict" }),
    scheme: text("scheme", { enum: ["bearer", "basic", "raw", "query"] }).notNull(),
    // Header name, or query parameter name for scheme "query".
    target: text("target").notNull(),
    // The placeholder's variable (case N1): null is the default (the secret's name, made
    // portable); placeholder false is none at all.
    placeholderEnv: text("placeholder_env"),
    placeholder: boolean("placeholder").notNull().default(true),
    // ["body"] lets the proxy swap the placeholder in bodies too (N2); [] headers and query only.
    placeholderIn: text("placeholder_in").array().notNull().default(sql`'{}'::text[]`),
    // Method and path limits (N3); null lets everything through.
    methods: text("methods").array(),
    paths: text("paths").array(),
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
    environmentId: environmentRef(),
    pattern: text("pattern").notNull(),
    action: text("action", { enum: ["allow", "block"] }).notNull(),
    // Added because a rule names this host; removed with the last such rule unless the user
    // saves the entry themselves, which makes it explicit.
    implicit: boolean("implicit").notNull().default(false),
    // How an allowed host's traffic leaves: direct, or through the user's egress agent (tunnel).
    // Null: as the run's egress says. Only an allow entry has one.
    via: text("via", { enum: ["direct", "tunnel"] }),
    // Method and path limits (N3); null lets everything through. Only an allow entry has them.
    methods: text("methods").array(),
    paths: text("paths").array(),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (t) => [
    uniqueIndex("vault_hosts_environment_pattern").on(t.environmentId, t.pattern),
    check("vault_hosts_action", sql`${t.action} in ('allow', 'block')`),
    check(
      "vault_hosts_via",
      sql`${t.via} is null or (${t.via} in ('direct', 'tunnel') and ${t.action} = 'allow')`,
    ),
  ],
);

// Models a run may declare (the model lane): the run names one; its proxy calls the provider
// (one of ModelProvider, each with its own format and auth) at base_url with the secret's value.
// The sandbox never sees either.
export const vaultModels = pgTable(
  "vault_models",
  {
    id: text("id").primaryKey(),
    environmentId: environmentRef(),
    name: text("name").notNull(),
    provider: text("provider", { enum: MODEL_PROVIDERS }).notNull(),
    baseUrl: text("base_url").notNull(),
    upstreamModel: text("upstream_model").notNull(),
    secretId: text("secret_id")
      .notNull()
      .references(() => vaultSecrets.id, { onDelete: "restrict" }),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
  },
  (t) => [
    uniqueIndex("vault_models_environment_name").on(t.environmentId, t.name),
    check("vault_models_provider", sql`${t.provider} in ('openai', 'openai-compatible', 'anthropic')`),
  ],
);
