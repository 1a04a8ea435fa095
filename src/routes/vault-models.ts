import { ModelProvider } from "@benchwright/shared/contract/policy";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { IdParam, jsonBody, jsonOk, newRouter, problems } from "../router";
import * as models from "../vault/models";
import { PROVIDERS } from "../vault/models";
import { SecretName } from "./vault-secrets";

// Models a run may declare (`model` in the run spec): the run's proxy serves them to the work
// sandbox in OpenAI's and Anthropic's formats and calls the provider, in its own format, with the
// named secret's value. The secret is named, never shown; no response here has a field that
// could carry its value.

// Printable ASCII without spaces: the name travels in the run spec and as `model` on the wire.
export const ModelName = z
  .string()
  .regex(/^[\x21-\x7e]{1,128}$/, "1-128 printable ASCII characters, no spaces")
  .openapi({ example: "gpt-4o-mini" });
const Provider = ModelProvider.openapi({
  description:
    "Who the lane calls and how: openai (Bearer key), openai-compatible (any OpenAI-format API with a Bearer key: OpenRouter, vLLM...), anthropic (Messages API, x-api-key)",
  example: "openai",
});
const BaseUrl = z
  .string()
  .min(1)
  .max(2048)
  .openapi({
    description: `The provider's API base: https only, no user info, query or fragment (stored canonical). Default for openai ${PROVIDERS.openai.defaultBaseUrl}, for anthropic ${PROVIDERS.anthropic.defaultBaseUrl}; required for openai-compatible (error base_url_required)`,
    example: "https://api.openai.com/v1",
  });

export const ModelInfo = z
  .object({
    id: z.string(),
    name: ModelName.openapi({ description: "What a run declares and its sandbox sends as `model`" }),
    provider: ModelProvider,
    baseUrl: z.string(),
    upstreamModel: z.string().openapi({ description: "The `model` sent to the provider" }),
    secret: z.string().openapi({ description: "The secret's name; its value is never returned" }),
    createdAt: z.string().datetime(),
    updatedAt: z.string().datetime(),
  })
  .strict()
  .openapi("Model");

const toJson = (m: models.ModelInfo): z.infer<typeof ModelInfo> => ({
  id: m.id,
  name: m.name,
  provider: m.provider,
  baseUrl: m.baseUrl,
  upstreamModel: m.upstreamModel,
  secret: m.secret,
  createdAt: m.createdAt.toISOString(),
  updatedAt: m.updatedAt.toISOString(),
});

const Fields = z
  .object({
    name: ModelName,
    provider: Provider,
    baseUrl: BaseUrl.optional(),
    upstreamModel: ModelName.optional().openapi({
      description: "Default: the name",
      example: "gpt-4o-mini",
    }),
    secret: SecretName.openapi({
      description:
        "A vault secret's name: sent the way the provider documents (Authorization: Bearer; x-api-key for anthropic)",
    }),
  })
  .strict();

const tags = ["vault: models"];
const params = IdParam("mdl_");

export const modelsRoutes = newRouter()
  .openapi(
    createRoute({
      method: "get",
      path: "/models",
      tags,
      operationId: "listModels",
      summary: "List the models runs may declare (by name)",
      responses: { 200: jsonOk(z.object({ models: z.array(ModelInfo) })), ...problems(401) },
    }),
    async (c) => c.json({ models: (await models.listModels(c.var.db, c.var.principal)).map(toJson) }, 200),
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/models",
      tags,
      operationId: "createModel",
      summary: "Add a model a run may declare (one per name)",
      request: jsonBody(Fields),
      responses: { 201: jsonOk(ModelInfo, "Created"), ...problems(400, 401, 409) },
    }),
    async (c) => {
      const made = unwrap(await models.createModel(c.var.db, c.var.principal, c.req.valid("json")));
      return c.json(toJson(made), 201);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/models/{id}",
      tags,
      operationId: "getModel",
      summary: "Read a model",
      request: { params },
      responses: { 200: jsonOk(ModelInfo), ...problems(401, 404) },
    }),
    async (c) =>
      c.json(toJson(unwrap(await models.getModel(c.var.db, c.var.principal, c.req.valid("param").id))), 200),
  )
  .openapi(
    createRoute({
      method: "patch",
      path: "/models/{id}",
      tags,
      operationId: "updateModel",
      summary: "Change a model (runs that declared its old name no longer find it)",
      request: { params, ...jsonBody(Fields.partial().strict()) },
      responses: { 200: jsonOk(ModelInfo), ...problems(400, 401, 404, 409) },
    }),
    async (c) => {
      const { id } = c.req.valid("param");
      const model = unwrap(await models.updateModel(c.var.db, c.var.principal, id, c.req.valid("json")));
      return c.json(toJson(model), 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/models/{id}",
      tags,
      operationId: "deleteModel",
      summary:
        "Delete a model (a run declaring it that has not read its vault yet stops before any code runs)",
      request: { params },
      responses: { 204: { description: "Deleted" }, ...problems(401, 404) },
    }),
    async (c) => {
      unwrap(await models.deleteModel(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.body(null, 204);
    },
  );
