#!/usr/bin/env node
// `benchwright`: what a user runs on their own machine (see `benchwright --help`). All of it, the
// egress agent included, is one bundle: ../dist/benchwright.cjs. The package (npm pack in cli/)
// ships that bundle; in a fresh checkout of the repository it is built here on first use. Plain
// CommonJS so that `npx benchwright` needs nothing but node.
const { existsSync } = require("node:fs");
const { join } = require("node:path");
const { spawnSync } = require("node:child_process");

const bundle = join(__dirname, "..", "dist", "benchwright.cjs");
if (!existsSync(bundle)) {
  const built = spawnSync("npm", ["run", "--silent", "build:cli"], {
    cwd: join(__dirname, "..", ".."),
    stdio: ["ignore", "inherit", "inherit"],
  });
  if (built.status !== 0 || !existsSync(bundle)) {
    process.stderr.write("benchwright: could not build the CLI (npm run build:cli)\n");
    process.exit(1);
  }
}
require(bundle);
