import { spawnSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startLoopbackUpstream } from "../../scripts/lib/demo-upstream";
import { BENCH_PACKAGE, benchIndexRoutes, buildWheel } from "../../scripts/lib/pip-index";
import { until } from "../until";

// The example benchmark's package index (scripts/lib/pip-index.ts), checked by the real client:
// the wheel is one pip installs and Python imports, and the upstream server the end-to-end test
// runs in its namespace serves it as a PEP 503 index that pip reads, over HTTPS with a test CA.
// Needs python3 with pip on the host (this machine's kind has both; CI runs here too).

const dir = mkdtempSync(join(tmpdir(), "bw-pip-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));

const python = spawnSync("python3", ["-m", "pip", "--version"], { encoding: "utf8" });
const NO_PIP = python.status === 0 ? null : `python3 -m pip is not available here (${python.stderr.trim()})`;
if (NO_PIP) console.warn(`skipping the pip client checks: ${NO_PIP}`);

function py(args: string[], env: Record<string, string> = {}) {
  const res = spawnSync("python3", args, {
    encoding: "utf8",
    env: {
      PATH: process.env.PATH,
      HOME: dir,
      // Nothing from this machine's pip settings, caches or other indexes.
      PIP_CONFIG_FILE: "/dev/null",
      PIP_NO_CACHE_DIR: "1",
      PIP_DISABLE_PIP_VERSION_CHECK: "1",
      ...env,
    },
    timeout: 120_000,
  });
  return { code: res.status, out: `${res.stdout}${res.stderr}` };
}

describe("the wheel", () => {
  it("is the same bytes every build, and names itself as pip expects", () => {
    const one = buildWheel(BENCH_PACKAGE);
    const two = buildWheel(BENCH_PACKAGE);
    expect(one.bytes.equals(two.bytes)).toBe(true);
    expect(one.filename).toBe("benchscore-1.0.0-py3-none-any.whl");
    expect(one.sha256).toBe(createHash("sha256").update(one.bytes).digest("hex"));
  });

  it.skipIf(NO_PIP !== null)("is a zip whose RECORD hashes every file (Python's zipfile reads it)", () => {
    const wheel = buildWheel(BENCH_PACKAGE);
    const file = join(dir, wheel.filename);
    writeFileSync(file, wheel.bytes);
    const check = py([
      "-c",
      [
        "import base64, hashlib, sys, zipfile",
        "z = zipfile.ZipFile(sys.argv[1])",
        "assert z.testzip() is None",
        "names = set(z.namelist())",
        "rows = [l.split(',') for l in z.read('benchscore-1.0.0.dist-info/RECORD').decode().splitlines()]",
        "seen = set()",
        "for path, h, size in rows:",
        "    seen.add(path)",
        "    if path.endswith('RECORD'): assert h == '' and size == ''; continue",
        "    data = z.read(path)",
        "    want = 'sha256=' + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()",
        "    assert h == want and int(size) == len(data), path",
        "assert seen == names, (seen, names)",
        "print('ok', len(rows))",
      ].join("\n"),
      file,
    ]);
    expect(check.out).toBe("ok 4\n");
  });
});

describe.skipIf(NO_PIP !== null)("the index, served by the upstream server, read by pip", () => {
  let upstream: Awaited<ReturnType<typeof startLoopbackUpstream>>;
  let index: string;
  let ca: string;
  beforeAll(async () => {
    // On loopback the client names the server by address: the index's host is 127.0.0.1 here.
    upstream = await startLoopbackUpstream({
      hosts: [],
      expectedKey: "unused",
      static: benchIndexRoutes("127.0.0.1"),
    });
    index = `https://127.0.0.1:${upstream.httpsPort}/simple/`;
    ca = join(dir, "ca.pem");
    writeFileSync(ca, upstream.caPem);
  });
  afterAll(() => upstream?.stop());

  it("pip download finds the wheel through /simple/ and checks its sha256", async () => {
    const into = join(dir, "download");
    const res = py([
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--index-url",
      index,
      "--cert",
      ca,
      "-d",
      into,
      "benchscore",
    ]);
    expect(res.code, res.out).toBe(0);
    expect(readdirSync(into)).toEqual(["benchscore-1.0.0-py3-none-any.whl"]);
    expect(
      readFileSync(join(into, "benchscore-1.0.0-py3-none-any.whl")).equals(buildWheel(BENCH_PACKAGE).bytes),
    ).toBe(true);
    // The server's lines are read once this test yields (spawnSync held the event loop).
    await until("the upstream's record of the file", () =>
      upstream.seen.some((s) => s.path === "/files/benchscore-1.0.0-py3-none-any.whl"),
    );
    const paths = upstream.seen.map((s) => [s.path, s.static]);
    expect(paths).toContainEqual(["/simple/benchscore/", 200]);
    expect(paths).toContainEqual(["/files/benchscore-1.0.0-py3-none-any.whl", 200]);
  });

  it("pip install puts a package Python imports and runs", () => {
    const target = join(dir, "site");
    const res = py([
      "-m",
      "pip",
      "install",
      "--no-deps",
      "--index-url",
      index,
      "--cert",
      ca,
      "--target",
      target,
      "benchscore",
    ]);
    expect(res.code, res.out).toBe(0);
    const run = py(
      [
        "-c",
        "import benchscore, json; print(json.dumps([benchscore.__version__, benchscore.score('a b c', 'A b d')]))",
      ],
      { PYTHONPATH: target },
    );
    expect(run.code, run.out).toBe(0);
    expect(JSON.parse(run.out)).toEqual(["1.0.0", { exact: false, overlap: 0.6667 }]);
  });

  it("answers 404 for a project it does not hold", async () => {
    const res = py([
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--index-url",
      index,
      "--cert",
      ca,
      "-d",
      join(dir, "x"),
      "nosuchpkg",
    ]);
    expect(res.code).not.toBe(0);
    expect(res.out).toContain("No matching distribution found for nosuchpkg");
    await until("the upstream's record of the 404", () =>
      upstream.seen.some((s) => s.path === "/simple/nosuchpkg/" && s.static === 404),
    );
  });
});
