import { and, asc, eq, inArray } from "drizzle-orm";
import type { Principal } from "../context";
import {
  type EgressVia,
  type HostAction,
  type InjectScheme,
  InjectSpec,
  type ModelBudget,
  type PolicyDocument,
  type RunEgress,
} from "../contract/policy";
import { SecretValue } from "../contract/proxy-wire";
import { randomId } from "../crypto/api-keys";
import { encryptSecret, fingerprintSecret, type KeyRing } from "../crypto/vault-crypto";
import { vaultHosts, vaultModels, vaultRules, vaultSecrets, vaultSettings } from "../db/schema";
import type { Db, Q, Tx } from "../db/types";
import { fail, ok, type Result, unwrap } from "../errors";
import { compilePolicy, type RunOptions, refusedRule, type VaultSnapshot } from "../policy/compile";
import { parseHostPattern, patternCovers } from "../policy/host";
import { STARTER_PACK_HOSTS } from "../policy/starter-pack";
import { change, notFound } from "./change";
import { modelLane } from "./models";

// The vault's domain logic over Postgres. Every query is scoped by the principal's environment,
// so another tenant's ids simply do not exist here (404, never 403). Every change runs in one
// transaction that first bumps the vault version, which also serialises writers per vault.

export interface SecretInfo {
  id: string;
  name: string;
  fingerprint: string;
  createdAt: Date;
  updatedAt: Date;
}
export interface RuleInfo {
  id: string;
  position: number;
  host: string;
  secret: string;
  inject: InjectSpec;
  createdAt: Date;
  updatedAt: Date;
}
export interface HostEntry {
  id: string;
  pattern: string;
  action: HostAction;
  implicit: boolean;
  /** How an allowed host's traffic leaves; null: as the run's egress says. */
  via: EgressVia | null;
  createdAt: Date;
  updatedAt: Date;
}
export interface VaultSettingsInfo {
  default: HostAction;
  version: number;
}

const secretColumns = {
  id: vaultSecrets.id,
  name: vaultSecrets.name,
  fingerprint: vaultSecrets.fingerprint,
  createdAt: vaultSecrets.createdAt,
  updatedAt: vaultSecrets.updatedAt,
};
const hostColumns = {
  id: vaultHosts.id,
  pattern: vaultHosts.pattern,
  action: vaultHosts.action,
  implicit: vaultHosts.implicit,
  via: vaultHosts.via,
  createdAt: vaultHosts.createdAt,
  updatedAt: vaultHosts.updatedAt,
};

function checkPattern(input: string, use: "host-entry" | "rule"): Result<string> {
  const parsed = parseHostPattern(input, use);
  return parsed.ok
    ? ok(parsed.pattern)
    : fail("invalid_host_pattern", `${JSON.stringify(input)}: ${parsed.message}`);
}

// ---- secrets ----

function checkSecretValue(value: string): Result<null> {
  // The same rule the proxy's contract enforces (printable ASCII, 1 byte to 16 KiB): values are
  // sent in headers or query strings, where CR/LF/NUL would split a request. Refused here, at
  // save time, rather than failing a run later at the proxy.
  if (!SecretValue.safeParse(value).success) {
    return fail(
      "invalid_request",
      "A secret value must be printable ASCII: no control characters (CR, LF, NUL, ...) and no non-ASCII characters.",
    );
  }
  return ok(null);
}

export async function listSecrets(db: Db, p: Principal): Promise<SecretInfo[]> {
  return db
    .select(secretColumns)
    .from(vaultSecrets)
    .where(eq(vaultSecrets.environmentId, p.environmentId))
    .orderBy(asc(vaultSecrets.name));
}

export async function getSecret(db: Db, p: Principal, id: string): Promise<Result<SecretInfo>> {
  const [row] = await db
    .select(secretColumns)
    .from(vaultSecrets)
    .where(and(eq(vaultSecrets.environmentId, p.environmentId), eq(vaultSecrets.id, id)));
  return row ? ok(row) : notFound("secret", id);
}

async function sealed(ring: KeyRing, p: Principal, secretId: string, value: string) {
  return {
    ciphertext: await encryptSecret(
      ring,
      { userId: p.userId, environmentId: p.environmentId, secretId },
      value,
    ),
    keyId: ring.currentKeyId,
    fingerprint: await fingerprintSecret(ring, value),
  };
}

