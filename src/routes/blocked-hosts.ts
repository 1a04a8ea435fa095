import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { jsonOk, NextCursor, newRouter, PageQuery, problems } from "../router";
import { listBlockedHosts, RUNS_PER_HOST } from "../runs/audit-log";

// Blocked hosts across the caller's environment (every run of it), most recently seen first.
// Hosts and counts only, as the proxies reported them.

const Source = z.enum(["proxy", "local_agent", "both"]);

const AccountBlockedHost = z
  .object({
    host: z.string(),
    seenCount: z.number().int().openapi({ description: "Refusals, summed over the runs" }),
    firstSeen: z.string().datetime(),
    lastSeen: z.string().datetime(),
    source: Source.openapi({
      description: "Who refused it: runs' proxies, the user's local egress agent, or both",
    }),
    runs: z.array(z.string()).openapi({
      description: `Ids of the newest runs that saw it (at most ${RUNS_PER_HOST}), newest first`,
    }),
    runCount: z.number().int().openapi({ description: "How many runs saw it" }),
  })
  .strict()
  .openapi("AccountBlockedHost");

const Query = PageQuery.extend({
  runId: z
    .string()
    .max(64)
    .optional()
    .openapi({ description: "Only hosts this run saw (the counts stay environment-wide)" }),
  source: Source.optional().openapi({ description: "Only hosts with this (aggregated) source" }),
}).strict();

export const blockedHostsRoutes = newRouter().openapi(
  createRoute({
    method: "get",
    path: "/blocked-hosts",
    tags: ["runs"],
    operationId: "listBlockedHosts",
    summary: "Hosts refused across this environment's runs, one row per host (most recently seen first)",
    request: { query: Query },
    responses: {
      200: jsonOk(
        z.object({
          blockedHosts: z.array(AccountBlockedHost),
          nextCursor: NextCursor,
        }),
      ),
      ...problems(400, 401, 404),
    },
  }),
  async (c) => {
    const page = unwrap(
      await listBlockedHosts(c.var.db, c.var.principal, {
        ...c.req.valid("query"),
        ring: c.var.config.keyRing,
      }),
    );
    return c.json(
      {
        blockedHosts: page.items.map((h) => ({
          ...h,
          firstSeen: h.firstSeen.toISOString(),
          lastSeen: h.lastSeen.toISOString(),
        })),
        nextCursor: page.nextCursor,
      },
      200,
    );
  },
);
