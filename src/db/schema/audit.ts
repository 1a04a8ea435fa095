import { LIMIT_KINDS } from "@benchwright/shared/contract/http-limits";
import { MODEL_ENDPOINTS } from "@benchwright/shared/contract/model-lane";
import { bigint, boolean, index, integer, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";
import { environmentRef, userRef } from "./accounts";
import { runs } from "./runs";

// Audit (rows from the run's proxy; counts per host, never paths, queries or bodies).
export const blockedHostLog = pgTable(
  "blocked_host_log",
  {
    userId: userRef(),
    environmentId: environmentRef(),
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
    environmentId: environmentRef(),
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
    environmentId: environmentRef(),
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

// Requests refused for a method or path limit (case N3): per host, method and limit, never the
// path. Counts add up over batches, as the blocked hosts' do.
export const limitRefusalLog = pgTable(
  "limit_refusal_log",
  {
    environmentId: environmentRef(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    host: text("host").notNull(),
    method: text("method").notNull(),
    limit: text("limit", { enum: LIMIT_KINDS }).notNull(),
    count: bigint("count", { mode: "number" }).notNull(),
    firstSeen: timestamp("first_seen", { withTimezone: true }).notNull(),
    lastSeen: timestamp("last_seen", { withTimezone: true }).notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.host, t.method, t.limit] })],
);

// A rule's placeholder sent toward another host (case N2): it went out unswapped; per host and
// secret name, never the value.
export const strayPlaceholderLog = pgTable(
  "stray_placeholder_log",
  {
    environmentId: environmentRef(),
    runId: text("run_id")
      .notNull()
      .references(() => runs.id, { onDelete: "cascade" }),
    host: text("host").notNull(),
    secret: text("secret").notNull(),
    count: bigint("count", { mode: "number" }).notNull(),
    firstSeen: timestamp("first_seen", { withTimezone: true }).notNull(),
    lastSeen: timestamp("last_seen", { withTimezone: true }).notNull(),
  },
  (t) => [primaryKey({ columns: [t.runId, t.host, t.secret] })],
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
