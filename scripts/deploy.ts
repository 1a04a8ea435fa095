// `npm run deploy -- --env <staging|production> [--secrets-file <path>] [--dry-run --outdir <dir>]`:
// checks that the database's migrations and this checkout's agree (refusing otherwise), applies
// the pending ones, then runs `wrangler deploy --env <name>`. Migrations first, so the new code
// never meets an old schema; they only add, so the code still deployed works with the new one.
//
// DATABASE_URL comes from the environment or from the secrets file (the file `wrangler deploy
// --secrets-file` reads on a first deploy: `NAME=value` lines or JSON), never from the command
// line; it is not passed on to wrangler and never printed. --dry-run changes nothing: it reports
// what would be applied and builds the Worker with `wrangler deploy --dry-run`.
import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { parseArgs, parseEnv } from "node:util";
import { experimental_readRawConfig } from "wrangler";
import { applyMigrations } from "./lib/migrate";
import { appliedMigrations, codeMigrations, compareMigrations } from "./lib/migration-check";
import { configureNeonForNode } from "./lib/neon-node";

const USAGE =
  "usage: npm run deploy -- --env <staging|production> [--secrets-file <path>] [--dry-run --outdir <dir>]";

function fail(message: string, status = 2): never {
  console.error(message);
  process.exit(status);
}

const { values: args } = (() => {
  try {
    return parseArgs({
      options: {
        env: { type: "string" },
        "secrets-file": { type: "string" },
        "dry-run": { type: "boolean", default: false },
        outdir: { type: "string" },
      },
    });
  } catch (e) {
    return fail(`${(e as Error).message}\n${USAGE}`);
  }
})();

const environments = Object.keys(experimental_readRawConfig({ config: "wrangler.toml" }).rawConfig.env ?? {});
if (!args.env) fail(`--env is required: one of ${environments.join(", ")}\n${USAGE}`);
// The top level of wrangler.toml is development (the local backend): never deployed.
if (!environments.includes(args.env)) {
  fail(`no environment ${args.env} in wrangler.toml: one of ${environments.join(", ")}`);
}
if (args.outdir && !args["dry-run"]) fail("--outdir goes with --dry-run");

const databaseUrl = process.env.DATABASE_URL || fromSecretsFile(args["secrets-file"], "DATABASE_URL");
if (!databaseUrl) {
  fail(
    `DATABASE_URL is not set: export it (read -rs DATABASE_URL; export DATABASE_URL) or put it in --secrets-file; the ${args.env} database to migrate`,
  );
}

configureNeonForNode(process.env.DATABASE_WS_PROXY || undefined);
const agreement = compareMigrations(
  codeMigrations(),
  await databaseStep("read", () => appliedMigrations(databaseUrl)),
);
if (!agreement.ok) {
  fail(
    `refusing to deploy ${args.env}: the database's migrations and this checkout's disagree\n${agreement.problems.map((p) => `  - ${p}`).join("\n")}`,
    1,
  );
}
const pending = agreement.pending.length > 0 ? agreement.pending.join(", ") : "none";
if (args["dry-run"]) {
  console.log(`dry run: migrations to apply to the ${args.env} database: ${pending}`);
} else {
  console.log(`applying migrations to the ${args.env} database: ${pending}`);
  await databaseStep("migrate", () => applyMigrations(databaseUrl));
  console.log("migrations applied");
}

const wranglerArgs = ["deploy", "--env", args.env];
if (args["secrets-file"]) wranglerArgs.push("--secrets-file", args["secrets-file"]);
if (args["dry-run"]) wranglerArgs.push("--dry-run", ...(args.outdir ? ["--outdir", args.outdir] : []));
// Wrangler needs neither database setting; the child never sees them.
const { DATABASE_URL: _url, DATABASE_WS_PROXY: _proxy, ...childEnv } = process.env;
const wrangler = spawnSync("node_modules/.bin/wrangler", wranglerArgs, { stdio: "inherit", env: childEnv });
process.exit(wrangler.status ?? 1);

/** One value of a secrets file (`NAME=value` lines, or a JSON object), as wrangler reads it. */
function fromSecretsFile(path: string | undefined, name: string): string | undefined {
  if (!path) return undefined;
  let text: string;
  try {
    text = readFileSync(path, "utf8");
  } catch (e) {
    return fail(`cannot read the secrets file (${(e as NodeJS.ErrnoException).code ?? "error"})`);
  }
  try {
    const values = text.trimStart().startsWith("{")
      ? (JSON.parse(text) as Record<string, unknown>)
      : parseEnv(text);
    const value = values[name];
    return typeof value === "string" && value ? value : undefined;
  } catch {
    // A JSON error quotes the text it choked on: the file's values.
    return fail("the secrets file is neither NAME=value lines nor a JSON object");
  }
}

/** A database step whose failure says what failed, by class and code only (a driver's message can quote the URL). */
async function databaseStep<T>(what: "read" | "migrate", step: () => Promise<T>): Promise<T> {
  try {
    return await step();
  } catch (e) {
    const err = e as Error & { code?: string };
    const doing = what === "read" ? "read the database's migrations" : "apply the migrations";
    return fail(`could not ${doing}: ${err.name}${err.code ? ` ${err.code}` : ""}`, 1);
  }
}
