import { hasLimits } from "@benchwright/shared/contract/http-limits";
import type { EgressVia, HostAction } from "@benchwright/shared/contract/policy";
import { patternCovers } from "@benchwright/shared/policy/host";
import { STARTER_PACK_HOSTS, starterPackMethods } from "@benchwright/shared/policy/starter-pack";
import { and, asc, eq, inArray } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { randomId } from "../crypto/api-keys";
import { vaultHosts, vaultRules } from "../db/schema";
import type { Db, Tx } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { change, checkPattern, notFound } from "./change";
import { checkLimits, type LimitsInput, limitsOnBlock } from "./limits";

// The vault's host entries over Postgres: a pattern allowed or blocked, and an allowed host's
// route (via) and method and path limits (limits.ts). The default for hosts no entry names is a setting (settings.ts). Every change is
// one vault change (change.ts), scoped by the owner's environment.

export interface HostEntry {
  id: string;
  pattern: string;
  action: HostAction;
  implicit: boolean;
  /** How an allowed host's traffic leaves; null: as the run's egress says. */
  via: EgressVia | null;
  /** Method and path limits of an allowed host; null: none. */
  methods: string[] | null;
  paths: string[] | null;
  createdAt: Date;
  updatedAt: Date;
}

const hostColumns = {
  id: vaultHosts.id,
  pattern: vaultHosts.pattern,
  action: vaultHosts.action,
  implicit: vaultHosts.implicit,
  via: vaultHosts.via,
  methods: vaultHosts.methods,
  paths: vaultHosts.paths,
  createdAt: vaultHosts.createdAt,
  updatedAt: vaultHosts.updatedAt,
};

export async function listHosts(db: Db, p: Owner): Promise<HostEntry[]> {
  return db
    .select(hostColumns)
    .from(vaultHosts)
    .where(eq(vaultHosts.environmentId, p.environmentId))
    .orderBy(asc(vaultHosts.pattern));
}

export async function getHost(db: Db, p: Owner, id: string): Promise<Result<HostEntry>> {
  const [row] = await db
    .select(hostColumns)
    .from(vaultHosts)
    .where(and(eq(vaultHosts.environmentId, p.environmentId), eq(vaultHosts.id, id)));
  return row ? ok(row) : notFound("host entry", id);
}

/** A block entry must not cover a host a rule injects for (the mirror of rule_host_blocked). */
async function ruleUnder(tx: Tx, environmentId: string, pattern: string): Promise<string | null> {
  const rules = await tx
    .select({ id: vaultRules.id, host: vaultRules.hostPattern })
    .from(vaultRules)
    .where(eq(vaultRules.environmentId, environmentId));
  const hit = rules.find((r) => r.host === pattern || patternCovers(pattern, r.host));
  return hit ? `${hit.id} (${hit.host})` : null;
}

const viaOnBlock = (pattern: string) =>
  fail(
    "via_on_block",
    `${pattern} is blocked, so it has no route: only an allowed host may carry via (tunnel or direct).`,
  );

/**
 * Creates or replaces the entry for a pattern; saving it makes it explicit. `via`: the route of
 * an allowed host (null: as the run's egress says; undefined: keep the entry's own); `limits`
 * likewise, field by field. A block entry has neither, so blocking drops them.
 */
