// `npm test`: runs vitest with a JSON report beside the normal output, then prints the one line
// CI reads: "N passed, N failed" (", N skipped" when some were skipped). Extra arguments go to vitest.
//
// The CLI supports Node 22 and 24 (cli/package.json `engines`). Without arguments (the whole
// suite, as CI runs it) the CLI's suite runs a second time with the CLI on Node 22: the cli
// workspace's exact devDependency `node` (cli/node_modules/node), named to test/cli/harness.ts in
// BW_CLI_NODE. The line counts both passes.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync } from "node:fs";
import { resolve } from "node:path";

mkdirSync("test-results", { recursive: true });
const args = process.argv.slice(2);
const passes = [{ report: "test-results/vitest.json", args, env: {} }];
const totals = { passed: 0, failed: 0, skipped: 0 };
if (args.length === 0) {
  const node22 = oldestCliNode();
  if (node22) {
    const env = { BW_CLI_NODE: node22 };
    passes.push({ report: "test-results/vitest-cli-node22.json", args: ["--project", "cli"], env });
  } else totals.failed += 1;
}

for (const pass of passes) {
  rmSync(pass.report, { force: true });
  if (pass.env.BW_CLI_NODE) console.log(`\nThe CLI's suite again, the CLI on ${pass.env.BW_CLI_NODE}`);
  const run = spawnSync(
    "npx",
    [
      "vitest",
      "run",
      "--reporter=default",
      "--reporter=json",
      `--outputFile.json=${pass.report}`,
      ...pass.args,
    ],
    { stdio: "inherit", env: { ...process.env, ...pass.env } },
  );
  const counted = count(pass.report);
  totals.passed += counted.passed;
  totals.failed += counted.failed;
  totals.skipped += counted.skipped;
  if (run.status !== 0) process.exitCode = run.status ?? 1;
}
if (totals.passed === 0 || totals.failed > 0) process.exitCode ||= 1;
console.log(
  `${totals.passed} passed, ${totals.failed} failed${totals.skipped ? `, ${totals.skipped} skipped` : ""}`,
);

/** One pass's counts from vitest's JSON report; a pass that wrote none counts as one failure. */
function count(report) {
  try {
    const r = JSON.parse(readFileSync(report, "utf8"));
    // A suite that failed to load counts as a failure even though none of its tests ran.
    const brokenSuites = r.testResults.filter(
      (s) => s.status === "failed" && s.assertionResults.length === 0,
    ).length;
    const passed = r.numPassedTests;
    // A pass that ran nothing proves nothing.
    const failed = r.numFailedTests + brokenSuites + (passed === 0 ? 1 : 0);
    return { passed, failed, skipped: r.numPendingTests + r.numTodoTests };
  } catch {
    return { passed: 0, failed: 1, skipped: 0 };
  }
}

/**
 * The Node 22 that the cli workspace pins, checked to be that version (a silent fall-back to
 * another Node would pass while proving nothing about 22); null, said why, when it is not there.
 */
function oldestCliNode() {
  const want = JSON.parse(readFileSync("cli/package.json", "utf8")).devDependencies.node;
  const path = resolve("cli/node_modules/node/bin/node");
  const got = spawnSync(path, ["--version"], { encoding: "utf8" }).stdout?.trim();
  if (got === `v${want}`) return path;
  console.error(`${path} is ${got || "missing"}, not v${want} (cli/package.json): run npm ci`);
  return null;
}
