import type { KeyRing } from "@benchwright/shared/contract/key-ring";
import { consoleLog } from "@benchwright/shared/contract/log";
import { describeIssues, PolicyEnvelope } from "@benchwright/shared/contract/proxy-wire";
import { budgetOf, readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { and, eq, inArray } from "drizzle-orm";
import { decryptSecret, VaultDecryptError } from "../crypto/vault-crypto";
import { runs, vaultSecrets, vaultSettings } from "../db/schema";
import type { Q } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { readPolicy } from "../vault/policy";
import type { RunOwner } from "./proxy-credentials";

// A run's view of its vault: the policy compiled now (with the run's egress option and declared
// model and its budget) and the values of exactly the secrets its rules and its model lane name.
// Read by the coordinator at run start (a failure stops the run before any benchmark code, E1)
// and served to the run's proxy over the internal API, and only there.

/** A vault change between the reads of one compile makes it read again, this many times at most. */
const COMPILE_ATTEMPTS = 3;

export async function vaultVersion(db: Q, environmentId: string): Promise<number> {
  const [row] = await db
    .select({ version: vaultSettings.version })
    .from(vaultSettings)
    .where(eq(vaultSettings.environmentId, environmentId));
  return row?.version ?? 0;
}

/**
 * The run's policy envelope, compiled now from its environment's vault (the same compile as the
 * preview, with the run's egress and declared model), with the values of exactly the secrets its
 * rules and model lane name. All or nothing: a secret that does not decrypt, or a declared model
 * the vault no longer has, fails the whole envelope (vault_unreadable), so the proxy keeps what it
 * has rather than enforce a partial policy, and a run not yet started stops before any code runs.
 */
export async function runPolicyEnvelope(
  db: Q,
  keyRing: KeyRing,
  run: RunOwner,
): Promise<Result<PolicyEnvelope>> {
  const [row] = await db.select({ spec: runs.spec }).from(runs).where(eq(runs.id, run.id));
  if (!row) return fail("not_found", "No such run.");
  const spec = readStoredSpec(row.spec);
  const egress = spec.egress;
  const model = spec.model ?? null;
  const budget = budgetOf(spec);
  for (let attempt = 0; attempt < COMPILE_ATTEMPTS; attempt++) {
    const read = await readPolicy(db, run, { egress, model, budget });
    if (!read.ok && read.error.code !== "unknown_model") return read;
    if (!read.ok) {
      // Checked at launch, so deleted or renamed since.
      return fail(
        "vault_unreadable",
        `The run's model ${JSON.stringify(model)} is missing from the vault (deleted or renamed after the run was launched), so its model lane cannot be set up.`,
      );
    }
    const policy = read.value;
    const names = [
      ...new Set([...policy.rules.map((r) => r.secret), ...(policy.model ? [policy.model.secret] : [])]),
    ];
    const rows =
      names.length === 0
        ? []
        : await db
            .select({ id: vaultSecrets.id, name: vaultSecrets.name, ciphertext: vaultSecrets.ciphertext })
            .from(vaultSecrets)
            .where(and(eq(vaultSecrets.environmentId, run.environmentId), inArray(vaultSecrets.name, names)));
    // Every vault change bumps the version in its transaction, and this read comes after the
    // secrets': the same version means the secrets belong to the compiled rules.
    if ((await vaultVersion(db, run.environmentId)) !== policy.version) continue;
    const secrets: Record<string, string> = {};
    for (const secret of rows) {
      try {
        secrets[secret.name] = await decryptSecret(
          keyRing,
          { userId: run.userId, environmentId: run.environmentId, secretId: secret.id },
          secret.ciphertext,
        );
      } catch (error) {
        if (!(error instanceof VaultDecryptError)) throw error;
        // Ids and the reason only; the message of a decrypt error never holds a value either.
        consoleLog("error", {
          event: "vault_unreadable",
          runId: run.id,
          secretId: secret.id,
          reason: error.reason,
          keyId: error.keyId ?? null,
        });
        return fail(
          "vault_unreadable",
          `The secret ${secret.name} of this run's vault could not be decrypted (${error.reason}).`,
        );
      }
    }
    const envelope = PolicyEnvelope.safeParse({ policy, secrets });
    if (!envelope.success) {
      // Paths and messages only: zod's messages do not quote the values.
      return fail(
        "vault_unreadable",
        `The policy envelope is invalid: ${describeIssues(envelope.error.issues)}`,
      );
    }
    return ok(envelope.data);
  }
  return fail("vault_unreadable", "The vault changed during every read of it; retry.");
}
