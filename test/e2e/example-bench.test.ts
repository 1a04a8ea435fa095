import { mkdtempSync, readdirSync, readFileSync, statSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { expect, it } from "vitest";
import { BENCH_PACKAGE, benchIndexRoutes, buildWheel, INDEX_HOST } from "../../scripts/lib/pip-index";
import { buildCli, cli as runCli } from "../cli/harness";
import { until } from "../until";
import { demoVault, describeE2e, type E2eOptions, newUser, waitForEnd } from "./harness";
import { runPageText, setupImageRows, setupRanIn, stagesCard } from "./setup-images";

// Issue 20's example benchmark end to end, on real parts: examples/qa-bench launched with the
// real CLI (`runs launch --from ... --follow`: packed, uploaded as a bundle, launched), on the
// local backend under catch-all routing. Its setup.sh pip installs a real wheel from a real
// PEP 503 index that the suite's upstream serves from its own namespace (reachable only
// through the run's proxy, the index host allowed in the vault), once: in the work sandbox,
// whose setup is kept as a setup image that the three tasks start from. The tasks call the API
// host with no key (the proxy injects the vault's, the upstream checks it) and write their
// results to $BW_OUT; `runs artifacts --out` brings them back. The vault's secret is a canary
// that no artifact and no CLI output may contain.

const EXAMPLE = join(import.meta.dirname, "..", "..", "examples", "qa-bench");
const TASKS = ["goodbye", "hello", "hello-there"];

let bin: string;

async function start(): Promise<E2eOptions> {
  // The CLI's bundle, built from the current sources for this file alone (as cli-walk does).
  bin = await buildCli("bw-example-cli-");
  return { name: "bwt-e2x", index: 84, static: benchIndexRoutes() };
}

describeE2e("the example benchmark: bundle, setup, tasks, artifacts", { start }, (e) => {
  const outputs: string[] = [];
  it("installs its package through the proxy once, fans out three tasks from the setup image, and its results come back", async () => {
    const user = await newUser(e.stack.apiUrl);
    // The API host gets the canary as its key; a block default makes the run catch-all, so the
    // index host must be allowed (the setup stage goes through the boundary too).
    await demoVault(user, e.canary, { default: "block" });
    const allowed = await user.call("POST", "/v1/vault/hosts", { pattern: INDEX_HOST, action: "allow" });
    expect(allowed.status, allowed.text).toBeLessThan(300);
    // The judge: an ordinary rule whose secret the tasks read from their environment (a
    // placeholder, case N1); the dataset host: allowed read-only (case N3). The judge's key is a
    // canary of its own, and the demo upstream checks the API's key, so the judge gets the same.
    const judgeSecret = await user.call("POST", "/v1/vault/secrets", {
      name: "JUDGE_API_KEY",
      value: e.canary,
    });
    expect(judgeSecret.status, judgeSecret.text).toBeLessThan(300);
    const judgeRule = await user.call("POST", "/v1/vault/rules", {
      host: "judge.demo.test",
      secret: "JUDGE_API_KEY",
      inject: { scheme: "bearer" },
    });
    expect(judgeRule.status, judgeRule.text).toBeLessThan(300);
    const readOnly = await user.call("POST", "/v1/vault/hosts", {
      pattern: "data.demo.test",
      action: "allow",
      methods: ["GET", "HEAD"],
    });
    expect(readOnly.status, readOnly.text).toBeLessThan(300);

    const home = mkdtempSync(join(tmpdir(), "bw-example-home-"));
    const cli = async (args: string[], input?: string) => {
      const res = await runCli(args, { home, input, bin });
      outputs.push(res.stdout, res.stderr);
      return res;
    };
    expect((await cli(["login", "--url", e.stack.apiUrl], `${user.key}\n`)).code).toBe(0);

    const launched = await cli(["runs", "launch", "--from", EXAMPLE, "--follow"]);
    expect(launched.code, `${launched.stdout}\n${launched.stderr}`).toBe(0);
    const id = /launched (run_\S+)/.exec(launched.stderr)?.[1] as string;
    expect(id).toBeTruthy();
    expect(launched.stdout).toContain(`${id} finished: completed`);
    // The folder went up as a bundle of the files its `files` list names, and the spec file.
    expect(launched.stderr).toMatch(/packed .*qa-bench: 5 files/);
    const sha = /uploaded bundle ([0-9a-f]{64})/.exec(launched.stderr)?.[1];
    const run = (await user.call("GET", `/v1/runs/${id}`)).json;
    expect(run).toMatchObject({ status: "finished", reason: "completed", routing: "catch-all" });
    expect(run.spec.bundle).toBe(sha);
    expect(run.spec.files).toBeUndefined();
    // The work sandbox's command ran with the installed package too.
    expect(launched.stdout).toContain('"benchscore": "1.0.0"');

    // Setup ran once, in the work sandbox: it read the index and fetched the wheel through the
    // proxy (catch-all: there is no other way out), pip checked its hash, and what it installed
    // was kept as a setup image; the three tasks started from that image, with no setup stage.
    const wheel = buildWheel(BENCH_PACKAGE);
    const fetched = e.upstream.seen.filter(
      (s) => s.host === INDEX_HOST && s.path === `/files/${wheel.filename}`,
    );
    expect(fetched.length).toBe(1);
    expect(fetched.every((s) => s.static === 200)).toBe(true);
    const images = setupImageRows(run);
    expect(images.built.map((b) => b.name)).toEqual(["work"]);
    const digest = images.built[0]?.digest as string;
    expect(digest).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(images.built[0]?.text).toMatch(
      /^Setup image sha256:[0-9a-f]{64} built now \(\d+\.\d MiB, \d+ files\) from the setup of work\.$/,
    );
    expect(images.used.map((u) => u.name).sort()).toEqual(TASKS);
    for (const used of images.used) {
      expect(used).toMatchObject({ digest, builtByRunId: id, builtNow: true });
      expect(used.text).toBe(`${used.name} starts from setup image ${digest}, built now: no setup stage.`);
    }
    expect(setupRanIn(run)).toEqual(["work"]);
    // The follow printed it, and the run page says it per sandbox.
    expect(launched.stdout).toContain(`Setup image ${digest} built now`);
    const page = await runPageText(e.stack.apiUrl, user, id);
    expect(stagesCard(page, "work")).toContain("setup 1: sh setup.sh exited 0");
    expect(stagesCard(page, "work")).toContain(`setup kept as setup image ${digest} built now (`);
    for (const task of TASKS) {
      const card = stagesCard(page, task);
      expect(card).toContain(`setup started from setup image ${digest} built now`);
      expect(card).toContain("the wiring proved, before any command proved");
      expect(card).not.toContain("sh setup.sh");
    }
    const listed = (await user.call("GET", "/v1/setup-images")).json.setupImages;
    expect(listed).toEqual([
      expect.objectContaining({ status: "built", digest, builtBy: id, setup: ["sh setup.sh"], bundle: sha }),
    ]);
    const routes = await until(
      "the index host in the run's egress routes",
      async () => {
        const res = JSON.parse((await cli(["logs", "egress-routes", id, "--json"])).stdout);
        return (res.egressRoutes as { host: string }[]).some((r) => r.host === INDEX_HOST) ? res : null;
      },
      30_000,
      500,
    );
    expect(routes.egressRoutes.map((r: { host: string }) => r.host)).toContain("api.demo.test");

    // Each task called the API without a key; the upstream saw the vault's.
    const calls = e.upstream.seen.filter(
      (s) => s.host === "api.demo.test" && s.endpoint === "chat.completions",
    );
    expect(calls.length).toBe(TASKS.length);
    expect(calls.every((s) => s.keyMatches === true)).toBe(true);
    // Each judge call carried JUDGE_API_KEY from the task's environment; the judge saw the
    // vault's key. The dataset host saw each read and no upload: the proxy refused the POSTs.
    const judged = e.upstream.seen.filter((s) => s.host === "judge.demo.test");
    expect(judged.length).toBe(TASKS.length);
    expect(judged.every((s) => s.keyMatches === true)).toBe(true);
    const data = e.upstream.seen.filter((s) => s.host === "data.demo.test");
    expect(data.map((s) => s.path).sort()).toEqual(TASKS.map((t) => `/datasets/qa/${t}.json`).sort());

    // The artifacts: one result file per task sandbox, nothing cut; the work sandbox wrote none.
    const artifacts = await cli(["runs", "artifacts", id, "--json"]);
    expect(artifacts.code, artifacts.stderr).toBe(0);
    const list = JSON.parse(artifacts.stdout);
    expect(list.cut).toEqual([]);
    expect(
      list.artifacts.map((a: { sandboxName: string; path: string }) => `${a.sandboxName}/${a.path}`).sort(),
    ).toEqual(TASKS.map((t) => `${t}/${t}.json`).sort());
    const out = mkdtempSync(join(tmpdir(), "bw-example-out-"));
    const saved = await cli(["runs", "artifacts", id, "--out", out]);
    expect(saved.code, saved.stderr).toBe(0);
    expect(saved.stdout).toContain(`saved 3 of 3 artifacts under ${out}`);
    const files = walk(out);
    expect([...files].sort()).toEqual(TASKS.map((t) => `${t}/${t}.json`).sort());
    for (const task of TASKS) {
      const result = JSON.parse(readFileSync(join(out, task, `${task}.json`), "utf8"));
      expect(result).toMatchObject({
        task,
        answer: "Hello world",
        api: { status: 200, error: null },
        judge: { status: 200, error: null, keyInEnvironment: "placeholder" },
        dataset: { read: 200, write: 403 },
        package: { name: "benchscore", version: "1.0.0" },
      });
      // The refusal named the limit (case N3).
      expect(result.dataset.writeAnswer).toMatch(/method|GET/i);
      // Imported from the virtual environment setup.sh made, not from anywhere else.
      expect(result.package.file).toMatch(
        /^\/home\/sandbox\/\.venv\/lib\/python3[.\d]*\/site-packages\/benchscore\/__init__\.py$/,
      );
    }
    expect(JSON.parse(readFileSync(join(out, "hello", "hello.json"), "utf8")).score).toEqual({
      exact: true,
      overlap: 1,
    });

    // case H5: the canary is in no stored artifact (the proxy never handed it to the sandbox),
    // and in nothing the CLI printed.
    for (const file of files) expect(readFileSync(join(out, file), "utf8")).not.toContain(e.canary);
    for (const text of outputs) expect(text).not.toContain(e.canary);
  }, 300_000);

  it("case G6: a failing setup command stops the run before any command runs, in any sandbox", async () => {
    const user = await newUser(e.stack.apiUrl);
    await demoVault(user, e.canary);
    const launched = await user.call("POST", "/v1/runs", {
      setup: ["echo setting-up", "exit 7"],
      commands: ["echo WORK-RAN"],
      tasks: [{ name: "t1", commands: ["echo TASK-RAN"] }],
    });
    expect(launched.status, launched.text).toBe(202);
    const run = await waitForEnd(user, launched.json.id, 120_000);
    expect(run).toMatchObject({ status: "stopped", reason: "setup_failed" });
    expect(run.reasonDetail).toMatch(/^work \(sbx_\w+\): setup command 2 exited 7: exit 7$/);
    const full = (await user.call("GET", `/v1/runs/${launched.json.id}`)).json;
    const outputs = full.trace.filter((t: { kind: string }) => t.kind === "output");
    const text = JSON.stringify(outputs);
    // The first setup command ran (its output is in the trace); no execute command ran anywhere.
    expect(text).toContain("setting-up");
    expect(text).not.toContain("WORK-RAN");
    expect(text).not.toContain("TASK-RAN");
    const notes = JSON.stringify(full.notes ?? full);
    expect(notes).toMatch(/Setup command 2 in work \(exit 7\) exited 7, so the run stopped/);
  }, 180_000);
});

/** Every file under dir, relative, sorted. */
function walk(dir: string, root = dir): string[] {
  return readdirSync(dir)
    .flatMap((name) => {
      const path = join(dir, name);
      return statSync(path).isDirectory() ? walk(path, root) : [relative(root, path)];
    })
    .sort();
}
