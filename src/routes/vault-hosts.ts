import { EgressVia, HostAction } from "@benchwright/shared/contract/policy";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { IdParam, jsonBody, jsonOk, newRouter, problems } from "../router";
import * as vault from "../vault/hosts";
import * as settings from "../vault/settings";

// The contract's enum rebuilt with this module's z, which carries .openapi() whatever the order
// in which modules were loaded.
const Via = z.enum(EgressVia.options);

export const HostEntry = z
  .object({
    id: z.string(),
    pattern: z.string(),
    action: HostAction,
    implicit: z.boolean().openapi({ description: "Added for a rule's host; removed with the rule" }),
    via: Via.nullable().openapi({
      description:
        "How an allowed host's traffic leaves: tunnel (through the user's egress agent, which makes routing catch-all) or direct; null: as the run's egress says (local → tunnel)",
    }),
    methods: z
      .array(z.string())
      .nullable()
      .openapi({ description: "The methods requests to this host may use; null: any" }),
    paths: z
      .array(z.string())
      .nullable()
      .openapi({ description: "The paths (prefixes or globs) requests to this host may use; null: any" }),
    createdAt: z.string().datetime(),
    updatedAt: z.string().datetime(),
  })
  .strict()
  .openapi("HostEntry");

const toJson = (h: vault.HostEntry): z.infer<typeof HostEntry> => ({
  ...h,
  createdAt: h.createdAt.toISOString(),
  updatedAt: h.updatedAt.toISOString(),
});

/** A host pattern as the user writes it (checked and canonicalised by the vault service). */
export const HostPatternInput = z.string().min(1).max(300);

/** The route of an allowed host; a block entry takes none (400 via_on_block). */
export const ViaInput = Via.openapi({
  description:
    "Allowed hosts only: tunnel (through the user's machine) or direct; omitted: as the run's egress says",
});

// Limits as the user writes them; the vault service checks the grammar (400 invalid_limit) and
// refuses them on a block entry (400 limits_on_block).
export const MethodsInput = z
  .array(z.string().max(64))
  .max(100)
  .nullable()
  .openapi({
    description: "Allowed hosts and rules only: the methods requests may use (RFC 9110 tokens); null: any",
    example: ["GET", "HEAD"],
  });
export const PathsInput = z
  .array(z.string().max(300))
  .max(100)
  .nullable()
  .openapi({
    description:
      'Allowed hosts and rules only: the paths requests may use, compared with the normalised path: "/repos" is a prefix on a segment boundary, "*" a glob within a segment, "**" across segments; null: any',
    example: ["/repos/acme/"],
  });

const Settings = z
  .object({ default: HostAction, version: z.number().int() })
  .strict()
  .openapi("VaultSettings");

const tags = ["vault: hosts"];
const params = IdParam("hst_");

