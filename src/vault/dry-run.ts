import { hasLimits } from "@benchwright/shared/contract/http-limits";
import { type PlaceholderEnv, placeholderEnvs } from "@benchwright/shared/contract/placeholder";
import {
  type EgressVia,
  type HostAction,
  InjectSpec,
  type PolicyDocument,
  type PolicyRouting,
  type PolicyRule,
} from "@benchwright/shared/contract/policy";
import { readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { buildPolicyIndex, type PolicyIndex, type VaultSnapshot } from "@benchwright/shared/policy/compile";
import { parseHostPattern, patternCovers } from "@benchwright/shared/policy/host";
import { and, eq } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { blockedHostLog, egressRouteLog, runs } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { listHosts } from "./hosts";
import {
  checkLimits,
  checkPlaceholderEnv,
  type LimitsInput,
  limitsOnBlock,
  resolvePlaceholderEnv,
} from "./limits";
import { compileVault, previewPolicy } from "./policy";
import type { RuleInput } from "./rules";
import { listSecrets } from "./secrets";
import { getSettings } from "./settings";

// Dry run: replays the hosts a run reached or was refused (its egress_route_log and
// blocked_host_log) against a draft vault and against the vault as it is now, with the code the
// proxy decides by (compilePolicy, then buildPolicyIndex's decideHost and matchRule), and the
// run's egress. Each host's route is the proxy's too: the deciding entry's `via`, else the run's
// egress. Rules are named by index and secret name; no secret value is read at all. It shows the
// limits requests would be held to (the deciding entry's, each rule's) and the placeholder
// variables the run's sandboxes would get (placeholderEnvs, as the coordinator computes them).

export interface HostEntryInput extends LimitsInput {
  pattern: string;
  action: HostAction;
  /** An allowed host's route; none: as the run's egress says. A block entry takes none. */
  via?: EgressVia | undefined;
}

/** A whole vault, as the user would leave it. */
export interface DraftVault {
  default: HostAction;
  hosts: readonly HostEntryInput[];
  /** In order; the first matching rule wins. */
  rules: readonly RuleInput[];
}

/** Edits of the current vault. Rules are removed by their current index, then added at the end. */
export interface VaultChanges {
  default?: HostAction | undefined;
  hosts?:
    | { upsert?: readonly HostEntryInput[] | undefined; remove?: readonly string[] | undefined }
    | undefined;
  rules?: { add?: readonly RuleInput[] | undefined; remove?: readonly number[] | undefined } | undefined;
}

/** Exactly one of `draft` and `changes`. */
export interface DryRunInput {
  runId: string;
  draft?: DraftVault | undefined;
  changes?: VaultChanges | undefined;
}

export type Route = "direct" | "tunnel";

export interface HostOutcome {
  action: HostAction;
  /** Index of the rule whose secret would be injected (in that vault's order), or null. */
  rule: number | null;
  /** How allowed traffic leaves: through the user's machine (tunnel) or straight out. */
  route: Route;
  /** The deciding host entry's limits (null: none; a blocked host has none). */
  methods: string[] | null;
  paths: string[] | null;
}

/** A rule as the dry run shows it: by index and secret name, with its limits and placeholder. */
export interface RuleView {
  index: number;
  host: string;
  secret: string;
  placeholderEnv: string | null;
  placeholderIn: string[];
  methods: string[] | null;
  paths: string[] | null;
}

export interface HostReplay {
  host: string;
  draft: HostOutcome;
  current: HostOutcome;
  /** The host would be treated differently: action, injected rule (not its number), or route. */
  changed: boolean;
}

export interface DryRunResult {
  runId: string;
  /** Changed hosts first, then by name; at most MAX_DRY_RUN_HOSTS. */
  hosts: HostReplay[];
  routing: { draft: PolicyRouting; current: PolicyRouting };
  /** Each vault's rules in order, with their limits and placeholder variables. */
  rules: { draft: RuleView[]; current: RuleView[] };
  /** The placeholder variables the run's sandboxes would get (the declared model's lane wins its own). */
  placeholders: { draft: PlaceholderEnv[]; current: PlaceholderEnv[] };
  counts: { hosts: number; changed: number };
  /** True when the run recorded more hosts than `hosts` holds. */
  truncated: boolean;
}

export const MAX_DRY_RUN_HOSTS = 1000;
/** A vault change between the reads of the current vault makes them read again, this many times at most. */
const READ_ATTEMPTS = 3;

interface Entry {
  action: HostAction;
  via?: EgressVia | undefined;
  methods: string[] | null;
  paths: string[] | null;
  /** Added for a rule's host, as the vault does; goes with the last rule naming the host. */
  implicit: boolean;
}

interface Base {
  doc: PolicyDocument;
  implicit: Set<string>;
  secretNames: Set<string>;
}

/** The current vault, compiled as a run started now would get it, and what the edits need. */
async function readCurrent(db: Db, p: Owner, egress: "direct" | "local"): Promise<Base> {
  let base: Base | null = null;
  for (let attempt = 0; attempt < READ_ATTEMPTS; attempt++) {
    const doc = await previewPolicy(db, p, { egress });
    const implicit = new Set((await listHosts(db, p)).filter((h) => h.implicit).map((h) => h.pattern));
    const secretNames = new Set((await listSecrets(db, p)).map((s) => s.name));
    base = { doc, implicit, secretNames };
    // Every vault write bumps the version: the same version means the reads belong together.
    if ((await getSettings(db, p)).version === doc.version) break;
  }
  if (!base) throw new Error("no vault read");
  return base;
}

const where = (path: string, input: unknown) => `${path}: ${JSON.stringify(input)}`;

function checkEntryPattern(path: string, input: string): Result<string> {
  const parsed = parseHostPattern(input, "host-entry");
  return parsed.ok
    ? ok(parsed.pattern)
    : fail("invalid_host_pattern", `${where(path, input)}: ${parsed.message}`);
}

/** A rule as the vault would save it: canonical host, known secret, the contract's inject spec. */
function checkRule(path: string, input: RuleInput, secretNames: Set<string>): Result<PolicyRule> {
  const host = parseHostPattern(input.host, "rule");
  if (!host.ok) return fail("invalid_host_pattern", `${where(`${path}.host`, input.host)}: ${host.message}`);
  const inject = InjectSpec.safeParse(input.inject);
  if (!inject.success) {
    return fail(
      "invalid_request",
      `${path}.inject: ${inject.error.issues.map((i) => [...i.path, i.message].join(": ")).join("; ")}`,
    );
  }
  if (!secretNames.has(input.secret)) {
    return fail("unknown_secret", `${path}.secret: no secret named ${input.secret}; create it first.`);
  }
  const limits = checkLimits(input, `${path}.`);
  if (!limits.ok) return limits;
  const env = input.placeholderEnv
    ? checkPlaceholderEnv(input.placeholderEnv, `${path}.placeholderEnv`)
    : ok(input.placeholderEnv);
  if (!env.ok) return env;
  return ok({
    index: 0,
    host: host.pattern,
    secret: input.secret,
    inject: inject.data,
    // As the vault would store and compile it: absent is the default name, null none.
    placeholderEnv: resolvePlaceholderEnv({
      secret: input.secret,
      placeholder: env.value !== null,
      placeholderEnv: env.value ?? null,
    }),
    placeholderIn: [...new Set(input.placeholderIn ?? [])],
    methods: limits.value.methods ?? null,
    paths: limits.value.paths ?? null,
  });
}

function checkRules(path: string, rules: readonly RuleInput[], names: Set<string>): Result<PolicyRule[]> {
  const out: PolicyRule[] = [];
  for (const [i, rule] of rules.entries()) {
    const checked = checkRule(`${path}[${i}]`, rule, names);
    if (!checked.ok) return checked;
    out.push(checked.value);
  }
  return ok(out);
}

/** Entries as the vault would save them (canonical, once each; a block entry has no route). */
function checkEntries(path: string, hosts: readonly HostEntryInput[]): Result<Map<string, Entry>> {
  const out = new Map<string, Entry>();
  for (const [i, h] of hosts.entries()) {
    const pattern = checkEntryPattern(`${path}[${i}].pattern`, h.pattern);
    if (!pattern.ok) return pattern;
    if (out.has(pattern.value)) {
      return fail("invalid_request", `${path}[${i}].pattern: ${pattern.value} is given twice`);
    }
    if (h.via && h.action === "block") {
      return fail("via_on_block", `${path}[${i}].via: ${pattern.value} is blocked, so it has no route`);
    }
    if (h.action === "block" && hasLimits(h)) return limitsOnBlock(pattern.value, `${path}[${i}]: `);
    const limits = checkLimits(h, `${path}[${i}].`);
    if (!limits.ok) return limits;
    out.set(pattern.value, {
      action: h.action,
      implicit: false,
      ...(h.via ? { via: h.via } : {}),
      methods: limits.value.methods ?? null,
      paths: limits.value.paths ?? null,
    });
  }
  return ok(out);
}

/** The whole draft as the vault would hold it (a rule's host without an entry gets an allow). */
function fromDraft(draft: DraftVault, base: Base): Result<Resolved> {
  const entries = checkEntries("draft.hosts", draft.hosts);
  if (!entries.ok) return entries;
  const rules = checkRules("draft.rules", draft.rules, base.secretNames);
  if (!rules.ok) return rules;
  return ok({ default: draft.default, hosts: entries.value, rules: rules.value });
}

interface Resolved {
  default: HostAction;
  hosts: Map<string, Entry>;
  rules: PolicyRule[];
}

/** The current vault with the edits applied, the way the vault's own writes would apply them. */
function fromChanges(changes: VaultChanges, base: Base): Result<Resolved> {
  const hosts = new Map<string, Entry>(
    base.doc.hosts.map((h) => [
      h.pattern,
      {
        action: h.action,
        implicit: base.implicit.has(h.pattern),
        ...(h.via ? { via: h.via } : {}),
        methods: h.methods,
        paths: h.paths,
      },
    ]),
  );
  let rules: PolicyRule[] = [...base.doc.rules];

  const remove = changes.rules?.remove ?? [];
  for (const [i, index] of remove.entries()) {
    if (!Number.isInteger(index) || index < 0 || index >= rules.length) {
      return fail(
        "invalid_request",
        `changes.rules.remove[${i}]: the vault has no rule ${index} (it has ${rules.length})`,
      );
    }
    if (remove.indexOf(index) !== i)
      return fail("invalid_request", `changes.rules.remove[${i}]: ${index} is given twice`);
  }
  const removed = rules.filter((_, i) => remove.includes(i));
  rules = rules.filter((_, i) => !remove.includes(i));
  // A removed rule's implicit entry goes with the last rule naming its host.
  for (const rule of removed) {
    if (hosts.get(rule.host)?.implicit && !rules.some((r) => r.host === rule.host)) hosts.delete(rule.host);
  }
  const added = checkRules("changes.rules.add", changes.rules?.add ?? [], base.secretNames);
  if (!added.ok) return added;
  rules.push(...added.value);

  const drop = changes.hosts?.remove ?? [];
  const dropped = new Set<string>();
  for (const [i, input] of drop.entries()) {
    const pattern = checkEntryPattern(`changes.hosts.remove[${i}]`, input);
    if (!pattern.ok) return pattern;
    if (!hosts.has(pattern.value) || dropped.has(pattern.value)) {
      return fail("invalid_request", `changes.hosts.remove[${i}]: no entry ${pattern.value} to remove`);
    }
    const rule = rules.findIndex((r) => r.host === pattern.value);
    if (rule !== -1) {
      return fail("host_has_rule", `changes.hosts.remove[${i}]: rule ${rule} needs ${pattern.value} allowed`);
    }
    dropped.add(pattern.value);
    hosts.delete(pattern.value);
  }
  const upsert = checkEntries("changes.hosts.upsert", changes.hosts?.upsert ?? []);
  if (!upsert.ok) return upsert;
  // An upsert replaces the entry, as POST /v1/vault/hosts does: its route is the one given.
  for (const [pattern, entry] of upsert.value) hosts.set(pattern, entry);

  return ok({ default: changes.default ?? base.doc.default, hosts, rules });
}

/** The vault's own rule: a rule's host is never blocked by an entry (rule_host_blocked). */
function withImplicitEntries(vault: Resolved, version: number): Result<VaultSnapshot> {
  for (const [i, rule] of vault.rules.entries()) {
    for (const [pattern, entry] of vault.hosts) {
      if (entry.action === "block" && patternCovers(pattern, rule.host)) {
        return fail(
          "rule_host_blocked",
          `Rule ${i} (${rule.host}) injects a credential for a host the entry ${pattern} blocks; the vault refuses that.`,
        );
      }
    }
    // As the vault's: an implicit entry carries no limits.
    if (!vault.hosts.has(rule.host)) {
      vault.hosts.set(rule.host, { action: "allow", implicit: true, methods: null, paths: null });
    }
  }
  return ok({
    version,
    default: vault.default,
    hosts: [...vault.hosts]
      .sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0))
      .map(([pattern, { action, via, methods, paths }]) => ({ pattern, action, via, methods, paths })),
    rules: vault.rules,
  });
}

