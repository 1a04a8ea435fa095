import type { ModelBudget, PolicyDocument, RunEgress } from "@benchwright/shared/contract/policy";
import {
  compilePolicy,
  type RunOptions,
  refusedRule,
  type VaultSnapshot,
} from "@benchwright/shared/policy/compile";
import { asc, eq } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { vaultHosts } from "../db/schema";
import type { Db, Q } from "../db/types";
import { fail, ok, type Result, unwrap } from "../errors";
import { modelLane } from "./models";
import { readRules } from "./rules";
import { readSettings } from "./settings";

// The compiled view of a vault: what a run started now would get (compilePolicy over the
// settings, host entries, rules and the declared model, read together). Each rule carries its
// resolved placeholder variable (rules.ts) and its limits; host entries their limits.

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
export async function readPolicy(db: Q, p: Owner, run: PolicyOptions): Promise<Result<PolicyDocument>> {
  return db.transaction(async (tx) => {
    const settings = await readSettings(tx, p.environmentId);
    const hosts = await tx
      .select({
        pattern: vaultHosts.pattern,
        action: vaultHosts.action,
        via: vaultHosts.via,
        methods: vaultHosts.methods,
        paths: vaultHosts.paths,
      })
      .from(vaultHosts)
      .where(eq(vaultHosts.environmentId, p.environmentId))
      .orderBy(asc(vaultHosts.pattern));
    const rules = await readRules(tx, p.environmentId);
    const model = run.model ? await modelLane(tx, p.environmentId, run.model, run.budget ?? null) : null;
    if (run.model && !model) {
      return fail(
        "unknown_model",
        `No model named ${JSON.stringify(run.model)} in this vault; add it with POST /v1/vault/models.`,
      );
    }
    return compileVault(
      {
        version: settings.version,
        default: settings.default,
        hosts,
        rules: rules.map((r) => ({
          host: r.host,
          secret: r.secret,
          inject: r.inject,
          placeholderEnv: r.placeholderEnv,
          placeholderIn: r.placeholderIn,
          methods: r.methods,
          paths: r.paths,
        })),
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
export async function previewPolicy(db: Db, p: Owner, run: PolicyOptions): Promise<PolicyDocument> {
  return unwrap(await readPolicy(db, p, run));
}
