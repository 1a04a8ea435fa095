import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { packFolder } from "../../cli/src/pack";
import { startLoopbackUpstream } from "../../scripts/lib/demo-upstream";
import { BENCH_PACKAGE, benchIndexRoutes, buildWheel, INDEX_HOST } from "../../scripts/lib/pip-index";

// examples/qa-bench checked piece by piece on this machine, before a run puts it together
// (test/e2e/example-bench.test.ts): the CLI packs what its `files` say, its pins match the wheel
// the suite's index serves, and task_impl.py runs with the package pip installs from that index.

const EXAMPLE = join(import.meta.dirname, "..", "..", "examples", "qa-bench");
const read = (name: string) => readFileSync(join(EXAMPLE, name), "utf8");
const dir = mkdtempSync(join(tmpdir(), "bw-example-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const pip = spawnSync("python3", ["-m", "pip", "--version"]);
const NO_PIP = pip.status === 0 ? null : "python3 -m pip is not available here";
if (NO_PIP) console.warn(`skipping task_impl.py's run: ${NO_PIP}`);

describe("the folder", () => {
  it("packs the files its `files` names and its spec, nothing else", async () => {
    const spec = JSON.parse(read("benchwright.json"));
    const packed = await packFolder(EXAMPLE, { files: spec.files, always: ["benchwright.json"] });
    expect(packed.paths).toEqual([
      "benchwright.json",
      "pip.conf",
      "requirements.txt",
      "setup.sh",
      "task_impl.py",
    ]);
    expect(spec.setup).toEqual(["sh setup.sh"]);
    expect(spec.tasks.map((t: { name: string }) => t.name)).toEqual(["hello", "hello-there", "goodbye"]);
  });

  it("pins the wheel the index serves, from the index the suite's upstream serves", () => {
    const wheel = buildWheel(BENCH_PACKAGE);
    expect(read("requirements.txt")).toContain(`benchscore==1.0.0 --hash=sha256:${wheel.sha256}`);
    expect(read("pip.conf")).toContain(`index-url = https://${INDEX_HOST}/simple/`);
    expect(spawnSync("sh", ["-n", join(EXAMPLE, "setup.sh")]).status).toBe(0);
  });
});

describe.skipIf(NO_PIP !== null)("task_impl.py, with benchscore from the index", () => {
  let upstream: Awaited<ReturnType<typeof startLoopbackUpstream>>;
  let site: string;
  let ca: string;
  const env = () => ({
    PATH: process.env.PATH,
    HOME: dir,
    PYTHONPATH: site,
    // requests (the task's HTTP stack) reads REQUESTS_CA_BUNDLE; the wiring sets both in a run.
    SSL_CERT_FILE: ca,
    REQUESTS_CA_BUNDLE: ca,
    // localhost: the API, the judge and the dataset; 127.0.0.1: the index (a host the upstream
    // serves only files for).
    QA_BENCH_API: `https://localhost:${upstream.httpsPort}/v1/chat/completions`,
    QA_BENCH_JUDGE: `https://localhost:${upstream.httpsPort}/v1/chat/completions`,
    QA_BENCH_DATA: `https://localhost:${upstream.httpsPort}/datasets/qa`,
  });
  beforeAll(async () => {
    upstream = await startLoopbackUpstream({
      hosts: ["localhost"],
      expectedKey: "the-vault-key",
      static: benchIndexRoutes("127.0.0.1"),
    });
    ca = join(dir, "ca.pem");
    writeFileSync(ca, upstream.caPem);
    site = join(dir, "site");
    // As setup.sh does it (there into a venv), with the example's own pins.
    const installed = spawnSync(
      "python3",
      [
        "-m",
        "pip",
        "install",
        "--no-cache-dir",
        "--require-hashes",
        "--index-url",
        `https://127.0.0.1:${upstream.httpsPort}/simple/`,
        "--cert",
        ca,
        "--target",
        site,
        "-r",
        join(EXAMPLE, "requirements.txt"),
      ],
      { encoding: "utf8", env: { PATH: process.env.PATH, HOME: dir, PIP_CONFIG_FILE: "/dev/null" } },
    );
    expect(installed.status, `${installed.stdout}${installed.stderr}`).toBe(0);
  });
  afterAll(() => upstream?.stop());

  it("--plan names the tasks and the package's version", () => {
    const res = spawnSync("python3", [join(EXAMPLE, "task_impl.py"), "--plan"], {
      encoding: "utf8",
      env: env(),
    });
    expect(res.status, res.stderr).toBe(0);
    expect(JSON.parse(res.stdout)).toEqual({
      tasks: ["goodbye", "hello", "hello-there"],
      benchscore: "1.0.0",
    });
  });

  it("sends no key of its own: without the proxy the API answers 401, and the task records it and exits 1", () => {
    const out = join(dir, "out");
    const res = spawnSync("python3", [join(EXAMPLE, "task_impl.py"), "hello"], {
      encoding: "utf8",
      env: { ...env(), BW_OUT: out },
    });
    expect(res.status, res.stderr).toBe(1);
    const result = JSON.parse(readFileSync(join(out, "hello.json"), "utf8"));
    expect(result).toMatchObject({
      task: "hello",
      reference: "Hello world",
      answer: null,
      score: null,
      api: { status: 401 },
      // No JUDGE_API_KEY in this environment: the judge is called without one, and refuses.
      judge: { status: 401, keyInEnvironment: "none" },
      // Outside a run nothing limits the dataset host: the upload goes through.
      dataset: { read: 200, write: 200 },
      package: { name: "benchscore", version: "1.0.0", file: join(site, "benchscore", "__init__.py") },
    });
    expect(result.api.error).toContain("invalid_api_key");
  });

  it("refuses an unknown task (exit 2)", () => {
    const res = spawnSync("python3", [join(EXAMPLE, "task_impl.py"), "nope"], {
      encoding: "utf8",
      env: env(),
    });
    expect(res.status).toBe(2);
    expect(res.stderr).toContain("tasks: goodbye, hello, hello-there");
  });
});
