import { BundleCode } from "@benchwright/shared/contract/bundle";
import { type ProblemTable, problemBodyOf } from "@benchwright/shared/contract/problem";
import { z } from "@hono/zod-openapi";
import type { Context } from "hono";

// One problem+json shape (RFC 9457) for the whole API, a closed set of codes, one status map.
export const ErrorCode = z.enum([
  "unauthorized",
  "read_only_key",
  "not_found",
  "route_not_found",
  "invalid_request",
  // A list cursor that was changed, or that another list or environment gave (case O3).
  "invalid_cursor",
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
  // Method and path limits and placeholders of rules and host entries (issue 35).
  "invalid_limit",
  "limits_on_block",
  "invalid_placeholder_env",
  "model_exists",
  "invalid_base_url",
  "base_url_required",
  "invalid_order",
  "unknown_benchmark",
  "unknown_model",
  "model_budget_without_model",
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
  "registry_unreachable",
  "registry_refused",
  // Bundles (POST /v1/bundles) and what a run may ask for.
  "bundle_upload_too_large",
  "unsupported_media_type",
  "bundle_not_found",
  // A refused bundle: the BundleCode (shared/contract/bundle.ts) that says why.
  ...BundleCode.options,
  "resources_out_of_bounds",
  // Setup images (DELETE /v1/setup-images/{key}).
  "setup_image_building",
  // API keys (POST /v1/api-keys).
  "invalid_expiry",
  "scope_too_wide",
  // Retries and limits (src/idempotency, src/limits).
  "invalid_idempotency_key",
  "idempotency_key_reused",
  "idempotency_key_in_use",
  "rate_limited",
  "too_many_runs",
  // Run-end notifications (src/notifications).
  "invalid_notification_url",
  "too_many_notifications",
  "config_invalid",
  "database_unavailable",
  "internal_error",
]);
export type ErrorCode = z.infer<typeof ErrorCode>;

/** A refused bundle answers with the BundleCode that says why (so each must be an ErrorCode). */
export const bundleErrorCode = (code: BundleCode): ErrorCode => code;

export const ERROR_STATUS = {
  unauthorized: 401,
  read_only_key: 403,
  not_found: 404,
  route_not_found: 404,
  invalid_request: 400,
  invalid_cursor: 400,
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
  invalid_limit: 400,
  limits_on_block: 400,
  invalid_placeholder_env: 400,
  model_exists: 409,
  invalid_base_url: 400,
  base_url_required: 400,
  invalid_order: 400,
  unknown_benchmark: 400,
  unknown_model: 400,
  model_budget_without_model: 400,
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
  registry_unreachable: 503,
  registry_refused: 502,
  bundle_upload_too_large: 413,
  unsupported_media_type: 415,
  bundle_not_found: 404,
  bundle_invalid: 422,
  bundle_path_traversal: 422,
  bundle_absolute_path: 422,
  bundle_link_escape: 422,
  bundle_special_file: 422,
  bundle_too_large: 422,
  bundle_too_many_files: 422,
  resources_out_of_bounds: 422,
  setup_image_building: 409,
  invalid_expiry: 400,
  scope_too_wide: 403,
  invalid_idempotency_key: 400,
  idempotency_key_reused: 409,
  idempotency_key_in_use: 409,
  rate_limited: 429,
  too_many_runs: 429,
  invalid_notification_url: 400,
  too_many_notifications: 409,
  config_invalid: 500,
  database_unavailable: 503,
  internal_error: 500,
} as const satisfies Record<ErrorCode, number>;

