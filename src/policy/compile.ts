import {
  deriveFields,
  type HostAction,
  type InjectSpec,
  PolicyDocument,
  type PolicyRule,
} from "../contract/policy";
import { canonicalHost, wildcardRemainders } from "./host";

// Vault → policy document, and the per-request lookups the proxy runs over a document. Pure.

export interface VaultSnapshot {
  version: number;
  default: HostAction;
  /** Canonical patterns, as parseHostPattern returned them. */
  hosts: readonly { pattern: string; action: HostAction }[];
  /** Canonical host patterns, in the user's order. */
  rules: readonly { host: string; secret: string; inject: InjectSpec }[];
}

export interface RunOptions {
  /** "local": the run egresses through the user's machine, which forces catch-all routing. */
  egress: "direct" | "local";
}

const NOTHING_TO_DO =
  "This run goes without a proxy: the vault has no rules and no blocked hosts, and its default " +
  "allows every host, so a proxy would have nothing to do.";

/**
 * Compiles a vault snapshot into the document the run's proxy enforces. The result is checked
 * against the schema, so a malformed snapshot (e.g. a non-canonical pattern) throws rather than
 * yield a document the proxy would refuse.
 */
export function compilePolicy(vault: VaultSnapshot, run: RunOptions = { egress: "direct" }): PolicyDocument {
  const derived = deriveFields(vault, run.egress);
  return PolicyDocument.parse({
    schema: 1,
    version: vault.version,
    default: vault.default,
    routing: derived.routing,
    enforce: derived.enforce,
    note: derived.enforce ? null : NOTHING_TO_DO,
    hosts: vault.hosts.map((h) => ({ pattern: h.pattern, action: h.action })),
    rules: vault.rules.map((r, index) => ({ index, host: r.host, secret: r.secret, inject: r.inject })),
    hostsFile: derived.hostsFile,
  });
}

export interface HostDecision {
  action: HostAction;
  /** The entry that decided, or null when the default (or an invalid host) did. */
  pattern: string | null;
}

export interface RuleMatch {
  index: number;
  rule: PolicyRule;
}

export interface PolicyIndex {
  /**
   * Host policy for a host in any spelling (it is canonicalised; a port is ignored). An exact
   * entry wins, else the most specific matching wildcard, else the default. A host that is not a
   * valid host is blocked, whatever the default.
   */
  decideHost(host: string): HostDecision;
  /** The first rule, in the user's order, whose pattern matches the host; null if none. */
  matchRule(host: string): RuleMatch | null;
}

/**
 * Indexes a document for lookups in O(labels of the host), independent of the number of entries:
 * maps keyed by exact host and by wildcard remainder (`*.example.com` → `example.com`).
 */
export function buildPolicyIndex(doc: PolicyDocument): PolicyIndex {
  const exactHosts = new Map<string, HostDecision>();
  const wildHosts = new Map<string, HostDecision>();
  for (const { pattern, action } of doc.hosts) {
    const wild = pattern.startsWith("*.");
    const map = wild ? wildHosts : exactHosts;
    const key = wild ? pattern.slice(2) : pattern;
    // Two entries for one pattern should not exist; if they do, block wins (fail closed).
    if (map.get(key)?.action === "block") continue;
    map.set(key, Object.freeze({ action, pattern }));
  }
  const exactRules = new Map<string, number>();
  const wildRules = new Map<string, number>();
  for (const rule of doc.rules) {
    const wild = rule.host.startsWith("*.");
    const map = wild ? wildRules : exactRules;
    const key = wild ? rule.host.slice(2) : rule.host;
    if (!map.has(key)) map.set(key, rule.index);
  }
  const fallback: HostDecision = Object.freeze({ action: doc.default, pattern: null });
  const invalid: HostDecision = Object.freeze({ action: "block", pattern: null });

  return {
    decideHost(input) {
      const host = canonicalHost(input);
      if (host === null) return invalid;
      const exact = exactHosts.get(host);
      if (exact) return exact;
      // Longest remainder first: the most specific wildcard wins.
      for (const rest of wildcardRemainders(host)) {
        const hit = wildHosts.get(rest);
        if (hit) return hit;
      }
      return fallback;
    },
    matchRule(input) {
      const host = canonicalHost(input);
      if (host === null) return null;
      let best = exactRules.get(host) ?? Number.POSITIVE_INFINITY;
      for (const rest of wildcardRemainders(host)) {
        const index = wildRules.get(rest);
        if (index !== undefined && index < best) best = index;
      }
      const rule = Number.isFinite(best) ? doc.rules[best] : undefined;
      return rule ? { index: best, rule } : null;
    },
  };
}