async function saveHost(
  tx: Tx,
  p: Owner,
  pattern: string,
  action: HostAction,
  via: EgressVia | null | undefined,
  limitsInput: LimitsInput = {},
): Promise<Result<HostEntry>> {
  if (action === "block" && via) return viaOnBlock(pattern);
  if (action === "block" && hasLimits(limitsInput)) return limitsOnBlock(pattern);
  const limits = checkLimits(limitsInput);
  if (!limits.ok) return limits;
  const { methods, paths } = limits.value;
  if (action === "block") {
    const rule = await ruleUnder(tx, p.environmentId, pattern);
    if (rule) {
      return fail(
        "rule_host_blocked",
        `Rule ${rule} injects a credential for this host; delete the rule before blocking it.`,
      );
    }
  }
  const [row] = await tx
    .insert(vaultHosts)
    .values({
      id: randomId("hst_"),
      environmentId: p.environmentId,
      pattern,
      action,
      via: via ?? null,
      methods: methods ?? null,
      paths: paths ?? null,
    })
    .onConflictDoUpdate({
      target: [vaultHosts.environmentId, vaultHosts.pattern],
      set: {
        action,
        implicit: false,
        ...(action === "block"
          ? { via: null, methods: null, paths: null }
          : {
              ...(via === undefined ? {} : { via }),
              ...(methods === undefined ? {} : { methods }),
              ...(paths === undefined ? {} : { paths }),
            }),
        updatedAt: new Date(),
      },
    })
    .returning(hostColumns);
  return row ? ok(row) : fail("internal_error", "Host entry was not saved.");
}

/** Creates or replaces the entry (an omitted via or limit is none). */
export async function putHost(
  db: Db,
  p: Owner,
  input: { pattern: string; action: HostAction; via?: EgressVia | null | undefined } & LimitsInput,
): Promise<Result<HostEntry>> {
  const pattern = checkPattern(input.pattern, "host-entry");
  if (!pattern.ok) return pattern;
  if (input.action === "block" && input.via) return viaOnBlock(pattern.value);
  const limits = { methods: input.methods ?? null, paths: input.paths ?? null };
  return change(db, p.environmentId, (tx) =>
    saveHost(tx, p, pattern.value, input.action, input.via ?? null, limits),
  );
}

/**
 * Changes an entry's action, route and/or limits. `via` undefined keeps the entry's route
 * (blocking drops it), null clears it; a route on an entry that is or becomes a block is refused
 * (via_on_block). Limits likewise (limits_on_block).
 */
export async function updateHost(
  db: Db,
  p: Owner,
  id: string,
  input: { action?: HostAction | undefined; via?: EgressVia | null | undefined } & LimitsInput,
): Promise<Result<HostEntry>> {
  // Read and write in one transaction, so a concurrent delete cannot be undone by this update.
  return change(db, p.environmentId, async (tx) => {
    const [entry] = await tx
      .select({ pattern: vaultHosts.pattern, action: vaultHosts.action })
      .from(vaultHosts)
      .where(and(eq(vaultHosts.environmentId, p.environmentId), eq(vaultHosts.id, id)));
    if (!entry) return notFound("host entry", id);
    return saveHost(tx, p, entry.pattern, input.action ?? entry.action, input.via, {
      methods: input.methods,
      paths: input.paths,
    });
  });
}

export async function deleteHost(db: Db, p: Owner, id: string): Promise<Result<null>> {
  return change(db, p.environmentId, async (tx) => {
    const [entry] = await tx
      .select({ pattern: vaultHosts.pattern })
      .from(vaultHosts)
      .where(and(eq(vaultHosts.environmentId, p.environmentId), eq(vaultHosts.id, id)));
    if (!entry) return notFound("host entry", id);
    const [rule] = await tx
      .select({ id: vaultRules.id })
      .from(vaultRules)
      .where(and(eq(vaultRules.environmentId, p.environmentId), eq(vaultRules.hostPattern, entry.pattern)));
    if (rule) {
      return fail(
        "host_has_rule",
        `Rule ${rule.id} needs this host allowed; delete the rule and its entry goes too.`,
      );
    }
    await tx
      .delete(vaultHosts)
      .where(and(eq(vaultHosts.environmentId, p.environmentId), eq(vaultHosts.id, id)));
    return ok(null);
  });
}

/**
 * Allows the common package and source hosts, the source hosts read-only (starter-pack.ts);
 * entries the user already has are left alone, their limits included.
 */
