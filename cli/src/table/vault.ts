import { UsageError } from "../commands/shared";
import * as vault from "../commands/vault";
import { type CommandTable, list, none, one, str, type Values } from "../registry";

// The vault's commands: secrets, rules, hosts, the default, previews (models: ./models.ts).

const LIMIT_OPTIONS = { methods: { type: "string" }, paths: { type: "string" } } as const;
const PLACEHOLDER_OPTIONS = {
  "placeholder-env": { type: "string" },
  "no-placeholder": { type: "boolean" },
  "placeholder-in": { type: "string" },
} as const;
const LIMITS_HELP =
  "--methods GET,HEAD and --paths /repos/acme/,/orgs/ limit the requests let through (paths are\n" +
  'prefixes on a segment boundary, or globs with * and **); "any" clears a limit. A request outside\n' +
  "them gets a 403 from the proxy.";
const PLACEHOLDER_HELP =
  "The run's sandboxes get the secret's placeholder (never the secret) in a variable: the secret's name\n" +
  "unless --placeholder-env NAME; --no-placeholder for none. The proxy swaps it for the secret in\n" +
  "headers and the query on the rule's hosts; --placeholder-in body also in bodies (none: not).";
const limitFlags = (v: Values) => ({ methods: str(v, "methods"), paths: str(v, "paths") });
const placeholderFlags = (v: Values) => ({
  placeholderEnv: str(v, "placeholder-env"),
  noPlaceholder: v["no-placeholder"] === true,
  placeholderIn: str(v, "placeholder-in"),
});

export const VAULT_COMMANDS: CommandTable = {
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
      "benchwright vault rules add HOST --secret NAME [--inject bearer|basic|raw|query] [--name N] [--position N]\n" +
      "  [--methods M,...] [--paths P,...] [--placeholder-env NAME | --no-placeholder] [--placeholder-in body]",
    summary: "inject a secret into requests to a host (the proxy adds it; the sandbox never has it)",
    help:
      "--inject bearer (default) sends `Authorization: Bearer <secret>`; basic sends Basic auth (the secret\n" +
      "is user:password); raw sends the secret as the value of header --name; query adds query parameter\n" +
      "--name. HOST may be a wildcard (*.example.com). Adding a rule allows its host.\n" +
      `${LIMITS_HELP}\n${PLACEHOLDER_HELP}`,
    options: {
      secret: { type: "string" },
      inject: { type: "string" },
      name: { type: "string" },
      position: { type: "string" },
      ...LIMIT_OPTIONS,
      ...PLACEHOLDER_OPTIONS,
    },
    run: (ctx, v, p) =>
      vault.rulesAdd(ctx, one(p, "host"), {
        secret: str(v, "secret"),
        inject: str(v, "inject"),
        name: str(v, "name"),
        position: v.position === undefined ? undefined : Number.parseInt(String(v.position), 10),
        ...limitFlags(v),
        ...placeholderFlags(v),
      }),
  },
  "vault rules update": {
    usage:
      "benchwright vault rules update RULE_ID|HOST [--methods M,...|any] [--paths P,...|any]\n" +
      "  [--placeholder-env NAME | --no-placeholder] [--placeholder-in body|none]",
    summary: "change a rule's limits and placeholder variable (what is not given stays)",
    help: `${LIMITS_HELP}\n${PLACEHOLDER_HELP}`,
    options: { ...LIMIT_OPTIONS, ...PLACEHOLDER_OPTIONS },
    run: (ctx, v, p) =>
      vault.rulesUpdate(ctx, one(p, "rule id or host"), { ...limitFlags(v), ...placeholderFlags(v) }),
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
    usage: "benchwright vault hosts allow PATTERN... [--via direct|tunnel] [--methods M,...] [--paths P,...]",
    summary: "allow hosts (exact names or *.wildcards); --via tunnel sends them through your machine",
    help: LIMITS_HELP,
    options: { via: { type: "string" }, ...LIMIT_OPTIONS },
    run: (ctx, v, p) => vault.hostsSet(ctx, "allow", p, { via: str(v, "via"), ...limitFlags(v) }),
  },
  "vault hosts update": {
    usage: "benchwright vault hosts update PATTERN|HOST_ID [--methods M,...|any] [--paths P,...|any]",
    summary: "change an allowed host's method and path limits (what is not given stays)",
    help: LIMITS_HELP,
    options: LIMIT_OPTIONS,
    run: (ctx, v, p) => vault.hostsUpdate(ctx, one(p, "pattern or host id"), limitFlags(v)),
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
    summary:
      "allow common package and source hosts (npm, PyPI, GitHub, Debian, crates, Go, Maven...), source hosts read-only",
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
};
