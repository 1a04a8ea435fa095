import { API_KEY_SCOPES } from "@benchwright/shared/contract/api-key-scope";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { shownOnce } from "../idempotency/withheld";
import { DURATION_PATTERN } from "../keys/expiry";
import * as keys from "../keys/service";
import { IdParam, iso, jsonBody, jsonOk, NextCursor, newRouter, PageQuery, problems } from "../router";

// Self-served API keys (case K3). The key is in POST's answer and nowhere else: not in the list,
// not in a log, not in a replay (the idempotency store keeps the answer without it, case L5).

const Scope = z.enum(API_KEY_SCOPES).openapi({
  description: "`full`: everything; `read`: GET and HEAD only (anything else is 403 read_only_key)",
});

const CreateApiKey = z
  .object({
    name: z.string().trim().min(1).max(100).openapi({ example: "ci-watcher" }),
    scope: Scope.optional().openapi({ description: "Default `full`. Never wider than the calling key's" }),
    expiresAt: z.string().datetime({ offset: true }).optional().openapi({
      description: "When the key stops working (at least a minute, at most five years away)",
      example: "2027-06-30T00:00:00Z",
    }),
    expiresIn: z.string().regex(DURATION_PATTERN).optional().openapi({
      description: "Or a duration from now: a count and m, h or d, e.g. `90d`. Not with expiresAt",
      example: "90d",
    }),
  })
  .strict()
  .openapi("CreateApiKey");

const ApiKey = z
  .object({
    id: z.string(),
    name: z.string(),
    prefix: z.string().openapi({ description: "The key's first characters, to recognise it by" }),
    scope: Scope,
    createdAt: z.string().datetime(),
    lastUsedAt: z
      .string()
      .datetime()
      .nullable()
      .openapi({ description: "Last use, to the minute (updated at most once a minute)" }),
    expiresAt: z.string().datetime().nullable(),
    revokedAt: z.string().datetime().nullable(),
    state: z.enum(["active", "expired", "revoked"]),
    current: z.boolean().openapi({ description: "Whether this is the key making the request" }),
  })
  .strict()
  .openapi("ApiKey");

const ApiKeyWithSecret = ApiKey.extend({
  key: shownOnce(
    z.string(),
    "The key itself, shown only in this answer: store it now.",
    "revoke that key and make another",
  ),
}).openapi("ApiKeyWithSecret");

const view = (k: keys.KeyInfo): z.infer<typeof ApiKey> => ({
  id: k.id,
  name: k.name,
  prefix: k.prefix,
  scope: k.scope,
  createdAt: k.createdAt.toISOString(),
  lastUsedAt: iso(k.lastUsedAt),
  expiresAt: iso(k.expiresAt),
  revokedAt: iso(k.revokedAt),
  state: k.state,
  current: k.current,
});

const tags = ["account"];

export const apiKeysRoutes = newRouter()
  .openapi(
    createRoute({
      method: "post",
      path: "/api-keys",
      tags,
      operationId: "createApiKey",
      summary: "Make an API key for this environment; the key is shown only in this answer",
      request: jsonBody(CreateApiKey),
      responses: {
        201: jsonOk(ApiKeyWithSecret, "Created; the key is shown only here"),
        ...problems(400, 401, 403),
      },
    }),
    async (c) => {
      const made = unwrap(
        await keys.createKey(c.var.db, c.var.principal, c.var.keyScope, c.req.valid("json")),
      );
      return c.json({ ...view(made.info), key: made.key }, 201);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/api-keys",
      tags,
      operationId: "listApiKeys",
      summary: "This environment's API keys, newest first (never the keys or their hashes)",
      request: { query: PageQuery.strict() },
      responses: {
        200: jsonOk(z.object({ apiKeys: z.array(ApiKey), nextCursor: NextCursor }).strict()),
        ...problems(400, 401),
      },
    }),
    async (c) => {
      const ring = c.var.config.keyRing;
      const page = unwrap(await keys.listKeys(c.var.db, c.var.principal, { ...c.req.valid("query"), ring }));
      return c.json({ apiKeys: page.items.map(view), nextCursor: page.nextCursor }, 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/api-keys/{id}",
      tags,
      operationId: "revokeApiKey",
      summary: "Revoke an API key (this one too): from now on it and its sessions are refused",
      request: { params: IdParam("key_") },
      responses: { 204: { description: "Revoked" }, ...problems(401, 403, 404) },
    }),
    async (c) => {
      unwrap(await keys.revokeKey(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.body(null, 204);
    },
  );