/**
 * What the proxy does with a request to `host`: host policy first (which also gives the route:
 * the deciding entry's via, else the run's egress); a blocked host gets no rule.
 */
function outcome(doc: PolicyDocument, index: PolicyIndex, host: string): HostOutcome {
  const { action, via, pattern } = index.decideHost(host);
  const rule = action === "block" ? null : (index.matchRule(host)?.index ?? null);
  const entry = pattern === null ? undefined : doc.hosts.find((h) => h.pattern === pattern);
  return { action, rule, route: via, methods: entry?.methods ?? null, paths: entry?.paths ?? null };
}

/** What of a rule changes a request's treatment: all of it but its place in the order. */
const ruleKey = (doc: PolicyDocument, index: number | null) => {
  const rule = index === null ? undefined : doc.rules[index];
  if (!rule) return null;
  const { index: _, ...rest } = rule;
  return JSON.stringify(rest);
};

const ruleViews = (doc: PolicyDocument): RuleView[] =>
  doc.rules.map(({ index, host, secret, placeholderEnv, placeholderIn, methods, paths }) => ({
    index,
    host,
    secret,
    placeholderEnv,
    placeholderIn,
    methods,
    paths,
  }));

const sameLimits = (a: HostOutcome, b: HostOutcome) =>
  JSON.stringify([a.methods, a.paths]) === JSON.stringify([b.methods, b.paths]);

