import {
  hasLimits,
  type Limits,
  limitVerdict,
  normalisePath,
} from "@benchwright/shared/contract/http-limits";
import type { EgressVia, ModelLaneSpec } from "@benchwright/shared/contract/policy";
import { MODEL_LANE_HOST, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import type { RuleMatch } from "@benchwright/shared/policy/compile";
import { COMPUTE_PATH_PREFIX } from "../compute-lane";
import type { Dialed } from "../original-dst";
import type { PolicyState } from "../policy-client";
import type { AddressBlocker, Upstream } from "../upstream";
import { type Injection, inject } from "./inject";
import { type PlaceholderSwap, placeholderSwap } from "./placeholders";
import {
  blockedBody,
  blockedRefusal,
  connectRefusal,
  type LimitOwner,
  limitRefusal,
  probeRefusal,
  Refusal,
  spoolFull,
  tunnelDownBody,
} from "./refusal";
import { explicitPortRefusal, type Target, type TargetConn } from "./target";

// The decision for one target, as a plain value: which lane answers it, or the host policy's
// verdict, the first matching rule and its injection, and the route out. decide() does no I/O;
// only destination() below resolves the name and checks the address it will dial (A12, A13).
// Smokescreen and tokenizer read this way: what was asked (target.ts), what is decided (here),
// then how the bytes move (forward.ts). Every way in is decided here: a request, an HTTP/2
// stream or an Upgrade handshake by decideRequest(), a ClientHello by spliceable() or
// decideDialed(), a CONNECT by decideConnect(), each through decide()'s own steps.

export interface DecideContext {
  policy: PolicyState;
  /** The audit can take rows (E3): false refuses new egress. */
  accepting: boolean;
  /** The egress tunnel is paired with the user's agent now. */
  tunnelUp: boolean;
  /** Which of the proxy's own lanes are served. */
  lanes: { compute: boolean; model: boolean };
  /** The run's placeholder nonce; unset: no placeholder is swapped or counted (N2). */
  placeholderNonce?: string | undefined;
}

export interface RuleDecision {
  index: number;
  /** The header and path to send; holds the secret, so it is never logged. */
  injection: Injection;
  secret: string;
}

export type Decision =
  | { kind: "refuse"; refusal: Refusal; rule: number | null }
  /** The platform's compute lane (compute-lane.ts). */
  | { kind: "compute" }
  /** The declared model's lane (model/lane.ts); null when the run declares no model. */
  | { kind: "model"; lane: { spec: ModelLaneSpec; secret: string } | null }
  /**
   * Forward upstream: `target` is what goes upstream (a rule's host is always https). `dialed`:
   * the address the sandbox itself dialled (a DNAT'd direct connection, I4), where it goes
   * instead of the name's resolved address; only ever set with no rule and a direct route.
   */
  | {
      kind: "forward";
      target: Target;
      via: EgressVia;
      rule: RuleDecision | null;
      /** The policy's IP-literal block entries, asked of every resolved answer (case I5). */
      blockedAddress: AddressBlocker;
      /** The host entry's and the rule's method and path limits, each request held to all (N3). */
      limits: HeldTo[];
      dialed?: Dialed;
      /** The rule's placeholder to swap, and the run's to count as strays (N2). */
      placeholders: PlaceholderSwap | null;
    };

/** Limits a forwarded request is held to, and whose they are. */
export interface HeldTo {
  limits: Limits;
  owner: LimitOwner;
}

const refuse = (refusal: Refusal, rule: number | null = null): Extract<Decision, { kind: "refuse" }> => ({
  kind: "refuse",
  refusal,
  rule,
});

export function decide(target: Target, ctx: DecideContext): Decision {
  // The platform's own probe (wiring step): answered here, before policy, never audited and
  // never forwarded. It proves the redirect and the CA trust, not anything about the policy.
  if (target.host === WIRING_PROBE_HOST) {
    // The compute lane shares the platform's host: only over TLS to this proxy, only its path.
    if (ctx.lanes.compute && target.scheme === "https" && target.path.startsWith(COMPUTE_PATH_PREFIX))
      return { kind: "compute" };
    return refuse(probeRefusal());
  }
  // The declared model's lane: outside host policy by design (the model is what the user
  // asked to evaluate), but never without an audit trail: a full spool refuses it too.
  if (target.host === MODEL_LANE_HOST && ctx.lanes.model) {
    if (!ctx.accepting) return refuse(spoolFull());
    const state = ctx.policy;
    const spec = state.kind === "ready" ? state.policy.model : null;
    const secret = spec && state.kind === "ready" ? state.secrets[spec.secret] : undefined;
    if (spec && secret === undefined)
      return refuse(new Refusal(503, "refuse", "model secret missing", "Policy incomplete.\n"));
    return { kind: "model", lane: spec && secret !== undefined ? { spec, secret } : null };
  }

  const verdict = hostVerdict(target.host, ctx.policy);
  if (verdict.kind === "no policy") {
    return refuse(
      new Refusal(
        403,
        "refuse",
        `no valid policy (${verdict.state})`,
        blockedBody(target.host, "no valid policy is loaded"),
      ),
    );
  }
  if (verdict.kind === "block") return refuse(blockedRefusal(target.host));
  if (!ctx.accepting) return refuse(spoolFull());
  const { state, via, match } = verdict;
  const limits: HeldTo[] = [];
  if (verdict.limits && verdict.pattern !== null)
    limits.push({ limits: verdict.limits, owner: { kind: "host", pattern: verdict.pattern } });
  if (match && hasLimits(match.rule))
    limits.push({ limits: match.rule, owner: { kind: "rule", index: match.index, host: match.rule.host } });

  let rule: RuleDecision | null = null;
  if (match) {
    const secret = state.secrets[match.rule.secret];
    if (secret === undefined)
      return refuse(new Refusal(503, "refuse", "rule secret missing", "Policy incomplete.\n"));
    // B3: a credential only travels over verified TLS; a plain-http request is upgraded.
    if (target.scheme === "http") target = { ...target, scheme: "https", port: 443 };
    rule = { index: match.index, injection: inject(match.rule.inject, secret, target.path), secret };
  }

  // Through the user's machine, or straight out. A tunnelled host is never sent direct: with
  // the agent away it is refused, and the agent resolves and checks the address itself.
  if (via === "tunnel" && !ctx.tunnelUp) {
    return refuse(
      new Refusal(503, "refuse", "egress tunnel down", tunnelDownBody(target.host), {}, { route: "refused" }),
      rule?.index ?? null,
    );
  }
  const placeholders = placeholderSwap(
    state.policy,
    match?.rule ?? null,
    rule?.secret ?? null,
    ctx.placeholderNonce,
  );
  return {
    kind: "forward",
    target,
    via,
    rule,
    blockedAddress: state.index.blockedAddress,
    limits,
    placeholders,
  };
}

type HostVerdict =
  | { kind: "no policy"; state: Exclude<PolicyState, { kind: "ready" }>["kind"] }
  | { kind: "block" }
  | {
      kind: "allow";
      state: Extract<PolicyState, { kind: "ready" }>;
      via: EgressVia;
      match: RuleMatch | null;
      /** The deciding entry (null: the default) and its limits, if any. */
      pattern: string | null;
      limits: Limits | undefined;
    };

/**
 * The host policy's verdict on a host, the step every decision takes (a request's here, a
 * CONNECT's in decideConnect): with no valid policy, never any egress (E4); else the host's entry
 * or the default decides, and an allowed host comes with how it leaves and its first rule.
 */
function hostVerdict(host: string, policy: PolicyState): HostVerdict {
  if (policy.kind !== "ready") return { kind: "no policy", state: policy.kind };
  const { host: decision, rule: match } = policy.index.decide(host);
  if (decision.action === "block") return { kind: "block" };
  return {
    kind: "allow",
    state: policy,
    via: decision.via,
    match,
    pattern: decision.pattern,
    limits: decision.limits,
  };
}

/** A CONNECT's decision: refused, or the tunnel opened (its TLS then read as any, tls-in.ts). */
export type ConnectDecision = ReturnType<typeof refuse> | { kind: "open"; host: string; port: 443 };

/**
 * A CONNECT on the explicit port, decided on its target alone, before any TLS: a `host:port`, to
 * port 443 only (A17, as the redirects), then the host policy's verdict, as for any request. What
 * else decide() weighs (the platform's lanes, the audit spool, a rule's secret, the egress
 * tunnel) is decided for each request inside the tunnel, where it is answered readably; the
 * wiring probe is let in whatever the policy says, and answered inside. `target` is
 * connectTarget()'s: null when the CONNECT named no `host:port`.
 */
export function decideConnect(
  target: { host: string; port: number | null } | null,
  ctx: DecideContext,
): ConnectDecision {
  if (!target || target.port === null) return refuse(connectRefusal(400, "CONNECT target is not host:port"));
  if (target.port !== 443)
    return refuse(connectRefusal(403, `CONNECT to port ${target.port}: only 443 leaves`));
  if (target.host !== WIRING_PROBE_HOST) {
    const verdict = hostVerdict(target.host, ctx.policy);
    if (verdict.kind === "no policy")
      return refuse(connectRefusal(403, "no valid policy: all egress denied"));
    if (verdict.kind === "block") return refuse(blockedRefusal(target.host));
  }
  return { kind: "open", host: target.host, port: 443 };
}

/**
 * Whether a TLS connection for `host` is spliced (relayed without termination, I3): under
 * catch-all routing, for a host the policy allows, that no rule matches and no limit holds, and
 * only when decide() itself would forward it, straight out or through the egress tunnel (a
 * tunnelled host whose tunnel is down is decide()'s readable 503). So a blocked host, a rule
 * host, a limited host (N3), the platform's own hosts, no policy or a full audit spool are all
 * terminated, where they are answered readably, injected or held to their limits.
 */
export function spliceable(host: string, ctx: DecideContext): Extract<Decision, { kind: "forward" }> | null {
  if (ctx.policy.kind !== "ready" || ctx.policy.policy.routing.mode !== "catch-all") return null;
  const decided = decide({ host, port: 443, scheme: "https", path: "/" }, ctx);
  return decided.kind === "forward" && untouched(decided) ? decided : null;
}

/** A forwarded host the proxy need not read: no credential to inject, no limit to hold it to. */
const untouched = (decided: Extract<Decision, { kind: "forward" }>) =>
  decided.rule === null && decided.limits.length === 0;

/**
 * A connection the sandbox dialled itself, by address, and DNAT'd to a direct listener (default
 * routing, I4): decided on the name it carries (SNI or Host) as any request is, and on the dialled
 * address too, so an IP-literal block holds whatever name is sent. A host decide() forwards with
 * no rule or limit and straight out goes to the dialled address (checked like any address,
 * destination()); anything else (a refusal, a rule host, a limited host, a lane, a tunnelled
 * host) is exactly decide()'s answer, as if the connection had come through the hosts file. With
 * no usable name (a ClientHello without SNI) pass the dialled address as `target.host`: it is
 * decided on the address alone.
 * `host` is what the decision is about (the record's and the audit's host).
 */
export function decideDialed(
  target: Target,
  dialed: Dialed,
  ctx: DecideContext,
): { host: string; decided: Decision } {
  if (target.host !== dialed.address && ctx.policy.kind === "ready") {
    // The address's own entry counts whatever name is sent; the default is for the name.
    const entry = ctx.policy.index.decideHost(dialed.address);
    if (entry.action === "block" && entry.pattern !== null)
      return { host: dialed.address, decided: refuse(blockedRefusal(dialed.address)) };
  }
  const decided = decide(target, ctx);
  return {
    host: target.host,
    decided:
      decided.kind === "forward" && untouched(decided) && decided.via === "direct"
        ? { ...decided, dialed }
        : decided,
  };
}

/**
 * The decision for one request on any way in (an HTTP/1.1 request, an HTTP/2 stream, an Upgrade
 * handshake): decideDialed() when its connection was dialled by address (I4), else decide().
 * `target` is the request's, with the host the decision is about. The explicit port's own rule
 * (plain http to port 80 only, I6) is applied here, first, so that no way in can skip it (an
 * Upgrade handshake did, L4); a forwarded request is then held to its method and path limits
 * (N3), here too, so that every way in is.
 */
export function decideRequest(
  target: Target,
  method: string,
  conn: TargetConn & { dialed?: Dialed },
  ctx: DecideContext,
): { target: Target; decided: Decision } {
  const portRefusal = explicitPortRefusal(conn, target);
  if (portRefusal) return { target, decided: refuse(portRefusal) };
  if (!conn.dialed) return { target, decided: withinLimits(target, method, decide(target, ctx)) };
  const { host, decided } = decideDialed(target, conn.dialed, ctx);
  const named = { ...target, host };
  return { target: named, decided: withinLimits(named, method, decided) };
}

/** A forward decision as it stands, or the refusal of the first limit the request is outside. */
function withinLimits(target: Target, method: string, decided: Decision): Decision {
  if (decided.kind !== "forward") return decided;
  for (const { limits, owner } of decided.limits) {
    const outside = limitVerdict(limits, method, target.path);
    if (outside === null) continue;
    const normalised = outside === "unnormalisable_path" ? normalisePath(target.path) : null;
    const why = normalised && !normalised.ok ? normalised.reason : undefined;
    return refuse(
      limitRefusal(target.host, method, outside, limits, owner, why),
      decided.rule?.index ?? null,
    );
  }
  return decided;
}

export type Destination = { ok: true; address: string; port: number } | { ok: false; refusal: Refusal };

/**
 * Where a forwarded target's connection goes: a direct host's name resolved once and every
 * answer checked (private, loopback, metadata, the proxy's own...), the first answer dialled; a
 * tunnelled host by name, which the user's agent resolves and checks on its side; a connection
 * the sandbox dialled by address (`dialed`) to that address, checked the same way, never a
 * fresh resolve of the name.
 */
export async function destination(
  upstream: Upstream,
  target: Target,
  via: EgressVia,
  blocked?: AddressBlocker,
  dialed?: Dialed,
): Promise<Destination> {
  if (via === "tunnel") return { ok: true, address: target.host, port: target.port };
  const resolved = dialed
    ? await upstream.resolve(dialed.address, dialed.port, blocked)
    : await upstream.resolve(target.host, target.port, blocked);
  if (resolved.ok) return resolved;
  // A name that resolves to an address a block entry names (I5) is blocked like the entry.
  const why =
    resolved.kind === "blocked"
      ? "it resolves to an address this run's policy blocks"
      : "it resolves to a private or reserved address";
  return {
    ok: false,
    refusal: new Refusal(
      resolved.kind === "dns" ? 502 : 403,
      resolved.kind === "blocked" ? "block" : "refuse",
      resolved.reason,
      resolved.kind === "dns" ? `Could not resolve ${target.host}.\n` : blockedBody(target.host, why),
      {},
      resolved.kind === "dns" ? { route: "refused" } : { route: "refused", blockedBy: "proxy" },
    ),
  };
}
