import { spawn } from "node:child_process";
import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, dirname, join } from "node:path";
import { build } from "esbuild";
import { inject } from "vitest";
import { configureNeonForNode, nodeDb } from "../../scripts/lib/neon-node";
import { provisionApiKey } from "../../src/auth/provision";
import { randomId } from "../../src/crypto/api-keys";

// The CLI as a user runs it: a child process of cli/bin/benchwright.cjs with its own config
// directory, talking to `wrangler dev` (test/setup/cli-stack.ts) over real HTTP.

const BIN = join(import.meta.dirname, "..", "..", "cli", "bin", "benchwright.cjs");

/**
 * The Node the CLI runs on: the suite's own (the project's Node 24), or BW_CLI_NODE, which
 * `npm test` sets for its second pass of this suite (Node 22, the oldest the CLI supports:
 * scripts/test.mjs). The suite itself and `wrangler dev` stay on the project's Node.
 */
export const CLI_NODE = process.env.BW_CLI_NODE || process.execPath;

/** PATH with CLI_NODE's folder first, so that `#!/usr/bin/env node` finds it too. */
export const CLI_PATH = `${dirname(CLI_NODE)}${delimiter}${process.env.PATH ?? ""}`;

export interface Result {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function apiUrl(): string {
  return inject("apiUrl");
}

/**
 * The CLI bundled from the current sources into a directory of its own, for a file that must not
 * read the cli project's cli/dist while that builds it. Returns the bundle's path.
 */
export async function buildCli(prefix = "bw-cli-bin-"): Promise<string> {
  const bin = join(mkdtempSync(join(tmpdir(), prefix)), "benchwright.cjs");
  await build({
    entryPoints: ["cli/src/main.ts"],
    bundle: true,
    platform: "node",
    target: "node22",
    format: "cjs",
    outfile: bin,
    logLevel: "warning",
  });
  return bin;
}

/** A private XDG_CONFIG_HOME per test, so no test sees another's login. */
export function configHome(): string {
  return mkdtempSync(join(tmpdir(), "bw-cli-home-"));
}

export function cli(
  args: string[],
  options: { home: string; input?: string; env?: Record<string, string>; bin?: string; cwd?: string },
): Promise<Result> {
  return new Promise((resolve, reject) => {
    const child = spawn(CLI_NODE, [options.bin ?? BIN, ...args], {
      cwd: options.cwd,
      // HOME too: a fallback to ~/.config must not find the developer's own login.
      env: { PATH: CLI_PATH, XDG_CONFIG_HOME: options.home, HOME: options.home, ...options.env },
      stdio: ["pipe", "pipe", "pipe"],
    });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => {
      stdout += d;
    });
    child.stderr.on("data", (d) => {
      stderr += d;
    });
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
    child.stdin.end(options.input ?? "");
  });
}

/** A fresh tenant: a user with one environment and an API key, made as create-user makes them. */
export async function newUser(): Promise<{ key: string; userId: string; environmentId: string }> {
  configureNeonForNode(inject("databaseWsProxy"));
  const { db, pool } = nodeDb(inject("databaseUrl"));
  try {
    return await provisionApiKey(db, { email: `${randomId("cli_")}@tenants.test` });
  } finally {
    await pool.end();
  }
}

/** The API itself, to check what the CLI did (never through the CLI). */
export async function api(key: string, path: string): Promise<{ status: number; text: string }> {
  const res = await fetch(`${apiUrl()}${path}`, { headers: { authorization: `Bearer ${key}` } });
  return { status: res.status, text: await res.text() };
}

/** A user logged in through the CLI in their own config directory. */
export async function loggedIn() {
  const user = await newUser();
  const home = configHome();
  const login = await cli(["login", "--url", apiUrl()], { home, input: `${user.key}\n` });
  if (login.code !== 0) throw new Error(`login failed: ${login.stderr}`);
  return { ...user, home };
}
