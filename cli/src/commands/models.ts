import { type Api, ApiError } from "../api";
import { api, type Ctx, print, table, UsageError } from "./shared";

// `benchwright vault models ...`: the models a run may declare. The fields go to the API as given
// (provider, baseUrl, ...): the API validates them, so the CLI need not change when the set of
// providers does. Untyped calls for the same reason: this file reads only the fields it prints.

interface Model {
  id: string;
  name: string;
  provider: string;
  baseUrl?: string | null;
  upstreamModel?: string;
  secret: string;
}

export interface ModelFields {
  name?: string | undefined;
  provider?: string | undefined;
  baseUrl?: string | undefined;
  upstreamModel?: string | undefined;
  secret?: string | undefined;
}

/** The body: only the fields given (the flags' names are the API's). */
function body(f: ModelFields): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(f)) if (v !== undefined) out[k] = v;
  return out;
}

const row = (m: Model) => [m.id, m.name, m.provider, m.baseUrl ?? "", m.upstreamModel ?? m.name, m.secret];

/** A model by id (mdl_...) or by name. */
async function resolve(client: Api, ref: string): Promise<Model> {
  if (ref.startsWith("mdl_"))
    return client.json<Model>("get", "/v1/vault/models/{id}", { params: { id: ref } });
  const { models } = await client.json<{ models: Model[] }>("get", "/v1/vault/models");
  const found = models.find((m) => m.name === ref);
  if (!found) throw new ApiError(404, "not_found", `no model named ${ref}`, null);
  return found;
}

export async function modelsList(ctx: Ctx): Promise<void> {
  const res = await api(ctx).json<{ models: Model[] }>("get", "/v1/vault/models");
  print(ctx, res, () =>
    res.models.length === 0
      ? ["no models"]
      : table([["ID", "NAME", "PROVIDER", "BASE URL", "UPSTREAM", "SECRET"], ...res.models.map(row)]),
  );
}

export async function modelsAdd(ctx: Ctx, name: string, fields: ModelFields): Promise<void> {
  if (fields.provider === undefined) throw new UsageError("--provider is required");
  if (fields.secret === undefined) throw new UsageError("--secret NAME (a vault secret's name) is required");
  const made = await api(ctx).json<Model>("post", "/v1/vault/models", { body: body({ ...fields, name }) });
  print(ctx, made, () => [`added ${made.id}: ${made.name} (${made.provider}) with secret ${made.secret}`]);
}

export async function modelsShow(ctx: Ctx, ref: string): Promise<void> {
  const m = await resolve(api(ctx), ref);
  print(ctx, m, () => table([["ID", "NAME", "PROVIDER", "BASE URL", "UPSTREAM", "SECRET"], row(m)]));
}

export async function modelsUpdate(ctx: Ctx, ref: string, fields: ModelFields): Promise<void> {
  const patch = body(fields);
  if (Object.keys(patch).length === 0) {
    throw new UsageError(
      "nothing to change: give --name, --provider, --base-url, --upstream-model or --secret",
    );
  }
  const client = api(ctx);
  const { id } = await resolve(client, ref);
  const m = await client.json<Model>("patch", "/v1/vault/models/{id}", { params: { id }, body: patch });
  print(ctx, m, () => [`updated ${m.id}: ${m.name} (${m.provider}) with secret ${m.secret}`]);
}

export async function modelsRemove(ctx: Ctx, ref: string): Promise<void> {
  const client = api(ctx);
  const { id, name } = await resolve(client, ref);
  await client.json("delete", "/v1/vault/models/{id}", { params: { id } });
  print(ctx, { id, deleted: true }, () => [`removed ${id} (${name})`]);
}
