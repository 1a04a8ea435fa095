import { z } from "zod";

// How the e2b backend talks to the templates' programs through E2B's process API: every command
// is one `bash -l -c <string>` (that is what the SDK's commands.run sends), built here from words
// that are each quoted, so no value ever becomes shell syntax. The programs themselves are in
// proxy-image/src (bw-exec: e2b-exec.ts; bw-tunnel: e2b-tunnel.ts) and in the templates
// (bw-check-user, bw-redirect: proxy-image/e2b-work.Dockerfile).

/** A word for a POSIX shell, quoted as Python's shlex.quote does (plain words stay plain). */
export function shellQuote(word: string): string {
  if (word === "") return "''";
  if (!/[^\w@%+=:,./-]/.test(word)) return word;
  return `'${word.replaceAll("'", `'"'"'`)}'`;
}

export const commandLine = (words: readonly string[]) => words.map(shellQuote).join(" ");

/** What bw-exec prints for start (with `created`), poll and kill: one JSON line. */
export const RunnerStatus = z.object({
  created: z.boolean().optional(),
  state: z.enum(["running", "exited"]),
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  stdout: z.string(),
  stderr: z.string(),
  stdoutEnd: z.number().int().min(0),
  stderrEnd: z.number().int().min(0),
});
export type RunnerStatus = z.infer<typeof RunnerStatus>;

/** bw-exec's exit code for an exec id it does not know. */
export const RUNNER_UNKNOWN_EXEC = 3;

export function startCommand(
  execId: string,
  argv: readonly string[],
  timeoutMs: number | null,
  stdinBytes: number,
): string {
  return commandLine([
    "bw-exec",
    "start",
    execId,
    timeoutMs === null ? "-" : String(timeoutMs),
    String(stdinBytes),
    "--",
    ...argv,
  ]);
}

export const pollCommand = (execId: string, stdoutFrom: number, stderrFrom: number, waitMs: number) =>
  commandLine(["bw-exec", "poll", execId, String(stdoutFrom), String(stderrFrom), String(waitMs)]);

export const killCommand = (execId: string) => commandLine(["bw-exec", "kill", execId]);

/** The last line of a program's stdout, parsed as JSON; null when it is not JSON. */
export function lastJson(stdout: string): unknown {
  const line = stdout.trimEnd().split("\n").at(-1) ?? "";
  try {
    return JSON.parse(line);
  } catch {
    return null;
  }
}
