import type { Schemas } from "../api";
import { reserveSecretFile } from "../io";
import { api, type Ctx, Failed, nextPage, oneOf, type PageOptions, print, table, UsageError } from "./shared";

// `benchwright keys ...`: the environment's API keys (POST/GET/DELETE /v1/api-keys, case K3).
// A new key is shown by the API once. It goes to a new 0600 file (--out), or to standard output
// when asked (--print, for `KEY=$(benchwright keys create ci --print)`); never both, never by
// default, so it does not land in a terminal's scrollback or a CI log by accident.

type ApiKey = Schemas["ApiKey"];
type WithKey = Schemas["ApiKeyWithSecret"];

export interface CreateOptions {
  scope?: string | undefined;
  expiresIn?: string | undefined;
  expiresAt?: string | undefined;
  out?: string | undefined;
  print?: boolean | undefined;
}

/** Checked before anything is sent: a key the API shows once must have somewhere to go. */
function target(opts: CreateOptions): { out: string } | { print: true } {
  if (opts.out && opts.print) throw new UsageError("give --out PATH or --print, not both");
  if (opts.out) return { out: opts.out };
  if (opts.print) return { print: true };
  throw new UsageError(
    "--out PATH or --print is required: the key is shown only once.\n" +
      "--out writes it to a new file (mode 0600); --print writes it to standard output",
  );
}

const expiry = (k: ApiKey) => k.expiresAt ?? "never";

function describe(k: ApiKey): string[] {
  return [
    `${k.id}  ${k.name}`,
    `prefix     ${k.prefix}`,
    `scope      ${k.scope}`,
    `created    ${k.createdAt}`,
    `expires    ${expiry(k)}`,
  ];
}

export async function keysCreate(ctx: Ctx, name: string, opts: CreateOptions): Promise<void> {
  const to = target(opts);
  const scope = oneOf(opts.scope, ["read", "full"] as const, "--scope");
  const client = api(ctx);
  // The file first: a key the API makes must not be left with nowhere to go.
  const file = "out" in to ? reserveSecretFile(to.out) : null;
  let made: WithKey;
  try {
    made = await client.call("post", "/v1/api-keys", {
      body: {
        name,
        ...(scope ? { scope } : {}),
        ...(opts.expiresIn ? { expiresIn: opts.expiresIn } : {}),
        ...(opts.expiresAt ? { expiresAt: opts.expiresAt } : {}),
      },
    });
  } catch (error) {
    file?.discard();
    throw error;
  }
  const { key, ...rest } = made;
  if (!key) {
    file?.discard();
    throw new Failed(`the API did not send ${made.id}'s key; revoke it and make another`);
  }
  if ("print" in to) {
    if (ctx.json) ctx.out(JSON.stringify(made, null, 2));
    else {
      ctx.out(key);
      for (const line of describe(made)) ctx.err(line);
    }
    return;
  }
  file?.write(key);
  print(ctx, { ...rest, keyFile: to.out }, () => [
    ...describe(made),
    `key written to ${to.out} (shown only this once)`,
  ]);
}

export async function keysList(ctx: Ctx, page: PageOptions): Promise<void> {
  const res = await api(ctx).call("get", "/v1/api-keys", { query: page });
  print(ctx, res, () => [
    ...(res.apiKeys.length === 0
      ? ["no API keys"]
      : table([
          ["ID", "NAME", "PREFIX", "SCOPE", "STATE", "CREATED", "LAST USED", "EXPIRES"],
          ...res.apiKeys.map((k) => [
            k.current ? `${k.id} *` : k.id,
            k.name,
            k.prefix,
            k.scope,
            k.state,
            k.createdAt,
            k.lastUsedAt ?? "-",
            expiry(k),
          ]),
        ])),
    ...nextPage(res.nextCursor),
  ]);
}

export async function keysRevoke(ctx: Ctx, id: string): Promise<void> {
  await api(ctx).call("delete", "/v1/api-keys/{id}", { params: { id } });
  print(ctx, { id, revoked: true }, () => [`revoked ${id}: it and its sessions are refused from now on`]);
}
