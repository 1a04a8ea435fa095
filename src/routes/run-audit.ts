import { LIMIT_KINDS } from "@benchwright/shared/contract/http-limits";
import { MODEL_ENDPOINTS } from "@benchwright/shared/contract/model-lane";
import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { IdParam, jsonOk, NextCursor, newRouter, PageQuery, problems } from "../router";
import { listModelCalls, MINUTES_SHOWN, runModelUse } from "../runs/model-calls";
import {
  listEgressRoutes,
  listLimitRefusals,
  listRunBlockedHosts,
  listStrayPlaceholders,
} from "../runs/run-logs";

// A run's audit, as its proxy reported it: hosts refused (with counts), the route each host
// was reached by, requests refused for a method or path limit, placeholders sent toward another
// host than their rule's, and the model lane's calls (model, provider, status, tokens). Paths,
// queries, bodies, placeholder values, prompts and outputs are never recorded. Scoped by the key's environment: another
// tenant's run is 404.

const BlockedHost = z
  .object({
    host: z.string(),
    seenCount: z.number().int(),
    firstSeen: z.string().datetime(),
    lastSeen: z.string().datetime(),
    source: z.enum(["proxy", "local_agent", "both"]).openapi({
      description: "Who refused it: the run's proxy, the user's local egress agent, or both",
    }),
  })
  .strict()
  .openapi("BlockedHost");

const EgressRouteEntry = z
  .object({
    host: z.string(),
    route: z.enum(["direct", "tunnel", "refused"]),
    count: z.number().int(),
    firstSeen: z.string().datetime(),
    lastSeen: z.string().datetime(),
  })
  .strict()
  .openapi("EgressRoute");

const LimitRefusal = z
  .object({
    host: z.string(),
    method: z.string().openapi({ description: "The refused request's method, uppercase" }),
    limit: z.enum(LIMIT_KINDS).openapi({
      description:
        "Which limit it was outside: the method list, the path list, or a path that does not normalise (refused whatever the limits)",
    }),
    count: z.number().int(),
    firstSeen: z.string().datetime(),
    lastSeen: z.string().datetime(),
  })
  .strict()
  .openapi("LimitRefusal");

const StrayPlaceholder = z
  .object({
    host: z.string().openapi({ description: "The host the placeholder was sent to" }),
    secret: z
      .string()
      .openapi({ description: "The secret whose placeholder it was (its name; never a value)" }),
    count: z.number().int(),
    firstSeen: z.string().datetime(),
    lastSeen: z.string().datetime(),
  })
  .strict()
  .openapi("StrayPlaceholder");

const ModelCall = z
  .object({
    callId: z.string(),
    at: z.string().datetime(),
    model: z.string(),
    provider: z.string(),
    endpoint: z.enum(MODEL_ENDPOINTS).openapi({ description: "The endpoint the caller spoke" }),
    stream: z.boolean(),
    status: z.number().int().openapi({ description: "The HTTP status the caller got" }),
    inputTokens: z.number().int(),
    outputTokens: z.number().int(),
    cachedInputTokens: z
      .number()
      .int()
      .openapi({ description: "Of inputTokens, read from the prompt cache" }),
    refused: z.string().nullable().openapi({
      description: "Why the lane answered itself without calling upstream (over_budget...); null: it called",
    }),
    ms: z.number().int(),
  })
  .strict()
  .openapi("ModelCall");

const RunModel = z
  .object({
    name: z.string().openapi({ description: "The model the run declared" }),
    provider: z.string().nullable(),
    baseHost: z.string().nullable().openapi({ description: "The provider's API host, as at launch" }),
  })
  .strict()
  .openapi("RunModel");

const Ms = z.number().int().nullable();
const ModelTotals = z
  .object({
    calls: z.number().int().openapi({ description: "Every call recorded, refused ones included" }),
    inputTokens: z.number().int(),
    outputTokens: z.number().int(),
    cachedInputTokens: z.number().int(),
    refused: z.number().int().openapi({ description: "Calls the lane refused itself (budget spent...)" }),
    errors: z.number().int().openapi({ description: "Calls sent upstream that got a 4xx or 5xx" }),
    latencyMs: z
      .object({ p50: Ms, p95: Ms })
      .strict()
      .openapi({ description: "Of the calls sent upstream; null before any" }),
  })
  .strict()
  .openapi("ModelTotals");

const BudgetLine = z
  .object({
    used: z.number().int(),
    limit: z.number().int().nullable().openapi({ description: "Null: no limit set" }),
  })
  .strict();
const ModelSpend = z
  .object({
    calls: BudgetLine.openapi({ description: "Calls sent upstream (refused ones do not count)" }),
    inputTokens: BudgetLine,
    outputTokens: BudgetLine,
  })
  .strict()
  .openapi("ModelSpend");

const MinuteTokens = z
  .object({ minute: z.string().datetime(), inputTokens: z.number().int(), outputTokens: z.number().int() })
  .strict()
  .openapi("MinuteTokens");

const query = PageQuery.strict();

// ---- routes ----

const tags = ["runs"];
const params = IdParam("run_");