const TITLES: Record<ErrorCode, string> = {
  // API keys on /v1, a run's proxy token on /internal.
  unauthorized: "Missing or invalid credentials",
  read_only_key: "This API key may only read (GET, HEAD)",
  not_found: "Not found",
  route_not_found: "No such route",
  invalid_request: "Invalid request",
  invalid_cursor: "Not a cursor of this list: pass the nextCursor this list gave, unchanged",
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
  invalid_limit: "Invalid method or path limit",
  limits_on_block: "Only an allowed host has method or path limits",
  invalid_placeholder_env: "Invalid placeholder variable name",
  model_exists: "A model with that name exists",
  invalid_base_url: "Invalid model base URL",
  base_url_required: "This provider needs a base URL",
  invalid_order: "Invalid rule order",
  invalid_signature: "Missing, invalid or expired signature",
  wrong_run: "The batch names another run",
  already_stored: "Already stored",
  vault_unreadable: "The vault could not be read",
  // The image build cache (src/images).
  registry_unreachable: "The image registry did not answer",
  registry_refused: "The image registry refused or misanswered the broker",
  bundle_upload_too_large: "Bundle larger than this deployment accepts",
  unsupported_media_type: "Body must be a .tar.gz (application/gzip or application/octet-stream)",
  bundle_not_found: "No bundle with that hash in this environment",
  bundle_invalid: "Not a gzip-compressed tar archive",
  bundle_path_traversal: "A bundle entry's path has a .. segment",
  bundle_absolute_path: "A bundle entry's path is absolute",
  bundle_link_escape: "A bundle link points out of the bundle",
  bundle_special_file: "A bundle entry is a device, FIFO or other special file",
  bundle_too_large: "The bundle unpacks to more than the size bound",
  bundle_too_many_files: "The bundle has more entries than the count bound",
  resources_out_of_bounds: "Resources outside this deployment's bounds",
  setup_image_building: "The setup image is being built; it can be dropped once built",
  invalid_expiry: "An API key's expiry must be in the future, and only one of expiresAt and expiresIn",
  scope_too_wide: "A key cannot make a key with a wider scope than its own",
  invalid_idempotency_key: "Idempotency-Key must be 1-255 printable ASCII characters",
  idempotency_key_reused: "Idempotency-Key already used with another request",
  idempotency_key_in_use: "A request with this Idempotency-Key has not finished",
  rate_limited: "Too many requests for this API key",
  too_many_runs: "Too many runs in this environment at once",
  invalid_notification_url: "This URL cannot receive notifications",
  too_many_notifications: "This environment has as many notification URLs as it may",
  unknown_benchmark: "No such benchmark",
  unknown_model: "No model with that name in the vault",
  model_budget_without_model: "A model budget needs a declared model",
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
    /** Seconds for `Retry-After`: a refusal that a later retry can get past (429, in-use 409). */
    readonly retryAfter?: number,
    /** More headers the refusal carries (the rate limit's RateLimit-Policy and RateLimit). */
    readonly headers?: Readonly<Record<string, string>>,
  ) {
    super(`${code}: ${detail}`);
  }
}

const PROBLEMS: ProblemTable<ErrorCode> = { status: ERROR_STATUS, title: TITLES };

/** A code's status and title, for the page its problem `type` names (src/pages/problems.tsx). */
export const problemInfo = (code: ErrorCode) => ({ status: ERROR_STATUS[code], title: TITLES[code] });

/** The problem body; `origin` is this deployment's, whose /problems/<code> page `type` names. */
export function problemBody(code: ErrorCode, detail: string, requestId: string, origin: string) {
  return { ...problemBodyOf(PROBLEMS, code, detail, origin), requestId };
}

export function problem(
  c: Context,
  code: ErrorCode,
  detail: string,
  retryAfter?: number,
  more?: Readonly<Record<string, string>>,
): Response {
  const requestId = (c.get("requestId") as string | undefined) ?? "unknown";
  const headers: Record<string, string> = {
    ...more,
    "content-type": "application/problem+json",
    "x-request-id": requestId,
  };
  if (retryAfter !== undefined) headers["retry-after"] = String(Math.max(1, Math.ceil(retryAfter)));
  const origin = new URL(c.req.url).origin;
  return new Response(JSON.stringify(problemBody(code, detail, requestId, origin)), {
    status: ERROR_STATUS[code],
    headers,
  });
}

export function unwrap<T>(result: Result<T>): T {
  if (!result.ok) throw new ApiError(result.error.code, result.error.detail);
  return result.value;
}
