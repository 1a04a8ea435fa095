import type { StoredRunSpec } from "@benchwright/shared/contract/run-spec";
import { index, integer, jsonb, pgTable, primaryKey, text, timestamp } from "drizzle-orm/pg-core";
import { environmentRef, userRef } from "./accounts";
import { createdAt } from "./columns";
import { runs } from "./runs";

// Webhooks (runs started by a signed delivery from outside).
// A registered webhook endpoint: deliveries to /hooks/{id}, signed (Standard Webhooks) with its
// secret, start a run from `runTemplate`. The secret is stored only encrypted with the vault key
// ring (AAD binds owner and `webhook:<id>`); after a rotation the previous one still verifies
// until `previousSecretExpiresAt`. Revoking drops both ciphertexts.
export const webhooks = pgTable(
  "webhooks",
  {
    id: text("id").primaryKey(),
    userId: userRef(),
    environmentId: environmentRef(),
    name: text("name").notNull(),
    // A RunSpec as validated when the webhook was registered (read through readStoredSpec).
    // Never holds a secret.
    runTemplate: jsonb("run_template").$type<StoredRunSpec>().notNull(),
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