export const hostsRoutes = newRouter()
  .openapi(
    createRoute({
      method: "get",
      path: "/hosts",
      tags,
      operationId: "listHostEntries",
      summary: "List host entries",
      responses: { 200: jsonOk(z.object({ hosts: z.array(HostEntry) })), ...problems(401) },
    }),
    async (c) => c.json({ hosts: (await vault.listHosts(c.var.db, c.var.principal)).map(toJson) }, 200),
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/hosts",
      tags,
      operationId: "setHostEntry",
      summary: "Allow or block a host pattern (creates or replaces the entry; makes it explicit)",
      request: jsonBody(
        z
          .object({
            pattern: HostPatternInput.openapi({ example: "*.evil.example" }),
            action: HostAction,
            via: ViaInput.optional(),
            methods: MethodsInput.optional(),
            paths: PathsInput.optional(),
          })
          .strict(),
      ),
      responses: { 200: jsonOk(HostEntry), ...problems(400, 401, 409) },
    }),
    async (c) =>
      c.json(toJson(unwrap(await vault.putHost(c.var.db, c.var.principal, c.req.valid("json")))), 200),
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/hosts/starter-pack",
      tags,
      operationId: "allowStarterPack",
      summary:
        "Allow common package and source hosts (npm, PyPI, GitHub, Debian/Ubuntu, crates, Go, Maven...); the source hosts read-only (GET, HEAD)",
      // No fields. A body is optional, but if sent it must be `{}`: like every body here, it is
      // strict, so it cannot carry a user or environment id that is silently ignored (case C3).
      request: {
        body: { content: { "application/json": { schema: z.object({}).strict() } }, required: false },
      },
      responses: {
        200: jsonOk(z.object({ added: z.array(z.string()), kept: z.array(z.string()) })),
        ...problems(400, 401),
      },
    }),
    async (c) => c.json(unwrap(await vault.addStarterPack(c.var.db, c.var.principal)), 200),
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/hosts/from-blocked",
      tags,
      operationId: "allowBlockedHosts",
      summary:
        "Allow hosts runs were refused (exact names; a block entry becomes allow; one vault version for the call)",
      request: jsonBody(
        z
          .object({
            hosts: z
              .array(HostPatternInput.openapi({ example: "pypi.example" }))
              .min(1)
              .max(vault.MAX_ALLOW_HOSTS),
          })
          .strict(),
      ),
      responses: {
        200: jsonOk(
          z.object({
            entries: z.array(HostEntry).openapi({ description: "The entries of the hosts sent, in order" }),
            created: z.number().int(),
            updated: z.number().int().openapi({
              description: "Block entries switched to allow (or a rule's implicit entry made explicit)",
            }),
            unchanged: z.number().int(),
          }),
        ),
        ...problems(400, 401),
      },
    }),
    async (c) => {
      const done = unwrap(await vault.allowHosts(c.var.db, c.var.principal, c.req.valid("json").hosts));
      return c.json({ ...done, entries: done.entries.map(toJson) }, 200);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/hosts/{id}",
      tags,
      operationId: "getHostEntry",
      summary: "Read a host entry",
      request: { params },
      responses: { 200: jsonOk(HostEntry), ...problems(401, 404) },
    }),
    async (c) =>
      c.json(toJson(unwrap(await vault.getHost(c.var.db, c.var.principal, c.req.valid("param").id))), 200),
  )
  .openapi(
    createRoute({
      method: "patch",
      path: "/hosts/{id}",
      tags,
      operationId: "updateHostEntry",
      summary: "Change a host entry's action, route and/or limits (blocking drops route and limits)",
      request: {
        params,
        ...jsonBody(
          z
            .object({
              action: HostAction.optional(),
              via: ViaInput.nullable()
                .optional()
                .openapi({ description: "tunnel or direct; null clears it (the run's egress decides)" }),
              methods: MethodsInput.optional(),
              paths: PathsInput.optional(),
            })
            .strict()
            .refine((b) => Object.values(b).some((v) => v !== undefined), {
              message: "give action, via, methods or paths",
            }),
        ),
      },
      responses: { 200: jsonOk(HostEntry), ...problems(400, 401, 404, 409) },
    }),
    async (c) => {
      const entry = unwrap(
        await vault.updateHost(c.var.db, c.var.principal, c.req.valid("param").id, c.req.valid("json")),
      );
      return c.json(toJson(entry), 200);
    },
  )
  .openapi(
    createRoute({
      method: "delete",
      path: "/hosts/{id}",
      tags,
      operationId: "deleteHostEntry",
      summary: "Delete a host entry (refused while a rule needs it)",
      request: { params },
      responses: { 204: { description: "Deleted" }, ...problems(401, 404, 409) },
    }),
    async (c) => {
      unwrap(await vault.deleteHost(c.var.db, c.var.principal, c.req.valid("param").id));
      return c.body(null, 204);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/settings",
      tags,
      operationId: "getVaultSettings",
      summary: "The default action for hosts no entry names, and the vault version",
      responses: { 200: jsonOk(Settings), ...problems(401) },
    }),
    async (c) => c.json(await settings.getSettings(c.var.db, c.var.principal), 200),
  )
  .openapi(
    createRoute({
      method: "put",
      path: "/settings",
      tags,
      operationId: "setVaultSettings",
      summary: "Set the default action (block switches runs to catch-all routing)",
      request: jsonBody(z.object({ default: HostAction }).strict()),
      responses: { 200: jsonOk(Settings), ...problems(400, 401) },
    }),
    async (c) =>
      c.json(unwrap(await settings.setDefault(c.var.db, c.var.principal, c.req.valid("json").default)), 200),
  );
