import { z } from "zod";
import { isCanonicalHostName, isCanonicalPattern } from "./host-name";
import { hasLimits } from "./http-limits";
import { MODEL_PROVIDERS } from "./model-lane";
import { EnvName, PlaceholderPlace } from "./placeholder";
import { followsFromEntries } from "./policy-routing";
import { ROUTING_MODES } from "./routing";

// The policy wire contract: what the control plane compiles from a vault and the run's proxy
// enforces. Imported by both sides, so they cannot drift. Objects are strict (an unknown field is
// an error, case C3/E4). Which routing the entries call for is policy-routing.ts, and
// PolicyDocument below also refuses a document whose derived fields disagree with its entries:
// the proxy denies everything rather than guess (E4). Secret values are not part of it; they travel on another
// channel.

export const HostAction = z.enum(["allow", "block"]);
export type HostAction = z.infer<typeof HostAction>;

export const InjectScheme = z.enum(["bearer", "basic", "raw", "query"]);
export type InjectScheme = z.infer<typeof InjectScheme>;

// RFC 7230 token (tchar). Stored lowercase: header names are case-insensitive and the proxy
// must replace any same-named header the agent sent.
const TOKEN = /^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$/;
// Headers that frame the message or belong to the hop: a credential written into one of them
// could split or smuggle requests, so no rule may target them.
const RESERVED_HEADERS = new Set([
  "host",
  "content-length",
  "transfer-encoding",
  "connection",
  "keep-alive",
  "proxy-connection",
  "te",
  "trailer",
  "upgrade",
]);

export const HeaderName = z
  .string()
  .min(1)
  .max(128)
  .regex(TOKEN, "a header name is an RFC 7230 token: letters, digits and !#$%&'*+-.^_`|~")
  .toLowerCase()
  .refine(
    (name) => !RESERVED_HEADERS.has(name),
    "this header frames the request and cannot carry a credential",
  );

// Printable ASCII without space and without the query delimiters & = #.
export const QueryParamName = z
  .string()
  .min(1)
  .max(128)
  .regex(
    /^[\x21\x22\x24\x25\x27-\x3c\x3e-\x7e]+$/,
    "a query parameter name is printable ASCII without space & = #",
  );

/** How a rule's secret is put into the request. bearer/basic default to the authorization header. */
export const InjectSpec = z.discriminatedUnion("scheme", [
  z
    .object({ scheme: InjectScheme.extract(["bearer", "basic"]), name: HeaderName.default("authorization") })
    .strict(),
  z.object({ scheme: InjectScheme.extract(["raw"]), name: HeaderName }).strict(),
  z.object({ scheme: InjectScheme.extract(["query"]), name: QueryParamName }).strict(),
]);
export type InjectSpec = z.infer<typeof InjectSpec>;

export const RoutingReason = z.enum([
  "block_default",
  "wildcard_block",
  "wildcard_rule",
  "ip_literal",
  "local_egress",
  "tunnel_host",
  "wildcard_limit",
]);
export type RoutingReason = z.infer<typeof RoutingReason>;

/** How a run's work sandboxes reach the proxy: the one name for it. */
export const RoutingMode = z.enum(ROUTING_MODES);
export type RoutingMode = z.infer<typeof RoutingMode>;

/** A canonical host pattern (grammar only; the public-suffix check happens when it is saved). */
export const HostPattern = z.string().refine(isCanonicalPattern, "not a canonical host pattern");

/**
 * How an allowed host's traffic leaves the proxy: straight out, or through the tunnel to the
 * user's own machine (the local egress agent). Unset: the run's egress decides (local → tunnel).
 */
export const EgressVia = z.enum(["direct", "tunnel"]);
export type EgressVia = z.infer<typeof EgressVia>;

/**
 * An HTTP method a limit lets through: an RFC 9110 token, stored uppercase (methods are
 * case-sensitive on the wire, and every method a client library sends is uppercase).
 */
export const HttpMethod = z
  .string()
  .min(1)
  .max(32)
  .regex(TOKEN, "a method is an RFC 9110 token (GET, HEAD, POST...)")
  .toUpperCase();

/**
 * A path a limit lets through, compared with the request's normalised path (http-limits.ts):
 * starts with "/"; without "*" it is a prefix on a segment boundary ("/repos" lets /repos and
 * /repos/x through, not /reposx; "/repos/" only what is under it); with "*" it is a glob over the
 * whole path, "*" within one segment and "**" across segments. Printable ASCII without space,
 * "?", "#", "%", "\\" or ";", and no "." or ".." segment: a limit names normalised paths only.
 */
