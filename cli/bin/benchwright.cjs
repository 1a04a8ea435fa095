#!/usr/bin/env node
// `benchwright`: what a user runs on their own machine (see `benchwright --help`).
//   benchwright egress-agent ...   the bundled egress agent (proxy-image/dist/egress-agent.cjs)
//   benchwright <anything else>    the API client (cli/dist/benchwright.cjs)
// Either bundle is built on first use in a fresh checkout. Plain CommonJS so that `npx benchwright`
// needs nothing but node.
const { existsSync } = require("node:fs");
const { join } = require("node:path");
const { spawnSync } = require("node:child_process");

const root = join(__dirname, "..", "..");

function bundle(path, script, what) {
  if (existsSync(path)) return path;
  const built = spawnSync("npm", ["run", "--silent", script], {
    cwd: root,
    stdio: ["ignore", "inherit", "inherit"],
  });
  if (built.status !== 0 || !existsSync(path)) {
    process.stderr.write(`benchwright: could not build the ${what} (npm run ${script})\n`);
    process.exit(1);
  }
  return path;
}

const [command, ...rest] = process.argv.slice(2);
if (command === "egress-agent") {
  const agent = bundle(join(root, "proxy-image", "dist", "egress-agent.cjs"), "build:proxy", "egress agent");
  process.argv = [process.argv[0], agent, ...rest];
  require(agent);
} else {
  require(bundle(join(root, "cli", "dist", "benchwright.cjs"), "build:cli", "CLI"));
}
