import { sql } from "drizzle-orm";
import {
  bigint,
  bigserial,
  boolean,
  check,
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
} from "drizzle-orm/pg-core";
import { API_KEY_SCOPES } from "../auth/scope";
import type { CutReason } from "../contract/bundle";
import { MODEL_ENDPOINTS, MODEL_PROVIDERS } from "../contract/model-lane";
import { ROUTING_MODES } from "../contract/routing";
import { RUN_STATES } from "../contract/run-states";
import type { RunSpec } from "../runs/spec";

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
    // How an allowed host's traffic leaves: direct, or through the user's egress agent (tunnel).
    // Null: as the run's egress says. Only an allow entry has one.
    via: text("via", { enum: ["direct", "tunnel"] }),
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
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
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

// ---- runs ----

// The status column holds one of the run states (contract/run-states.ts).
export { RUN_STATES, type RunState } from "../contract/run-states";

// A run: what was asked (spec), where it is (status), why it ended (reason), and what the
// boundary looked like (routing, notes, proof). The coordinator Durable Object is the only
// writer of status; the proxy's internal API writes ca_* and the audit tables.
export const runs = pgTable(
  "runs",
  {
    id: text("id").primaryKey(),
    userId: text("user_id")
      .notNull()
      .references(() => users.id, { onDelete: "cascade" }),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    status: text("status", { enum: RUN_STATES }).notNull().default("queued"),
    // Stable code of why the run ended (finished, cancelled, vault_unreadable, ...), and a sentence.
    reason: text("reason"),
    reasonDetail: text("reason_detail"),
    // The launch request as validated (commands, egress, tasks, ...). Never holds a secret.
    // Typed once here; read through storedSpec (src/runs/spec.ts), never cast.
    spec: jsonb("spec").$type<RunSpec>().notNull(),
    backend: text("backend").notNull(),
    routing: text("routing", { enum: ROUTING_MODES }),
    policyVersion: bigint("policy_version", { mode: "number" }),
    // "Network the platform changed": [{ level: "note" | "warning", code, text }].
    notes: jsonb("notes").notNull().default([]),
    // What the wiring step proved (redirect installed, canary refused, direct egress failed).
    proof: jsonb("proof"),
    // SHA-256 of the run's proxy token; the token itself only reaches the proxy sandbox.
    proxyTokenHash: text("proxy_token_hash").unique(),
    // SHA-256 of the run's egress agent token (bwe_); minting a new one replaces it, the run's end
    // clears it. The token itself is shown to the user once.
    egressTokenHash: text("egress_token_hash").unique(),
    // The run's audit signing key, encrypted with the vault key ring (AAD binds owner and run).
    auditKeyCiphertext: text("audit_key_ciphertext"),
    caCertPem: text("ca_cert_pem"),
    caFingerprint: text("ca_fingerprint"),
    proxyReadyAt: timestamp("proxy_ready_at", { withTimezone: true }),
    // Linger: seconds asked for (null: none), when the window ends once lingering began, and when
    // the lingering proxy was paused for idleness (null: awake). Written by the coordinator only.
    lingerSeconds: integer("linger_seconds"),
    lingerUntil: timestamp("linger_until", { withTimezone: true }),
    lingerPausedAt: timestamp("linger_paused_at", { withTimezone: true }),
    createdAt: createdAt(),
    updatedAt: updatedAt(),
    startedAt: timestamp("started_at", { withTimezone: true }),
    endedAt: timestamp("ended_at", { withTimezone: true }),
  },
  (t) => [
    index("runs_environment_created").on(t.environmentId, t.createdAt),
    check("runs_linger_seconds", sql`${t.lingerSeconds} between 0 and 86400`),
    check(
      "runs_status",
      sql`${t.status} in ('queued', 'fetching_vault', 'starting_proxy', 'starting_sandboxes', 'wiring', 'running', 'finishing', 'lingering', 'finished', 'stopped', 'failed')`,
    ),
  ],
);