/** Hosts the run reached (any route) or was refused, each once, by name. */
async function runHosts(db: Db, p: Owner, runId: string): Promise<string[]> {
  const reached = db
    .selectDistinct({ host: egressRouteLog.host })
    .from(egressRouteLog)
    .where(and(eq(egressRouteLog.runId, runId), eq(egressRouteLog.environmentId, p.environmentId)));
  const refused = db
    .selectDistinct({ host: blockedHostLog.host })
    .from(blockedHostLog)
    .where(and(eq(blockedHostLog.runId, runId), eq(blockedHostLog.environmentId, p.environmentId)));
  const rows = await reached.union(refused);
  return rows.map((r) => r.host).sort();
}

export async function dryRun(db: Db, p: Owner, input: DryRunInput): Promise<Result<DryRunResult>> {
  if ((input.draft === undefined) === (input.changes === undefined)) {
    return fail(
      "invalid_request",
      "Give exactly one of draft (a whole vault) and changes (edits of the current one).",
    );
  }
  const [run] = await db
    .select({ id: runs.id, spec: runs.spec })
    .from(runs)
    .where(and(eq(runs.id, input.runId), eq(runs.environmentId, p.environmentId)));
  if (!run) return fail("not_found", `No run ${input.runId}.`);
  // As the run's proxy gets it.
  const { egress, model } = readStoredSpec(run.spec);

  const base = await readCurrent(db, p, egress);
  const resolved = input.draft ? fromDraft(input.draft, base) : fromChanges(input.changes ?? {}, base);
  if (!resolved.ok) return resolved;
  const snapshot = withImplicitEntries(resolved.value, base.doc.version);
  if (!snapshot.ok) return snapshot;
  const compiled = compileVault(snapshot.value, { egress });
  if (!compiled.ok) return compiled;
  const draftDoc = compiled.value;
  const [draftIndex, currentIndex] = [buildPolicyIndex(draftDoc), buildPolicyIndex(base.doc)];

  const replays = (await runHosts(db, p, run.id)).map((host): HostReplay => {
    const draft = outcome(draftDoc, draftIndex, host);
    const current = outcome(base.doc, currentIndex, host);
    const changed =
      draft.action !== current.action ||
      draft.route !== current.route ||
      !sameLimits(draft, current) ||
      ruleKey(draftDoc, draft.rule) !== ruleKey(base.doc, current.rule);
    return { host, draft, current, changed };
  });
  const changed = replays.filter((r) => r.changed);
  const shown = [...changed, ...replays.filter((r) => !r.changed)].slice(0, MAX_DRY_RUN_HOSTS);
  return ok({
    runId: run.id,
    hosts: shown,
    routing: { draft: draftDoc.routing, current: base.doc.routing },
    rules: { draft: ruleViews(draftDoc), current: ruleViews(base.doc) },
    placeholders: {
      draft: placeholderEnvs(draftDoc.rules, model !== undefined),
      current: placeholderEnvs(base.doc.rules, model !== undefined),
    },
    counts: { hosts: replays.length, changed: changed.length },
    truncated: replays.length > shown.length,
  });
}
