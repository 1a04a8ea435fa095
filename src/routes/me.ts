import { createRoute, z } from "@hono/zod-openapi";
import { jsonOk, newRouter, problems } from "../router";

// Who the API key speaks for: lets a client check its key without touching the vault.
export const meRoutes = newRouter().openapi(
  createRoute({
    method: "get",
    path: "/me",
    tags: ["account"],
    operationId: "getMe",
    summary: "The user and environment this API key belongs to",
    responses: {
      200: jsonOk(z.object({ userId: z.string(), environmentId: z.string(), keyId: z.string() }).strict()),
      ...problems(401),
    },
  }),
  (c) => c.json({ ...c.var.principal }, 200),
);
