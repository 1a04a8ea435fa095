import { ROUTING_MODES } from "@benchwright/shared/contract/routing";
import type { StoredRunSpec } from "@benchwright/shared/contract/run-spec";
import { RUN_STATES } from "@benchwright/shared/contract/run-states";
import { sql } from "drizzle-orm";
import {
  bigint,
  bigserial,
  check,
  index,
  integer,
  jsonb,
  pgTable,
  text,
  timestamp,
  uniqueIndex,
} from "drizzle-orm/pg-core";
import { environmentRef, userRef } from "./accounts";
import { createdAt, updatedAt } from "./columns";

// The status column holds one of the run states (contract/run-states.ts).
export { RUN_STATES, type RunState } from "@benchwright/shared/contract/run-states";

// A run: what was asked (spec), where it is (status), why it ended (reason), and what the
// boundary looked like (routing, notes, proof). The coordinator Durable Object is the only
// writer of status; the proxy's internal API writes ca_* and the audit tables.
export const runs = pgTable(
  "runs",
  {
    id: text("id").primaryKey(),
    userId: userRef(),
    environmentId: environmentRef(),
    status: text("status", { enum: RUN_STATES }).notNull().default("queued"),
    // Stable code of why the run ended (finished, cancelled, vault_unreadable, ...), and a sentence.
    reason: text("reason"),
    reasonDetail: text("reason_detail"),
    // The launch request as validated (commands, egress, tasks, ...). Never holds a secret.
    // Typed once here; read through readStoredSpec (contract/run-spec.ts), never cast.
    spec: jsonb("spec").$type<StoredRunSpec>().notNull(),
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
