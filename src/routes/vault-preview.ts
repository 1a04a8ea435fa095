import { PolicyDocument } from "@benchwright/shared/contract/policy";
import { createRoute, z } from "@hono/zod-openapi";
import { jsonOk, newRouter, problems } from "../router";
import * as vault from "../vault/policy";

// The policy a run started now would get: routing mode and why, hosts-file entries, rules by
// secret name. Secret values never appear; they reach only the run's proxy, on another channel.
export const previewRoutes = newRouter().openapi(
  createRoute({
    method: "get",
    path: "/policy-preview",
    tags: ["vault"],
    operationId: "previewPolicy",
    summary:
      "Preview the compiled policy (routing mode with reasons, hosts-file entries, the declared model's lane)",
    request: {
      query: z
        .object({
          egress: z.enum(["direct", "local"]).default("direct").openapi({
            description: "local: the run egresses through the user's machine (forces catch-all)",
          }),
          model: z.string().min(1).max(128).optional().openapi({
            description: "A model the run declares (a vault model's name); unknown → 400 unknown_model",
          }),
        })
        .strict(),
    },
    responses: { 200: jsonOk(PolicyDocument.openapi("PolicyDocument")), ...problems(400, 401) },
  }),
  async (c) => c.json(await vault.previewPolicy(c.var.db, c.var.principal, c.req.valid("query")), 200),
);