export async function addStarterPack(db: Db, p: Owner): Promise<Result<{ added: string[]; kept: string[] }>> {
  return change(db, p.environmentId, async (tx) => {
    const added: string[] = [];
    const kept: string[] = [];
    for (const pattern of STARTER_PACK_HOSTS) {
      const rows = await tx
        .insert(vaultHosts)
        .values({
          id: randomId("hst_"),
          environmentId: p.environmentId,
          pattern,
          action: "allow",
          methods: starterPackMethods(pattern),
        })
        .onConflictDoNothing()
        .returning({ id: vaultHosts.id });
      (rows.length > 0 ? added : kept).push(pattern);
      if (rows.length === 0) {
        // A rule's implicit allow entry becomes the user's own, or deleting the rule would take
        // the starter-pack host out of the allow list with it. Block entries stay as they are.
        await tx
          .update(vaultHosts)
          .set({ implicit: false, updatedAt: new Date() })
          .where(
            and(
              eq(vaultHosts.environmentId, p.environmentId),
              eq(vaultHosts.pattern, pattern),
              eq(vaultHosts.implicit, true),
            ),
          );
      }
    }
    return ok({ added, kept });
  });
}

// ---- allowing hosts that runs were refused ----

export const MAX_ALLOW_HOSTS = 100;

export interface AllowHostsResult {
  /** The entries of the hosts asked for, in the order first asked. */
  entries: HostEntry[];
  created: number;
  updated: number;
  unchanged: number;
}

/**
 * Allows exact hosts (as the blocked-hosts list names them) in one vault change, so one version
 * bump: a host without an entry gets an allow entry, a block entry becomes allow, an allow entry
 * stays (an implicit one, a rule's, becomes the user's own and counts as updated). Names are
 * checked and canonicalised as POST /v1/vault/hosts does; wildcards are refused, since a refused
 * request names one host. All or nothing: one bad name and nothing is written.
 */
export async function allowHosts(
  db: Db,
  p: Owner,
  hosts: readonly string[],
): Promise<Result<AllowHostsResult>> {
  if (hosts.length < 1 || hosts.length > MAX_ALLOW_HOSTS) {
    return fail("invalid_request", `hosts: from 1 to ${MAX_ALLOW_HOSTS} host names`);
  }
  const patterns: string[] = [];
  for (const input of hosts) {
    const pattern = checkPattern(input, "host-entry");
    if (!pattern.ok) return pattern;
    if (pattern.value.startsWith("*.")) {
      return fail(
        "invalid_host_pattern",
        `${JSON.stringify(input)}: exact host names only; allow a wildcard with POST /v1/vault/hosts`,
      );
    }
    if (!patterns.includes(pattern.value)) patterns.push(pattern.value);
  }
  return change(db, p.environmentId, async (tx) => {
    const inVault = and(eq(vaultHosts.environmentId, p.environmentId), inArray(vaultHosts.pattern, patterns));
    const existing = new Map(
      (
        await tx
          .select({ pattern: vaultHosts.pattern, action: vaultHosts.action, implicit: vaultHosts.implicit })
          .from(vaultHosts)
          .where(inVault)
      ).map((e) => [e.pattern, e]),
    );
    const counts = { created: 0, updated: 0, unchanged: 0 };
    for (const pattern of patterns) {
      const entry = existing.get(pattern);
      if (entry && entry.action === "allow" && !entry.implicit) {
        counts.unchanged++;
        continue;
      }
      // Allowing never conflicts with a rule, so saveHost cannot refuse here. An entry's own
      // route is kept (a block entry has none).
      const saved = await saveHost(tx, p, pattern, "allow", undefined);
      if (!saved.ok) return saved;
      counts[entry ? "updated" : "created"]++;
    }
    const rows = await tx.select(hostColumns).from(vaultHosts).where(inVault);
    const byPattern = new Map(rows.map((r) => [r.pattern, r]));
    const entries = patterns.flatMap((pattern) => byPattern.get(pattern) ?? []);
    return ok({ entries, ...counts });
  });
}