export async function createSecret(
  db: Db,
  ring: KeyRing,
  p: Principal,
  input: { name: string; value: string },
): Promise<Result<SecretInfo>> {
  const valid = checkSecretValue(input.value);
  if (!valid.ok) return valid;
  const id = randomId("sec_");
  const seal = await sealed(ring, p, id, input.value);
  return change(db, p.environmentId, async (tx) => {
    const [row] = await tx
      .insert(vaultSecrets)
      .values({ id, environmentId: p.environmentId, name: input.name, ...seal })
      .onConflictDoNothing()
      .returning(secretColumns);
    return row
      ? ok(row)
      : fail("secret_exists", `A secret named ${input.name} exists; replace its value with PUT.`);
  });
}

export async function replaceSecret(
  db: Db,
  ring: KeyRing,
  p: Principal,
  id: string,
  input: { value: string },
): Promise<Result<SecretInfo>> {
  const valid = checkSecretValue(input.value);
  if (!valid.ok) return valid;
  const seal = await sealed(ring, p, id, input.value);
  return change(db, p.environmentId, async (tx) => {
    const [row] = await tx
      .update(vaultSecrets)
      .set({ ...seal, updatedAt: new Date() })
      .where(and(eq(vaultSecrets.environmentId, p.environmentId), eq(vaultSecrets.id, id)))
      .returning(secretColumns);
    return row ? ok(row) : notFound("secret", id);
  });
}

export async function deleteSecret(db: Db, p: Principal, id: string): Promise<Result<null>> {
  return change(db, p.environmentId, async (tx) => {
    const users = await tx
      .select({ id: vaultRules.id })
      .from(vaultRules)
      .where(and(eq(vaultRules.environmentId, p.environmentId), eq(vaultRules.secretId, id)));
    if (users.length > 0) {
      const ids = users.map((r) => r.id).join(", ");
      return fail("secret_in_use", `Rules ${ids} use this secret; delete or change them first.`);
    }
    // The models' foreign key restricts the delete too; say which, as for rules.
    const models = await tx
      .select({ name: vaultModels.name })
      .from(vaultModels)
      .where(and(eq(vaultModels.environmentId, p.environmentId), eq(vaultModels.secretId, id)));
    if (models.length > 0) {
      const names = models.map((m) => m.name).join(", ");
      return fail("secret_in_use", `Models ${names} use this secret; delete or change them first.`);
    }
    const deleted = await tx
      .delete(vaultSecrets)
      .where(and(eq(vaultSecrets.environmentId, p.environmentId), eq(vaultSecrets.id, id)))
      .returning({ id: vaultSecrets.id });
    return deleted.length > 0 ? ok(null) : notFound("secret", id);
  });
}

// ---- rules ----

export interface RuleInput {
  host: string;
  secret: string;
  inject: { scheme: InjectScheme; name?: string | undefined };
}

function ruleSelect(q: Q, environmentId: string) {
  return q
    .select({
      id: vaultRules.id,
      position: vaultRules.position,
      host: vaultRules.hostPattern,
      secret: vaultSecrets.name,
      scheme: vaultRules.scheme,
      target: vaultRules.target,
      createdAt: vaultRules.createdAt,
      updatedAt: vaultRules.updatedAt,
    })
    .from(vaultRules)
    .innerJoin(vaultSecrets, eq(vaultSecrets.id, vaultRules.secretId))
    .where(eq(vaultRules.environmentId, environmentId))
    .orderBy(asc(vaultRules.position), asc(vaultRules.createdAt))
    .$dynamic();
}

type RuleRow = Awaited<ReturnType<typeof ruleSelect>>[number];
const toRule = ({ scheme, target, ...r }: RuleRow): RuleInfo => ({ ...r, inject: { scheme, name: target } });

export async function listRules(db: Db, p: Principal): Promise<RuleInfo[]> {
  return (await ruleSelect(db, p.environmentId)).map(toRule);
}

export async function getRule(db: Db, p: Principal, id: string): Promise<Result<RuleInfo>> {
  const rows = await listRules(db, p);
  const rule = rows.find((r) => r.id === id);
  return rule ? ok(rule) : notFound("rule", id);
}

function injectTarget(inject: RuleInput["inject"]): Result<string> {
  if (!inject.name && (inject.scheme === "raw" || inject.scheme === "query")) {
    return fail(
      "invalid_request",
      inject.scheme === "raw"
        ? "Scheme raw needs inject.name, the header to set."
        : "Scheme query needs inject.name, the query parameter to set.",
    );
  }
  // The contract's own check (header token, no framing headers, query-safe names; lowercases
  // header names): a rule the policy document would refuse must not be saved, or every compile
  // of this vault would fail — and a CR/LF in a header name could split the proxied request.
  const spec = InjectSpec.safeParse(
    inject.name ? { scheme: inject.scheme, name: inject.name } : { scheme: inject.scheme },
  );
  if (!spec.success) {
    return fail("invalid_request", `inject.name: ${spec.error.issues.map((i) => i.message).join("; ")}`);
  }
  return ok(spec.data.name);
}

