import { splitHostPort } from "@benchwright/shared/contract/host-name";
import type { ModelBudget, ModelLaneSpec, ModelProvider } from "@benchwright/shared/contract/policy";
import { and, asc, eq, type SQL } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { randomId } from "../crypto/api-keys";
import { vaultModels, vaultSecrets } from "../db/schema";
import type { Db, Q, Tx } from "../db/types";
import { fail, ok, type Result } from "../errors";
import { change, notFound } from "./change";
import { secretIdByName } from "./secrets";

// Models a run may declare (the model lane), in the vault: one per name, each naming a provider
// (PROVIDERS), its base URL and the secret it authenticates with (by name; the value stays in
// vault_secrets). Every write is a vault change (change.ts), so a run's compile sees it whole.

// The control plane's side of each model provider (the proxy's side, how a call authenticates
// and which format it speaks, is proxy-image/src/proxy/model/providers.ts): where its API is when the
// vault model names no base URL, and how to say to a person what the lane does with the key.
// One row per provider, so a new provider is a row here and one there.

export interface ProviderFacts {
  /** The API base used when the model gives none; null: the model must give one. */
  defaultBaseUrl: string | null;
  /** How the lane sends the model's secret, for people (the vault page, the docs). */
  auth: string;
}

export const PROVIDERS: Readonly<Record<ModelProvider, ProviderFacts>> = {
  openai: { defaultBaseUrl: "https://api.openai.com/v1", auth: "Authorization: Bearer" },
  // OpenRouter, vLLM, a gateway...: nothing to default to.
  "openai-compatible": { defaultBaseUrl: null, auth: "Authorization: Bearer" },
  anthropic: {
    defaultBaseUrl: "https://api.anthropic.com/v1",
    auth: "x-api-key, with anthropic-version",
  },
};

export interface ModelInfo {
  id: string;
  name: string;
  provider: ModelProvider;
  baseUrl: string;
  upstreamModel: string;
  /** The secret's name; its value is never part of a model. */
  secret: string;
  createdAt: Date;
  updatedAt: Date;
}

// ---- models a run may declare (the model lane) ----

export interface ModelInput {
  name: string;
  provider: ModelProvider;
  /** Default: the provider's (PROVIDERS); openai-compatible has none, so it must be given. */
  baseUrl?: string | undefined;
  /** Default: the name. */
  upstreamModel?: string | undefined;
  /** A secret's name in this vault. */
  secret: string;
}

const MAX_BASE_URL_LENGTH = 2048;

/**
 * A model's base URL, canonical: https, a canonical host (and a port other than 443), the path
 * without a trailing slash; no user info, query or fragment. The input is never quoted back: a
 * URL with user info may carry a credential.
 */
