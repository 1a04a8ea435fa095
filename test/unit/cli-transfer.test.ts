import { createHash, randomBytes } from "node:crypto";
import {
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { artifactTarget, saveArtifact, UnsafeArtifactPath } from "../../cli/src/commands/artifacts";
import { Failed } from "../../cli/src/commands/shared";
import { buildCli, cli as runCli } from "../cli/harness";

// The CLI's side of bundles and artifacts over real HTTP: `runs launch --from` (what it uploads
// and launches, and what it does when the API answers otherwise) and `runs artifacts --out`
// (where it writes, and what it refuses). The API here is a loopback server of this test that
// answers as the test says, including as no honest API would (names that leave DIR, bytes that
// do not match their hash): the CLI trusts the disk more than the server, and only a server
// that misbehaves on purpose can show it. The honest path against the real API is
// test/cli/bundles.test.ts and test/e2e/example-bench.test.ts.

const sha256 = (b: Uint8Array | string) => createHash("sha256").update(b).digest("hex");
const made: string[] = [];
const temp = (prefix: string) => {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  made.push(dir);
  return dir;
};

interface Seen {
  method: string;
  path: string;
  headers: IncomingMessage["headers"];
  body: Buffer;
}
type Handler = (req: Seen, res: ServerResponse) => void;

let bin: string;
let server: Server;
let url: string;
let handler: Handler;
const seen: Seen[] = [];

beforeAll(async () => {
  bin = await buildCli();
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const s = {
        method: req.method ?? "",
        path: req.url ?? "",
        headers: req.headers,
        body: Buffer.concat(chunks),
      };
      seen.push(s);
      handler(s, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});
afterAll(async () => {
  await new Promise((r) => server?.close(r));
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

function json(res: ServerResponse, status: number, body: unknown) {
  res.writeHead(status, { "content-type": status < 300 ? "application/json" : "application/problem+json" });
  res.end(JSON.stringify(body));
}

const KEY = "bw_test_transfer_key";

/** The built CLI against the loopback server, with a fresh config home each call. */
function cli(args: string[], cwd?: string) {
  return runCli(args, {
    home: temp("bw-cli-home-"),
    bin,
    cwd,
    env: { BENCHWRIGHT_API_KEY: KEY, BENCHWRIGHT_URL: url },
  });
}

function benchFolder(spec: Record<string, unknown>, files: Record<string, string> = {}): string {
  const root = temp("bw-cli-bench-");
  writeFileSync(join(root, "benchwright.json"), JSON.stringify(spec));
  for (const [p, c] of Object.entries(files)) {
    mkdirSync(join(root, p, ".."), { recursive: true });
    writeFileSync(join(root, p), c);
  }
  return root;
}

const RUN = {
  id: "run_transfer",
  status: "queued",
  backend: "local",
  egressAgent: null,
};

describe("runs launch --from FOLDER", () => {
  it("uploads the packed folder as application/gzip with its length, then launches it by its sha256, files stripped", async () => {
    seen.length = 0;
    handler = (req, res) => {
      if (req.path === "/v1/bundles") {
        return json(res, 201, {
          sha256: sha256(req.body),
          size: req.body.length,
          files: 3,
          unpackedBytes: 10,
          createdAt: "2026-12-01T00:00:00Z",
        });
      }
      if (req.path === "/v1/runs") return json(res, 202, RUN);
      json(res, 404, { code: "not_found", detail: "no" });
    };
    const folder = benchFolder(
      { commands: ["python3 task_impl.py"], setup: ["sh setup.sh"], files: ["*.py", "setup.sh"] },
      { "task_impl.py": "print(1)\n", "setup.sh": "true\n", "notes.txt": "not listed" },
    );
    const res = await cli(["runs", "launch", "--from", folder]);
    expect(res.code, res.stderr).toBe(0);
    const [upload, launch] = seen;
    expect(upload).toMatchObject({ method: "POST", path: "/v1/bundles" });
    expect(upload?.headers["content-type"]).toBe("application/gzip");
    expect(upload?.headers["content-length"]).toBe(String(upload?.body.length));
    expect(upload?.headers.authorization).toBe(`Bearer ${KEY}`);
    expect(launch).toMatchObject({ method: "POST", path: "/v1/runs" });
    expect(JSON.parse(launch?.body.toString() ?? "")).toEqual({
      commands: ["python3 task_impl.py"],
      setup: ["sh setup.sh"],
      bundle: sha256(upload?.body ?? ""),
    });
    expect(res.stderr).toContain(`packed ${folder}: 3 files`);
    expect(res.stderr).toContain(`uploaded bundle ${sha256(upload?.body ?? "")}`);
    // Not a terminal: no progress line (no carriage returns) in what a script reads.
    expect(res.stderr).not.toContain("\r");
  });

  /** A server of its own for one test; `url` points at it meanwhile. */
  async function withServer(
    handle: (req: IncomingMessage, res: ServerResponse) => void,
    test: () => Promise<void>,
  ): Promise<void> {
    const own = createServer(handle);
    await new Promise<void>((r) => own.listen(0, "127.0.0.1", r));
    const before = url;
    url = `http://127.0.0.1:${(own.address() as AddressInfo).port}`;
    try {
      await test();
    } finally {
      url = before;
      own.closeAllConnections();
      await new Promise((r) => own.close(r));
    }
  }

  /** 8 MiB of random bytes: gzip cannot shrink them below what the socket buffers take at once. */
  function bigFolder(): string {
    const folder = benchFolder({ commands: ["true"] });
    const blob = new Uint8Array(8 << 20);
    for (let i = 0; i < blob.length; i += 65_536) blob.set(randomBytes(65_536), i);
    writeFileSync(join(folder, "blob.bin"), blob);
    return folder;
  }

  it("shows the API's 413 when it answers before the body is all sent, and launches nothing", async () => {
    const paths: string[] = [];
    await withServer(
      (req, res) => {
        // Answer from the headers alone, while the CLI is still sending the body.
        paths.push(req.url ?? "");
        json(res, 413, { code: "bundle_upload_too_large", detail: "The bundle is over 64 MiB." });
      },
      async () => {
        const res = await cli(["runs", "launch", "--from", bigFolder()]);
        expect(res.code).toBe(1);
        expect(res.stderr).toContain("bundle_upload_too_large: The bundle is over 64 MiB.");
        expect(paths).toEqual(["/v1/bundles"]);
      },
    );
  });

  it("says the API may refuse the size when it closes the connection mid-upload without an answer", async () => {
    await withServer(
      (req) => req.socket.destroy(),
      async () => {
        const res = await cli(["runs", "launch", "--from", bigFolder()]);
        expect(res.code).toBe(1);
        expect(res.stderr).toMatch(/could not reach .*: (EPIPE|ECONNRESET|UND_ERR_SOCKET|other side closed)/);
        expect(res.stderr).toContain("the API may refuse a bundle this large");
      },
    );
  });

  it("launches nothing when the API's hash is not the hash of the bytes sent", async () => {
    seen.length = 0;
    handler = (req, res) =>
      req.path === "/v1/bundles"
        ? json(res, 201, { sha256: "0".repeat(64), size: 1, files: 1, unpackedBytes: 1, createdAt: "x" })
        : json(res, 202, RUN);
    const res = await cli(["runs", "launch", "--from", benchFolder({ commands: ["true"] }, { "a.py": "" })]);
    expect(res.code).toBe(1);
    expect(res.stderr).toContain("not launched");
    expect(seen.map((s) => s.path)).toEqual(["/v1/bundles"]);
  });

  it("launches a folder that holds only its spec without a bundle", async () => {
    seen.length = 0;
    handler = (req, res) => (req.path === "/v1/runs" ? json(res, 202, RUN) : json(res, 404, { code: "x" }));
    const res = await cli(["runs", "launch", "--from", benchFolder({ commands: ["true"] })]);
    expect(res.code, res.stderr).toBe(0);
    expect(seen.map((s) => [s.path, JSON.parse(s.body.toString())])).toEqual([
      ["/v1/runs", { commands: ["true"] }],
    ]);
  });

  it("refuses credential-looking files before sending anything (exit 2), naming each", async () => {
    seen.length = 0;
    const folder = benchFolder(
      { commands: ["true"] },
      { ".env": "TOKEN=x", "keys/id_rsa": "k", "ok.py": "" },
    );
    const res = await cli(["runs", "launch", "--from", folder]);
    expect(res.code).toBe(2);
    expect(res.stderr).toContain(".env  looks like a credential (.env)");
    expect(res.stderr).toContain("keys/id_rsa  looks like a credential (id_*)");
    expect(res.stderr).toContain("--include-secret-file .env --include-secret-file keys/id_rsa");
    expect(seen).toEqual([]);
  });

  it("refuses a spec that names a bundle itself, and `files` in a spec given as a file", async () => {
    seen.length = 0;
    const folder = benchFolder({ commands: ["true"], bundle: "a".repeat(64) });
    expect((await cli(["runs", "launch", "--from", folder])).code).toBe(2);
    const file = join(benchFolder({ commands: ["true"], files: ["x"] }), "benchwright.json");
    const res = await cli(["runs", "launch", "--from", file]);
    expect(res.code).toBe(2);
    expect(res.stderr).toContain("give --from the folder");
    expect(seen).toEqual([]);
  });
});

describe("runs artifacts --out DIR", () => {
  const good = "result 1\n";
  const other = '{"ok":true}\n';
  const artifacts = [
    { id: "a1", sandboxName: "work", path: "result.txt", body: good },
    { id: "a2", sandboxName: "task-1", path: "deep/dir/out.json", body: other },
    { id: "a3", sandboxName: "work", path: "../../escaped.txt", body: "x" },
    { id: "a4", sandboxName: "work", path: "/etc/evil", body: "x" },
    { id: "a5", sandboxName: "..", path: "up.txt", body: "x" },
    { id: "a6", sandboxName: "work", path: "a/./b", body: "x" },
    { id: "a7", sandboxName: "work", path: "tampered.txt", body: "not what was listed", listed: "listed" },
  ];

  it("saves each artifact under DIR/<sandbox>/<path>, verified; refuses names that leave DIR and bytes that do not match", async () => {
    seen.length = 0;
    handler = (req, res) => {
      if (req.path === "/v1/runs/run_x/artifacts") {
        return json(res, 200, {
          artifacts: artifacts.map((a) => ({
            id: a.id,
            sandboxId: `sb_${a.sandboxName}`,
            sandboxName: a.sandboxName,
            path: a.path,
            size: Buffer.byteLength(a.listed ?? a.body),
            sha256: sha256(a.listed ?? a.body),
          })),
          cut: [
            {
              sandboxId: "sb_work",
              sandboxName: "work",
              path: "huge.bin",
              reason: "too_large",
              size: 90 << 20,
            },
          ],
        });
      }
      const a = artifacts.find((x) => req.path === `/v1/runs/run_x/artifacts/${x.id}`);
      if (!a) return json(res, 404, { code: "not_found", detail: "no" });
      res.writeHead(200, { "content-type": "application/octet-stream" });
      res.end(a.body);
    };
    const parent = temp("bw-cli-out-");
    const out = join(parent, "out");
    const res = await cli(["runs", "artifacts", "run_x", "--out", out]);
    expect(res.code).toBe(1);
    expect(readFileSync(join(out, "work", "result.txt"), "utf8")).toBe(good);
    expect(readFileSync(join(out, "task-1", "deep", "dir", "out.json"), "utf8")).toBe(other);
    // Nothing outside DIR, nothing unverified inside it (no half-written parts either).
    expect(readdirSync(parent)).toEqual(["out"]);
    expect(readdirSync(join(out, "work")).sort()).toEqual(["result.txt"]);
    expect(existsSync("/etc/evil")).toBe(false);
    for (const bad of ['"work/../../escaped.txt"', '"work//etc/evil"', '"../up.txt"', '"work/a/./b"']) {
      expect(res.stderr).toContain(`${bad}: refused`);
    }
    expect(res.stderr).toContain("work/tampered.txt: not saved:");
    expect(res.stderr).toContain("5 artifacts not saved");
    expect(res.stdout).toContain("work/huge.bin: over the size bound (90.0 MiB)");
    expect(res.stdout).toContain("saved 2 of 7 artifacts");
    // The refused ones were never even asked for.
    expect(seen.map((s) => s.path).filter((p) => /a[3-6]$/.test(p))).toEqual([]);
  });

  it("lists them as a table without --out, and what was cut", async () => {
    const res = await cli(["runs", "artifacts", "run_x"]);
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout.split("\n")[0]).toMatch(/^SANDBOX\s+PATH\s+SIZE\s+SHA256$/);
    expect(res.stdout).toMatch(/work\s+result\.txt\s+9 B\s+[0-9a-f]{16}/);
    expect(res.stdout).toContain("not collected (1):");
  });
});

describe("artifactTarget and saveArtifact", () => {
  it("refuses every name that is not a plain relative path", () => {
    const ok = artifactTarget("/o", "work", "a/b.json");
    expect(ok).toBe("/o/work/a/b.json");
    const bad: Array<[string, string]> = [
      ["work", ".."],
      ["work", "../x"],
      ["work", "a/../../x"],
      ["work", "/abs"],
      ["work", ""],
      ["work", "a//b"],
      ["work", "a/"],
      ["work", "./a"],
      ["work", "a\\..\\b"],
      ["work", "a\0b"],
      ["..", "x"],
      [".", "x"],
      ["", "x"],
      ["a/b", "x"],
    ];
    for (const [box, path] of bad) {
      expect(() => artifactTarget("/o", box, path), `${box} ${path}`).toThrow(UnsafeArtifactPath);
    }
  });

  const stream = (text: string) => new Blob([text]).stream();

  it("writes nothing through a symlink already in DIR", async () => {
    const out = temp("bw-cli-out-");
    const elsewhere = temp("bw-cli-elsewhere-");
    symlinkSync(elsewhere, join(out, "work"));
    const target = artifactTarget(out, "work", "x.txt");
    await expect(saveArtifact(stream("x"), out, target, { size: 1, sha256: sha256("x") })).rejects.toThrow(
      UnsafeArtifactPath,
    );
    expect(readdirSync(elsewhere)).toEqual([]);
  });

  it("replaces a symlink at the target itself rather than writing through it", async () => {
    const out = temp("bw-cli-out-");
    const victim = join(temp("bw-cli-victim-"), "victim.txt");
    writeFileSync(victim, "untouched");
    mkdirSync(join(out, "work"));
    symlinkSync(victim, join(out, "work", "x.txt"));
    await saveArtifact(stream("new"), out, artifactTarget(out, "work", "x.txt"), {
      size: 3,
      sha256: sha256("new"),
    });
    expect(readFileSync(victim, "utf8")).toBe("untouched");
    expect(readFileSync(join(out, "work", "x.txt"), "utf8")).toBe("new");
  });

  it("keeps no file whose bytes are longer than listed or hash otherwise", async () => {
    const out = temp("bw-cli-out-");
    const target = artifactTarget(out, "work", "x.txt");
    await expect(
      saveArtifact(stream("longer"), out, target, { size: 2, sha256: sha256("lo") }),
    ).rejects.toThrow(Failed);
    await expect(saveArtifact(stream("ab"), out, target, { size: 2, sha256: sha256("ba") })).rejects.toThrow(
      /sha256/,
    );
    expect(readdirSync(join(out, "work"))).toEqual([]);
  });
});