export const runAuditRoutes = newRouter()
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/blocked-hosts",
      tags,
      operationId: "listRunBlockedHosts",
      summary: "Hosts the run's boundary refused, with counts (most recently seen first)",
      request: { params, query },
      responses: {
        200: jsonOk(z.object({ blockedHosts: z.array(BlockedHost), nextCursor: NextCursor })),
        ...problems(400, 401, 404),
      },
    }),
    async (c) => {
      const page = { ...c.req.valid("query"), ring: c.var.config.keyRing };
      const found = unwrap(
        await listRunBlockedHosts(c.var.db, c.var.principal, c.req.valid("param").id, page),
      );
      return c.json(
        {
          blockedHosts: found.items.map((r) => ({
            host: r.host,
            seenCount: r.seenCount,
            firstSeen: r.firstSeen.toISOString(),
            lastSeen: r.lastSeen.toISOString(),
            source: r.source,
          })),
          nextCursor: found.nextCursor,
        },
        200,
      );
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/egress-routes",
      tags,
      operationId: "listRunEgressRoutes",
      summary: "Hosts the run reached and by which route (direct, tunnel, refused), with counts",
      request: { params, query },
      responses: {
        200: jsonOk(z.object({ egressRoutes: z.array(EgressRouteEntry), nextCursor: NextCursor })),
        ...problems(400, 401, 404),
      },
    }),
    async (c) => {
      const page = { ...c.req.valid("query"), ring: c.var.config.keyRing };
      const found = unwrap(await listEgressRoutes(c.var.db, c.var.principal, c.req.valid("param").id, page));
      return c.json(
        {
          egressRoutes: found.items.map((r) => ({
            host: r.host,
            route: r.route,
            count: r.count,
            firstSeen: r.firstSeen.toISOString(),
            lastSeen: r.lastSeen.toISOString(),
          })),
          nextCursor: found.nextCursor,
        },
        200,
      );
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/limit-refusals",
      tags,
      operationId: "listRunLimitRefusals",
      summary:
        "Requests the run's proxy refused for a method or path limit, per host, method and limit, with counts (most recently seen first); never the path",
      request: { params, query },
      responses: {
        200: jsonOk(z.object({ limitRefusals: z.array(LimitRefusal), nextCursor: NextCursor })),
        ...problems(400, 401, 404),
      },
    }),
    async (c) => {
      const page = { ...c.req.valid("query"), ring: c.var.config.keyRing };
      const found = unwrap(await listLimitRefusals(c.var.db, c.var.principal, c.req.valid("param").id, page));
      return c.json(
        {
          limitRefusals: found.items.map((r) => ({
            host: r.host,
            method: r.method,
            limit: r.limit,
            count: r.count,
            firstSeen: r.firstSeen.toISOString(),
            lastSeen: r.lastSeen.toISOString(),
          })),
          nextCursor: found.nextCursor,
        },
        200,
      );
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/stray-placeholders",
      tags,
      operationId: "listRunStrayPlaceholders",
      summary:
        "Placeholders sent toward a host other than their rule's, per host and secret name, with counts (most recently seen first): they went out unswapped, so that host saw only the placeholder, never the secret",
      request: { params, query },
      responses: {
        200: jsonOk(z.object({ strayPlaceholders: z.array(StrayPlaceholder), nextCursor: NextCursor })),
        ...problems(400, 401, 404),
      },
    }),
    async (c) => {
      const page = { ...c.req.valid("query"), ring: c.var.config.keyRing };
      const found = unwrap(
        await listStrayPlaceholders(c.var.db, c.var.principal, c.req.valid("param").id, page),
      );
      return c.json(
        {
          strayPlaceholders: found.items.map((r) => ({
            host: r.host,
            secret: r.secret,
            count: r.count,
            firstSeen: r.firstSeen.toISOString(),
            lastSeen: r.lastSeen.toISOString(),
          })),
          nextCursor: found.nextCursor,
        },
        200,
      );
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/model-calls",
      tags,
      operationId: "listRunModelCalls",
      summary:
        "The run's declared model, its calls through the model lane (newest first), totals, spend against its modelBudget and tokens per minute; never prompts or outputs",
      request: { params, query },
      responses: {
        200: jsonOk(
          z.object({
            model: RunModel.nullable().openapi({ description: "Null: the run declared no model" }),
            calls: z.array(ModelCall),
            totals: ModelTotals,
            budget: ModelSpend.nullable().openapi({
              description: "Spend against the run's modelBudget; null: it set none",
            }),
            tokensPerMinute: z.array(MinuteTokens).openapi({
              description: `The last ${MINUTES_SHOWN} minutes up to the newest call, oldest first, every minute`,
            }),
            lastReportedAt: z.string().datetime().nullable().openapi({
              description:
                "When the run's proxy last delivered an audit batch: the figures are as of then (batches are flushed every second or so)",
            }),
            nextCursor: NextCursor,
          }),
        ),
        ...problems(400, 401, 404),
      },
    }),
    async (c) => {
      const page = { ...c.req.valid("query"), ring: c.var.config.keyRing };
      const { db, principal } = c.var;
      const use = unwrap(await runModelUse(db, principal, c.req.valid("param").id));
      const found = unwrap(await listModelCalls(db, principal, c.req.valid("param").id, page));
      return c.json(
        {
          model: use.model,
          calls: found.items.map((r) => ({ ...r, at: r.at.toISOString() })),
          totals: use.totals,
          budget: use.budget,
          tokensPerMinute: use.perMinute.map((m) => ({ ...m, minute: m.minute.toISOString() })),
          lastReportedAt: use.lastReportedAt?.toISOString() ?? null,
          nextCursor: found.nextCursor,
        },
        200,
      );
    },
  );
