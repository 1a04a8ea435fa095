import { spawnSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { CLI_NODE, cli, configHome } from "./harness";

// Issue 36, item 3: the CLI where users are. It runs on Node 22 and 24 (this suite runs once per
// version: scripts/test.mjs), an older Node is told what is needed, and the docs never have
// anyone run `npx` on the package's name without --no: the name is not ours on the registry, so
// a bare one would download and run whatever a stranger published under it.

const ROOT = join(import.meta.dirname, "..", "..");
const major = (node: string) =>
  Number(spawnSync(node, ["-p", "process.versions.node"], { encoding: "utf8" }).stdout.split(".")[0]);

// The machine's own Node (Debian's /usr/bin/node, 20 on these machines) when it is older than 22.
const OLD_NODE = "/usr/bin/node";
const oldNode = spawnSync(OLD_NODE, ["--version"]).status === 0 && major(OLD_NODE) < 22;

describe("Node versions", () => {
  it("runs on this pass's Node, 22 or later", async () => {
    expect(major(CLI_NODE)).toBeGreaterThanOrEqual(22);
    const pkg = JSON.parse(readFileSync(join(ROOT, "cli", "package.json"), "utf8"));
    const res = await cli(["--version"], { home: configHome() });
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout.trim()).toBe(pkg.version);
    expect(pkg.engines.node).toBe(">=22.0.0");
    // The second pass is on Node 22: the cli workspace's pin (scripts/test.mjs checks the exact one).
    if (process.env.BW_CLI_NODE) expect(major(CLI_NODE)).toBe(22);
  });

  it.skipIf(!oldNode)("tells an older Node what it needs (exit 1) before loading anything", () => {
    const bin = join(ROOT, "cli", "bin", "benchwright.cjs");
    const res = spawnSync(OLD_NODE, [bin, "whoami"], { encoding: "utf8", env: { PATH: "/usr/bin:/bin" } });
    expect(res.status).toBe(1);
    expect(res.stderr).toContain("benchwright: needs Node.js 22 or later; this is v");
    expect(res.stdout).toBe("");
  });
});

describe("docs", () => {
  it("run the CLI as npx --no benchwright or the installed benchwright, never a bare npx of the name", () => {
    const files = spawnSync("git", ["ls-files", "-z"], { cwd: ROOT, encoding: "utf8" })
      .stdout.split("\0")
      .filter((f) => /\.(md|ts|tsx|mjs|cjs|js|json|sh)$/.test(f) || f === ".ci/run");
    expect(files.length).toBeGreaterThan(100);
    const bare: string[] = [];
    for (const file of files) {
      const text = readFileSync(join(ROOT, file), "utf8");
      for (const m of text.matchAll(/\bnpx((?:\s+-[\w=-]+)*)\s+benchwright\b/g)) {
        if (!/(^|\s)--no(\s|$)/.test(m[1] as string)) bare.push(`${file}: ${m[0]}`);
      }
    }
    expect(bare).toEqual([]);
  });
});