export const PathLimit = z
  .string()
  .min(1)
  .max(256)
  .regex(/^\/[\x21-\x7e]*$/, "a path limit starts with / and is printable ASCII without space")
  .refine((p) => !/[?#%\\;]/.test(p), "a path limit has no ? # % \\ or ;")
  .refine(
    (p) => !p.split("/").some((seg) => seg === "." || seg === ".."),
    "a path limit has no . or .. segment",
  )
  .refine((p) => !p.includes("//"), "a path limit has no empty segment (//)");

/**
 * Method and path limits of a host entry or a rule: unset (or null) lets everything through.
 * A request must pass both; outside them the proxy answers 403 naming the limit (case N3).
 */
export const RequestLimits = {
  methods: z.array(HttpMethod).min(1).max(16).nullable().default(null),
  paths: z.array(PathLimit).min(1).max(64).nullable().default(null),
};
export type RequestLimitFields = { methods: string[] | null; paths: string[] | null };

export const PolicyHostEntry = z
  .object({ pattern: HostPattern, action: HostAction, via: EgressVia.optional(), ...RequestLimits })
  .strict()
  .refine((h) => h.via === undefined || h.action === "allow", {
    message: "only an allowed host has a route",
    path: ["via"],
  })
  .refine((h) => h.action === "allow" || !hasLimits(h), {
    message: "only an allowed host has method or path limits",
    path: ["methods"],
  });
export type PolicyHostEntry = z.infer<typeof PolicyHostEntry>;

/** The run's egress: "local" sends every allowed host through the user's machine by default. */
export const RunEgress = z.enum(["direct", "local"]);
export type RunEgress = z.infer<typeof RunEgress>;

/**
 * The providers the model lane can call, a closed set. Each has one wire format and one way to
 * authenticate (the proxy's table in proxy-image/src/proxy/model/providers.ts):
 * - openai: OpenAI's API (Bearer key), base https://api.openai.com/v1 unless given;
 * - openai-compatible: any API speaking OpenAI's format with a Bearer key (OpenRouter, vLLM...),
 *   its base URL required;
 * - anthropic: Anthropic's Messages API (x-api-key, anthropic-version), base
 *   https://api.anthropic.com/v1 unless given.
 */
export const ModelProvider = z.enum(MODEL_PROVIDERS);
export type ModelProvider = z.infer<typeof ModelProvider>;

const BudgetCount = z
  .number()
  .int()
  .min(0)
  .max(2 ** 40);

/**
 * What a run may spend through the model lane (beyond every anchor's boundary): at most this
 * many calls, input tokens and output tokens (each optional; null is no limit). Past any of them
 * the lane refuses the call in the caller's format. Tokens are the provider's own counts.
 */
export const ModelBudget = z
  .object({
    calls: BudgetCount.nullable().default(null),
    inputTokens: BudgetCount.nullable().default(null),
    outputTokens: BudgetCount.nullable().default(null),
  })
  .strict();
export type ModelBudget = z.infer<typeof ModelBudget>;

/**
 * The run's declared model, served by the proxy's model lane (outside host policy by design: it
 * is what the user asked to evaluate). The work sandbox sees only placeholder base URLs and keys
 * (OpenAI's and Anthropic's); the proxy calls `baseUrl` in the provider's format with the
 * secret's value, translating between OpenAI's and Anthropic's formats where they differ.
 */
export const ModelLaneSpec = z
  .object({
    /** The name the run declares and the sandbox sends as `model`. */
    name: z.string().min(1).max(128),
    provider: ModelProvider,
    /** The provider's API base, https only (e.g. https://api.openai.com/v1). */
    baseUrl: z.url({ protocol: /^https$/, error: "must be an https URL" }).max(2048),
    /** The `model` sent upstream (often the same as name). */
    upstreamModel: z.string().min(1).max(128),
    /** The vault secret the lane authenticates with; its value travels with the secrets. */
    secret: z.string().min(1),
    /** The run's budget (modelBudget), or null for none. */
    budget: ModelBudget.nullable().default(null),
  })
  .strict();
export type ModelLaneSpec = z.infer<typeof ModelLaneSpec>;

export const PolicyRule = z
  .object({
    /** 0-based position in the user's order; the first matching rule wins. */
    index: z.number().int().min(0),
    host: HostPattern,
    /** The secret's name; its value is not in the document. */
    secret: z.string().min(1),
    inject: InjectSpec,
    /**
     * The environment variable the work and task sandboxes get the secret's placeholder in
     * (placeholder.ts), or null for none (case N1). The compiler fills in the default.
     */
    placeholderEnv: EnvName.nullable().default(null),
    /** Where beyond headers and the query the proxy swaps the placeholder: ["body"] opts in (N2). */
    placeholderIn: z.array(PlaceholderPlace).max(1).default([]),
    ...RequestLimits,
  })
  .strict();
export type PolicyRule = z.infer<typeof PolicyRule>;

export const PolicyRouting = z.object({ mode: RoutingMode, reasons: z.array(RoutingReason) }).strict();
export type PolicyRouting = z.infer<typeof PolicyRouting>;

/**
 * A policy document's shape: its fields, strict, with each rule at its own index. That the
 * derived fields (routing, enforce, note, hostsFile) follow from the entries is checked by
 * PolicyDocument below, which is what every parse site uses.
 */
export const PolicyDocumentShape = z
  .object({
    schema: z.literal(1),
    version: z.number().int().min(0),
    default: HostAction,
    routing: PolicyRouting,
    /** False only when the vault gives a proxy nothing to do; the run then goes without one. */
    enforce: z.boolean(),
    note: z.string().nullable(),
    /** The run's egress option, which decides the route of a host entry without its own `via`. */
    egress: RunEgress.default("direct"),
    hosts: z.array(PolicyHostEntry),
    rules: z.array(PolicyRule),
    /** The run's declared model (the model lane), or null. */
    model: ModelLaneSpec.nullable().default(null),
    /** Hosts the work sandbox's hosts file points at the proxy (default mode only). */
    hostsFile: z.array(z.string().refine(isCanonicalHostName, "not a canonical exact host name")),
  })
  .strict()
  .superRefine((doc, ctx) => {
    doc.rules.forEach((rule, i) => {
      if (rule.index !== i) {
        ctx.addIssue({ code: "custom", path: ["rules", i, "index"], message: `must be ${i}, its position` });
      }
    });
  });

/** A policy document, checked whole: its shape, and derived fields that follow from its entries. */
export const PolicyDocument = PolicyDocumentShape.superRefine((doc, ctx) => followsFromEntries(doc, ctx));
export type PolicyDocument = z.infer<typeof PolicyDocument>;
