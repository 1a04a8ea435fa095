import { Api, ApiError } from "../api";
import { type Config, configPath, readConfig, removeConfig, writeConfig } from "../config";
import { readSecret } from "../io";
import { api, apiBase, type Ctx, DEFAULT_URL, Failed, print, UsageError } from "./shared";

export async function login(ctx: Ctx, opts: { url?: string; positionals: string[] }): Promise<void> {
  if (opts.positionals.length > 0) {
    throw new UsageError(
      "an API key is never an argument (shell history, process lists): pipe it, e.g.\n" +
        '  printf %s "$BW_KEY" | benchwright login --url URL\nor run benchwright login and paste it at the prompt',
    );
  }
  // Before the key is even read: nothing is sent over plain http to another machine (K5).
  const url = apiBase(opts.url ?? DEFAULT_URL, "--url");
  const key = (await readSecret(`API key for ${url}: `)).trim();
  if (!key) throw new UsageError("no API key was given (standard input was empty)");
  const me = await new Api(url, key).call("get", "/v1/me");
  const config: Config = { url, key };
  const path = configPath(ctx.env, ctx.profile);
  writeConfig(path, config);
  print(ctx, me, () => [
    `logged in to ${url} as ${me.userId} (environment ${me.environmentId})`,
    `saved ${path} (profile ${ctx.profile})`,
  ]);
}

/**
 * Forgets the profile's saved key; with --revoke the API refuses it first, so a copy of the file
 * (a backup, another machine) is no use either. A key the API already refuses is forgotten all the
 * same; any other failure keeps the file, so the key is neither lost nor left working unseen.
 * BENCHWRIGHT_API_KEY is the caller's own variable: never revoked here, only mentioned.
 */
export async function logout(ctx: Ctx, opts: { revoke: boolean }): Promise<void> {
  const path = configPath(ctx.env, ctx.profile);
  const saved = readConfig(path);
  let revoked: string | null = null;
  if (saved && opts.revoke) {
    const client = new Api(apiBase(saved.url, `the URL saved in ${path}`), saved.key);
    try {
      const me = await client.call("get", "/v1/me");
      await client.call("delete", "/v1/api-keys/{id}", { params: { id: me.keyId } });
      revoked = me.keyId;
    } catch (error) {
      if (!(error instanceof ApiError && error.code === "unauthorized")) {
        const why = error instanceof ApiError ? `${error.code}: ${error.detail}` : (error as Error).message;
        throw new Failed(
          `the key saved in ${path} was not revoked (${why}); it is still saved. ` +
            "Revoke it with benchwright keys revoke (another key), or run logout without --revoke",
        );
      }
    }
  }
  const removed = removeConfig(path);
  print(ctx, { profile: ctx.profile, path, removed, revokedKeyId: revoked }, () => [
    removed ? `logged out: removed ${path} (profile ${ctx.profile})` : `not logged in (no ${path})`,
    ...(revoked ? [`revoked ${revoked}: the API refuses it from now on`] : []),
    ...(ctx.env.BENCHWRIGHT_API_KEY ? ["BENCHWRIGHT_API_KEY is still set in this shell"] : []),
  ]);
}

export async function whoami(ctx: Ctx): Promise<void> {
  const client = api(ctx);
  const me = await client.call("get", "/v1/me");
  print(ctx, me, () => [
    `profile      ${ctx.profile}`,
    `url          ${client.url}`,
    `user         ${me.userId}`,
    `environment  ${me.environmentId}`,
    `key          ${me.keyId}`,
  ]);
}
