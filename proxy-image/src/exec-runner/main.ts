// `bw-exec`, the exec runner (exec-runner.ts), as a command; the calls and answers are in
// shared/contract/exec-runner.ts. Besides those, `bw-exec supervise <dir> <node>` is start's own
// detached supervisor.
import {
  EXEC_DIR_DEFAULT,
  RUNNER_EXIT_OF,
  type RunnerError,
  RunnerStart,
} from "@benchwright/shared/contract/exec-runner";
import { logLine } from "@benchwright/shared/contract/log";
import { freeze, kill, poll, Refusal, type RunnerHost, seal, start, supervise } from "./exec-runner";
import { setupCgroupPath } from "./exec-seal";

const MAX_SPEC_BYTES = 4 * 1024 * 1024;

const usage = (why: string) => new Refusal("bad_request", `usage: ${why}`);

function count(text: string | undefined, what: string): number {
  if (text === undefined || !/^[0-9]{1,15}$/.test(text)) throw usage(`${what} must be a whole number`);
  return Number(text);
}

/** One line, not the end of stdin: a v4 Kubernetes exec cannot close its stdin. */
async function readLine(max: number): Promise<string> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of process.stdin) {
    const buf = chunk as Buffer;
    const nl = buf.indexOf(10);
    chunks.push(nl === -1 ? buf : buf.subarray(0, nl));
    size += buf.length;
    if (nl !== -1 || size > max) break;
  }
  return Buffer.concat(chunks).toString("utf8");
}

/** Exactly `bytes` bytes of stdin: fewer is a bad call, not a shorter input. */
async function readBytes(bytes: number): Promise<Buffer> {
  const chunks: Buffer[] = [];
  let got = 0;
  for await (const chunk of process.stdin) {
    chunks.push(chunk as Buffer);
    got += (chunk as Buffer).length;
    if (got >= bytes) break;
  }
  if (got < bytes) throw usage(`stdin ended after ${got} of ${bytes} bytes`);
  return Buffer.concat(chunks).subarray(0, bytes);
}

async function main(args: string[]): Promise<unknown> {
  const base = process.env.BW_EXEC_DIR || EXEC_DIR_DEFAULT;
  const node = process.env.BW_NODE || process.execPath;
  // The runner's own settings are not the command's business.
  const env = { ...process.env };
  delete env.BW_EXEC_DIR;
  delete env.BW_NODE;
  delete env.BW_EXEC_SETUP_CGROUP;
  const host: RunnerHost = { base, self: process.argv[1] as string, node, setupCgroup: setupCgroupPath() };
  const [op, ...rest] = args;
  switch (op) {
    case "start": {
      const execId = rest[0] ?? "";
      if (rest.length <= 1) {
        let spec: RunnerStart;
        try {
          spec = RunnerStart.parse(JSON.parse(await readLine(MAX_SPEC_BYTES)));
        } catch {
          throw new Refusal("bad_request", "stdin is not one RunnerStart line");
        }
        const { argv, cwd, timeoutMs, setup, pids } = spec;
        const stdin = spec.stdin === undefined ? null : Buffer.from(spec.stdin);
        return start(host, execId, { argv, cwd, timeoutMs, setup, pids }, { ...env, ...spec.env }, stdin);
      }
      const timeoutMs = rest[1] === "-" ? null : count(rest[1], "timeoutMs");
      const stdinBytes = count(rest[2], "stdinBytes");
      let at = 3;
      let setup = false;
      let pids: number | undefined;
      for (; rest[at] !== "--" && at < rest.length; at++) {
        if (rest[at] === "--setup") setup = true;
        else if (rest[at] === "--pids") pids = Math.max(1, count(rest[++at], "--pids"));
        else throw usage(`unknown option ${rest[at]}`);
      }
      if (rest[at] !== "--" || rest.length < at + 2) throw usage("the command follows --");
      const stdin = stdinBytes > 0 ? await readBytes(stdinBytes) : null;
      const spec = {
        argv: rest.slice(at + 1),
        timeoutMs,
        ...(setup ? { setup } : {}),
        ...(pids ? { pids } : {}),
      };
      return start(host, execId, spec, env, stdin);
    }
    case "seal": {
      const flags = new Set(rest);
      for (const f of flags) if (f !== "--sweep" && f !== "--dry-run") throw usage(`unknown option ${f}`);
      return seal(host, { sweep: flags.has("--sweep"), dryRun: flags.has("--dry-run") });
    }
    case "poll":
      return poll(
        base,
        rest[0] ?? "",
        count(rest[1], "stdoutFrom"),
        count(rest[2], "stderrFrom"),
        count(rest[3] ?? "0", "waitMs"),
      );
    case "kill":
      return kill(base, rest[0] ?? "");
    case "freeze":
    case "thaw":
      return freeze(base, op === "freeze");
    default:
      throw new Refusal("bad_request", `unknown operation ${op ?? "(none)"}`);
  }
}

const [op, ...rest] = process.argv.slice(2);
if (op === "supervise") {
  supervise(rest[0] ?? "", rest[1] ?? process.execPath); // lives until the command ends
} else if (op === "hold") {
  // A pod's main process: nothing to do but stay, and go when Kubernetes asks.
  process.on("SIGTERM", () => process.exit(0));
  setInterval(() => {}, 1 << 30);
  // The pod's log (sandbox0): one JSON line with its event, like every other.
  process.stdout.write(`${logLine("info", { event: "holding" })}\n`);
} else {
  // process.exit, not the end of the event loop: stdin may still be open (a Kubernetes exec).
  const answer = (line: unknown, code: number) =>
    process.stdout.write(`${JSON.stringify(line)}\n`, () => process.exit(code));
  main(process.argv.slice(2)).then(
    (reply) => answer(reply, 0),
    (e: unknown) => {
      const refusal = e instanceof Refusal ? e : new Refusal("internal", (e as Error)?.message ?? String(e));
      const reply: RunnerError = { error: refusal.code, detail: refusal.message };
      process.stderr.write(`bw-exec: ${refusal.message}\n`);
      answer(reply, RUNNER_EXIT_OF[refusal.code]);
    },
  );
}
