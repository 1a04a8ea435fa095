import { chmodSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { homedir } from "node:os";
import { join } from "node:path";

// Where `benchwright login` keeps the API's URL and key: private to the user (dir 0700, file
// 0600), written whole through a rename so a reader never sees half a file.

export interface Config {
  url: string;
  key: string;
}

export function configPath(env: NodeJS.ProcessEnv = process.env): string {
  const base = env.XDG_CONFIG_HOME || join(homedir(), ".config");
  return join(base, "benchwright", "config.json");
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
  const dir = join(path, "..");
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
  const tmp = `${path}.${process.pid}.tmp`;
  writeFileSync(tmp, `${JSON.stringify(config, null, 2)}\n`, { mode: 0o600 });
  chmodSync(tmp, 0o600);
  renameSync(tmp, path);
}
