import type { z } from "zod";
import { isCanonicalIp } from "./host-name";
import { hasLimits } from "./http-limits";
import type {
  EgressVia,
  HostAction,
  PolicyDocumentShape,
  PolicyRouting,
  RoutingMode,
  RoutingReason,
  RunEgress,
} from "./policy";

// The routing choice: which of a run's connections must come to the proxy (and so whether its
// work sandboxes are wired catch-all or by hosts file), whether a proxy is needed at all, and
// whether the egress tunnel is. It follows from the vault's entries and the run's egress alone.
// The compiler derives these fields with it, and the parsers (policy.ts's PolicyDocument,
// proxy-wire.ts's PolicyEnvelope) refuse a document whose fields say otherwise through
// followsFromEntries, so that the two cannot disagree (case E4: the proxy denies everything rather
// than guess).

/** Whether a policy sends any traffic through the user's machine (so needs the egress tunnel). */
export function usesTunnel(routing: PolicyRouting): boolean {
  return routing.reasons.some((r) => r === "local_egress" || r === "tunnel_host");
}

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
    hosts: readonly {
      pattern: string;
      action: HostAction;
      via?: EgressVia | undefined;
      methods?: readonly string[] | null | undefined;
      paths?: readonly string[] | null | undefined;
    }[];
    rules: readonly { host: string }[];
  },
  egress: RunEgress,
  model = false,
): DerivedFields {
  const wild = (p: string) => p.startsWith("*.");
  const blocks = entries.hosts.filter((h) => h.action === "block");
  const reasons: RoutingReason[] = [];
  if (entries.default === "block") reasons.push("block_default");
  if (blocks.some((h) => wild(h.pattern))) reasons.push("wildcard_block");
  if (entries.rules.some((r) => wild(r.host))) reasons.push("wildcard_rule");
  // A limited host must come to the proxy to be held to its limits (N3): an exact name by the
  // hosts file, a wildcard only by catch-all.
  const limited = entries.hosts.filter((h) => h.action === "allow" && hasLimits(h));
  if (limited.some((h) => wild(h.pattern))) reasons.push("wildcard_limit");
  // A connection to an IP literal never consults the hosts file, so only catch-all routing
  // brings it to the proxy: without it the block would not hold and the rule never apply.
  if (
    blocks.some((h) => isCanonicalIp(h.pattern)) ||
    limited.some((h) => isCanonicalIp(h.pattern)) ||
    entries.rules.some((r) => isCanonicalIp(r.host))
  ) {
    reasons.push("ip_literal");
  }
  // Traffic through the user's machine is catch-all, whether the whole run's or some hosts'.
  const tunnelHost = entries.hosts.some((h) => h.action === "allow" && h.via === "tunnel");
  if (egress === "local") reasons.push("local_egress");
  else if (tunnelHost) reasons.push("tunnel_host");
  const mode: RoutingMode = reasons.length > 0 ? "catch-all" : "default";
  // Under local egress the proxy is the way into the tunnel, and a declared model's lane lives in
  // the proxy: either makes it run even for an empty vault.
  const enforce =
    entries.rules.length > 0 ||
    blocks.length > 0 ||
    limited.length > 0 ||
    entries.default === "block" ||
    egress === "local" ||
    tunnelHost ||
    model;
  const hostsFile =
    mode === "default"
      ? [
          ...new Set([
            ...entries.rules.map((r) => r.host),
            ...blocks.map((h) => h.pattern),
            ...limited.map((h) => h.pattern),
          ]),
        ]
          .filter((h) => !wild(h) && !isCanonicalIp(h))
          .sort()
      : [];
  return { routing: { mode, reasons }, enforce, hostsFile };
}

/** Adds an issue for each derived field of `doc` that does not follow from its entries. */
export function followsFromEntries(
  doc: z.infer<typeof PolicyDocumentShape>,
  ctx: z.RefinementCtx,
  at: string[] = [],
) {
  const expected = deriveFields(doc, doc.egress, doc.model !== null);
  const same = (a: readonly string[], b: readonly string[]) =>
    a.length === b.length && a.every((x, i) => x === b[i]);
  if (!same(doc.routing.reasons, expected.routing.reasons) || doc.routing.mode !== expected.routing.mode) {
    ctx.addIssue({
      code: "custom",
      path: [...at, "routing"],
      message: `does not follow from the entries (expected ${expected.routing.mode})`,
    });
  }
  if (doc.enforce !== expected.enforce) {
    ctx.addIssue({
      code: "custom",
      path: [...at, "enforce"],
      message: `must be ${expected.enforce} for these entries`,
    });
  }
  if ((doc.note === null) !== doc.enforce) {
    ctx.addIssue({
      code: "custom",
      path: [...at, "note"],
      message: "a note is given exactly when enforce is false",
    });
  }
  if (!same(doc.hostsFile, expected.hostsFile)) {
    ctx.addIssue({ code: "custom", path: [...at, "hostsFile"], message: "does not follow from the entries" });
  }
}
