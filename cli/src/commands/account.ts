import { Api } from "../api";
import { type Config, configPath, writeConfig } from "../config";
import { readSecret } from "../io";
import { api, apiBase, type Ctx, DEFAULT_URL, print, UsageError } from "./shared";

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
  const path = configPath(ctx.env);
  writeConfig(path, config);
  print(ctx, me, () => [
    `logged in to ${url} as ${me.userId} (environment ${me.environmentId})`,
    `saved ${path}`,
  ]);
}

export async function whoami(ctx: Ctx): Promise<void> {
  const client = api(ctx);
  const me = await client.call("get", "/v1/me");
  print(ctx, me, () => [
    `url          ${client.url}`,
    `user         ${me.userId}`,
    `environment  ${me.environmentId}`,
    `key          ${me.keyId}`,
  ]);
}
