import { Api } from "../api";
import { configPath, DEFAULT_PROFILE, readConfig } from "../config";

// What every command shares: the context it prints through, the client of the API it is logged
// in to, and the errors that map to the CLI's exit codes (cli/src/main.ts).

export const DEFAULT_URL = "http://127.0.0.1:8787";
/**
 * The file a benchmark folder describes its run in: a RunSpec, as POST /v1/runs takes it, plus
 * the CLI's own `files` (what to pack).
 */
export const SPEC_FILE = "benchwright.json";

/** Exit 2: the command line is wrong; nothing was sent. */
export class UsageError extends Error {}
/** Exit 3: no API key (run `benchwright login`, or set BENCHWRIGHT_API_KEY). */
export class NotLoggedIn extends Error {}
/** Exit 4: the run a command waited for ended without every command exiting 0. */
export class RunNotCompleted extends Error {}

export interface Ctx {
  json: boolean;
  out: (line: string) => void;
  /** Progress for people (standard error), never part of what --json prints. */
  err: (line: string) => void;
  env: NodeJS.ProcessEnv;
  /** The saved login commands use (--profile, else BENCHWRIGHT_PROFILE, else the default). */
  profile: string;
}

/**
 * The API's base URL, checked before any key goes to it (K5): https, or plain http to this machine
 * only (127.0.0.0/8, ::1, localhost: `npm start`'s stack). A key sent over plain http to another
 * host can be read by anyone on the path. `from` names where the URL came from, for the message.
 */
export function apiBase(text: string, from: string): string {
  let url: URL;
  try {
    url = new URL(text);
  } catch {
    throw new UsageError(`${from} ${text} is not a URL`);
  }
  if (url.username || url.password || url.search || url.hash) {
    throw new UsageError(`${from} must be the API's base URL (no user, password, query or fragment)`);
  }
  if (url.protocol === "http:" && !isLoopback(url.hostname)) {
    throw new UsageError(
      `${from} ${url.origin} is plain http:// to another machine: your API key would cross the network ` +
        "unencrypted. Use https:// (plain http:// only to this machine: 127.0.0.1, ::1, localhost)",
    );
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new UsageError(`${from} must be an https:// URL`);
  }
  return `${url.origin}${url.pathname.replace(/\/+$/, "")}`;
}

function isLoopback(hostname: string): boolean {
  const host = hostname.replace(/^\[|\]$/g, "").toLowerCase();
  if (host === "localhost" || host === "::1") return true;
  // WHATWG URL parsing has already made any IPv4 form (0x7f.1, 2130706433) dotted decimal.
  return /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(host);
}

/**
 * The API the user is logged in to. BENCHWRIGHT_API_KEY (with BENCHWRIGHT_URL, else the saved
 * URL, else the default) is for scripts and CI; the URL alone never overrides the saved one, so a
 * stray variable cannot send the saved key to another host.
 */
export function api(ctx: Ctx): Api {
  const path = configPath(ctx.env, ctx.profile);
  const saved = readConfig(path);
  const envKey = ctx.env.BENCHWRIGHT_API_KEY?.trim();
  // Checked at every use, not only at login: a saved file or a variable may name any URL.
  if (envKey) {
    const from = ctx.env.BENCHWRIGHT_URL ? "BENCHWRIGHT_URL" : saved ? "the saved URL" : "the default URL";
    return new Api(apiBase(ctx.env.BENCHWRIGHT_URL || saved?.url || DEFAULT_URL, from), envKey);
  }
  if (!saved) {
    const login = ctx.profile === DEFAULT_PROFILE ? "login" : `login --profile ${ctx.profile}`;
    throw new NotLoggedIn(`not logged in (no ${path}): run benchwright ${login}, or set BENCHWRIGHT_API_KEY`);
  }
  return new Api(apiBase(saved.url, `the URL saved in ${path}`), saved.key);
}

/** With --json the API's JSON as it answered; else the lines for people. */
export function print(ctx: Ctx, body: unknown, human: () => string[]): void {
  if (ctx.json) ctx.out(JSON.stringify(body, null, 2));
  else for (const line of human()) ctx.out(line);
}

export function table(rows: string[][]): string[] {
  const widths = rows[0]?.map((_, i) => Math.max(...rows.map((r) => (r[i] ?? "").length))) ?? [];
  return rows.map((r) =>
    r
      .map((cell, i) => (i === r.length - 1 ? cell : cell.padEnd(widths[i] ?? 0)))
      .join("  ")
      .trimEnd(),
  );
}

export function oneOf<T extends string>(
  value: string | undefined,
  allowed: readonly T[],
  flag: string,
): T | undefined {
  if (value === undefined) return undefined;
  if (!(allowed as readonly string[]).includes(value)) {
    throw new UsageError(`${flag} is ${allowed.slice(0, -1).join(", ")} or ${allowed.at(-1)}`);
  }
  return value as T;
}

/** A list page's --limit and --cursor (registry.ts's pageOf). */
export type PageOptions = { limit?: number | undefined; cursor?: string | undefined };
export const nextPage = (cursor: string | null | undefined) => (cursor ? [`more: --cursor ${cursor}`] : []);

/** Exit 1: the API answered, but not with what the command needs (said in the message). */
export class Failed extends Error {}

/**
 * Where a secret the API shows once goes: a file of the user's (written 0600 by writeSecretFile,
 * never an existing one). Checked before anything is sent, so the secret has somewhere to go.
 */
export function secretTarget(path: string | undefined): string {
  if (!path) {
    throw new UsageError(
      "--secret-out PATH is required: the signing secret is shown only once, and is written there\n" +
        "(mode 0600; never printed, so it stays out of terminals and logs)",
    );
  }
  return path;
}

/** What is printed of an answer that carries a secret: everything but it, and where it went. */
/**
 * The signing secret of an answer that shows one. Absent only from a replay of an Idempotency-Key
 * (the API never stores it), which these commands do not send: then there is none to write.
 */
export function secretOf(made: { id: string; secret?: string }, lost: string): string {
  if (!made.secret) throw new Failed(`the API did not send ${made.id}'s signing secret; ${lost}`);
  return made.secret;
}

export function withoutSecret<T extends { secret?: string }>(made: T, secretFile: string) {
  const { secret: _secret, ...rest } = made;
  return { ...rest, secretFile };
}