export function canonicalBaseUrl(input: string): Result<string> {
  const bad = (why: string) => fail("invalid_base_url", `baseUrl: ${why}.`);
  if (input.length === 0 || input.length > MAX_BASE_URL_LENGTH) {
    return bad(`1 to ${MAX_BASE_URL_LENGTH} characters`);
  }
  // The URL parser would silently drop tabs, newlines and edge spaces: refuse them instead.
  if (!/^[\x21-\x7e]+$/.test(input)) return bad("printable ASCII without spaces");
  if (!/^https:\/\//i.test(input)) return bad("must be an https:// URL");
  const authority = input.slice("https://".length).split("/")[0] ?? "";
  if (authority.includes("@")) {
    return bad("no user name or password in the URL; keep the key in a vault secret and name it");
  }
  if (input.includes("?") || input.includes("#")) return bad("no query string or fragment");
  let url: URL;
  try {
    url = new URL(input);
  } catch {
    return bad("not a URL");
  }
  if (url.protocol !== "https:" || url.username !== "" || url.password !== "") {
    return bad("must be an https:// URL without user info");
  }
  const host = splitHostPort(url.host);
  if (!host) return bad("not a valid host");
  const port = host.port === null || host.port === 443 ? "" : `:${host.port}`;
  const path = url.pathname.replace(/\/+$/, "");
  return ok(`https://${host.host}${port}${path}`);
}

function modelSelect(q: Q, environmentId: string, also?: SQL) {
  return q
    .select({
      id: vaultModels.id,
      name: vaultModels.name,
      provider: vaultModels.provider,
      baseUrl: vaultModels.baseUrl,
      upstreamModel: vaultModels.upstreamModel,
      secret: vaultSecrets.name,
      createdAt: vaultModels.createdAt,
      updatedAt: vaultModels.updatedAt,
    })
    .from(vaultModels)
    .innerJoin(vaultSecrets, eq(vaultSecrets.id, vaultModels.secretId))
    .where(and(eq(vaultModels.environmentId, environmentId), also))
    .orderBy(asc(vaultModels.name));
}

export async function listModels(db: Db, p: Owner): Promise<ModelInfo[]> {
  return modelSelect(db, p.environmentId);
}

export async function getModel(db: Db, p: Owner, id: string): Promise<Result<ModelInfo>> {
  const [row] = await modelSelect(db, p.environmentId, eq(vaultModels.id, id));
  return row ? ok(row) : notFound("model", id);
}

/**
 * The model a run declares, by name, as the proxy's model lane is given it, with the run's budget
 * (modelBudget; null: none); null if the vault has no such model.
 */
export async function modelLane(
  q: Q,
  environmentId: string,
  name: string,
  budget: ModelBudget | null = null,
): Promise<ModelLaneSpec | null> {
  const [row] = await modelSelect(q, environmentId, eq(vaultModels.name, name));
  return row
    ? {
        name: row.name,
        provider: row.provider,
        baseUrl: row.baseUrl,
        upstreamModel: row.upstreamModel,
        secret: row.secret,
        budget,
      }
    : null;
}

/** Whether the vault has a model of this name (a run may declare it). */
export async function hasModel(q: Q, environmentId: string, name: string): Promise<boolean> {
  const [row] = await q
    .select({ id: vaultModels.id })
    .from(vaultModels)
    .where(and(eq(vaultModels.environmentId, environmentId), eq(vaultModels.name, name)));
  return row !== undefined;
}

async function resolveModelInput(tx: Tx, p: Owner, input: ModelInput) {
  const given = input.baseUrl ?? PROVIDERS[input.provider].defaultBaseUrl;
  if (given === null) {
    return fail(
      "base_url_required",
      `baseUrl: a ${input.provider} model needs its API's base URL (e.g. https://openrouter.ai/api/v1).`,
    );
  }
  const baseUrl = canonicalBaseUrl(given);
  if (!baseUrl.ok) return baseUrl;
  const secretId = await secretIdByName(tx, p.environmentId, input.secret);
  if (!secretId.ok) return secretId;
  return ok({
    name: input.name,
    provider: input.provider,
    baseUrl: baseUrl.value,
    upstreamModel: input.upstreamModel ?? input.name,
    secretId: secretId.value,
  });
}

const modelExists = (name: string) =>
  fail("model_exists", `A model named ${name} exists in this vault; change it with PATCH.`);

export async function createModel(db: Db, p: Owner, input: ModelInput): Promise<Result<ModelInfo>> {
  const id = randomId("mdl_");
  const created = await change(db, p.environmentId, async (tx) => {
    const resolved = await resolveModelInput(tx, p, input);
    if (!resolved.ok) return resolved;
    const rows = await tx
      .insert(vaultModels)
      .values({ id, environmentId: p.environmentId, ...resolved.value })
      .onConflictDoNothing()
      .returning({ id: vaultModels.id });
    return rows.length > 0 ? ok(null) : modelExists(input.name);
  });
  return created.ok ? getModel(db, p, id) : created;
}

export async function updateModel(
  db: Db,
  p: Owner,
  id: string,
  patch: Partial<ModelInput>,
): Promise<Result<ModelInfo>> {
  const updated = await change(db, p.environmentId, async (tx) => {
    const [current] = await modelSelect(tx, p.environmentId, eq(vaultModels.id, id));
    if (!current) return notFound("model", id);
    // A new provider without a base URL: a URL that was the old provider's default follows the
    // provider (to the new one's default, or base_url_required); a URL the user gave stays.
    const provider = patch.provider ?? current.provider;
    const wasDefault = current.baseUrl === PROVIDERS[current.provider].defaultBaseUrl;
    const resolved = await resolveModelInput(tx, p, {
      name: patch.name ?? current.name,
      provider,
      baseUrl: patch.baseUrl ?? (provider !== current.provider && wasDefault ? undefined : current.baseUrl),
      upstreamModel: patch.upstreamModel ?? current.upstreamModel,
      secret: patch.secret ?? current.secret,
    });
    if (!resolved.ok) return resolved;
    // Writers of one vault are serialised by the version bump, so this check cannot race.
    if (resolved.value.name !== current.name && (await hasModel(tx, p.environmentId, resolved.value.name))) {
      return modelExists(resolved.value.name);
    }
    await tx
      .update(vaultModels)
      .set({ ...resolved.value, updatedAt: new Date() })
      .where(and(eq(vaultModels.environmentId, p.environmentId), eq(vaultModels.id, id)));
    return ok(null);
  });
  return updated.ok ? getModel(db, p, id) : updated;
}

/** Runs that declare it and have not read their vault yet stop before any code (model missing). */
export async function deleteModel(db: Db, p: Owner, id: string): Promise<Result<null>> {
  return change(db, p.environmentId, async (tx) => {
    const deleted = await tx
      .delete(vaultModels)
      .where(and(eq(vaultModels.environmentId, p.environmentId), eq(vaultModels.id, id)))
      .returning({ id: vaultModels.id });
    return deleted.length > 0 ? ok(null) : notFound("model", id);
  });
}
