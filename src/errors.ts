import { z } from "@hono/zod-openapi";
import type { Context } from "hono";

// One problem+json shape (RFC 9457) for the whole API, a closed set of codes, one status map.
export const ErrorCode = z.enum([
  "unauthorized",
  "not_found",
  "route_not_found",
  "invalid_request",
  "invalid_json",
  "unknown_field",
  "payload_too_large",
  "invalid_host_pattern",
  "secret_exists",
  "unknown_secret",
  "secret_in_use",
  "rule_host_blocked",
  "host_has_rule",
  "via_on_block",
  "model_exists",
  "invalid_base_url",
  "invalid_order",
  "unknown_benchmark",
  "unknown_model",
  "run_ended",
  "linger_too_long",
  "backend_not_configured",
  "environment_conflict",
  "too_many_environments",
  "proxy_gone",
  "proxy_unreachable",
  "invalid_signature",
  "wrong_run",
  "already_stored",
  "vault_unreadable",
  "invalid_content_hash",
  "registry_not_configured",
  "registry_unreachable",
  "registry_refused",
  "image_not_pushed",
  "image_tag_changed",
  "config_invalid",
  "database_unavailable",
  "internal_error",
]);
export type ErrorCode = z.infer<typeof ErrorCode>;

export const ERROR_STATUS = {
  unauthorized: 401,
  not_found: 404,
  route_not_found: 404,
  invalid_request: 400,
  invalid_json: 400,
  unknown_field: 400,
  payload_too_large: 413,
  invalid_host_pattern: 400,
  secret_exists: 409,
  unknown_secret: 400,
  secret_in_use: 409,
  rule_host_blocked: 409,
  host_has_rule: 409,
  via_on_block: 400,
  model_exists: 409,
  invalid_base_url: 400,
  invalid_order: 400,
  unknown_benchmark: 400,
  unknown_model: 400,
  run_ended: 409,
  linger_too_long: 400,
  backend_not_configured: 400,
  environment_conflict: 409,
  too_many_environments: 409,
  proxy_gone: 409,
  proxy_unreachable: 503,
  invalid_signature: 401,
  wrong_run: 403,
  already_stored: 409,
  vault_unreadable: 503,
  invalid_content_hash: 400,
  registry_not_configured: 503,
  registry_unreachable: 503,
  registry_refused: 502,
  image_not_pushed: 409,
  image_tag_changed: 409,
  config_invalid: 500,
  database_unavailable: 503,
  internal_error: 500,
} as const satisfies Record<ErrorCode, number>;

const TITLES: Record<ErrorCode, string> = {
  // API keys on /v1, a run's proxy token on /internal.
  unauthorized: "Missing or invalid credentials",
  not_found: "Not found",
  route_not_found: "No such route",
  invalid_request: "Invalid request",
  invalid_json: "Body is not valid JSON",
  unknown_field: "Unknown field in request",
  payload_too_large: "Request body too large",
  invalid_host_pattern: "Invalid host pattern",
  secret_exists: "A secret with that name exists",
  unknown_secret: "No secret with that name",
  secret_in_use: "Secret is used by a rule or a model",
  rule_host_blocked: "Host is blocked",
  host_has_rule: "Host entry is needed by a rule",
  via_on_block: "Only an allowed host has a route",
  model_exists: "A model with that name exists",
  invalid_base_url: "Invalid model base URL",
  invalid_order: "Invalid rule order",
  invalid_signature: "Missing, invalid or expired signature",
  wrong_run: "The batch names another run",
  already_stored: "Already stored",
  vault_unreadable: "The vault could not be read",
  // The image build cache (src/images).
  invalid_content_hash: "Content hash must be 64 lowercase hex digits (SHA-256)",
  registry_not_configured: "No image registry is configured here",
  registry_unreachable: "The image registry did not answer",
  registry_refused: "The image registry refused or misanswered the broker",
  image_not_pushed: "No image manifest at the tag",
  image_tag_changed: "The tag no longer holds the recorded image",
  unknown_benchmark: "No such benchmark",
  unknown_model: "No model with that name in the vault",
  run_ended: "The run has ended",
  linger_too_long: "Linger longer than 24 hours",
  backend_not_configured: "That compute backend is not configured here",
  environment_conflict: "The environment cannot do that now",
  too_many_environments: "Too many environments for one run",
  proxy_gone: "The run has no proxy running",
  proxy_unreachable: "The run's proxy did not answer",
  config_invalid: "Server configuration is invalid",
  database_unavailable: "Database unavailable",
  internal_error: "Internal error",
};

export const Problem = z
  .object({
    type: z.string(),
    title: z.string(),
    status: z.number().int(),
    detail: z.string(),
    code: ErrorCode,
    requestId: z.string(),
  })
  .openapi("Problem");

/** A failure a service reports; routes turn it into a problem response. */
export interface Failure {
  readonly code: ErrorCode;
  readonly detail: string;
}
export type Result<T> = { ok: true; value: T } | { ok: false; error: Failure };
export const ok = <T>(value: T): Result<T> => ({ ok: true, value });
export const fail = (code: ErrorCode, detail: string): { ok: false; error: Failure } => ({
  ok: false,
  error: { code, detail },
});

/** Thrown from anywhere in a request; the app's error handler renders it. */
export class ApiError extends Error {
  constructor(
    readonly code: ErrorCode,
    readonly detail: string,
  ) {
    super(`${code}: ${detail}`);
  }
}

export function problemBody(code: ErrorCode, detail: string, requestId: string) {
  return {
    type: `https://benchwright.dev/problems/${code}`,
    title: TITLES[code],
    status: ERROR_STATUS[code],
    detail,
    code,
    requestId,
  };
}

export function problem(c: Context, code: ErrorCode, detail: string): Response {
  const requestId = (c.get("requestId") as string | undefined) ?? "unknown";
  return new Response(JSON.stringify(problemBody(code, detail, requestId)), {
    status: ERROR_STATUS[code],
    headers: { "content-type": "application/problem+json", "x-request-id": requestId },
  });
}

export function unwrap<T>(result: Result<T>): T {
  if (!result.ok) throw new ApiError(result.error.code, result.error.detail);
  return result.value;
}
