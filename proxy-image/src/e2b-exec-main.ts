// `bw-exec`, the E2B templates' exec runner (see e2b-exec.ts), as a command:
//
//   bw-exec start <id> <timeoutMs|-> <stdinBytes> -- <argv...>   (reads exactly stdinBytes first)
//   bw-exec poll <id> <stdoutFrom> <stderrFrom> <waitMs>
//   bw-exec kill <id>
//   bw-exec supervise <dir> <timeoutMs|-> -- <argv...>           (internal: start's supervisor)
//
// Each prints one JSON line (ExecStatus; start adds `created`) and exits 0; an unknown exec exits
// 3, a bad call 2, a state directory that is not the caller's own 4, each with a line on stderr.
import { EXEC_DIR_DEFAULT, EXEC_EXIT, ExecRunnerError, kill, poll, start, supervise } from "./e2b-exec";

const usage = (why: string) => new ExecRunnerError(EXEC_EXIT.usage, `usage: ${why}`);

function count(text: string | undefined, what: string): number {
  if (text === undefined || !/^[0-9]{1,15}$/.test(text)) throw usage(`${what} must be a whole number`);
  return Number(text);
}

function timeout(text: string | undefined): number | null {
  return text === "-" ? null : count(text, "timeoutMs");
}

function afterDashes(args: string[], at: number): string[] {
  if (args[at] !== "--") throw usage("the command follows --");
  return args.slice(at + 1);
}

function readStdin(bytes: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let got = 0;
    const done = () => {
      process.stdin.removeAllListeners();
      process.stdin.pause();
      const all = Buffer.concat(chunks);
      if (all.length < bytes) reject(usage(`stdin ended after ${all.length} of ${bytes} bytes`));
      else resolve(all.subarray(0, bytes));
    };
    process.stdin.on("data", (c: Buffer) => {
      chunks.push(c);
      got += c.length;
      if (got >= bytes) done();
    });
    process.stdin.on("end", done);
    process.stdin.on("error", reject);
  });
}

async function main(args: string[]): Promise<void> {
  const base = process.env.BW_EXEC_DIR || EXEC_DIR_DEFAULT;
  // The runner's own setting is not the command's business.
  const env = { ...process.env };
  delete env.BW_EXEC_DIR;
  const [verb, ...rest] = args;
  let result: unknown;
  switch (verb) {
    case "start": {
      const [id, t, n] = rest;
      const stdinBytes = count(n, "stdinBytes");
      const argv = afterDashes(rest, 3);
      const stdin = stdinBytes > 0 ? await readStdin(stdinBytes) : null;
      result = await start({
        base,
        id: id ?? "",
        argv,
        timeoutMs: timeout(t),
        stdin,
        self: process.argv[1] as string,
        env,
      });
      break;
    }
    case "poll": {
      const [id, out, err, wait] = rest;
      result = await poll(
        base,
        id ?? "",
        count(out, "stdoutFrom"),
        count(err, "stderrFrom"),
        count(wait, "waitMs"),
      );
      break;
    }
    case "kill":
      result = await kill(base, rest[0] ?? "");
      break;
    case "supervise":
      supervise(rest[0] ?? "", timeout(rest[1]), afterDashes(rest, 2), env);
      return; // lives until the command ends
    default:
      throw usage("bw-exec start|poll|kill ...");
  }
  process.stdout.write(`${JSON.stringify(result)}\n`);
}

main(process.argv.slice(2)).then(
  () => {
    if (process.argv[2] !== "supervise") process.exit(0);
  },
  (e: unknown) => {
    process.stderr.write(`bw-exec: ${e instanceof Error ? e.message : String(e)}\n`);
    process.exit(e instanceof ExecRunnerError ? e.exit : 1);
  },
);
