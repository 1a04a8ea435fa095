import { canonicalHost, isCanonicalIp } from "../contract/host-name";
import { hasLimits, type Limits } from "../contract/http-limits";
import type { PlaceholderPlace } from "../contract/placeholder";
import type {
  EgressVia,
  HostAction,
  InjectSpec,
  ModelLaneSpec,
  PolicyRule,
  RequestLimitFields,
  RunEgress,
} from "../contract/policy";
import { PolicyDocument } from "../contract/policy";
import { deriveFields } from "../contract/policy-routing";
import { addressKey } from "./addresses";
import { parseHostPattern, wildcardRemainders } from "./host";

// Vault → policy document, and the per-request lookups the proxy runs over a document. Pure.

export interface VaultSnapshot {
  version: number;
  default: HostAction;
  /** Canonical patterns, as parseHostPattern returned them; limits on allow entries only. */
  hosts: readonly ({
    pattern: string;
    action: HostAction;
    via?: EgressVia | null | undefined;
  } & Partial<RequestLimitFields>)[];
  /**
   * Canonical host patterns, in the user's order. placeholderEnv is resolved (the default name
   * filled in; null or absent: no placeholder).
   */
  rules: readonly ({
    host: string;
    secret: string;
    inject: InjectSpec;
    placeholderEnv?: string | null | undefined;
    placeholderIn?: readonly PlaceholderPlace[] | undefined;
  } & Partial<RequestLimitFields>)[];
}

export interface RunOptions {
  /** "local": the run egresses through the user's machine, which forces catch-all routing. */
  egress: RunEgress;
  /** The run's declared model, as the vault describes it (null or absent: none). */
  model?: ModelLaneSpec | null;
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
  const hosts = vault.hosts.map((h) => ({
    pattern: h.pattern,
    action: h.action,
    ...(h.via && h.action === "allow" ? { via: h.via } : {}),
    methods: h.methods ?? null,
    paths: h.paths ?? null,
  }));
  const model = run.model ?? null;
  const derived = deriveFields({ ...vault, hosts }, run.egress, model !== null);
  return PolicyDocument.parse({
    schema: 1,
    version: vault.version,
    default: vault.default,
    routing: derived.routing,
    enforce: derived.enforce,
    note: derived.enforce ? null : NOTHING_TO_DO,
    egress: run.egress,
    hosts,
    rules: vault.rules.map((r, index) => ({
      index,
      host: r.host,
      secret: r.secret,
      inject: r.inject,
      placeholderEnv: r.placeholderEnv ?? null,
      placeholderIn: r.placeholderIn ?? [],
      methods: r.methods ?? null,
      paths: r.paths ?? null,
    })),
    model,
    hostsFile: derived.hostsFile,
  });
}

/**
 * The first stored rule that today's pattern checks refuse, as `rule N (host): why`, or null. The
 * document schema checks the grammar only (a newer suffix list must not make stored documents
 * unreadable), so the control plane asks this before it compiles a vault for a run: a wildcard
 * rule over a domain the suffix list has learnt entries under since it was saved (case I8) then
 * yields no document, and no proxy ever holds it. Only wildcards: the suffix checks are theirs.
 */
export function refusedRule(rules: VaultSnapshot["rules"]): string | null {
  for (const [i, rule] of rules.entries()) {
    if (!rule.host.startsWith("*.")) continue;
    const checked = parseHostPattern(rule.host, "rule");
    if (!checked.ok) return `rule ${i + 1} (${rule.host}): ${checked.message}`;
  }
  return null;
}

export interface HostDecision {
  action: HostAction;
  /** The entry that decided, or null when the default (or an invalid host) did. */
  pattern: string | null;
  /** How an allowed host leaves: the deciding entry's `via`, else the run's egress. */
  via: EgressVia;
  /** The deciding entry's method and path limits (case N3); absent when it has none. */
  limits?: Limits;
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
  /**
   * decideHost, then (unless blocked) matchRule, with one canonicalisation and one walk of the
   * host's labels: what the proxy asks per request.
   */
  decide(host: string): { host: HostDecision; rule: RuleMatch | null };
  /**
   * The block entry naming this address (a resolved answer, in any spelling), or null: an IP
   * literal blocked is blocked under every name that resolves to it (case I5).
   */
  blockedAddress(address: string): string | null;
}

export interface HostPolicy {
  default: HostAction;
  egress: RunEgress;
  hosts: readonly ({ pattern: string; action: HostAction; via?: EgressVia | undefined } & Partial<Limits>)[];
}

/**
 * Host policy alone (no rules): what the proxy decides per host, and what the local egress agent
 * enforces on its side with the same code. O(labels of the host), independent of the number of
 * entries: maps keyed by exact host and by wildcard remainder (`*.example.com` → `example.com`).
 */
export function buildHostDecider(policy: HostPolicy): (host: string) => HostDecision {
  const { exactHosts, wildHosts, fallback, invalid } = hostEntries(policy);
  return (input) => {
    const host = canonicalHost(input);
    if (host === null) return invalid;
    const exact = exactHosts.get(exactKey(host));
    if (exact) return exact;
    // Longest remainder first: the most specific wildcard wins.
    for (const rest of wildcardRemainders(host)) {
      const hit = wildHosts.get(rest);
      if (hit) return hit;
    }
    return fallback;
  };
}

