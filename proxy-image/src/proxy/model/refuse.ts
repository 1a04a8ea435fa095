import type { ServerResponse } from "node:http";
import { errorBody, type Refusal, type WireFormat } from "./translate";

// The lane's own answers when it does not call the provider (or the provider cannot be
// reached): an error in the format the caller spoke, so its SDK raises the error it would for
// the provider's own (cases J1, J3), with the lane's code where the format has room for one.

export type ModelLaneErrorCode =
  | "model_not_declared"
  | "not_found"
  | "invalid_request"
  | "untranslatable"
  | "unsupported_parameter"
  | "payload_too_large"
  | "over_budget"
  | "budget_in_flight"
  | "upstream_failed";

/**
 * The lane's own refusal: its code goes where the caller's format has room for one (OpenAI's
 * `code`); the error type follows the status in both formats (errorBody).
 */
export function laneRefusal(
  status: number,
  code: ModelLaneErrorCode,
  message: string,
  param?: string,
): Refusal {
  return param === undefined ? { status, type: code, message } : { status, type: code, message, param };
}

/** Writes the error (or ends a response already under way); returns the status. */
export function refuse(
  res: ServerResponse,
  format: WireFormat,
  refusal: Refusal,
  headers: Record<string, string> = {},
): number {
  const { status } = refusal;
  if (res.headersSent) {
    res.destroy();
    return status;
  }
  const body = JSON.stringify(errorBody(format, refusal));
  res.writeHead(status, {
    "content-type": "application/json",
    "content-length": Buffer.byteLength(body),
    // The lane's 4xx answers are final: retrying cannot change them (both SDKs retry a 429
    // unless told not to). A retryable one says so with its own Retry-After instead.
    ...(status < 500 ? { "x-should-retry": "false" } : {}),
    ...headers,
  });
  res.end(body);
  return status;
}

/** The caller's format where no endpoint decided it (an unknown path, the model list). */
export function formatOfRequest(path: string, headers: Record<string, unknown>): WireFormat {
  return path.startsWith("/v1/messages") || typeof headers["anthropic-version"] === "string"
    ? "anthropic-messages"
    : "openai-chat";
}
