import { parseArgs } from "node:util";
import pkg from "../package.json";
import { ApiError, NetworkError } from "./api";
import { type Ctx, Failed, NotLoggedIn, RunNotCompleted, UsageError } from "./commands/shared";
import { completionScript, suggest } from "./completion";
import { profileOf } from "./config";
import type { Command, CommandTable, Values } from "./registry";
import { ACCOUNT_COMMANDS } from "./table/account";
import { KEYS_COMMANDS } from "./table/keys";
import { MORE_COMMANDS } from "./table/more";
import { RUNS_COMMANDS } from "./table/runs";
import { VAULT_COMMANDS } from "./table/vault";

// `benchwright`: a client of the public API only (what any user could do with curl). Exit codes:
// 0 ok, 1 the API said no or could not be reached, 2 usage, 3 not logged in, 4 a run the command
// waited for did not complete (a command failed, or the run stopped or failed). The command table
// lives in cli/src/table/; `egress-agent` is the bundled agent (@benchwright/egress-agent), not a table entry.

const COMMANDS: CommandTable = {
  ...ACCOUNT_COMMANDS,
  ...KEYS_COMMANDS,
  ...VAULT_COMMANDS,
  ...MORE_COMMANDS,
  ...RUNS_COMMANDS,
  completion: {
    usage: "benchwright completion bash|zsh",
    summary: 'print a shell completion script (eval "$(benchwright completion bash)" in ~/.bashrc)',
    run: async (ctx, _v, p) => {
      const shell = p[0];
      if (p.length !== 1 || (shell !== "bash" && shell !== "zsh"))
        throw new UsageError("expected bash or zsh");
      ctx.out(completionScript(shell, COMMANDS, AGENT_FLAGS).trimEnd());
    },
  },
};

/** The egress agent's flags, for completion (egress-agent/src/main.ts parses them). */
const AGENT_FLAGS = {
  "egress-agent": [
    "--url",
    "--token-stdin",
    "--allow-cidr",
    "--block",
    "--policy-interval-ms",
    "--insecure-http",
  ],
};

/** Options every command takes: --json, and --profile (the saved login to use, cli/src/config.ts). */
const GLOBAL_OPTIONS = { json: { type: "boolean" }, profile: { type: "string" } } as const;

const EXTRA = [
  [
    "egress-agent",
    "BENCHWRIGHT_EGRESS_TOKEN=bwe_... benchwright egress-agent --url URL",
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
    `usage: benchwright ${prefix ? `${prefix.trim()} ` : ""}<command> [--json] [--profile NAME] [--help]`,
    "",
    ...rows.map(([n, s]) => `  ${(n as string).padEnd(width)}  ${s}`),
    "",
    "--json prints the API's JSON. --profile NAME (or BENCHWRIGHT_PROFILE) uses the login saved by",
    "benchwright login --profile NAME, one per deployment. Exit codes: 0 ok, 1 API or network error,",
    "2 usage, 3 not logged in, 4 a run waited for (--follow, runs follow, demo) did not complete.",
  ].join("\n");
}

function commandHelp(name: string, c: Command): string {
  return [
    `usage: ${c.usage} [--json] [--profile NAME]`,
    "",
    `${name}: ${c.summary}`,
    ...(c.help ? ["", c.help] : []),
  ].join("\n");
}

/** --profile may also come before the command's words: `benchwright --profile staging runs list`. */
function leadingProfile(argv: string[]): { leading: string[]; argv: string[] } {
  const n = argv[0] === "--profile" && argv.length > 1 ? 2 : argv[0]?.startsWith("--profile=") ? 1 : 0;
  return { leading: argv.slice(0, n), argv: argv.slice(n) };
}

export async function main(given: string[], env: NodeJS.ProcessEnv = process.env): Promise<number> {
  const out = (line: string) => process.stdout.write(`${line}\n`);
  const err = (line: string) => process.stderr.write(`${line}\n`);
  const { leading, argv } = leadingProfile(given);
  if (argv[0] === "--version" || argv[0] === "-V") {
    out(pkg.version);
    return 0;
  }
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
    const flag = argv.findIndex((a) => a.startsWith("-"));
    const typed = flag < 0 ? argv : argv.slice(0, flag);
    const near = suggest(typed, [...Object.keys(COMMANDS), ...Object.keys(AGENT_FLAGS)]);
    if (near) {
      err(`did you mean: benchwright ${near}?`);
      return 2;
    }
    err(overview(words.length > 0 ? `${name} ` : ""));
    return 2;
  }
  const dash = command.rest ? args.indexOf("--") : -1;
  const own = [...leading, ...(dash >= 0 ? args.slice(0, dash) : args)];
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
      options: { ...command.options, ...GLOBAL_OPTIONS, help: { type: "boolean", short: "h" } },
      allowPositionals: true,
      strict: true,
    }));
  } catch (error) {
    err(`benchwright ${name}: ${(error as Error).message}`);
    err(`usage: ${command.usage}`);
    return 2;
  }
  const profile = profileOf(values.profile as string | undefined, env);
  if (!profile) {
    const from = values.profile === undefined ? "BENCHWRIGHT_PROFILE" : "--profile";
    err(
      `benchwright: ${from} must be a profile name: a-z, 0-9, - and _, at most 40, not starting with - or _`,
    );
    return 2;
  }
  const ctx: Ctx = { json: values.json === true, out, err, env, profile };
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
    if (error instanceof RunNotCompleted) {
      err(`benchwright: ${error.message}`);
      return 4;
    }
    if (error instanceof Failed) {
      err(`benchwright: ${error.message}`);
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

// The agent reads process.argv itself: drop the word that chose it, then load it (bundled in).
if (process.argv[2] === "egress-agent") {
  process.argv.splice(2, 1);
  void import("@benchwright/egress-agent/main");
} else {
  main(process.argv.slice(2)).then(
    (code) => {
      process.exitCode = code;
    },
    (error) => {
      process.stderr.write(`benchwright: ${(error as Error).stack ?? error}\n`);
      process.exitCode = 1;
    },
  );
}
