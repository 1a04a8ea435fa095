import { z } from "zod";
import { isCanonicalHostName, isCanonicalIp, isCanonicalPattern } from "../policy/host";

// The policy wire contract: what the control plane compiles from a vault and the run's proxy
// enforces. Imported by both sides, so they cannot drift. Objects are strict (an unknown field is
// an error, case C3/E4), and a document whose derived fields (routing, enforce, hostsFile)
// disagree with its entries is refused too: the proxy denies everything rather than guess (E4).
// Secret values are not part of it; they travel on another channel.

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
]);
export type RoutingReason = z.infer<typeof RoutingReason>;

export const RoutingMode = z.enum(["default", "catch-all"]);
export type RoutingMode = z.infer<typeof RoutingMode>;

/** A canonical host pattern (grammar only; the public-suffix check happens when it is saved). */
export const HostPattern = z.string().refine(isCanonicalPattern, "not a canonical host pattern");

export const PolicyHostEntry = z.object({ pattern: HostPattern, action: HostAction }).strict();
export type PolicyHostEntry = z.infer<typeof PolicyHostEntry>;

export const PolicyRule = z
  .object({
    /** 0-based position in the user's order; the first matching rule wins. */
    index: z.number().int().min(0),
    host: HostPattern,
    /** The secret's name; its value is not in the document. */
    secret: z.string().min(1),
    inject: InjectSpec,
  })
  .strict();
export type PolicyRule = z.infer<typeof PolicyRule>;

export const PolicyRouting = z.object({ mode: RoutingMode, reasons: z.array(RoutingReason) }).strict();
export type PolicyRouting = z.infer<typeof PolicyRouting>;

export const PolicyDocument = z
  .object({
    schema: z.literal(1),
    version: z.number().int().min(0),
    default: HostAction,
    routing: PolicyRouting,
    /** False only when the vault gives a proxy nothing to do; the run then goes without one. */
    enforce: z.boolean(),
    note: z.string().nullable(),
    hosts: z.array(PolicyHostEntry),
    rules: z.array(PolicyRule),
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
    const expected = deriveFields(doc, doc.routing.reasons.includes("local_egress") ? "local" : "direct");
    const same = (a: readonly string[], b: readonly string[]) =>
      a.length === b.length && a.every((x, i) => x === b[i]);
    if (!same(doc.routing.reasons, expected.routing.reasons) || doc.routing.mode !== expected.routing.mode) {
      ctx.addIssue({
        code: "custom",
        path: ["routing"],
        message: `does not follow from the entries (expected ${expected.routing.mode})`,
      });
    }
    if (doc.enforce !== expected.enforce) {
      ctx.addIssue({
        code: "custom",
        path: ["enforce"],
        message: `must be ${expected.enforce} for these entries`,
      });
    }
    if ((doc.note === null) !== doc.enforce) {
      ctx.addIssue({
        code: "custom",
        path: ["note"],
        message: "a note is given exactly when enforce is false",
      });
    }
    if (!same(doc.hostsFile, expected.hostsFile)) {
      ctx.addIssue({ code: "custom", path: ["hostsFile"], message: "does not follow from the entries" });
    }
  });
export type PolicyDocument = z.infer<typeof PolicyDocument>;

export interface DerivedFields {
  routing: PolicyRouting;
  enforce: boolean;
  hostsFile: string[];
}

/**
 * The fields of a policy document that follow from its entries (canonical patterns) and the
 * run's egress. Shared by the compiler and the schema check so that the two cannot disagree.
 */
export function deriveFields(
  entries: {
    default: HostAction;
    hosts: readonly { pattern: string; action: HostAction }[];
    rules: readonly { host: string }[];
  },
  egress: "direct" | "local",
): DerivedFields {
  const wild = (p: string) => p.startsWith("*.");
  const blocks = entries.hosts.filter((h) => h.action === "block");
  const reasons: RoutingReason[] = [];
  if (entries.default === "block") reasons.push("block_default");
  if (blocks.some((h) => wild(h.pattern))) reasons.push("wildcard_block");
  if (entries.rules.some((r) => wild(r.host))) reasons.push("wildcard_rule");
  // A connection to an IP literal never consults the hosts file, so only catch-all routing
  // brings it to the proxy: without it the block would not hold and the rule never apply.
  if (blocks.some((h) => isCanonicalIp(h.pattern)) || entries.rules.some((r) => isCanonicalIp(r.host))) {
    reasons.push("ip_literal");
  }
  if (egress === "local") reasons.push("local_egress");
  const mode: RoutingMode = reasons.length > 0 ? "catch-all" : "default";
  // Under local egress the proxy is the way into the tunnel, so it runs even for an empty vault.
  const enforce =
    entries.rules.length > 0 || blocks.length > 0 || entries.default === "block" || egress === "local";
  const hostsFile =
    mode === "default"
      ? [...new Set([...entries.rules.map((r) => r.host), ...blocks.map((h) => h.pattern)])]
          .filter((h) => !wild(h) && !isCanonicalIp(h))
          .sort()
      : [];
  return { routing: { mode, reasons }, enforce, hostsFile };
}
