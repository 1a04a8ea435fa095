import { SecretName as ContractSecretName } from "@benchwright/shared/contract/proxy-wire";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { IdParam, jsonBody, jsonOk, newRouter, problems } from "../router";
import * as vault from "../vault/secrets";

// Secrets are write-only: no response schema here has a field that could carry a value.
export const SecretName = ContractSecretName.openapi({ example: "OPENROUTER_API_KEY" });

const SecretValue = z.string().min(1, "the value is empty").max(16_384, "at most 16 KiB");

export const SecretInfo = z
  .object({
    id: z.string(),
    name: z.string(),
    fingerprint: z.string().openapi({ description: "HMAC fingerprint; the value itself is never returned" }),
    createdAt: z.string().datetime(),
    updatedAt: z.string().datetime(),
  })
  .strict()
  .openapi("SecretInfo");

const toJson = (s: vault.SecretInfo): z.infer<typeof SecretInfo> => ({
  id: s.id,
  name: s.name,
  fingerprint: s.fingerprint,
  createdAt: s.createdAt.toISOString(),
  updatedAt: s.updatedAt.toISOString(),
});

const tags = ["vault: secrets"];
const params = IdParam("sec_");

export const secretsRoutes = newRouter()
  .openapi(
    createRoute({
      method: "get",
      path: "/secrets",
      tags,
      operationId: "listSecrets",
      summary: "List secrets (names and fingerprints, never values)",
      responses: { 200: jsonOk(z.object({ secrets: z.array(SecretInfo) })), ...problems(401) },
    }),
    async (c) => c.json({ secrets: (await vault.listSecrets(c.var.db, c.var.principal)).map(toJson) }, 200),
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/secrets",
      tags,
      operationId: "createSecret",
      summary: "Create a secret",
      request: jsonBody(z.object({ name: SecretName, value: SecretValue }).strict()),
      responses: { 201: jsonOk(SecretInfo, "Created"), ...problems(400, 401, 409) },
    }),
    async (c) => {
      const body = c.req.valid("json");
      const secret = unwrap(await vault.createSecret(c.var.db, c.var.config.keyRing, c.var.principal, body));
      return c.json(toJson(secret), 201);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/secrets/{id}",
      tags,
      operationId: "getSecret",
      summary: "Read a secret's metadata",
      request: { params },
      responses: { 200: jsonOk(SecretInfo), ...problems(401, 404) },
    }),
    async (c) =>
      c.json(toJson(unwrap(await vault.getSecret(c.var.db, c.var.principal, c.req.valid("param").id))), 200),
  )
  .openapi(
    createRoute({
      method: "put",
      path: "/secrets/{id}",
      tags,
      operationId: "replaceSecretValue",
      summary: "Replace a secret's value",
      request: { params, ...jsonBody(z.object({ value: SecretValue }).strict()) },
      responses: { 200: jsonOk(SecretInfo), ...problems(400, 401, 404) },
    }),
    async (c) => {
      const { id } = c.req.valid("param");
      const secret = unwrap(
        await vault.replaceSecret(c.var.db, c.var.config.keyRing, c.var.principal, id, c.req.valid("json")),
      );
      return c.json(toJson(secret), 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/secrets/{id}",
      tags,
      operationId: "deleteSecret",
      summary: "Delete a secret (refused while a rule uses it)",
      request: { params },
      responses: { 204: { description: "Deleted" }, ...problems(401, 404, 409) },
    }),
    async (c) => {
      unwrap(await vault.deleteSecret(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.body(null, 204);
    },
  );