// The run trace: ordered events. `key` makes a write idempotent, so an alarm that runs a step
// twice (retry, eviction) records it once.
export const runEvents = pgTable(
  "run_events",
  {
    id: bigserial("id", { mode: "number" }).primaryKey(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    key: text("key").notNull(),
    kind: text("kind", { enum: ["transition", "note", "output", "proxy", "bug_report"] }).notNull(),
    state: text("state"),
    reason: text("reason"),
    detail: jsonb("detail"),
    at: timestamp("at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [uniqueIndex("run_events_run_key").on(t.runId, t.key), index("run_events_run_id").on(t.runId, t.id)],
);

// Every sandbox the broker made, recorded before the backend is asked, so none is orphaned.
export const sandboxes = pgTable(
  "sandboxes",
  {
    id: text("id").primaryKey(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    kind: text("kind", { enum: ["proxy", "work", "task", "orchestrator"] }).notNull(),
    taskIndex: integer("task_index"),
    backend: text("backend").notNull(),
    // Work and task sandboxes: the routing installed when it was made (a vault edit later does
    // not change it; a task sandbox made after the edit gets the new one).
    routing: text("routing", { enum: ROUTING_MODES }),
    status: text("status", { enum: ["creating", "ready", "destroyed", "failed"] })
      .notNull()
      .default("creating"),
    createdAt: createdAt(),
    destroyedAt: timestamp("destroyed_at", { withTimezone: true }),
  },
  (t) => [index("sandboxes_run").on(t.runId)],
);

// ---- audit (rows from the run's proxy; counts per host, never paths, queries or bodies) ----

export const blockedHostLog = pgTable(
  "blocked_host_log",
  {
    userId: text("user_id")
      .notNull()
      .references(() => users.id, { onDelete: "cascade" }),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    host: text("host").notNull(),
    seenCount: bigint("seen_count", { mode: "number" }).notNull(),
    firstSeen: timestamp("first_seen", { withTimezone: true }).notNull(),
    lastSeen: timestamp("last_seen", { withTimezone: true }).notNull(),
    source: text("source", { enum: ["proxy", "local_agent", "both"] }).notNull(),
  },
  (t) => [
    primaryKey({ columns: [t.runId, t.host] }),
    index("blocked_host_log_environment_last_seen").on(t.environmentId, t.lastSeen),
  ],
);

export const egressRouteLog = pgTable(
  "egress_route_log",
  {
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    host: text("host").notNull(),
    route: text("route", { enum: ["direct", "tunnel", "refused"] }).notNull(),
    count: bigint("count", { mode: "number" }).notNull(),
    firstSeen: timestamp("first_seen", { withTimezone: true }).notNull(),
    lastSeen: timestamp("last_seen", { withTimezone: true }).notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.host, t.route] })],
);

// The model lane's calls: which model and provider, status and token counts. Never a prompt or
// an output. A call id stored twice (a batch re-sent after a crash) is kept once.
export const modelCallLog = pgTable(
  "model_call_log",
  {
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    callId: text("call_id").notNull(),
    at: timestamp("at", { withTimezone: true }).notNull(),
    model: text("model").notNull(),
    provider: text("provider").notNull(),
    endpoint: text("endpoint", { enum: MODEL_ENDPOINTS }).notNull(),
    stream: boolean("stream").notNull(),
    status: integer("status").notNull(),
    inputTokens: bigint("input_tokens", { mode: "number" }).notNull(),
    outputTokens: bigint("output_tokens", { mode: "number" }).notNull(),
    cachedInputTokens: bigint("cached_input_tokens", { mode: "number" }).notNull().default(0),
    /** Why the lane answered itself (over_budget...), or null when the provider answered. */
    refused: text("refused"),
    ms: integer("ms").notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.callId] }), index("model_call_log_run_at").on(t.runId, t.at)],
);

