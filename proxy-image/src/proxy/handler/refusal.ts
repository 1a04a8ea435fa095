import type { LimitKindName, Limits } from "@benchwright/shared/contract/http-limits";
import { type AuditSource, type EgressRoute, PROBE_HEADER } from "@benchwright/shared/contract/proxy-wire";
import type { TunnelError } from "../tunnel-client";
import type { DecisionRecord } from "./record";

// Every way the proxy says no: the status, the decision and reason for the log, the body the
// agent reads, and what the audit learns from it (a refused route, a blocked host). Thrown from
// anywhere on the decision path and turned into one response and one record by the handler.

/** What a refusal tells the audit; derived into rows from the final record (record.ts). */
export interface RefusalAudit {
  route?: EgressRoute;
  blockedBy?: AuditSource;
  /** Which method or path limit the request was outside (a limit-refusal row, N3). */
  limit?: LimitKindName;
}

export class Refusal extends Error {
  constructor(
    readonly status: number,
    readonly decision: DecisionRecord["decision"],
    readonly reason: string,
    readonly body: string,
    readonly headers: Record<string, string> = {},
    readonly audit: RefusalAudit = {},
  ) {
    super(reason);
  }
}

/** What the client is told about a failure: a refusal as thrown, anything else a 502. */
export function toRefusal(e: unknown): Refusal {
  if (e instanceof Refusal) return e;
  const code = (e as Error & { code?: string }).code ?? (e as Error).name;
  return new Refusal(502, "error", `upstream failed: ${code}`, "Upstream request failed.\n");
}

export function bad(status: number, reason: string): Refusal {
  return new Refusal(status, "refuse", reason, `Bad request: ${reason}.\n`);
}

export function misdirected(reason: string): Refusal {
  return new Refusal(421, "refuse", reason, `Misdirected request: ${reason}.\n`);
}

export function probeRefusal(): Refusal {
  return new Refusal(
    403,
    "refuse",
    "wiring probe",
    "Benchwright wiring probe: this request reached the run's proxy.\n",
    { [PROBE_HEADER]: "refused" },
  );
}

export function spoolFull(): Refusal {
  return new Refusal(
    503,
    "refuse",
    "audit spool full",
    "Egress paused: the run's audit log cannot be delivered yet.\n",
  );
}

/** A CONNECT the proxy does not open: the status line alone (the client reads no body). */
export function connectRefusal(status: number, reason: string): Refusal {
  return new Refusal(status, "refuse", reason, "");
}

/** A host the policy blocks: a readable 403, a blocked-host row and a refused route. */
export function blockedRefusal(host: string): Refusal {
  return new Refusal(
    403,
    "block",
    "host blocked by policy",
    blockedBody(host),
    {},
    {
      route: "refused",
      blockedBy: "proxy",
    },
  );
}

export function tunnelDownBody(host: string): string {
  return [
    `Refused by Benchwright: ${host} goes out through the run owner's own machine, and their egress agent is not connected.`,
    "It is never sent direct instead. Start the egress agent (the run's page says how) and try again.",
    "",
  ].join("\n");
}

/** The user's egress agent refused the connection (or it is gone): recorded, never retried direct. */
export function tunnelRefusal(host: string, error: TunnelError): Refusal {
  const refused = { route: "refused" } as const;
  switch (error.kind) {
    case "blocked":
    case "address":
      // The agent is the second enforcement point: its refusals are audited as its own.
      return new Refusal(
        403,
        "block",
        `refused by the egress agent (${error.kind})`,
        blockedBody(
          host,
          error.kind === "blocked"
            ? "the egress agent on the run owner's machine blocks it"
            : "on the run owner's network it resolves to an address the egress agent does not dial",
        ),
        {},
        { ...refused, blockedBy: "local_agent" },
      );
    case "down":
      return new Refusal(503, "refuse", "egress tunnel down", tunnelDownBody(host), {}, refused);
    case "dns":
      return new Refusal(
        502,
        "refuse",
        "the egress agent could not resolve it",
        `Could not resolve ${host}.\n`,
        {},
        refused,
      );
    default:
      return new Refusal(
        502,
        "error",
        `the egress agent could not connect (${error.kind})`,
        "Upstream request failed.\n",
        {},
        refused,
      );
  }
}

/** Whose limits a request is held to: the host entry that allowed the host, or the matching rule. */
export type LimitOwner = { kind: "host"; pattern: string } | { kind: "rule"; index: number; host: string };

/**
 * A request outside a method or path limit (case N3): a readable 403 naming the limit and whose
 * it is, recorded as a limit refusal (host, method, limit; never the path). The body never
 * repeats the path: only the method, which is a token, and the policy's own limits.
 */
export function limitRefusal(
  host: string,
  method: string,
  limit: LimitKindName,
  limits: Limits,
  owner: LimitOwner,
  why?: string,
): Refusal {
  const whose =
    owner.kind === "host" ? `host entry ${owner.pattern}` : `rule ${owner.index + 1} (${owner.host})`;
  const first =
    limit === "method"
      ? `${(limits.methods ?? []).join(", ")} only on ${host}, by the ${whose}; this request was ${method}.`
      : limit === "path"
        ? `path outside the limits of ${host}, by the ${whose}: ${(limits.paths ?? []).join(" ")}.`
        : `the path cannot be compared with the path limits of ${host}, by the ${whose}: it has ${why ?? "what cannot be normalised"}.`;
  return new Refusal(
    403,
    "refuse",
    `${limit === "unnormalisable_path" ? "unnormalisable path" : `${limit} outside the limits`} of the ${owner.kind === "host" ? "host entry" : "rule"}`,
    [
      `Refused by Benchwright: ${first}`,
      "The run's owner can change the limits in the vault (Host policy, or the rule) and the change reaches this run within seconds.",
      "",
    ].join("\n"),
    {},
    { limit },
  );
}

/** What the agent reads when a host is refused: which host, why, and what the owner can do. */
export function blockedBody(host: string, why = "this run's policy blocks it"): string {
  return [
    `Blocked by Benchwright: ${host} is not reachable from this run because ${why}.`,
    "The run's owner can allow it in the vault (Host policy → allow) and the change reaches this run within seconds.",
    "",
  ].join("\n");
}
