import type { AgentErrorCode } from "@benchwright/shared/contract/local-agent";
import { problemBodyOf, problemTable } from "@benchwright/shared/contract/problem";

// The agent's failures: a closed set of codes (the contract's), one status each, one body shape
// (problem+json). Services throw AgentError; the server renders it.

// Each code with its status and title, side by side: one line each.
const PROBLEMS = problemTable<AgentErrorCode>({
  unauthorized: [401, "Missing or invalid agent secret"],
  invalid_request: [400, "Invalid request"],
  not_found: [404, "Not found"],
  cannot_isolate: [503, "This machine cannot isolate a sandbox"],
  sandbox_failed: [500, "The sandbox could not be made or used"],
  sealed: [409, "The sandbox's setup stage has ended"],
  setup_not_sealed: [409, "The sandbox's setup stage could not be sealed"],
  not_sealed: [409, "The sandbox's setup stage has not ended"],
  capture_too_late: [409, "The sandbox's changes can no longer be captured"],
  setup_image_missing: [409, "No complete setup layer of that digest"],
  setup_image_mismatch: [409, "The stored setup layer does not match its digest"],
  setup_image_too_large: [413, "The setup layer is larger than allowed"],
  setup_image_unsupported: [422, "The setup's changes cannot be kept as a layer"],
  setup_image_holds_run_files: [422, "The setup's changes hold one run's own files"],
  in_use: [409, "A live sandbox starts from it"],
});

export class AgentError extends Error {
  constructor(
    readonly code: AgentErrorCode,
    readonly detail: string,
  ) {
    super(`${code}: ${detail}`);
    this.name = "AgentError";
  }
}

/** An error's message, for a detail or a log line (a thrown non-Error as text). */
export const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

export const problemBody = (code: AgentErrorCode, detail: string) => problemBodyOf(PROBLEMS, code, detail);
