#!/usr/bin/env node
// `benchwright`: what a user runs on their own machine. One command so far:
//   benchwright egress-agent --url <control plane> --token <bwe_...>   (see `--help`)
// It runs the bundled agent (proxy-image/dist/egress-agent.cjs), building the bundles first on a
// fresh checkout. Plain CommonJS so that `npx benchwright` needs nothing but node.
const { existsSync } = require("node:fs");
const { join } = require("node:path");
const { spawnSync } = require("node:child_process");

const [command, ...rest] = process.argv.slice(2);
if (command !== "egress-agent") {
  process.stderr.write(
    "usage: benchwright egress-agent --url <control plane URL> --token <bwe_...> [--help]\n",
  );
  process.exit(2);
}
const bundle = join(__dirname, "..", "dist", "egress-agent.cjs");
if (!existsSync(bundle)) {
  const built = spawnSync("npm", ["run", "--silent", "build:proxy"], {
    cwd: join(__dirname, "..", ".."),
    stdio: ["ignore", "inherit", "inherit"],
  });
  if (built.status !== 0 || !existsSync(bundle)) {
    process.stderr.write("benchwright: could not build the egress agent (npm run build:proxy)\n");
    process.exit(1);
  }
}
process.argv = [process.argv[0], bundle, ...rest];
require(bundle);
