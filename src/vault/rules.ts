import { defaultPlaceholderEnv, PlaceholderPlace } from "@benchwright/shared/contract/placeholder";
import { InjectScheme, InjectSpec } from "@benchwright/shared/contract/policy";
import { patternCovers } from "@benchwright/shared/policy/host";
import { z } from "@hono/zod-openapi";
import { and, asc, eq } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { randomId } from "../crypto/api-keys";
import { vaultHosts, vaultRules, vaultSecrets } from "../db/schema";
import type { Db, Q, Tx } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { change, checkPattern, notFound } from "./change";
import { checkLimits, checkPlaceholderEnv, type LimitsInput, resolvePlaceholderEnv } from "./limits";
import { secretIdByName } from "./secrets";

// The vault's rules over Postgres, in order: for a request to a host, the first rule whose host
// matches injects its secret (named; the value stays in vault_secrets). A rule's host gets an
// implicit allow entry (with no limits) for as long as a rule names it. A rule may carry method
// and path limits and says where its placeholder goes (limits.ts). Every change is one vault
// change (change.ts), scoped by the owner's environment.

/** A rule as the API shows it (GET /v1/vault/rules): the one list of a rule's fields. */
export const Rule = z
  .object({
    id: z.string(),
    position: z.number().int(),
    host: z.string(),
    secret: z.string().openapi({ description: "The secret's name" }),
    inject: z.object({ scheme: InjectScheme, name: z.string() }),
    placeholderEnv: z.string().nullable().openapi({
      description:
        "The variable the run's sandboxes get this secret's placeholder in (the secret's name made portable unless the rule chose one); null: none",
    }),
    placeholderIn: z.array(PlaceholderPlace).openapi({
      description:
        '["body"]: the proxy swaps the placeholder in request bodies too; []: headers and query only',
    }),
    methods: z
      .array(z.string())
      .nullable()
      .openapi({ description: "The methods the rule's requests may use; null: any" }),
    paths: z
      .array(z.string())
      .nullable()
      .openapi({ description: "The paths (prefixes or globs) the rule's requests may use; null: any" }),
    createdAt: z.string().datetime(),
    updatedAt: z.string().datetime(),
  })
  .strict()
  .openapi("Rule");

/** A rule as read here: the API's Rule with its times as Dates (the route writes them as ISO). */
export type RuleInfo = Omit<z.infer<typeof Rule>, "createdAt" | "updatedAt"> & {
  createdAt: Date;
  updatedAt: Date;
};

const PlaceholderPlaces = z.array(PlaceholderPlace);

export interface RuleInput extends LimitsInput {
  host: string;
  secret: string;
  inject: { scheme: InjectScheme; name?: string | undefined };
  /** A variable name; null: no placeholder; undefined: the default (create) or as stored (update). */
  placeholderEnv?: string | null | undefined;
  placeholderIn?: readonly PlaceholderPlace[] | undefined;
}

/** The vault's rules in order, alone or inside a caller's transaction (the policy read's). */
export async function readRules(q: Q, environmentId: string): Promise<RuleInfo[]> {
  const rows = await q
    .select({
      id: vaultRules.id,
      position: vaultRules.position,
      host: vaultRules.hostPattern,
      secret: vaultSecrets.name,
      scheme: vaultRules.scheme,
      target: vaultRules.target,
      placeholder: vaultRules.placeholder,
      placeholderEnv: vaultRules.placeholderEnv,
      placeholderIn: vaultRules.placeholderIn,
      methods: vaultRules.methods,
      paths: vaultRules.paths,
      createdAt: vaultRules.createdAt,
      updatedAt: vaultRules.updatedAt,
    })
    .from(vaultRules)
    .innerJoin(vaultSecrets, eq(vaultSecrets.id, vaultRules.secretId))
    .where(eq(vaultRules.environmentId, environmentId))
    .orderBy(asc(vaultRules.position), asc(vaultRules.createdAt));
  return rows.map(({ scheme, target, placeholder, placeholderEnv, placeholderIn, ...r }) => ({
    ...r,
    inject: { scheme, name: target },
    placeholderEnv: resolvePlaceholderEnv({ secret: r.secret, placeholder, placeholderEnv }),
    placeholderIn: PlaceholderPlaces.parse(placeholderIn),
  }));
}

export async function listRules(db: Db, p: Owner): Promise<RuleInfo[]> {
  return readRules(db, p.environmentId);
}

