import { consoleLog } from "@benchwright/shared/contract/log";
import { RunSpec, readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { createRoute, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import { Hono } from "hono";
import { bodyLimit } from "hono/body-limit";
import { backendForLaunch } from "../broker/backends";
import type { AppEnv } from "../context";
import { coordinatorStub } from "../coordinator/client";
import { VaultDecryptError } from "../crypto/vault-crypto";
import { ApiError, problem, unwrap } from "../errors";
import { shownOnce } from "../idempotency/withheld";
import { IdParam, iso, jsonBody, jsonOk, newRouter, problems } from "../router";
import { checkLaunchable } from "../runs/launch";
import * as hooks from "../webhooks/service";
import { MAX_DELIVERY_BODY_BYTES, verifyDelivery } from "../webhooks/signature";

// Webhook-triggered runs (cases D1-D4). Two routers: the /v1 management API (API key,
// environment-scoped, in the OpenAPI document) and the public delivery endpoint
// `POST /hooks/{webhookId}`, which a sender calls without an API key: the Standard Webhooks
// signature is its credential.

const WebhookName = z.string().min(1).max(100).openapi({ example: "nightly eval" });

const CreateWebhook = z.object({ name: WebhookName, run: RunSpec }).strict().openapi("CreateWebhook");

const Webhook = z
  .object({
    id: z.string(),
    name: z.string(),
    url: z.string().openapi({ description: "Where senders POST signed deliveries" }),
    run: RunSpec.openapi({ description: "The run each fresh delivery starts" }),
    createdAt: z.string().datetime(),
    rotatedAt: z.string().datetime().nullable(),
    previousSecretExpiresAt: z
      .string()
      .datetime()
      .nullable()
      .openapi({ description: "Until then the secret before the last rotation still verifies" }),
  })
  .openapi("Webhook");

const WebhookWithSecret = Webhook.extend({
  secret: shownOnce(
    z.string(),
    "The signing secret (`whsec_...`). Shown only in this response: store it now.",
    "rotate it, POST /v1/webhooks/{id}/rotate-secret",
  ),
}).openapi("WebhookWithSecret");

const view = (c: Context, w: hooks.WebhookRow): z.infer<typeof Webhook> => ({
  id: w.id,
  name: w.name,
  url: `${new URL(c.req.url).origin}/hooks/${w.id}`,
  run: readStoredSpec(w.runTemplate),
  createdAt: w.createdAt.toISOString(),
  rotatedAt: iso(w.rotatedAt),
  previousSecretExpiresAt: iso(w.previousSecretExpiresAt),
});

const tags = ["webhooks"];
const params = IdParam("whk_");

export const webhooksRoutes = newRouter()
  .openapi(
    createRoute({
      method: "post",
      path: "/webhooks",
      tags,
      operationId: "createWebhook",
      summary: "Register a webhook: deliveries to its URL, signed with its secret, start a run",
      request: jsonBody(CreateWebhook),
      responses: {
        201: jsonOk(WebhookWithSecret, "Created; the secret is shown only here"),
        ...problems(400, 401),
      },
    }),
    async (c) => {
      const input = c.req.valid("json");
      unwrap(
        await checkLaunchable(
          c.var.db,
          c.var.principal.environmentId,
          input.run,
          c.var.config.resourceBounds,
        ),
      );
      const made = await hooks.createWebhook(c.var.db, c.var.config.keyRing, c.var.principal, input);
      return c.json({ ...view(c, made.webhook), secret: made.secret }, 201);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/webhooks",
      tags,
      operationId: "listWebhooks",
      summary: "List webhooks, newest first (never their secrets)",
      responses: { 200: jsonOk(z.object({ webhooks: z.array(Webhook) })), ...problems(401) },
    }),
    async (c) => {
      const rows = await hooks.listWebhooks(c.var.db, c.var.principal);
      return c.json({ webhooks: rows.map((w) => view(c, w)) }, 200);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/webhooks/{id}",
      tags,
      operationId: "getWebhook",
      summary: "Read a webhook (never its secret)",
      request: { params },
      responses: { 200: jsonOk(Webhook), ...problems(401, 404) },
    }),
    async (c) => {
      const w = unwrap(await hooks.getWebhook(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.json(view(c, w), 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/webhooks/{id}",
      tags,
      operationId: "revokeWebhook",
      summary: "Revoke a webhook: later deliveries are 404",
      request: { params },
      responses: { 204: { description: "Revoked" }, ...problems(401, 404) },
    }),
    async (c) => {
      unwrap(await hooks.revokeWebhook(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.body(null, 204);
    },
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/webhooks/{id}/rotate-secret",
      tags,
      operationId: "rotateWebhookSecret",
      summary: "New signing secret (shown once); the previous one keeps verifying for 24 hours",
      request: {
        params,
        // No options; a body, if sent, must be empty (unknown fields are refused, case C3).
        body: { content: { "application/json": { schema: z.object({}).strict() } }, required: false },
      },
      responses: {
        200: jsonOk(WebhookWithSecret, "Rotated; the new secret is shown only here"),
        ...problems(401, 404),
      },
    }),
    async (c) => {
      const { id } = c.req.valid("param");
      const made = unwrap(await hooks.rotateSecret(c.var.db, c.var.config.keyRing, c.var.principal, id));
      return c.json({ ...view(c, made.webhook), secret: made.secret }, 200);
    },
  );

// ---- the public delivery endpoint ----

/**
 * `POST /hooks/{webhookId}`: unknown or revoked webhook → 404 (ids are unguessable, so saying
 * so tells nothing); bad, missing or out-of-window signature → 401 invalid_signature; a replayed
 * delivery id → 200 with the first delivery's run; a fresh one → 202 with its new run. The body
 * is only verified and counted: never parsed, stored or logged.
 */
export const deliveryRoutes = new Hono<AppEnv>().post(
  "/:webhookId",
  bodyLimit({
    maxSize: MAX_DELIVERY_BODY_BYTES,
    onError: (c) => problem(c, "payload_too_large", `At most ${MAX_DELIVERY_BODY_BYTES} bytes.`),
  }),
  async (c) => {
    const id = c.req.param("webhookId");
    // Ids are `whk_` + base32: anything else is no webhook, without asking the database.
    const webhook = /^[a-z0-9_]{1,64}$/.test(id) ? await hooks.findLiveWebhook(c.var.db, id) : null;
    if (!webhook) throw new ApiError("not_found", "No such webhook.");
    let secrets: string[];
    try {
      secrets = await hooks.verificationSecrets(c.var.config.keyRing, webhook);
    } catch (error) {
      const reason = error instanceof VaultDecryptError ? error.reason : "error";
      consoleLog("error", { event: "webhook_secret_unreadable", webhookId: webhook.id, reason });
      throw new ApiError("vault_unreadable", "This webhook's secret could not be read.");
    }
    const raw = new Uint8Array(await c.req.arrayBuffer());
    const verified = verifyDelivery(secrets, c.req.raw.headers, raw);
    if (!verified.ok)
      throw new ApiError("invalid_signature", `The delivery was refused: ${verified.reason}.`);

    const spec = readStoredSpec(webhook.runTemplate);
    unwrap(await checkLaunchable(c.var.db, webhook.environmentId, spec, c.var.config.resourceBounds));
    const delivery = { deliveryId: verified.deliveryId, bodyBytes: raw.byteLength };
    const backend = backendForLaunch(c.env, spec.backend);
    const recorded = unwrap(
      await hooks.recordDelivery(c.var.db, webhook, delivery, spec, backend, c.var.config.maxActiveRuns),
    );
    if (!recorded.fresh) return c.json({ runId: recorded.runId }, 200);
    // After the commit, and only for a fresh delivery. If this fails the run stays queued (the
    // reaper's sweep starts or stops it) and the sender still gets its run id: a retry would be
    // a replay and could not start it either.
    try {
      await coordinatorStub(c.env, recorded.runId).start(recorded.runId, c.var.requestId);
    } catch (error) {
      const name = error instanceof Error ? error.name : "unknown";
      consoleLog("error", {
        event: "webhook_run_start_failed",
        runId: recorded.runId,
        requestId: c.var.requestId,
        error: name,
      });
    }
    return c.json({ runId: recorded.runId }, 202);
  },
);
