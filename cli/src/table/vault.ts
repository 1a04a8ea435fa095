import { UsageError } from "../commands/shared";
import * as vault from "../commands/vault";
import { type CommandTable, list, none, one, str } from "../registry";

// The vault's commands: secrets, rules, hosts, the default, previews (models: ./models.ts).

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
};
