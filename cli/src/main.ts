import { type ParseArgsConfig, parseArgs } from "node:util";
import { ApiError, NetworkError } from "./api";
import * as cmd from "./commands";
import { NotLoggedIn, UsageError } from "./commands";

// `benchwright`: a client of the public API only (what any user could do with curl). Exit codes:
// 0 ok, 1 the API said no or could not be reached, 2 usage, 3 not logged in.

type Options = NonNullable<ParseArgsConfig["options"]>;
type Values = Record<string, string | boolean | string[] | undefined>;

interface Command {
  usage: string;
  summary: string;
  help?: string;
  options?: Options;
  /** Everything after `--` is the command's (runs launch), not options. */
  rest?: boolean;
  run: (ctx: cmd.Ctx, values: Values, positionals: string[], rest: string[]) => Promise<void>;
}

const page: Options = { limit: { type: "string" }, cursor: { type: "string" } };
const pageOf = (v: Values) => ({
  limit: v.limit === undefined ? undefined : positiveInt(String(v.limit), "--limit"),
  cursor: v.cursor as string | undefined,
});

function positiveInt(text: string, what: string): number {
  const n = Number(text);
  if (!Number.isInteger(n) || n < 1) throw new UsageError(`${what} takes a positive whole number`);
  return n;
}

function one(positionals: string[], what: string): string {
  if (positionals.length !== 1) throw new UsageError(`expected exactly one ${what}`);
  return positionals[0] as string;
}

const COMMANDS: Record<string, Command> = {
  login: {
    usage: "benchwright login [--url URL]",
    summary: "store the API's URL and your API key (read from standard input or a prompt)",
    help:
      `The key is read from standard input when it is piped, else at a prompt that does not echo; it is\n` +
      `never an argument. It is checked (GET /v1/me) before it is saved to\n` +
      `$XDG_CONFIG_HOME/benchwright/config.json (or ~/.config/benchwright/config.json), mode 0600.\n` +
      `--url defaults to ${cmd.DEFAULT_URL} (npm start).`,
    options: { url: { type: "string" } },
    run: (ctx, v, p) => cmd.login(ctx, { url: v.url as string | undefined, positionals: p }),
  },
  whoami: {
    usage: "benchwright whoami",
    summary: "the user, environment and key you are logged in as",
    run: async (ctx, _v, p) => {
      if (p.length > 0) throw new UsageError("whoami takes no arguments");
      await cmd.whoami(ctx);
    },
  },
  "vault secrets set": {
    usage: "benchwright vault secrets set NAME [--from-file PATH]",
    summary: "create or replace a secret (the value from standard input, a prompt or a file)",
    help:
      "The value is read from --from-file PATH (as is), else from standard input when piped (one\n" +
      "trailing newline dropped), else at a prompt that does not echo. A value given as an argument\n" +
      "is refused: it would stay in shell history and process lists.",
    options: { "from-file": { type: "string" } },
    run: (ctx, v, p) =>
      cmd.secretsSet(ctx, { positionals: p, fromFile: v["from-file"] as string | undefined }),
  },
  "vault secrets list": {
    usage: "benchwright vault secrets list",
    summary: "secrets' names and fingerprints (never values)",
    run: async (ctx, _v, p) => {
      if (p.length > 0) throw new UsageError("vault secrets list takes no arguments");
      await cmd.secretsList(ctx);
    },
  },
  "runs launch": {
    usage: "benchwright runs launch [options] -- <command>...  |  benchwright runs launch --benchmark NAME",
    summary: "launch a run",
    help:
      "Everything after -- is one command, run by sh -c in the sandbox; --command CMD (repeatable)\n" +
      "gives several. Options: --benchmark NAME, --model NAME (a vault model), --egress direct|local,\n" +
      "--backend sandbox0|e2b|local.",
    options: {
      command: { type: "string", multiple: true },
      benchmark: { type: "string" },
      model: { type: "string" },
      egress: { type: "string" },
      backend: { type: "string" },
    },
    rest: true,
    run: async (ctx, v, p, rest) => {
      if (p.length > 0)
        throw new UsageError(`put the command after --: benchwright runs launch -- ${p.join(" ")}`);
      const commands = [...((v.command as string[] | undefined) ?? [])];
      if (rest.length > 0) commands.push(rest.join(" "));
      await cmd.runsLaunch(ctx, {
        commands,
        benchmark: v.benchmark as string | undefined,
        model: v.model as string | undefined,
        egress: v.egress as string | undefined,
        backend: v.backend as string | undefined,
      });
    },
  },
  "runs show": {
    usage: "benchwright runs show RUN_ID",
    summary: "a run's status, reason, notes, sandboxes and output",
    run: (ctx, _v, p) => cmd.runsShow(ctx, one(p, "run id")),
  },
  "runs cancel": {
    usage: "benchwright runs cancel RUN_ID",
    summary: "stop a run (its sandboxes are torn down)",
    run: (ctx, _v, p) => cmd.runsCancel(ctx, one(p, "run id")),
  },
  "logs blocked-hosts": {
    usage: "benchwright logs blocked-hosts RUN_ID [--limit N] [--cursor C]",
    summary: "hosts the run's boundary refused",
    options: page,
    run: (ctx, v, p) => cmd.blockedHosts(ctx, one(p, "run id"), pageOf(v)),
  },
  "logs egress-routes": {
    usage: "benchwright logs egress-routes RUN_ID [--limit N] [--cursor C]",
    summary: "hosts the run reached and by which route",
    options: page,
    run: (ctx, v, p) => cmd.egressRoutes(ctx, one(p, "run id"), pageOf(v)),
  },
};