// Audit batch ids already stored: a retried or replayed batch is stored once (case D5).
export const auditBatches = pgTable(
  "audit_batches",
  {
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    batchId: text("batch_id").notNull(),
    receivedAt: timestamp("received_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.batchId] })],
);

// ---- webhooks (runs started by a signed delivery from outside) ----

// A registered webhook endpoint: deliveries to /hooks/{id}, signed (Standard Webhooks) with its
// secret, start a run from `runTemplate`. The secret is stored only encrypted with the vault key
// ring (AAD binds owner and `webhook:<id>`); after a rotation the previous one still verifies
// until `previousSecretExpiresAt`. Revoking drops both ciphertexts.
export const webhooks = pgTable(
  "webhooks",
  {
    id: text("id").primaryKey(),
    userId: text("user_id")
      .notNull()
      .references(() => users.id, { onDelete: "cascade" }),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    name: text("name").notNull(),
    // A RunSpec as validated when the webhook was registered. Never holds a secret.
    runTemplate: jsonb("run_template").$type<RunSpec>().notNull(),
    secretCiphertext: text("secret_ciphertext"),
    previousSecretCiphertext: text("previous_secret_ciphertext"),
    previousSecretExpiresAt: timestamp("previous_secret_expires_at", { withTimezone: true }),
    createdAt: createdAt(),
    rotatedAt: timestamp("rotated_at", { withTimezone: true }),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
  },
  (t) => [index("webhooks_environment_created").on(t.environmentId, t.createdAt)],
);

// Deliveries accepted, keyed by the sender's `webhook-id`: a replayed or retried delivery finds
// its row and gets the same run (case D3). The body is never stored, only its size.
export const webhookDeliveries = pgTable(
  "webhook_deliveries",
  {
    webhookId: text("webhook_id")
      .notNull()
      .references(() => webhooks.id, { onDelete: "cascade" }),
    deliveryId: text("delivery_id").notNull(),
    // Set in the transaction that inserts the row, so a committed row always names its run.
    runId: text("run_id").references(() => runs.id, { onDelete: "cascade" }),
    bodyBytes: integer("body_bytes").notNull(),
    receivedAt: timestamp("received_at", { withTimezone: true }).notNull().defaultNow(),
  },
  (t) => [primaryKey({ columns: [t.webhookId, t.deliveryId] })],
);

// ---- compute control (issue 7) ----

// A run's compute-control capabilities: what a work or orchestrator sandbox presents to ask the
// broker for sandbox lifecycle (task environments) for its own run, instead of ever holding a
// backend credential. Short-lived, one random token each (stored hashed), revocable; all of a
// run's are revoked when it ends. Task sandboxes get none.
export const computeCapabilities = pgTable(
  "compute_capabilities",
  {
    id: text("id").primaryKey(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    // The sandbox it was handed to (work or orchestrator).
    holderSandboxId: text("holder_sandbox_id").notNull(),
    // SHA-256 of the token; the token itself only reaches the holder sandbox.
    tokenHash: text("token_hash").notNull().unique(),
    expiresAt: timestamp("expires_at", { withTimezone: true }).notNull(),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
    createdAt: createdAt(),
  },
  (t) => [index("compute_capabilities_run").on(t.runId)],
);

// The image build cache: per environment, a content hash of a task's image recipe and the digest
// the broker read from the registry after the one push it allowed. A later run uses the image
// by that digest, and only while the registry's tag still names it.
export const imageBuilds = pgTable(
  "image_builds",
  {
    id: text("id").primaryKey(),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    // sha256 hex of the recipe (Dockerfile and context), as the requester computed it.
    contentHash: text("content_hash").notNull(),
    repository: text("repository").notNull(),
    tag: text("tag").notNull(),
    status: text("status", { enum: ["pending", "built"] })
      .notNull()
      .default("pending"),
    // sha256:... read from the registry (Docker-Content-Digest) when the push was confirmed.
    digest: text("digest"),
    // The run whose push is allowed (pending), and until when its push credential is valid.
    pushRunId: text("push_run_id").references(() => runs.id, { onDelete: "set null" }),
    pushExpiresAt: timestamp("push_expires_at", { withTimezone: true }),
    createdAt: createdAt(),
    builtAt: timestamp("built_at", { withTimezone: true }),
  },
  (t) => [uniqueIndex("image_builds_environment_hash").on(t.environmentId, t.contentHash)],
);

// ---- bundles and artifacts (issue 20; the bytes are in R2, the FILES binding) ----

// A bundle: a .tar.gz of benchmark code uploaded to an environment, named by its sha256 and
// stored in R2 at `bundles/<environment_id>/<sha256>`. Checked entry by entry at upload (what
// it unpacks to: files, unpacked_bytes). Another environment's same bytes are its own row.
export const bundles = pgTable(
  "bundles",
  {
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    sha256: text("sha256").notNull(),
    size: bigint("size", { mode: "number" }).notNull(),
    files: integer("files").notNull(),
    unpackedBytes: bigint("unpacked_bytes", { mode: "number" }).notNull(),
    createdAt: createdAt(),
  },
  (t) => [
    primaryKey({ columns: [t.environmentId, t.sha256] }),
    check("bundles_sha256", sql`${t.sha256} ~ '^[0-9a-f]{64}$'`),
  ],
);

// The files a run's commands left in $BW_OUT of each work and task sandbox (artifacts), and the
// ones bw-collect cut (cut_reason set: over a bound, a symlink, a special or unreadable file;
// then no sha256, no R2 object, and the size only when it was known). An artifact's bytes are in
// R2 at `artifacts/<run_id>/<id>`. One row per (run, sandbox, path): storing again is a no-op.
export const runArtifacts = pgTable(
  "run_artifacts",
  {
    id: text("id").primaryKey(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    sandboxId: text("sandbox_id").notNull(),
    // The sandbox as the run names it: "work", or the task's name.
    sandboxName: text("sandbox_name").notNull(),
    // Relative to $BW_OUT, `/`-separated.
    path: text("path").notNull(),
    size: bigint("size", { mode: "number" }),
    sha256: text("sha256"),
    cutReason: text("cut_reason").$type<CutReason>(),
    createdAt: createdAt(),
  },
  (t) => [
    uniqueIndex("run_artifacts_run_sandbox_path").on(t.runId, t.sandboxId, t.path),
    check(
      "run_artifacts_kept_or_cut",
      sql`(${t.cutReason} is null and ${t.sha256} is not null and ${t.size} is not null) or (${t.cutReason} is not null and ${t.sha256} is null)`,
    ),
  ],
);

// ---- retries (issue 23) ----

// An Idempotency-Key of an environment (src/idempotency): the first request's keyed digest
// (method, path, body) and, once it finished, its answer. response_status null: still running.
// The answer's body is sealed with the vault key ring (it can hold a secret shown once); rows go
// after 24 hours (the reaper).
/** The answer headers an Idempotency-Key replays, lower-cased (typed once for the jsonb column). */
export type ReplayHeaders = Record<string, string>;

export const idempotencyKeys = pgTable(
  "idempotency_keys",
  {
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
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

// ---- run-end notifications (issue 23) ----

export const NOTIFICATION_EVENTS = ["run.ended"] as const;
export const DELIVERY_STATES = ["pending", "delivered", "failed", "cancelled"] as const;

// A URL a user asked to be told at (src/notifications): a Standard Webhooks-signed POST per
// event of their environment's runs. `origin` is the API origin it was registered through, for
// the links in each payload (an alarm has no request to read it from). The signing secret is
// sealed like a webhook's.
export const notifications = pgTable(
  "notifications",
  {
    id: text("id").primaryKey(),
    userId: text("user_id")
      .notNull()
      .references(() => users.id, { onDelete: "cascade" }),
    environmentId: text("environment_id")
      .notNull()
      .references(() => environments.id, { onDelete: "cascade" }),
    url: text("url").notNull(),
    events: jsonb("events").$type<(typeof NOTIFICATION_EVENTS)[number][]>().notNull(),
    origin: text("origin").notNull(),
    secretCiphertext: text("secret_ciphertext"),
    createdAt: createdAt(),
    revokedAt: timestamp("revoked_at", { withTimezone: true }),
  },
  (t) => [index("notifications_environment_created").on(t.environmentId, t.createdAt)],
);

// One event owed to one notification: made in the transaction that ends the run (an outbox, so a
// crash after the commit loses nothing), then sent and retried by the run's RunNotifier alarm.
// The id is the Standard Webhooks `webhook-id`, the same on every attempt so receivers de-dupe.
export const notificationDeliveries = pgTable(
  "notification_deliveries",
  {
    id: text("id").primaryKey(),
    notificationId: text("notification_id")
      .notNull()
      .references(() => notifications.id, { onDelete: "cascade" }),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    event: text("event", { enum: NOTIFICATION_EVENTS }).notNull(),
    status: text("status", { enum: DELIVERY_STATES }).notNull().default("pending"),
    attempts: integer("attempts").notNull().default(0),
    nextAttemptAt: timestamp("next_attempt_at", { withTimezone: true }),
    createdAt: createdAt(),
    deliveredAt: timestamp("delivered_at", { withTimezone: true }),
  },
  (t) => [
    uniqueIndex("notification_deliveries_once").on(t.notificationId, t.runId, t.event),
    index("notification_deliveries_due").on(t.status, t.nextAttemptAt),
    index("notification_deliveries_run").on(t.runId),
  ],
);

// Every attempt of a delivery, as it went: the receiver's status, or our words for why there was
// none (never the receiver's body, never a header).
export const notificationAttempts = pgTable(
  "notification_attempts",
  {
    deliveryId: text("delivery_id")
      .notNull()
      .references(() => notificationDeliveries.id, { onDelete: "cascade" }),
    attempt: integer("attempt").notNull(),
    startedAt: timestamp("started_at", { withTimezone: true }).notNull(),
    durationMs: integer("duration_ms").notNull(),
    statusCode: integer("status_code"),
    error: text("error"),
  },
  (t) => [primaryKey({ columns: [t.deliveryId, t.attempt] })],
);