/** Host entries by exact host (address key for IP literals) and by wildcard remainder. */
function hostEntries(policy: HostPolicy) {
  const runVia: EgressVia = policy.egress === "local" ? "tunnel" : "direct";
  const exactHosts = new Map<string, HostDecision>();
  const wildHosts = new Map<string, HostDecision>();
  for (const entry of policy.hosts) {
    const { pattern, action, via } = entry;
    const wild = pattern.startsWith("*.");
    const map = wild ? wildHosts : exactHosts;
    const key = wild ? pattern.slice(2) : exactKey(pattern);
    // Two entries for one pattern should not exist; if they do, block wins (fail closed).
    if (map.get(key)?.action === "block") continue;
    const limits = hasLimits(entry)
      ? { limits: { methods: entry.methods ?? null, paths: entry.paths ?? null } }
      : {};
    map.set(key, Object.freeze({ action, pattern, via: via ?? runVia, ...limits }));
  }
  const fallback: HostDecision = Object.freeze({ action: policy.default, pattern: null, via: runVia });
  const invalid: HostDecision = Object.freeze({ action: "block", pattern: null, via: runVia });
  return { exactHosts, wildHosts, fallback, invalid };
}

/** An IP literal's address key (NAT64, 6to4, mapped spellings are its IPv4), a name itself. */
function exactKey(host: string): string {
  return isCanonicalIp(host) ? (addressKey(host) ?? host) : host;
}

/**
 * The block entries that are IP literals, by address (case I5): the proxy and the egress agent
 * ask it of every resolved answer, so a name that resolves to a blocked address is blocked too.
 * Returns the deciding pattern, or null.
 */
export function buildAddressBlocker(
  hosts: readonly { pattern: string; action: HostAction }[],
): (address: string) => string | null {
  const blocked = new Map<string, string>();
  for (const { pattern, action } of hosts) {
    if (action !== "block" || !isCanonicalIp(pattern)) continue;
    const key = addressKey(pattern);
    if (key !== null && !blocked.has(key)) blocked.set(key, pattern);
  }
  return (address) => {
    if (blocked.size === 0) return null;
    const key = addressKey(address);
    return key === null ? null : (blocked.get(key) ?? null);
  };
}

/** Indexes a document for the per-request lookups: host policy, then the first matching rule. */
export function buildPolicyIndex(doc: PolicyDocument): PolicyIndex {
  const decideHost = buildHostDecider(doc);
  const exactRules = new Map<string, number>();
  const wildRules = new Map<string, number>();
  for (const rule of doc.rules) {
    const wild = rule.host.startsWith("*.");
    const map = wild ? wildRules : exactRules;
    const key = wild ? rule.host.slice(2) : rule.host;
    if (!map.has(key)) map.set(key, rule.index);
  }
  const ruleAt = (best: number): RuleMatch | null => {
    const rule = Number.isFinite(best) ? doc.rules[best] : undefined;
    return rule ? { index: best, rule } : null;
  };
  const ruleFor = (host: string): RuleMatch | null => {
    let best = exactRules.get(host) ?? Number.POSITIVE_INFINITY;
    for (const rest of wildcardRemainders(host)) {
      const index = wildRules.get(rest);
      if (index !== undefined && index < best) best = index;
    }
    return ruleAt(best);
  };
  // decide(): the host entries and the rules in one map per kind of key (an exact name; a
  // wildcard's remainder), so a name costs one lookup per label, not two. IP literals, whose
  // host entries are keyed by address, take decideHost and ruleFor.
  const { exactHosts, wildHosts, fallback, invalid } = hostEntries(doc);
  type Keyed = { host: HostDecision | null; rule: number };
  const exactKeyed = new Map<string, Keyed>();
  const wildKeyed = new Map<string, Keyed>();
  const keyed = (map: Map<string, Keyed>, key: string): Keyed => {
    const known = map.get(key);
    if (known) return known;
    const fresh: Keyed = { host: null, rule: Number.POSITIVE_INFINITY };
    map.set(key, fresh);
    return fresh;
  };
  for (const [key, decision] of exactHosts) {
    // An address key (`127.0.0.1`, `2001:db8::1`) never equals a name.
    if (!isCanonicalIp(key) && !key.includes(":")) keyed(exactKeyed, key).host = decision;
  }
  for (const [key, decision] of wildHosts) keyed(wildKeyed, key).host = decision;
  for (const [key, index] of exactRules) keyed(exactKeyed, key).rule = index;
  for (const [key, index] of wildRules) keyed(wildKeyed, key).rule = index;
  return {
    decideHost,
    blockedAddress: buildAddressBlocker(doc.hosts),
    matchRule(input) {
      const host = canonicalHost(input);
      return host === null ? null : ruleFor(host);
    },
    decide(input) {
      const host = canonicalHost(input);
      if (host === null) return { host: invalid, rule: null };
      if (isCanonicalIp(host)) {
        const decision = decideHost(host);
        return { host: decision, rule: decision.action === "block" ? null : ruleFor(host) };
      }
      const exact = exactKeyed.get(host);
      let decision = exact?.host ?? null;
      let best = exact?.rule ?? Number.POSITIVE_INFINITY;
      // Longest remainder first: the most specific wildcard entry wins; the rule is the first in
      // the user's order among every match.
      for (let dot = host.indexOf("."); dot !== -1; dot = host.indexOf(".", dot + 1)) {
        const hit = wildKeyed.get(host.slice(dot + 1));
        if (hit === undefined) continue;
        decision ??= hit.host;
        if (hit.rule < best) best = hit.rule;
      }
      decision ??= fallback;
      return { host: decision, rule: decision.action === "block" ? null : ruleAt(best) };
    },
  };
}
