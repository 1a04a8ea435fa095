// How the e2b backend talks to the templates' programs through E2B's process API: every command
// is one `bash -l -c <string>` (that is what the SDK's commands.run sends), built here from words
// that are each quoted, so no value ever becomes shell syntax. The programs themselves are in
// proxy-image/src (bw-exec: exec-runner.ts, its calls in shared/contract/exec-runner.ts; bw-bridge:
// e2b-bridge/bridge.ts) and in the templates (bw-check-user, bw-redirect: proxy-image/e2b-work.Dockerfile).

/** A word for a POSIX shell, quoted as Python's shlex.quote does (plain words stay plain). */
export function shellQuote(word: string): string {
  if (word === "") return "''";
  if (!/[^\w@%+=:,./-]/.test(word)) return word;
  return `'${word.replaceAll("'", `'"'"'`)}'`;
}

export const commandLine = (words: readonly string[]) => words.map(shellQuote).join(" ");

/** A bw-exec call (its arguments from shared/contract/exec-runner.ts) as one command line. */
export const runnerCommand = (args: readonly string[]) => commandLine(["bw-exec", ...args]);
