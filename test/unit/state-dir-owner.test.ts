import { spawnSync } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, expect, it } from "vitest";
import { ownerAlive, StateDir } from "../../local-agent/state-dir";

// The owner record tells the tests' sweep (test/setup/stale-agents.ts) a crashed agent's state
// directory from a live one's: only the former is cleaned.
const dirs: string[] = [];
const fresh = () => {
  const d = mkdtempSync(join(tmpdir(), "bw-owner-test-"));
  dirs.push(d);
  return d;
};
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

it("counts a directory prepared by a running process as alive", async () => {
  const root = fresh();
  await new StateDir(root).prepare("nft");
  expect(ownerAlive(root)).toBe(true);
});

it("counts a directory whose agent exited, or that has no record, as not alive", () => {
  const exited = spawnSync("sh", ["-c", "echo $$"], { encoding: "utf8" });
  const pid = Number(exited.stdout.trim());
  const root = fresh();
  writeFileSync(join(root, "owner"), JSON.stringify({ pid, start: "1" }));
  expect(ownerAlive(root)).toBe(false);
  expect(ownerAlive(fresh())).toBe(false);
});

it("counts a reused pid (another start time) as not alive", () => {
  const root = fresh();
  writeFileSync(join(root, "owner"), JSON.stringify({ pid: process.pid, start: "0" }));
  expect(ownerAlive(root)).toBe(false);
});
