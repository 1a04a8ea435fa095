// `npm test`: runs vitest with a JSON report beside the normal output, then prints the one line
// CI reads: "N passed, N failed" (", N skipped" when some were skipped). Extra arguments go to vitest.
import { spawnSync } from "node:child_process";
import { mkdirSync, readFileSync, rmSync } from "node:fs";

const report = "test-results/vitest.json";
mkdirSync("test-results", { recursive: true });
rmSync(report, { force: true });
const run = spawnSync(
  "npx",
  [
    "vitest",
    "run",
    "--reporter=default",
    "--reporter=json",
    `--outputFile.json=${report}`,
    ...process.argv.slice(2),
  ],
  { stdio: "inherit" },
);
let summary;
try {
  const r = JSON.parse(readFileSync(report, "utf8"));
  const skipped = r.numPendingTests + r.numTodoTests;
  // A suite that failed to load counts as a failure even though none of its tests ran.
  const brokenSuites = r.testResults.filter(
    (s) => s.status === "failed" && s.assertionResults.length === 0,
  ).length;
  const failed = r.numFailedTests + brokenSuites;
  summary = `${r.numPassedTests} passed, ${failed} failed${skipped ? `, ${skipped} skipped` : ""}`;
  if (r.numPassedTests === 0) process.exitCode = 1;
  if (failed > 0) process.exitCode = 1;
} catch {
  summary = "0 passed, 1 failed";
  process.exitCode = 1;
}
console.log(summary);
if (run.status !== 0) process.exitCode = run.status ?? 1;
