import { chmodSync, mkdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { basename, dirname, join } from "node:path";

// Where `benchwright login` keeps the API's URL and key: private to the user (dir 0700, file
// 0600), written whole through a rename so a reader never sees half a file. One file per profile
// (a deployment the user logs in to: staging, production...), so logging in to one never
// rewrites another's key. The default profile is config.json, where a login made before profiles
// existed already is; a named one is profiles/<name>.json.

export interface Config {
  url: string;
  key: string;
}

export const DEFAULT_PROFILE = "default";

// Lower case only: on a case-insensitive file system (macOS) "Prod" and "prod" would be one file.
const PROFILE_NAME = /^[a-z0-9][a-z0-9_-]{0,39}$/;

/**
 * The profile a command uses: --profile, else BENCHWRIGHT_PROFILE, else the default. Null when
 * the name chosen is not a profile name (it becomes a file name, so no `/` or `..`).
 */
export function profileOf(flag: string | undefined, env: NodeJS.ProcessEnv): string | null {
  const name = flag ?? (env.BENCHWRIGHT_PROFILE || DEFAULT_PROFILE);
  return PROFILE_NAME.test(name) ? name : null;
}

export function configPath(env: NodeJS.ProcessEnv = process.env, profile = DEFAULT_PROFILE): string {
  const base = join(env.XDG_CONFIG_HOME || join(homedir(), ".config"), "benchwright");
  return profile === DEFAULT_PROFILE ? join(base, "config.json") : join(base, "profiles", `${profile}.json`);
}

export function readConfig(path: string): Config | null {
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch {
    return null;
  }
  try {
    const parsed = JSON.parse(text) as Partial<Config>;
    if (typeof parsed.url === "string" && typeof parsed.key === "string" && parsed.key) {
      return { url: parsed.url, key: parsed.key };
    }
  } catch {}
  return null;
}

export function writeConfig(path: string, config: Config): void {
  const dir = dirname(path);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  // A named profile's folder and the one that holds it (an older one may be 0755).
  for (const made of basename(dir) === "profiles" ? [dir, dirname(dir)] : [dir]) chmodSync(made, 0o700);
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(config, null, 2)}\n`, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, path);
}

/** Forgets a saved login. False when there was none. */
export function removeConfig(path: string): boolean {
  try {
    rmSync(path);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw error;
  }
}