/** A rule's host must not be blocked by an entry: the credential would never be used. */
async function blockingEntry(tx: Tx, environmentId: string, host: string): Promise<string | null> {
  const blocks = await tx
    .select({ pattern: vaultHosts.pattern })
    .from(vaultHosts)
    .where(and(eq(vaultHosts.environmentId, environmentId), eq(vaultHosts.action, "block")));
  return blocks.find((b) => b.pattern === host || patternCovers(b.pattern, host))?.pattern ?? null;
}

async function ensureImplicitAllow(tx: Tx, environmentId: string, host: string): Promise<void> {
  await tx
    .insert(vaultHosts)
    .values({ id: randomId("hst_"), environmentId, pattern: host, action: "allow", implicit: true })
    .onConflictDoNothing();
}

/** Removes the implicit entry of a host no rule names any more. */
async function dropImplicitIfUnused(tx: Tx, environmentId: string, host: string): Promise<void> {
  const still = await tx
    .select({ id: vaultRules.id })
    .from(vaultRules)
    .where(and(eq(vaultRules.environmentId, environmentId), eq(vaultRules.hostPattern, host)));
  if (still.length > 0) return;
  await tx
    .delete(vaultHosts)
    .where(
      and(
        eq(vaultHosts.environmentId, environmentId),
        eq(vaultHosts.pattern, host),
        eq(vaultHosts.implicit, true),
      ),
    );
}

async function resolveRuleInput(tx: Tx, p: Principal, input: RuleInput) {
  const host = checkPattern(input.host, "rule");
  if (!host.ok) return host;
  const target = injectTarget(input.inject);
  if (!target.ok) return target;
  const [secret] = await tx
    .select({ id: vaultSecrets.id })
    .from(vaultSecrets)
    .where(and(eq(vaultSecrets.environmentId, p.environmentId), eq(vaultSecrets.name, input.secret)));
  if (!secret) return fail("unknown_secret", `No secret named ${input.secret}; create it first.`);
  const blocked = await blockingEntry(tx, p.environmentId, host.value);
  if (blocked) {
    return fail(
      "rule_host_blocked",
      `${host.value} is blocked by the host entry ${blocked}; a credential for it would never be sent. Remove or change that entry first.`,
    );
  }
  return ok({ host: host.value, secretId: secret.id, scheme: input.inject.scheme, target: target.value });
}

export async function createRule(
  db: Db,
  p: Principal,
  input: RuleInput & { position?: number | undefined },
): Promise<Result<RuleInfo>> {
  const id = randomId("rul_");
  const created = await change(db, p.environmentId, async (tx) => {
    const resolved = await resolveRuleInput(tx, p, input);
    if (!resolved.ok) return resolved;
    const existing = await ruleSelect(tx, p.environmentId);
    const order = existing.map((r) => r.id);
    const at = Math.min(Math.max(input.position ?? order.length, 0), order.length);
    order.splice(at, 0, id);
    await tx.insert(vaultRules).values({
      id,
      environmentId: p.environmentId,
      position: at,
      hostPattern: resolved.value.host,
      secretId: resolved.value.secretId,
      scheme: resolved.value.scheme,
      target: resolved.value.target,
    });
    await writeOrder(tx, p.environmentId, order);
    await ensureImplicitAllow(tx, p.environmentId, resolved.value.host);
    return ok(null);
  });
  return created.ok ? getRule(db, p, id) : created;
}

export async function updateRule(
  db: Db,
  p: Principal,
  id: string,
  patch: Partial<RuleInput> & { position?: number | undefined },
): Promise<Result<RuleInfo>> {
  const updated = await change(db, p.environmentId, async (tx) => {
    const rows = (await ruleSelect(tx, p.environmentId)).map(toRule);
    const current = rows.find((r) => r.id === id);
    if (!current) return notFound("rule", id);
    const resolved = await resolveRuleInput(tx, p, {
      host: patch.host ?? current.host,
      secret: patch.secret ?? current.secret,
      inject: patch.inject ?? current.inject,
    });
    if (!resolved.ok) return resolved;
    await tx
      .update(vaultRules)
      .set({
        hostPattern: resolved.value.host,
        secretId: resolved.value.secretId,
        scheme: resolved.value.scheme,
        target: resolved.value.target,
        updatedAt: new Date(),
      })
      .where(and(eq(vaultRules.environmentId, p.environmentId), eq(vaultRules.id, id)));
    if (resolved.value.host !== current.host) {
      await ensureImplicitAllow(tx, p.environmentId, resolved.value.host);
      await dropImplicitIfUnused(tx, p.environmentId, current.host);
    }
    if (patch.position !== undefined) {
      const order = rows.map((r) => r.id).filter((r) => r !== id);
      order.splice(Math.min(Math.max(patch.position, 0), order.length), 0, id);
      await writeOrder(tx, p.environmentId, order);
    }
    return ok(null);
  });
  return updated.ok ? getRule(db, p, id) : updated;
}