export async function getRule(db: Db, p: Owner, id: string): Promise<Result<RuleInfo>> {
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

async function resolveRuleInput(tx: Tx, p: Owner, input: RuleInput) {
  const host = checkPattern(input.host, "rule");
  if (!host.ok) return host;
  const target = injectTarget(input.inject);
  if (!target.ok) return target;
  const secretId = await secretIdByName(tx, p.environmentId, input.secret);
  if (!secretId.ok) return secretId;
  const limits = checkLimits(input);
  if (!limits.ok) return limits;
  const env = input.placeholderEnv ? checkPlaceholderEnv(input.placeholderEnv) : ok(input.placeholderEnv);
  if (!env.ok) return env;
  const blocked = await blockingEntry(tx, p.environmentId, host.value);
  if (blocked) {
    return fail(
      "rule_host_blocked",
      `${host.value} is blocked by the host entry ${blocked}; a credential for it would never be sent. Remove or change that entry first.`,
    );
  }
  return ok({
    host: host.value,
    secretId: secretId.value,
    scheme: input.inject.scheme,
    target: target.value,
    ...limits.value,
    // The columns: placeholder false is none; placeholder_env null is the default name, which a
    // name equal to it is stored as (so it follows the rule's secret, and a form can go back).
    ...(env.value === undefined
      ? {}
      : {
          placeholder: env.value !== null,
          placeholderEnv: env.value === defaultPlaceholderEnv(input.secret) ? null : env.value,
        }),
    ...(input.placeholderIn === undefined ? {} : { placeholderIn: [...new Set(input.placeholderIn)] }),
  });
}

export async function createRule(
  db: Db,
  p: Owner,
  input: RuleInput & { position?: number | undefined },
): Promise<Result<RuleInfo>> {
  const id = randomId("rul_");
  const created = await change(db, p.environmentId, async (tx) => {
    const resolved = await resolveRuleInput(tx, p, input);
    if (!resolved.ok) return resolved;
    const existing = await readRules(tx, p.environmentId);
    const order = existing.map((r) => r.id);
    const at = Math.min(Math.max(input.position ?? order.length, 0), order.length);
    order.splice(at, 0, id);
    const { host, ...columns } = resolved.value;
    await tx
      .insert(vaultRules)
      .values({ id, environmentId: p.environmentId, position: at, hostPattern: host, ...columns });
    await writeOrder(tx, p.environmentId, order);
    await ensureImplicitAllow(tx, p.environmentId, resolved.value.host);
    return ok(null);
  });
  return created.ok ? getRule(db, p, id) : created;
}

export async function updateRule(
  db: Db,
  p: Owner,
  id: string,
  patch: Partial<RuleInput> & { position?: number | undefined },
): Promise<Result<RuleInfo>> {
  const updated = await change(db, p.environmentId, async (tx) => {
    const rows = await readRules(tx, p.environmentId);
    const current = rows.find((r) => r.id === id);
    if (!current) return notFound("rule", id);
    const resolved = await resolveRuleInput(tx, p, {
      host: patch.host ?? current.host,
      secret: patch.secret ?? current.secret,
      inject: patch.inject ?? current.inject,
      // Unset fields stay as stored (resolveRuleInput leaves their columns out).
      methods: patch.methods,
      paths: patch.paths,
      placeholderEnv: patch.placeholderEnv,
      placeholderIn: patch.placeholderIn,
    });
    if (!resolved.ok) return resolved;
    const { host, ...columns } = resolved.value;
    await tx
      .update(vaultRules)
      .set({ hostPattern: host, ...columns, updatedAt: new Date() })
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

export async function deleteRule(db: Db, p: Owner, id: string): Promise<Result<null>> {
  return change(db, p.environmentId, async (tx) => {
    const [deleted] = await tx
      .delete(vaultRules)
      .where(and(eq(vaultRules.environmentId, p.environmentId), eq(vaultRules.id, id)))
      .returning({ host: vaultRules.hostPattern });
    if (!deleted) return notFound("rule", id);
    await dropImplicitIfUnused(tx, p.environmentId, deleted.host);
    const rest = await readRules(tx, p.environmentId);
    await writeOrder(
      tx,
      p.environmentId,
      rest.map((r) => r.id),
    );
    return ok(null);
  });
}

/** Sets the whole order at once: `ids` must be exactly this vault's rule ids, each once. */
export async function reorderRules(db: Db, p: Owner, ids: string[]): Promise<Result<RuleInfo[]>> {
  const done = await change(db, p.environmentId, async (tx) => {
    const current = (await readRules(tx, p.environmentId)).map((r) => r.id);
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
