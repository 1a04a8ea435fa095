import {
  index,
  integer,
  jsonb,
  pgTable,
  primaryKey,
  text,
  timestamp,
  uniqueIndex,
} from "drizzle-orm/pg-core";
import { environmentRef, userRef } from "./accounts";
import { createdAt } from "./columns";
import { runs } from "./runs";

// Run-end notifications (issue 23).
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
    userId: userRef(),
    environmentId: environmentRef(),
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
