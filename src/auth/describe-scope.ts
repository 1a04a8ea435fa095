import type { OpenAPIHono } from "@hono/zod-openapi";
import type { AppEnv } from "../context";
import { Problem } from "../errors";
import { WRITE_METHODS_LOWER } from "./scope";

/**
 * Puts the 403 a read-only key gets (read_only_key) on every /v1 operation that changes
 * something. Only the document: requireApiKey refuses the request itself. Call once all routes
 * are mounted.
 */
export function describeKeyScope(app: OpenAPIHono<AppEnv>): void {
  const writes = new Set<string>(WRITE_METHODS_LOWER);
  for (const def of app.openAPIRegistry.definitions) {
    if (def.type !== "route" || !def.route.path.startsWith("/v1/") || !writes.has(def.route.method)) continue;
    def.route.responses = {
      403: { description: "Problem details", content: { "application/problem+json": { schema: Problem } } },
      ...def.route.responses,
    };
  }
}
