import type { OpenAPIHono } from "@hono/zod-openapi";
import { z } from "@hono/zod-openapi";
import type { AppEnv } from "../context";
import { Problem } from "../errors";
import { IdempotencyKey } from "./middleware";

// Which POSTs take an Idempotency-Key: every one that creates something. The list is the one
// place that says so; app.ts applies the middleware to it, describeIdempotency puts the header
// in the OpenAPI document, and test/worker/idempotency.test.ts fails when a POST of the document
// is in neither list below.

/** POSTs that create something: a retry must not make it twice (paths as the document has them). */
export const IDEMPOTENT_POSTS = [
  "/v1/api-keys",
  "/v1/runs",
  "/v1/runs/{id}/egress-agent-token",
  "/v1/vault/secrets",
  "/v1/vault/rules",
  "/v1/vault/hosts",
  "/v1/vault/hosts/starter-pack",
  "/v1/vault/hosts/from-blocked",
  "/v1/vault/models",
  "/v1/bundles",
  "/v1/webhooks",
  "/v1/webhooks/{id}/rotate-secret",
  "/v1/notifications",
  "/v1/bug-reports",
] as const;

/**
 * Top-level fields of a covered POST's answer that are kept out of the store, so a replay shows
 * everything but them (case L5): every credential an answer shows once. Stripe replays the whole
 * answer; here the store would then hold a recoverable copy of a live credential for a day
 * (sealed, but open to anyone with the database and the KEK) where otherwise only its hash
 * exists, or none, and a replay would show it a second time. The creation stays exactly-once;
 * a client that lost the first answer gets a new credential the way each field's description
 * says (revoke the key and make another, a new agent token, a rotation). The fields are marked
 * `shownOnce` (./withheld.ts) in the routes' schemas, and test/worker/idempotency-credentials.test.ts
 * fails when the document shows a credential in a covered answer that is not withheld here.
 */
export const WITHHELD_FROM_REPLAY: Partial<Record<(typeof IDEMPOTENT_POSTS)[number], readonly string[]>> = {
  "/v1/api-keys": ["key"],
  "/v1/runs": ["egressAgent"],
  "/v1/runs/{id}/egress-agent-token": ["token", "command"],
  "/v1/webhooks": ["secret"],
  "/v1/webhooks/{id}/rotate-secret": ["secret"],
  "/v1/notifications": ["secret"],
};

/** POSTs that create nothing, and why a retry of one is already safe. */
export const NOT_CREATING_POSTS: Record<string, string> = {
  "/v1/vault/dry-run": "reads the vault and answers; changes nothing",
  "/v1/runs/{id}/cancel": "a state change: cancelling twice is cancelling once",
  "/v1/runs/{id}/halt": "a state change: halting twice is halting once",
  "/v1/runs/{id}/resume": "a state change: resuming twice is resuming once",
  "/v1/runs/{id}/linger": "sets the run's linger window; the same body sets the same window",
};

/** A document path as a Hono route pattern: `{id}` → `:id`. */
export const honoPath = (path: string) => path.replaceAll(/\{([^}]+)\}/g, ":$1");

const problemContent = { "application/problem+json": { schema: Problem } };

/**
 * Puts the Idempotency-Key header and its refusals (400, 409) on the covered operations of the
 * document. Only the document: the middleware reads and checks the header itself, with the
 * same schema. Call once all routes are mounted.
 */
export function describeIdempotency(app: OpenAPIHono<AppEnv>): void {
  const covered = new Set<string>(IDEMPOTENT_POSTS);
  for (const def of app.openAPIRegistry.definitions) {
    if (def.type !== "route" || def.route.method !== "post" || !covered.has(def.route.path)) continue;
    const route = def.route;
    if (route.request?.headers) throw new Error(`${route.path} has headers of its own; merge them here`);
    route.request = {
      ...route.request,
      headers: z.object({ "idempotency-key": IdempotencyKey.optional() }),
    };
    route.responses = {
      400: { description: "Problem details", content: problemContent },
      409: { description: "Problem details", content: problemContent },
      ...route.responses,
    };
    const withheld = WITHHELD_FROM_REPLAY[route.path as (typeof IDEMPOTENT_POSTS)[number]] ?? [];
    for (const [status, res] of Object.entries(route.responses)) {
      if (!status.startsWith("2") || "$ref" in res) continue;
      if (res.headers) throw new Error(`${route.path} ${status} has headers of its own; merge them here`);
      route.responses[status] = { ...res, headers: replayHeaders(withheld) };
    }
  }
}

/** The headers a replay adds to the first answer (on the covered operations' successes). */
function replayHeaders(withheld: readonly string[]) {
  const string = { type: "string" } as const;
  return {
    "Idempotent-Replayed": {
      description: "`true` when this is the kept answer of an earlier request with the same Idempotency-Key",
      schema: { ...string, enum: ["true"] },
    },
    ...(withheld.length > 0
      ? {
          "Idempotent-Withheld": {
            description: `On a replay whose first answer showed a credential once: the fields left out (of ${withheld.map((f) => `\`${f}\``).join(", ")}), comma-separated. They are never stored`,
            schema: string,
          },
        }
      : {}),
  };
}
