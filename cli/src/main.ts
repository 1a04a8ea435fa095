import { type ParseArgsConfig, parseArgs } from "node:util";
import { ApiError, NetworkError } from "./api";
import { login, whoami } from "./commands/account";
import { runsArtifacts } from "./commands/artifacts";
import { demo } from "./commands/demo";
import { blockedHosts, egressRoutes, modelCalls } from "./commands/logs";
import {
  commandOf,
  runsControl,
  runsFollow,
  runsLaunch,
  runsLinger,
  runsList,
  runsShow,
} from "./commands/runs";
import {
  type Ctx,
  DEFAULT_URL,
  Failed,
  NotLoggedIn,
  RunNotCompleted,
  SPEC_FILE,
  UsageError,
} from "./commands/shared";
import * as vault from "./commands/vault";
import { CREDENTIAL_PATTERNS } from "./pack";

// `benchwright`: a client of the public API only (what any user could do with curl). Exit codes:
// 0 ok, 1 the API said no or could not be reached, 2 usage, 3 not logged in, 4 a run the command
// waited for did not complete (a command failed, or the run stopped or failed).

type Options = NonNullable<ParseArgsConfig["options"]>;
type Values = Record<string, string | boolean | string[] | undefined>;

interface Command {
  usage: string;
  summary: string;
  help?: string;
  options?: Options;
  /** Everything after `--` is the command's (runs launch), not options. */
  rest?: boolean;
  run: (ctx: Ctx, values: Values, positionals: string[], rest: string[]) => Promise<void>;
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

function none(positionals: string[], name: string): void {
  if (positionals.length > 0) throw new UsageError(`${name} takes no arguments`);
}

const str = (v: Values, k: string) => v[k] as string | undefined;
const list = (v: Values, k: string) => (v[k] as string[] | undefined) ?? [];

const COMMANDS: Record<string, Command> = {
  login: {
    usage: "benchwright login [--url URL]",
    summary: "store the API's URL and your API key (read from standard input or a prompt)",
    help:
      `The key is read from standard input when it is piped, else at a prompt that does not echo; it is\n` +
      `never an argument. It is checked (GET /v1/me) before it is saved to\n` +
      `$XDG_CONFIG_HOME/benchwright/config.json (or ~/.config/benchwright/config.json), mode 0600.\n` +
      `--url defaults to ${DEFAULT_URL} (npm start). Scripts may instead set BENCHWRIGHT_API_KEY\n` +
      `(and BENCHWRIGHT_URL) in the environment.`,
    options: { url: { type: "string" } },
    run: (ctx, v, p) => login(ctx, { url: str(v, "url"), positionals: p }),
  },
  whoami: {
    usage: "benchwright whoami",
    summary: "the user, environment and key you are logged in as",
    run: async (ctx, _v, p) => {
      none(p, "whoami");
      await whoami(ctx);
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
    run: (ctx, v, p) => vault.secretsSet(ctx, { positionals: p, fromFile: str(v, "from-file") }),
  },
  "vault secrets list": {
    usage: "benchwright vault secrets list",
    summary: "secrets' names and fingerprints (never values)",
    run: async (ctx, _v, p) => {
      none(p, "vault secrets list");
      await vault.secretsList(ctx);
    },
  },
  "vault secrets delete": {
    usage: "benchwright vault secrets delete NAME",
    summary: "delete a secret (refused while a rule uses it)",
    run: (ctx, _v, p) => vault.secretsDelete(ctx, one(p, "secret name")),
  },
  "vault rules list": {
    usage: "benchwright vault rules list",
    summary: "rules in order: which secret goes to which host (first match wins)",
    run: async (ctx, _v, p) => {
      none(p, "vault rules list");
      await vault.rulesList(ctx);
    },
  },
  "vault rules add": {
    usage:
      "benchwright vault rules add HOST --secret NAME [--inject bearer|basic|raw|query] [--name N] [--position N]",
    summary: "inject a secret into requests to a host (the proxy adds it; the sandbox never has it)",
    help:
      "--inject bearer (default) sends `Authorization: Bearer <secret>`; basic sends Basic auth (the secret\n" +
      "is user:password); raw sends the secret as the value of header --name; query adds query parameter\n" +
      "--name. HOST may be a wildcard (*.example.com). Adding a rule allows its host.",
    options: {
      secret: { type: "string" },
      inject: { type: "string" },
      name: { type: "string" },
      position: { type: "string" },
    },
    run: (ctx, v, p) =>
      vault.rulesAdd(ctx, one(p, "host"), {
        secret: str(v, "secret"),
        inject: str(v, "inject"),
        name: str(v, "name"),
        position: v.position === undefined ? undefined : Number.parseInt(String(v.position), 10),
      }),
  },
  "vault rules remove": {
    usage: "benchwright vault rules remove RULE_ID|HOST",
    summary: "delete a rule (by id, or by host when one rule names it)",
    run: (ctx, _v, p) => vault.rulesRemove(ctx, one(p, "rule id or host")),
  },
  "vault hosts list": {
    usage: "benchwright vault hosts list",
    summary: "host entries: allowed and blocked patterns, and their routes",
    run: async (ctx, _v, p) => {
      none(p, "vault hosts list");
      await vault.hostsList(ctx);
    },
  },
  "vault hosts allow": {
    usage: "benchwright vault hosts allow PATTERN... [--via direct|tunnel]",
    summary: "allow hosts (exact names or *.wildcards); --via tunnel sends them through your machine",
    options: { via: { type: "string" } },
    run: (ctx, v, p) => vault.hostsSet(ctx, "allow", p, { via: str(v, "via") }),
  },
  "vault hosts block": {
    usage: "benchwright vault hosts block PATTERN...",
    summary: "block hosts: runs are refused them, and each refusal is recorded",
    run: (ctx, _v, p) => vault.hostsSet(ctx, "block", p, {}),
  },
  "vault hosts remove": {
    usage: "benchwright vault hosts remove PATTERN|HOST_ID",
    summary: "delete a host entry (the default applies to it again)",
    run: (ctx, _v, p) => vault.hostsRemove(ctx, one(p, "pattern or host id")),
  },
  "vault hosts promote": {
    usage: "benchwright vault hosts promote HOST... | --run RUN_ID",
    summary: "allow hosts a run was refused (named, or every one a run was refused)",
    help:
      "Exact host names only: a block entry for the name becomes allow. Running runs' proxies pick the\n" +
      "change up within seconds. Try it first: benchwright vault dry-run RUN_ID --allow HOST.",
    options: { run: { type: "string" } },
    run: (ctx, v, p) => vault.hostsPromote(ctx, p, { run: str(v, "run") }),
  },
  "vault default": {
    usage: "benchwright vault default [allow|block]",
    summary: "show or set the action for hosts no entry names (block: runs use catch-all routing)",
    run: async (ctx, _v, p) => {
      if (p.length > 1) throw new UsageError("expected allow or block");
      await vault.defaultAction(ctx, p[0]);
    },
  },
  "vault starter-pack": {
    usage: "benchwright vault starter-pack",
    summary: "allow common package and source hosts (npm, PyPI, GitHub, Debian, crates, Go, Maven...)",
    run: async (ctx, _v, p) => {
      none(p, "vault starter-pack");
      await vault.starterPack(ctx);
    },
  },
  "vault preview": {
    usage: "benchwright vault preview [--egress direct|local] [--model NAME]",
    summary: "the policy a run launched now would get: routing mode and why, hosts, rules",
    options: { egress: { type: "string" }, model: { type: "string" } },
    run: async (ctx, v, p) => {
      none(p, "vault preview");
      await vault.preview(ctx, { egress: str(v, "egress"), model: str(v, "model") });
    },
  },
  "vault dry-run": {
    usage:
      "benchwright vault dry-run RUN_ID [--allow P]... [--block P]... [--remove P]... [--default allow|block] [--all]",
    summary: "what edits of the vault would change for the hosts a past run used (nothing is saved)",
    help: "Lists the hosts whose decision or route would change; --all lists every host the run used.",
    options: {
      allow: { type: "string", multiple: true },
      block: { type: "string", multiple: true },
      remove: { type: "string", multiple: true },
      default: { type: "string" },
      all: { type: "boolean" },
    },
    run: (ctx, v, p) =>
      vault.dryRun(ctx, one(p, "run id"), {
        allow: list(v, "allow"),
        block: list(v, "block"),
        remove: list(v, "remove"),
        default: str(v, "default"),
        all: v.all === true,
      }),
  },
  "runs launch": {
    usage:
      "benchwright runs launch [options] -- <command>...  |  --benchmark NAME  |  --from FOLDER [--include-secret-file PATH]...",
    summary: "launch a run (--follow: and follow it to its end)",
    help:
      "Everything after -- is one command, run by sh -c in the sandbox (one word: as written, so\n" +
      "-- 'make && ./bench' works; several: each kept as one argument); --command CMD (repeatable) gives\n" +
      "several commands.\n" +
      "\n" +
      `--from FOLDER reads FOLDER/${SPEC_FILE}, a run spec as POST /v1/runs takes it (commands, setup,\n` +
      "tasks, model, egress, linger_seconds...), and packs the folder into a .tar.gz that is uploaded\n" +
      "(POST /v1/bundles, with progress on a terminal) and unpacked into each work and task sandbox's\n" +
      "home before setup; the spec's bundle is set to its sha256. What is packed: every file the\n" +
      `folder's .gitignore files do not exclude, never .git, always ${SPEC_FILE}; with "files" in\n` +
      `${SPEC_FILE} (gitignore-style patterns, e.g. ["*.py", "setup.sh", "data/"]) only what they match.\n` +
      "Refused (nothing is sent; each offending file is named): a symlink pointing outside the folder, a\n" +
      "device, FIFO or socket, and files that look like credentials:\n" +
      `  ${CREDENTIAL_PATTERNS.join("  ")}\n` +
      "(matched against the file's name, any letter case). --include-secret-file PATH (relative to the\n" +
      "folder; repeatable) packs one all the same. The same folder packs to the same sha256.\n" +
      `--from FILE.json sends that spec alone (nothing packed), as does a folder with only ${SPEC_FILE}.\n` +
      "\n" +
      "Options: --model NAME (a vault model), --budget calls=N,input=N,output=N (the model's budget:\n" +
      "any of them, k and m allowed, e.g. calls=1000,output=200k; past it the lane refuses calls),\n" +
      "--egress direct|local, --backend sandbox0|e2b|local,\n" +
      "--linger 15m (keep the proxy after the commands end), --follow (exit 4 unless the run completes).",
    options: {
      command: { type: "string", multiple: true },
      benchmark: { type: "string" },
      from: { type: "string" },
      "include-secret-file": { type: "string", multiple: true },
      model: { type: "string" },
      budget: { type: "string" },
      egress: { type: "string" },
      backend: { type: "string" },
      linger: { type: "string" },
      follow: { type: "boolean", short: "f" },
    },
    rest: true,
    run: async (ctx, v, p, rest) => {
      if (p.length > 0)
        throw new UsageError(`put the command after --: benchwright runs launch -- ${p.join(" ")}`);
      const commands = [...list(v, "command")];
      if (rest.length > 0) commands.push(commandOf(rest));
      await runsLaunch(ctx, {
        commands,
        benchmark: str(v, "benchmark"),
        from: str(v, "from"),
        includeSecretFiles: list(v, "include-secret-file"),
        model: str(v, "model"),
        budget: str(v, "budget"),
        egress: str(v, "egress"),
        backend: str(v, "backend"),
        linger: str(v, "linger"),
        follow: v.follow === true,
      });
    },
  },
  "runs follow": {
    usage: "benchwright runs follow RUN_ID",
    summary: "live status and output until the run's commands end (exit 4 unless it completes)",
    run: (ctx, _v, p) => runsFollow(ctx, one(p, "run id")),
  },
  "runs show": {
    usage: "benchwright runs show RUN_ID",
    summary: "a run's status, reason, notes, sandboxes and output",
    run: (ctx, _v, p) => runsShow(ctx, one(p, "run id")),
  },
  "runs list": {
    usage: "benchwright runs list [--limit N] [--cursor C]",
    summary: "runs, newest first",
    options: page,
    run: async (ctx, v, p) => {
      none(p, "runs list");
      await runsList(ctx, pageOf(v));
    },
  },
  "runs artifacts": {
    usage: "benchwright runs artifacts RUN_ID [--out DIR]",
    summary: "the files the run's commands left under $BW_OUT (--out DIR: download them)",
    help:
      "Lists each artifact (sandbox, path, size, sha256) and what was not collected and why (over the\n" +
      "size or count bound, a symlink, not a regular file). --out DIR saves each one to\n" +
      "DIR/<sandbox name>/<path>, checked against its sha256 before it is put in place. A name that\n" +
      "would leave DIR (.., an absolute path) is refused, and nothing is written through a symlink in\n" +
      "DIR; exit 1 if any artifact was not saved.",
    options: { out: { type: "string" } },
    run: (ctx, v, p) => runsArtifacts(ctx, one(p, "run id"), { out: str(v, "out") }),
  },
  "runs cancel": {
    usage: "benchwright runs cancel RUN_ID",
    summary: "stop a run (its sandboxes are torn down)",
    run: (ctx, _v, p) => runsControl(ctx, "cancel", one(p, "run id")),
  },
  "runs halt": {
    usage: "benchwright runs halt RUN_ID",
    summary: "halt a run for review: its commands stop, its proxy keeps enforcing",
    run: (ctx, _v, p) => runsControl(ctx, "halt", one(p, "run id")),
  },
  "runs resume": {
    usage: "benchwright runs resume RUN_ID",
    summary: "resume a halted run",
    run: (ctx, _v, p) => runsControl(ctx, "resume", one(p, "run id")),
  },
  "runs linger": {
    usage: "benchwright runs linger RUN_ID DURATION",
    summary: "keep the run's proxy this long after its commands end (e.g. 30m, 2h; 0 ends it)",
    run: async (ctx, _v, p) => {
      if (p.length !== 2) throw new UsageError("expected a run id and a duration (e.g. 30m)");
      await runsLinger(ctx, p[0] as string, p[1] as string);
    },
  },
  "logs blocked-hosts": {
    usage: "benchwright logs blocked-hosts [RUN_ID] [--limit N] [--cursor C]",
    summary: "hosts a run's boundary refused (no RUN_ID: across all your runs)",
    options: page,
    run: async (ctx, v, p) => {
      if (p.length > 1) throw new UsageError("expected at most one run id");
      await blockedHosts(ctx, p[0], pageOf(v));
    },
  },
  "logs egress-routes": {
    usage: "benchwright logs egress-routes RUN_ID [--limit N] [--cursor C]",
    summary: "hosts the run reached and by which route",
    options: page,
    run: (ctx, v, p) => egressRoutes(ctx, one(p, "run id"), pageOf(v)),
  },
  "logs model-calls": {
    usage: "benchwright logs model-calls RUN_ID [--limit N] [--cursor C]",
    summary: "the run's calls to its declared model (counts and tokens, never prompts)",
    options: page,
    run: (ctx, v, p) => modelCalls(ctx, one(p, "run id"), pageOf(v)),
  },
  demo: {
    usage: "benchwright demo",
    summary: "what npm start shows: a run with a key injected and a host refused",
    help:
      "Runs the built-in demo benchmark on the stack npm start brings up, as its dev user\n" +
      "(benchwright login < .data/dev-api-key), follows it, and checks what the boundary did.",
    run: async (ctx, _v, p) => {
      none(p, "demo");
      await demo(ctx);
    },
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
    "--json prints the API's JSON. Exit codes: 0 ok, 1 API or network error, 2 usage, 3 not logged in,",
    "4 a run waited for (--follow, runs follow, demo) did not complete.",
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
  const ctx: Ctx = { json: values.json === true, out, err, env };
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

main(process.argv.slice(2)).then(
  (code) => {
    process.exitCode = code;
  },
  (error) => {
    process.stderr.write(`benchwright: ${(error as Error).stack ?? error}\n`);
    process.exitCode = 1;
  },
);
