import { consoleLog } from "@benchwright/shared/contract/log";
import type { OpenAPIHono } from "@hono/zod-openapi";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../context";
import { ApiError, Problem } from "../errors";
import { RATE_LIMIT_HEADERS, RATE_LIMIT_PERIOD_SECONDS } from "./rate-limit-policy";

// Per-API-key request rate on /v1 (case K4), counted by Cloudflare's Workers rate-limiting
// binding API_RATE_LIMIT (wrangler.toml [[ratelimits]]; `wrangler dev` and the test pool run it
// locally too). Counted after the key is known, by its id: one key's flood cannot use up another
// key's allowance, and nothing secret (neither the key nor its hash) is sent to the counter.

export const rateLimit = createMiddleware<AppEnv>(async (c, next) => {
  let allowed = true;
  try {
    allowed = (await c.env.API_RATE_LIMIT.limit({ key: c.var.principal.keyId })).success;
  } catch (error) {
    // The counter is abuse protection, not the boundary: if it is away, requests go on (and say so).
    consoleLog("error", {
      event: "rate_limit_unavailable",
      requestId: c.var.requestId,
      error: (error as Error).name,
    });
  }
  if (!allowed) {
    throw new ApiError(
      "rate_limited",
      `This API key sent more requests than this deployment allows in ${RATE_LIMIT_PERIOD_SECONDS} seconds; retry after Retry-After seconds.`,
      RATE_LIMIT_PERIOD_SECONDS,
      RATE_LIMIT_HEADERS,
    );
  }
  await next();
});

/**
 * Puts the 429 on every operation the middleware covers (all of /v1 but `exempt`, the document)
 * in the OpenAPI document. Call once all routes are mounted.
 */
export function describeRateLimit(app: OpenAPIHono<AppEnv>, exempt: string): void {
  for (const def of app.openAPIRegistry.definitions) {
    if (def.type !== "route" || !def.route.path.startsWith("/v1/") || def.route.path === exempt) continue;
    def.route.responses = {
      429: { description: "Problem details", content: { "application/problem+json": { schema: Problem } } },
      ...def.route.responses,
    };
  }
}
