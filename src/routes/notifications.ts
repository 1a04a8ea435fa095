import { createRoute, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import type { AppEnv } from "../context";
import { NOTIFICATION_EVENTS } from "../db/schema";
import { ApiError, unwrap } from "../errors";
import { shownOnce } from "../idempotency/withheld";
import { ATTEMPT_TIMEOUT_MS, MAX_ATTEMPTS, RETRY_SCHEDULE_MS } from "../notifications/delivery";
import * as notify from "../notifications/service";
import { checkTarget } from "../notifications/target";
import { IdParam, iso, jsonBody, jsonOk, NextCursor, newRouter, PageQuery, problems } from "../router";

// Run-end notifications: a user registers an https URL and is sent a Standard Webhooks-signed
// POST each time a run of their environment ends (src/notifications). Environment-scoped like
// every /v1 resource; the signing secret is shown once, at registration.

const schedule = [0, ...RETRY_SCHEDULE_MS].map((ms) =>
  ms < 60_000 ? `${ms / 1000} s` : `${ms / 60_000} min`,
);

const NotificationUrl = z.string().max(2048).openapi({
  description:
    "Where to POST: https, a public DNS name (no IP address, no localhost or local name, nothing this deployment denies)",
  example: "https://ci.example.com/benchwright/run-ended",
});

const Events = z
  .array(z.enum(NOTIFICATION_EVENTS))
  .min(1)
  .max(NOTIFICATION_EVENTS.length)
  .openapi({ description: "What to be told of; `run.ended`: a run reached finished, stopped or failed" });

const CreateNotification = z
  .object({ url: NotificationUrl, events: Events.optional() })
  .strict()
  .openapi("CreateNotification");

const Notification = z
  .object({
    id: z.string(),
    url: z.string(),
    events: z.array(z.enum(NOTIFICATION_EVENTS)),
    createdAt: z.string().datetime(),
  })
  .openapi("Notification");

const NotificationWithSecret = Notification.extend({
  secret: shownOnce(
    z.string(),
    "The signing secret (`whsec_...`) to verify deliveries with, e.g. the `standardwebhooks` library. Shown only in this response: store it now.",
    "delete the URL (DELETE /v1/notifications/{id}) and register it again",
  ),
}).openapi("NotificationWithSecret");

const Attempt = z
  .object({
    attempt: z.number().int(),
    startedAt: z.string().datetime(),
    durationMs: z.number().int(),
    statusCode: z
      .number()
      .int()
      .nullable()
      .openapi({ description: "The receiver's status; null: no answer" }),
    error: z.string().nullable().openapi({ description: "Why it did not count as delivered; null: it did" }),
  })
  .openapi("NotificationAttempt");

const Delivery = z
  .object({
    id: z.string().openapi({ description: "The `webhook-id` header: the same on every attempt" }),
    runId: z.string(),
    event: z.enum(NOTIFICATION_EVENTS),
    status: z.enum(["pending", "delivered", "failed", "cancelled"]),
    nextAttemptAt: z.string().datetime().nullable(),
    deliveredAt: z.string().datetime().nullable(),
    createdAt: z.string().datetime(),
    attempts: z.array(Attempt),
  })
  .openapi("NotificationDelivery");

const view = (n: notify.NotificationRow): z.infer<typeof Notification> => ({
  id: n.id,
  url: n.url,
  events: n.events,
  createdAt: n.createdAt.toISOString(),
});

const deliveryView = (d: notify.DeliveryWithAttempts): z.infer<typeof Delivery> => ({
  id: d.id,
  runId: d.runId,
  event: d.event,
  status: d.status,
  nextAttemptAt: iso(d.nextAttemptAt),
  deliveredAt: iso(d.deliveredAt),
  createdAt: d.createdAt.toISOString(),
  attempts: d.attemptLog.map((a) => ({
    attempt: a.attempt,
    startedAt: a.startedAt.toISOString(),
    durationMs: a.durationMs,
    statusCode: a.statusCode,
    error: a.error,
  })),
});

const origin = (c: Context<AppEnv>) => new URL(c.req.url).origin;

const tags = ["notifications"];
const params = IdParam("ntf_");

export const notificationsRoutes = newRouter()
  .openapi(
    createRoute({
      method: "post",
      path: "/notifications",
      operationId: "createNotification",
      tags,
      summary: "Register a URL to be sent a signed POST when a run of this environment ends",
      description: `Each delivery is a Standard Webhooks request (\`webhook-id\`, \`webhook-timestamp\`, \`webhook-signature\`) with a JSON body \`{type, timestamp, data}\`. A 2xx answer within ${ATTEMPT_TIMEOUT_MS / 1000} s delivers it; anything else is retried ${MAX_ATTEMPTS - 1} times, after ${schedule.slice(1).join(", ")} (±10%), then the delivery fails. Redirects are not followed. Every attempt is listed under /deliveries.`,
      request: jsonBody(CreateNotification),
      responses: {
        201: jsonOk(NotificationWithSecret, "Registered; the secret is shown only here"),
        ...problems(400, 401, 409),
      },
    }),
    async (c) => {
      const input = c.req.valid("json");
      const target = checkTarget(input.url, c.var.config.notificationTargets);
      if (!target.ok)
        throw new ApiError("invalid_notification_url", `The URL was refused: ${target.reason}.`);
      const made = unwrap(
        await notify.createNotification(c.var.db, c.var.config.keyRing, c.var.principal, {
          url: target.url.href,
          events: [...new Set(input.events ?? (["run.ended"] as const))],
          origin: origin(c),
        }),
      );
      return c.json({ ...view(made.notification), secret: made.secret }, 201);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/notifications",
      operationId: "listNotifications",
      tags,
      summary: "List notification URLs, newest first (never their secrets)",
      request: { query: PageQuery.strict() },
      responses: {
        200: jsonOk(z.object({ notifications: z.array(Notification), nextCursor: NextCursor })),
        ...problems(400, 401),
      },
    }),
    async (c) => {
      const ring = c.var.config.keyRing;
      const page = unwrap(
        await notify.listNotifications(c.var.db, c.var.principal, { ...c.req.valid("query"), ring }),
      );
      return c.json({ notifications: page.items.map(view), nextCursor: page.nextCursor }, 200);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/notifications/{id}",
      operationId: "getNotification",
      tags,
      summary: "Read a notification URL (never its secret)",
      request: { params },
      responses: { 200: jsonOk(Notification), ...problems(401, 404) },
    }),
    async (c) => {
      const n = unwrap(await notify.getNotification(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.json(view(n), 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/notifications/{id}",
      operationId: "revokeNotification",
      tags,
      summary: "Revoke a notification URL: nothing more is sent to it, pending deliveries are cancelled",
      request: { params },
      responses: { 204: { description: "Revoked" }, ...problems(401, 404) },
    }),
    async (c) => {
      unwrap(await notify.revokeNotification(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.body(null, 204);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/notifications/{id}/deliveries",
      operationId: "listNotificationDeliveries",
      tags,
      summary: "The deliveries to a notification URL, newest first, each with every attempt",
      request: { params, query: PageQuery.strict() },
      responses: {
        200: jsonOk(z.object({ deliveries: z.array(Delivery), nextCursor: NextCursor })),
        ...problems(400, 401, 404),
      },
    }),
    async (c) => {
      const page = unwrap(
        await notify.listDeliveries(c.var.db, c.var.principal, c.req.valid("param").id, {
          ...c.req.valid("query"),
          ring: c.var.config.keyRing,
        }),
      );
      return c.json({ deliveries: page.items.map(deliveryView), nextCursor: page.nextCursor }, 200);
    },
  );
