// The routing modes, as a plain list: the one spelling of them. contract/policy.ts makes its zod
// enum (RoutingMode) of it, and the database schema its column enums, without loading zod there
// (a zod schema made before @hono/zod-openapi is loaded has no .openapi).

/** default: only the hosts file's names go to the proxy; catch-all: every connection does. */
export const ROUTING_MODES = ["default", "catch-all"] as const;
