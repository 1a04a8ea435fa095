import { spawn } from "node:child_process";

// Runs the agent's own helper commands (ip, nft, nsenter, ...). Never with the agent's
// environment (it holds the agent secret): a fixed PATH and the C locale, nothing else.

export const SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
export const BASE_ENV: Record<string, string> = { PATH: SAFE_PATH, LC_ALL: "C" };

export interface CommandResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function run(
  argv: readonly string[],
  options: { input?: string; timeoutMs?: number } = {},
): Promise<CommandResult> {
  return new Promise((resolve) => {
    const [file, ...args] = argv as [string, ...string[]];
    const child = spawn(file, args, { env: BASE_ENV, stdio: ["pipe", "pipe", "pipe"] });
    const out: Buffer[] = [];
    const err: Buffer[] = [];
    child.stdout.on("data", (d: Buffer) => out.push(d));
    child.stderr.on("data", (d: Buffer) => err.push(d));
    child.stdin.on("error", () => {});
    const timer = setTimeout(() => child.kill("SIGKILL"), options.timeoutMs ?? 20_000);
    child.on("error", (e) => {
      clearTimeout(timer);
      resolve({ code: null, stdout: "", stderr: e.message });
    });
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code, stdout: Buffer.concat(out).toString(), stderr: Buffer.concat(err).toString() });
    });
    child.stdin.end(options.input ?? "");
  });
}

export class CommandError extends Error {
  constructor(
    readonly argv: readonly string[],
    readonly result: CommandResult,
  ) {
    const why = result.stderr.trim().split("\n").slice(0, 3).join("; ") || `exit code ${result.code}`;
    super(`${argv.slice(0, 4).join(" ")}: ${why}`);
    this.name = "CommandError";
  }
}

/** Runs a command and returns its stdout; throws a CommandError naming it when it fails. */
export async function must(argv: readonly string[], options: { input?: string; timeoutMs?: number } = {}) {
  const result = await run(argv, options);
  if (result.code !== 0) throw new CommandError(argv, result);
  return result.stdout;
}