export async function deleteRule(db: Db, p: Principal, id: string): Promise<Result<null>> {
  return change(db, p.environmentId, async (tx) => {
    const [deleted] = await tx
      .delete(vaultRules)
      .where(and(eq(vaultRules.environmentId, p.environmentId), eq(vaultRules.id, id)))
      .returning({ host: vaultRules.hostPattern });
    if (!deleted) return notFound("rule", id);
    await dropImplicitIfUnused(tx, p.environmentId, deleted.host);
    const rest = await ruleSelect(tx, p.environmentId);
    await writeOrder(
      tx,
      p.environmentId,
      rest.map((r) => r.id),
    );
    return ok(null);
  });
}

/** Sets the whole order at once: `ids` must be exactly this vault's rule ids, each once. */
export async function reorderRules(db: Db, p: Principal, ids: string[]): Promise<Result<RuleInfo[]>> {
  const done = await change(db, p.environmentId, async (tx) => {
    const current = (await ruleSelect(tx, p.environmentId)).map((r) => r.id);
    const same =
      ids.length === current.length &&
      new Set(ids).size === ids.length &&
      ids.every((i) => current.includes(i));
    if (!same) {
      return fail(
        "invalid_order",
        `Send every rule id of this vault exactly once (${current.length} rules).`,
      );
    }
    await writeOrder(tx, p.environmentId, ids);
    return ok(null);
  });
  return done.ok ? ok(await listRules(db, p)) : done;
}

async function writeOrder(tx: Tx, environmentId: string, ids: string[]): Promise<void> {
  for (const [position, id] of ids.entries()) {
    await tx
      .update(vaultRules)
      .set({ position })
      .where(and(eq(vaultRules.environmentId, environmentId), eq(vaultRules.id, id)));
  }
}

// ---- host entries and the default ----

export async function listHosts(db: Db, p: Principal): Promise<HostEntry[]> {
  return db
    .select(hostColumns)
    .from(vaultHosts)
    .where(eq(vaultHosts.environmentId, p.environmentId))
    .orderBy(asc(vaultHosts.pattern));
}

