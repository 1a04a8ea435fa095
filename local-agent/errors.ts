import type { AgentErrorCode } from "../shared/contract/local-agent";
import { type ProblemTable, problemBodyOf } from "../shared/contract/problem";

// The agent's failures: a closed set of codes (the contract's), one status each, one body shape
// (problem+json). Services throw AgentError; the server renders it.

export const AGENT_ERROR_STATUS = {
  unauthorized: 401,
  invalid_request: 400,
  not_found: 404,
  cannot_isolate: 503,
  sandbox_failed: 500,
  sealed: 409,
} as const satisfies Record<AgentErrorCode, number>;

const TITLES: Record<AgentErrorCode, string> = {
  unauthorized: "Missing or invalid agent secret",
  invalid_request: "Invalid request",
  not_found: "Not found",
  cannot_isolate: "This machine cannot isolate a sandbox",
  sandbox_failed: "The sandbox could not be made or used",
  sealed: "The sandbox's setup stage has ended",
};

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

const PROBLEMS: ProblemTable<AgentErrorCode> = { status: AGENT_ERROR_STATUS, title: TITLES };

export const problemBody = (code: AgentErrorCode, detail: string) => problemBodyOf(PROBLEMS, code, detail);
