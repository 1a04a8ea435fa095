import { CURSOR_MAX_LENGTH, LIST_LIMIT } from "@benchwright/shared/contract/list";
import { OpenAPIHono, z } from "@hono/zod-openapi";
import type { AppEnv } from "./context";
import { type ErrorCode, Problem, problem } from "./errors";

// Every router shares one validation hook, so a bad body is the same problem+json everywhere:
// unknown fields → unknown_field (bodies are strict: they cannot smuggle a user or run id in),
// anything else → invalid_request, with zod's path and message in `detail`.
export function newRouter() {
  return new OpenAPIHono<AppEnv>({
    defaultHook: (result, c) => {
      if (result.success) return;
      const issues = result.error.issues;
      const unknown = issues.find((i) => i.code === "unrecognized_keys");
      const code: ErrorCode = unknown ? "unknown_field" : "invalid_request";
      const detail = issues
        .map((i) => {
          const at = i.path.length > 0 ? i.path.join(".") : result.target;
          return `${at}: ${i.message}`;
        })
        .join("; ");
      return problem(c, code, detail);
    },
  });
}

/** Standard error responses for the OpenAPI document. */
export function problems(...statuses: number[]) {
  const out: Record<
    number,
    { description: string; content: { "application/problem+json": { schema: typeof Problem } } }
  > = {};
  for (const s of statuses) {
    out[s] = { description: "Problem details", content: { "application/problem+json": { schema: Problem } } };
  }
  return out;
}

export const IdParam = (prefix: string) =>
  z.object({
    id: z
      .string()
      .max(64)
      .openapi({ param: { name: "id", in: "path" }, example: `${prefix}0123456789abcdef` }),
  });

export const jsonBody = <T extends z.ZodType>(schema: T) => ({
  body: { content: { "application/json": { schema } }, required: true },
});

export const jsonOk = <T extends z.ZodType>(schema: T, description = "OK") => ({
  description,
  content: { "application/json": { schema } },
});

/** A stored time as the API writes it: ISO 8601 in UTC, or null. */
export const iso = (d: Date | null) => (d ? d.toISOString() : null);

/** The `nextCursor` of a page of a list. */
export const NextCursor = z
  .string()
  .nullable()
  .openapi({ description: "Cursor of the next page; null on the last" });

/**
 * The query of every paginated list (shared/contract/list.ts): one limit range and default, one
 * cursor. Extend it with a list's filters, then `.strict()`.
 */
export const PageQuery = z.object({
  limit: z.coerce
    .number()
    .int()
    .min(LIST_LIMIT.min)
    .max(LIST_LIMIT.max)
    .default(LIST_LIMIT.default)
    .openapi({ description: `Items per page, ${LIST_LIMIT.min}-${LIST_LIMIT.max}` }),
  cursor: z.string().max(CURSOR_MAX_LENGTH).optional().openapi({
    description:
      "nextCursor of the previous page of this same list; opaque. Another list's or another environment's cursor, or a changed one, is 400 invalid_cursor",
  }),
});