export async function getHost(db: Db, p: Principal, id: string): Promise<Result<HostEntry>> {
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
 * an allowed host (null: as the run's egress says; undefined: keep the entry's own). A block
 * entry has none, so blocking drops it.
 */
async function saveHost(
  tx: Tx,
  p: Principal,
  pattern: string,
  action: HostAction,
  via: EgressVia | null | undefined,
): Promise<Result<HostEntry>> {
  if (action === "block" && via) return viaOnBlock(pattern);
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
    .values({ id: randomId("hst_"), environmentId: p.environmentId, pattern, action, via: via ?? null })
    .onConflictDoUpdate({
      target: [vaultHosts.environmentId, vaultHosts.pattern],
      set: {
        action,
        implicit: false,
        ...(action === "block" ? { via: null } : via === undefined ? {} : { via }),
        updatedAt: new Date(),
      },
    })
    .returning(hostColumns);
  return row ? ok(row) : fail("internal_error", "Host entry was not saved.");
}

/** Creates or replaces the entry (an omitted via is none: the run's egress decides). */
export async function putHost(
  db: Db,
  p: Principal,
  input: { pattern: string; action: HostAction; via?: EgressVia | null | undefined },
): Promise<Result<HostEntry>> {
  const pattern = checkPattern(input.pattern, "host-entry");
  if (!pattern.ok) return pattern;
  if (input.action === "block" && input.via) return viaOnBlock(pattern.value);
  return change(db, p.environmentId, (tx) => saveHost(tx, p, pattern.value, input.action, input.via ?? null));
}

/**
 * Changes an entry's action and/or route. `via` undefined keeps the entry's route (blocking drops
 * it), null clears it; a route on an entry that is or becomes a block is refused (via_on_block).
 */
export async function updateHost(
  db: Db,
  p: Principal,
  id: string,
  input: { action?: HostAction | undefined; via?: EgressVia | null | undefined },
): Promise<Result<HostEntry>> {
  // Read and write in one transaction, so a concurrent delete cannot be undone by this update.
  return change(db, p.environmentId, async (tx) => {
    const [entry] = await tx
      .select({ pattern: vaultHosts.pattern, action: vaultHosts.action })
      .from(vaultHosts)
      .where(and(eq(vaultHosts.environmentId, p.environmentId), eq(vaultHosts.id, id)));
    if (!entry) return notFound("host entry", id);
    return saveHost(tx, p, entry.pattern, input.action ?? entry.action, input.via);
  });
}

export async function deleteHost(db: Db, p: Principal, id: string): Promise<Result<null>> {
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

/** Allows the common package and source hosts; entries the user already has are left alone. */
export async function addStarterPack(
  db: Db,
  p: Principal,
): Promise<Result<{ added: string[]; kept: string[] }>> {
  return change(db, p.environmentId, async (tx) => {
    const added: string[] = [];
    const kept: string[] = [];
    for (const pattern of STARTER_PACK_HOSTS) {
      const rows = await tx
        .insert(vaultHosts)
        .values({ id: randomId("hst_"), environmentId: p.environmentId, pattern, action: "allow" })
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

export async function getSettings(db: Db, p: Principal): Promise<VaultSettingsInfo> {
  const [row] = await db
    .select({ default: vaultSettings.defaultAction, version: vaultSettings.version })
    .from(vaultSettings)
    .where(eq(vaultSettings.environmentId, p.environmentId));
  return row ?? { default: "allow", version: 0 };
}

export async function setDefault(
  db: Db,
  p: Principal,
  action: HostAction,
): Promise<Result<VaultSettingsInfo>> {
  const done = await change(db, p.environmentId, async (tx) => {
    await tx
      .update(vaultSettings)
      .set({ defaultAction: action })
      .where(eq(vaultSettings.environmentId, p.environmentId));
    return ok(null);
  });
  return done.ok ? ok(await getSettings(db, p)) : done;
}

// ---- the compiled view ----

export interface PolicyOptions {
  /** "local": the run egresses through the user's machine, which forces catch-all routing. */
  egress: RunEgress;
  /** The name of the model the run declares (a vault model), or none. */
  model?: string | null | undefined;
  /** The run's model budget, given to the lane with the model (none: no limit). */
  budget?: ModelBudget | null | undefined;
}

/**
 * What a run started now would get. Reads in one transaction so the version matches the rows,
 * the declared model's included; unknown_model when the vault has no model of that name.
 */
export async function readPolicy(db: Q, p: Principal, run: PolicyOptions): Promise<Result<PolicyDocument>> {
  return db.transaction(async (tx) => {
    const [settings] = await tx
      .select({ default: vaultSettings.defaultAction, version: vaultSettings.version })
      .from(vaultSettings)
      .where(eq(vaultSettings.environmentId, p.environmentId));
    const hosts = await tx
      .select({ pattern: vaultHosts.pattern, action: vaultHosts.action, via: vaultHosts.via })
      .from(vaultHosts)
      .where(eq(vaultHosts.environmentId, p.environmentId))
      .orderBy(asc(vaultHosts.pattern));
    const rules = (await ruleSelect(tx, p.environmentId)).map(toRule);
    const model = run.model ? await modelLane(tx, p.environmentId, run.model, run.budget ?? null) : null;
    if (run.model && !model) {
      return fail(
        "unknown_model",
        `No model named ${JSON.stringify(run.model)} in this vault; add it with POST /v1/vault/models.`,
      );
    }
    return compileVault(
      {
        version: settings?.version ?? 0,
        default: settings?.default ?? "allow",
        hosts,
        rules: rules.map((r) => ({ host: r.host, secret: r.secret, inject: r.inject })),
      },
      { egress: run.egress, model },
    );
  });
}

/**
 * compilePolicy as a Result: a stored rule that today's checks refuse is `invalid_host_pattern`,
 * saying which rule, so a run is not launched with it and its proxy never gets it (case I8).
 */
export function compileVault(vault: VaultSnapshot, run: RunOptions): Result<PolicyDocument> {
  const refused = refusedRule(vault.rules);
  if (refused !== null) {
    return fail(
      "invalid_host_pattern",
      `The vault's ${refused}. Remove the rule or narrow its host, then try again.`,
    );
  }
  return ok(compilePolicy(vault, run));
}

/** readPolicy for a caller that answers a request: an unknown model is its 400 unknown_model. */
export async function previewPolicy(db: Db, p: Principal, run: PolicyOptions): Promise<PolicyDocument> {
  return unwrap(await readPolicy(db, p, run));
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
  p: Principal,
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