const EXTRA = [
  [
    "egress-agent",
    "benchwright egress-agent --url URL --token bwe_...",
    "relay a run's egress through this machine",
  ],
];

function overview(prefix = ""): string {
  const names = Object.keys(COMMANDS).filter((n) => n.startsWith(prefix));
  const rows = [
    ...names.map((n) => [n, (COMMANDS[n] as Command).summary]),
    ...(prefix ? [] : EXTRA.map(([n, , s]) => [n as string, s as string])),
  ];
  const width = Math.max(...rows.map((r) => (r[0] as string).length));
  return [
    `usage: benchwright ${prefix ? `${prefix.trim()} ` : ""}<command> [--json] [--help]`,
    "",
    ...rows.map(([n, s]) => `  ${(n as string).padEnd(width)}  ${s}`),
    "",
    "--json prints the API's JSON. Exit codes: 0 ok, 1 API or network error, 2 usage, 3 not logged in.",
  ].join("\n");
}

function commandHelp(name: string, c: Command): string {
  return [`usage: ${c.usage} [--json]`, "", `${name}: ${c.summary}`, ...(c.help ? ["", c.help] : [])].join(
    "\n",
  );
}

export async function main(argv: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const out = (line: string) => process.stdout.write(`${line}\n`);
  const err = (line: string) => process.stderr.write(`${line}\n`);
  // The command's words come first; then its options and arguments.
  const words: string[] = [];
  let i = 0;
  while (i < argv.length && !(argv[i] as string).startsWith("-")) {
    const next = [...words, argv[i]].join(" ");
    if (!Object.keys(COMMANDS).some((n) => n === next || n.startsWith(`${next} `))) break;
    words.push(argv[i] as string);
    i++;
    if (COMMANDS[words.join(" ")]) break;
  }
  const name = words.join(" ");
  const command = COMMANDS[name];
  const args = argv.slice(i);
  const wantsHelp = args.includes("--help") || args.includes("-h");
  if (!command) {
    if (argv.length === 0 || (wantsHelp && words.length === 0 && argv[0]?.startsWith("-"))) {
      (argv.length === 0 ? err : out)(overview());
      return argv.length === 0 ? 2 : 0;
    }
    if (words.length > 0 && wantsHelp) {
      out(overview(`${name} `));
      return 0;
    }
    err(`benchwright: unknown command: ${argv.slice(0, Math.max(1, words.length + 1)).join(" ")}`);
    err(overview(words.length > 0 ? `${name} ` : ""));
    return 2;
  }
  const dash = command.rest ? args.indexOf("--") : -1;
  const own = dash >= 0 ? args.slice(0, dash) : args;
  const rest = dash >= 0 ? args.slice(dash + 1) : [];
  if (own.includes("--help") || own.includes("-h")) {
    out(commandHelp(name, command));
    return 0;
  }
  let values: Values;
  let positionals: string[];
  try {
    ({ values, positionals } = parseArgs({
      args: own,
      options: { ...command.options, json: { type: "boolean" }, help: { type: "boolean", short: "h" } },
      allowPositionals: true,
      strict: true,
    }));
  } catch (error) {
    err(`benchwright ${name}: ${(error as Error).message}`);
    err(`usage: ${command.usage}`);
    return 2;
  }
  const ctx: cmd.Ctx = { json: values.json === true, out, env };
  try {
    await command.run(ctx, values, positionals, rest);
    return 0;
  } catch (error) {
    if (error instanceof UsageError) {
      err(`benchwright ${name}: ${error.message}`);
      return 2;
    }
    if (error instanceof NotLoggedIn) {
      err(`benchwright: ${error.message}`);
      return 3;
    }
    if (error instanceof ApiError) {
      err(`benchwright: ${error.code}: ${error.detail}`);
      if (error.code === "unauthorized") err("(is the key revoked? run benchwright login again)");
      return 1;
    }
    if (error instanceof NetworkError) {
      err(`benchwright: ${error.message}`);
      return 1;
    }
    if ((error as Error).message === "interrupted") return 130;
    throw error;
  }
}

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error) => {
    process.stderr.write(`benchwright: ${(error as Error).stack ?? error}\n`);
    process.exitCode = 1;
  },
);
