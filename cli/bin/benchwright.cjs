#!/usr/bin/env node
// `benchwright`: what a user runs on their own machine (see `benchwright --help`). All of it, the
// egress agent included, is one bundle: ../dist/benchwright.cjs. The package (npm pack in cli/)
// ships that bundle; in a fresh checkout of the repository it is built here on first use. Plain
// CommonJS, so that any node can run it and say which it needs: the bundle is built
// for Node 22 and tested on 22 and 24 (npm only warns about `engines`).
const major = Number(process.versions.node.split(".")[0]);
if (major < 22) {
  process.stderr.write(
    `benchwright: needs Node.js 22 or later; this is ${process.version} (${process.execPath})\n`,
  );
  process.exit(1);
}
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
