import { spawnSync } from "node:child_process";
import { mkdtempSync, readdirSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { afterAll, describe, expect, it } from "vitest";

// The Worker as `wrangler deploy` would upload it, built offline with --dry-run, against
// Cloudflare's limit on a Worker's size: 10 MiB after compression on the Workers Paid plan (3 MiB
// on Free). A deployment needs Paid anyway (docs/operator-guide.md), so the test holds the bundle
// to the Paid limit and prints its size and the margin for both. gzip at its default level, as
// wrangler's own "gzip:" figure; source maps are not uploaded (no upload_source_maps).

const PAID_LIMIT = 10 * 1024 * 1024;
const FREE_LIMIT = 3 * 1024 * 1024;

const outdir = mkdtempSync(join(tmpdir(), "bw-bundle-"));
afterAll(() => rmSync(outdir, { recursive: true, force: true }));

describe.each(["staging", "production"])("wrangler deploy --dry-run --env %s", (env) => {
  // A build takes seconds, more on a busy machine.
  it("builds, and the upload fits Workers' size limit", { timeout: 300_000 }, () => {
    const dir = join(outdir, env);
    const r = spawnSync(
      "node_modules/.bin/wrangler",
      ["deploy", "--dry-run", "--env", env, "--outdir", dir],
      {
        encoding: "utf8",
        timeout: 300_000,
      },
    );
    expect(r.status, `${r.stdout}\n${r.stderr}`).toBe(0);
    const modules = readdirSync(dir, { recursive: true, withFileTypes: true }).filter(
      (f) => f.isFile() && !f.name.endsWith(".map") && f.name !== "README.md",
    );
    expect(modules.map((f) => f.name)).toContain("index.js");
    const compressed = modules.reduce(
      (sum, f) => sum + gzipSync(readFileSync(join(f.parentPath, f.name))).length,
      0,
    );
    const mib = (n: number) => (n / 1024 / 1024).toFixed(2);
    console.log(
      `${env}: ${mib(compressed)} MiB gzip; limit ${mib(PAID_LIMIT)} MiB Paid (${mib(PAID_LIMIT - compressed)} left), ${mib(FREE_LIMIT)} MiB Free`,
    );
    expect(compressed).toBeLessThan(PAID_LIMIT);
  });
});
