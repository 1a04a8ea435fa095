import { PlaceholderPlace } from "@benchwright/shared/contract/placeholder";
import { InjectScheme } from "@benchwright/shared/contract/policy";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { IdParam, jsonBody, jsonOk, newRouter, problems } from "../router";
import * as vault from "../vault/rules";
import { MethodsInput, PathsInput } from "./vault-hosts";
import { SecretName } from "./vault-secrets";

const Inject = z
  .object({
    scheme: InjectScheme.openapi({
      description:
        "bearer: `Bearer <secret>`; basic: `Basic base64(<secret>)` where the secret is user:password; raw: the secret as the header value; query: a query parameter",
    }),
    name: z.string().min(1).max(128).optional().openapi({
      description: "Header name (default authorization for bearer/basic) or query parameter name",
    }),
  })
  .strict();

const HostPattern = z.string().min(1).max(300).openapi({ example: "api.openrouter.ai" });
const Position = z.number().int().min(0).openapi({ description: "0-based place in the order; default last" });

// Checked by the vault service, which answers invalid_placeholder_env with the reason.
const PlaceholderEnvInput = z.string().min(1).max(300).nullable().openapi({
  description:
    "The variable the run's sandboxes get this secret's placeholder in: letters, digits and _, not the platform's (PATH, HTTPS_PROXY, BW_...); null: no placeholder; omitted: the secret's name made portable (on create), as it is (on update)",
  example: "OPENROUTER_API_KEY",
});
const PlaceholderIn = z
  .array(z.enum(PlaceholderPlace.options))
  .max(1)
  .openapi({ description: '["body"]: the proxy also swaps the placeholder in request bodies (up to 1 MiB)' });

/** A rule's fields beyond host, secret and inject, all optional (the dry run's rules take them too). */
export const RuleExtras = {
  placeholderEnv: PlaceholderEnvInput.optional(),
  placeholderIn: PlaceholderIn.optional(),
  methods: MethodsInput.optional(),
  paths: PathsInput.optional(),
};

const toJson = (r: vault.RuleInfo): z.infer<typeof vault.Rule> => ({
  ...r,
  createdAt: r.createdAt.toISOString(),
  updatedAt: r.updatedAt.toISOString(),
});

const tags = ["vault: rules"];
const params = IdParam("rul_");
const RuleList = z.object({ rules: z.array(vault.Rule) });

export const rulesRoutes = newRouter()
  .openapi(
    createRoute({
      method: "get",
      path: "/rules",
      tags,
      operationId: "listRules",
      summary: "List rules in order (first match wins)",
      responses: { 200: jsonOk(RuleList), ...problems(401) },
    }),
    async (c) => c.json({ rules: (await vault.listRules(c.var.db, c.var.principal)).map(toJson) }, 200),
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/rules",
      tags,
      operationId: "createRule",
      summary: "Add a rule: inject a secret into requests to a host",
      request: jsonBody(
        z
          .object({
            host: HostPattern,
            secret: SecretName,
            inject: Inject,
            position: Position.optional(),
            ...RuleExtras,
          })
          .strict(),
      ),
      responses: { 201: jsonOk(vault.Rule, "Created"), ...problems(400, 401, 409) },
    }),
    async (c) =>
      c.json(toJson(unwrap(await vault.createRule(c.var.db, c.var.principal, c.req.valid("json")))), 201),
  )
  .openapi(
    createRoute({
      method: "put",
      path: "/rules/order",
      tags,
      operationId: "reorderRules",
      summary: "Reorder all rules",
      request: jsonBody(z.object({ ids: z.array(z.string().max(64)).max(10_000) }).strict()),
      responses: { 200: jsonOk(RuleList), ...problems(400, 401) },
    }),
    async (c) => {
      const rules = unwrap(await vault.reorderRules(c.var.db, c.var.principal, c.req.valid("json").ids));
      return c.json({ rules: rules.map(toJson) }, 200);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/rules/{id}",
      tags,
      operationId: "getRule",
      summary: "Read a rule",
      request: { params },
      responses: { 200: jsonOk(vault.Rule), ...problems(401, 404) },
    }),
    async (c) =>
      c.json(toJson(unwrap(await vault.getRule(c.var.db, c.var.principal, c.req.valid("param").id))), 200),
  )
  .openapi(
    createRoute({
      method: "patch",
      path: "/rules/{id}",
      tags,
      operationId: "updateRule",
      summary: "Change a rule",
      request: {
        params,
        ...jsonBody(
          z
            .object({
              host: HostPattern.optional(),
              secret: SecretName.optional(),
              inject: Inject.optional(),
              position: Position.optional(),
              ...RuleExtras,
            })
            .strict(),
        ),
      },
      responses: { 200: jsonOk(vault.Rule), ...problems(400, 401, 404, 409) },
    }),
    async (c) => {
      const rule = unwrap(
        await vault.updateRule(c.var.db, c.var.principal, c.req.valid("param").id, c.req.valid("json")),
      );
      return c.json(toJson(rule), 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/rules/{id}",
      tags,
      operationId: "deleteRule",
      summary: "Delete a rule (its implicit host entry goes with it)",
      request: { params },
      responses: { 204: { description: "Deleted" }, ...problems(401, 404) },
    }),
    async (c) => {
      unwrap(await vault.deleteRule(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.body(null, 204);
    },
  );
