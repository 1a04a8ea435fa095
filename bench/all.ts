// `npm run bench`: every bench in turn, each in its own process as `npm run bench:<name>` runs
// it, each writing its section of bench/results/latest.{md,json}. One failing (a crash, an
// ambiguous forward, a run that did not start: never a time) does not stop the others; the exit
// status says whether any failed. BENCH_ONLY=fuzz,audit runs some of them.
import { spawnSync } from "node:child_process";
import { join } from "node:path";
import { BENCHES, ROOT } from "./lib/results";

const only = (process.env.BENCH_ONLY ?? "").split(",").filter(Boolean);
const unknown = only.filter((b) => !(BENCHES as readonly string[]).includes(b));
if (unknown.length > 0) throw new Error(`BENCH_ONLY: no bench ${unknown.join(", ")} (${BENCHES.join(", ")})`);

const failed: string[] = [];
for (const bench of BENCHES) {
  if (only.length > 0 && !only.includes(bench)) continue;
  process.stderr.write(`\n=== bench:${bench} ===\n`);
  const t0 = Date.now();
  const r = spawnSync(process.execPath, ["--import", "tsx", join(ROOT, "bench", `${bench}-bench.ts`)], {
    cwd: ROOT,
    stdio: "inherit",
  });
  const code = r.status ?? 1;
  process.stderr.write(
    `=== bench:${bench}: ${code === 0 ? "done" : `FAILED (${code})`} in ${((Date.now() - t0) / 1000).toFixed(0)} s\n`,
  );
  if (code !== 0) failed.push(bench);
}
process.stderr.write(
  failed.length === 0 ? "\nall benches done: bench/results/latest.md\n" : `\nfailed: ${failed.join(", ")}\n`,
);
process.exit(failed.length === 0 ? 0 : 1);
