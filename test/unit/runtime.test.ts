import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";

// The suite runs on the Node the project pins (npm's `node` package, a devDependency), not on
// the machine's own: npm puts node_modules/.bin first on PATH for every script, so vitest, tsx,
// wrangler and every `node` a test spawns are that one. A silent fall-back to the system Node
// (20 on these machines, end of life) fails here.
const pinned: string = JSON.parse(readFileSync(new URL("../../package.json", import.meta.url), "utf8"))
  .devDependencies.node;

describe("the runtime", () => {
  it("is the pinned Node 24, in this process and in every node a test spawns", () => {
    expect(pinned).toMatch(/^24\.\d+\.\d+$/);
    expect(process.versions.node).toBe(pinned);
    expect(Number(process.versions.node.split(".")[0])).toBe(24);
    const spawned = execFileSync("node", ["--version"], { encoding: "utf8" }).trim();
    expect(spawned).toBe(`v${pinned}`);
  });
});
