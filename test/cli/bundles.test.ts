import { mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { api, apiUrl, cli, loggedIn } from "./harness";

// The CLI against the real API for bundles and artifacts (issue 20): what `runs launch --from`
// uploads is what the API stores and the run names, and `runs artifacts` reads the real routes.
// These routes come with the API's part of issue 20; until the API serves them, this file says so
// and skips (test/unit/cli-transfer.test.ts covers the CLI's side on its own meanwhile).

const doc = (await (await fetch(`${apiUrl()}/v1/openapi.json`)).json()) as { paths: Record<string, unknown> };
const MISSING = ["/v1/bundles", "/v1/runs/{id}/artifacts"].filter((p) => !(p in doc.paths));
if (MISSING.length > 0) console.warn(`CLI bundle tests skipped: the API has no ${MISSING.join(", ")} yet`);

function bench(home: string): string {
  const folder = join(home, "bench");
  mkdirSync(join(folder, "lib"), { recursive: true });
  writeFileSync(join(folder, "benchwright.json"), JSON.stringify({ commands: ["python3 task_impl.py"] }));
  writeFileSync(join(folder, "task_impl.py"), "print('hi')\n");
  writeFileSync(join(folder, "lib", "util.py"), "X = 1\n");
  return folder;
}

describe.skipIf(MISSING.length > 0)("bundles and artifacts through the real API", () => {
  it("uploads the folder once per content, and the run names the bundle the API stored", async () => {
    const user = await loggedIn();
    const folder = bench(user.home);
    const first = await cli(["runs", "launch", "--from", folder, "--json"], { home: user.home });
    expect(first.code, first.stderr).toBe(0);
    expect(first.stderr).toContain(`packed ${folder}: 3 files`);
    const sha = /uploaded bundle ([0-9a-f]{64})/.exec(first.stderr)?.[1] as string;
    expect(sha).toBeTruthy();
    const specOf = async (launch: { stdout: string }) =>
      JSON.parse((await api(user.key, `/v1/runs/${JSON.parse(launch.stdout).id}`)).text).spec;
    expect((await specOf(first)).bundle).toBe(sha);
    const stored = await api(user.key, `/v1/bundles/${sha}`);
    expect(stored.status, stored.text).toBe(200);
    expect(JSON.parse(stored.text)).toMatchObject({ sha256: sha });
    // The same folder packs to the same bytes: the same bundle, answered as already stored.
    const again = await cli(["runs", "launch", "--from", folder, "--json"], { home: user.home });
    expect(again.code, again.stderr).toBe(0);
    expect((await specOf(again)).bundle).toBe(sha);
    // Another environment does not see it.
    const other = await loggedIn();
    expect((await api(other.key, `/v1/bundles/${sha}`)).status).toBe(404);
  });

  it("lists a run without artifacts, and --out saves nothing", async () => {
    const user = await loggedIn();
    const launched = await cli(["runs", "launch", "--json", "--", "true"], { home: user.home });
    const id = JSON.parse(launched.stdout).id as string;
    await cli(["runs", "cancel", id], { home: user.home });
    const listed = await cli(["runs", "artifacts", id], { home: user.home });
    expect(listed.code, listed.stderr).toBe(0);
    expect(listed.stdout).toContain(`${id}: no artifacts`);
    const saved = await cli(["runs", "artifacts", id, "--out", join(user.home, "out"), "--json"], {
      home: user.home,
    });
    expect(saved.code, saved.stderr).toBe(0);
    expect(JSON.parse(saved.stdout)).toEqual({ artifacts: [], cut: [] });
  });

  it("says a run it cannot see is not found (exit 1)", async () => {
    const user = await loggedIn();
    const res = await cli(["runs", "artifacts", "run_0123456789abcdef"], { home: user.home });
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(/^benchwright: not_found: /);
  });
});
