import type { HostAction } from "@benchwright/shared/contract/policy";
import { eq } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { vaultSettings } from "../db/schema";
import type { Db, Q } from "../db/types";
import { ok, type Result } from "../errors";
import { change } from "./change";

// The vault's settings: the default for hosts no entry names, and the version every vault
// change bumps (change.ts). A vault nobody has written yet has no row: allow, version 0.

export interface VaultSettingsInfo {
  default: HostAction;
  version: number;
}

/** The settings, alone or inside a caller's transaction (the policy read's). */
export async function readSettings(q: Q, environmentId: string): Promise<VaultSettingsInfo> {
  const [row] = await q
    .select({ default: vaultSettings.defaultAction, version: vaultSettings.version })
    .from(vaultSettings)
    .where(eq(vaultSettings.environmentId, environmentId));
  return row ?? { default: "allow", version: 0 };
}

export async function getSettings(db: Db, p: Owner): Promise<VaultSettingsInfo> {
  return readSettings(db, p.environmentId);
}

export async function setDefault(db: Db, p: Owner, action: HostAction): Promise<Result<VaultSettingsInfo>> {
  const done = await change(db, p.environmentId, async (tx) => {
    await tx
      .update(vaultSettings)
      .set({ defaultAction: action })
      .where(eq(vaultSettings.environmentId, p.environmentId));
    return ok(null);
  });
  return done.ok ? ok(await getSettings(db, p)) : done;
}
