import { spawnSync } from "node:child_process";
import { createHash, randomBytes } from "node:crypto";
import {
  chmodSync,
  copyFileSync,
  existsSync,
  linkSync,
  mkdirSync,
  mkdtempSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { gunzipSync } from "node:zlib";
import { tarGzEntries } from "@benchwright/shared/archive/entries";
import { COLLECT_EXIT, CollectManifest } from "@benchwright/shared/contract/bundle";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { streamOf } from "./archive-fixtures";

// bw-collect (proxy-image/dist/collect.cjs, built by the unit project's global setup) run as a
// child process over real directories, its archive read back with shared/archive's decoder the way
// the Worker reads it: `files/<path>` entries, then manifest.json.

const COLLECT = resolve(import.meta.dirname, "../../proxy-image/dist/collect.cjs");

let base: string;
let out: string;

beforeAll(() => {
  base = mkdtempSync(join(tmpdir(), "bw-collect-"));
  // Another uid (the unreadable test) must reach the programs and the directories below.
  chmodSync(base, 0o755);
});
afterAll(() => rmSync(base, { recursive: true, force: true }));
beforeEach(() => {
  out = join(base, `out-${randomBytes(4).toString("hex")}`);
  mkdirSync(out, { mode: 0o755 });
});

interface Collected {
  code: number | null;
  stderr: string;
  /** The archive's entries in order, with their bytes. */
  entries: { name: string; bytes: Buffer }[];
  manifest: CollectManifest;
  /** The whole tar, decompressed, to search for what must not be in it. */
  tar: Buffer;
}

async function collect(
  dir: string,
  args: string[] = [],
  o: { uid?: number; env?: Record<string, string> } = {},
): Promise<Collected> {
  const [node, program] = o.uid === undefined ? [process.execPath, COLLECT] : programsForOthers();
  const run = spawnSync(node, [program, dir, ...args], {
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin", ...o.env },
    ...(o.uid === undefined ? {} : { uid: o.uid, gid: o.uid }),
    maxBuffer: 512 * 1024 * 1024,
    timeout: 60_000,
  });
  if (run.status !== COLLECT_EXIT.ok) throw new Error(`collect exited ${run.status}: ${run.stderr}`);
  const entries: Collected["entries"] = [];
  for await (const entry of tarGzEntries(streamOf(run.stdout), { maxTarBytes: 1 << 30 })) {
    entries.push({
      name: entry.header.name,
      bytes: Buffer.from(await new Response(entry.body).arrayBuffer()),
    });
  }
  const last = entries.at(-1);
  expect(last?.name).toBe("manifest.json");
  const manifest = CollectManifest.parse(JSON.parse(last?.bytes.toString("utf8") ?? ""));
  return { code: run.status, stderr: run.stderr.toString(), entries, manifest, tar: gunzipSync(run.stdout) };
}

/** node and collect.cjs where another uid can run them (the checkout may sit in a 0700 directory). */
function programsForOthers(): [string, string] {
  const node = join(base, "node");
  const program = join(base, "collect.cjs");
  if (!existsSync(node)) {
    try {
      linkSync(process.execPath, node);
    } catch {
      copyFileSync(process.execPath, node);
    }
    chmodSync(node, 0o755);
  }
  copyFileSync(COLLECT, program);
  chmodSync(program, 0o644);
  return [node, program];
}

const sha256 = (data: string | Buffer) => createHash("sha256").update(data).digest("hex");
const names = (c: Collected) => c.entries.map((e) => e.name);

describe("case H4: a symlink in $BW_OUT is never followed", () => {
  it("symlinks to /etc/passwd, /proc/self/environ, /etc and up the tree are cut, their targets unread", async () => {
    const canary = `bw-canary-${randomBytes(8).toString("hex")}`;
    writeFileSync(join(out, "result.json"), '{"score": 1}\n');
    symlinkSync("/etc/passwd", join(out, "passwd"));
    symlinkSync("/proc/self/environ", join(out, "environ"));
    symlinkSync("/etc", join(out, "etc"));
    mkdirSync(join(out, "sub"));
    symlinkSync("../..", join(out, "sub", "up"));
    const c = await collect(out, [], { env: { BW_CANARY: canary } });
    expect(names(c)).toEqual(["files/result.json", "manifest.json"]);
    expect(c.manifest.cut).toEqual([
      { path: "environ", reason: "symlink", size: null },
      { path: "etc", reason: "symlink", size: null },
      { path: "passwd", reason: "symlink", size: null },
      { path: "sub/up", reason: "symlink", size: null },
    ]);
    // Neither the environment (the canary is in collect's own) nor /etc/passwd reached the archive.
    expect(c.tar.includes(canary)).toBe(false);
    expect(c.tar.includes("root:x:0:0")).toBe(false);
  });

  it("$BW_OUT itself replaced by a symlink: cut as `.`, nothing collected", async () => {
    const link = join(base, `link-${randomBytes(4).toString("hex")}`);
    symlinkSync("/etc", link);
    const c = await collect(link);
    expect(names(c)).toEqual(["manifest.json"]);
    expect(c.manifest).toMatchObject({
      files: [],
      cut: [{ path: ".", reason: "symlink", size: null }],
      missing: false,
    });
  });
});

describe("case H4: over the bounds, cut and listed", () => {
  it("past the count bound: the first files in order are kept, the rest cut `too_many`", async () => {
    for (const n of ["d", "a", "c", "b"]) writeFileSync(join(out, n), n.repeat(3));
    const c = await collect(out, ["--max-files", "2"]);
    expect(names(c)).toEqual(["files/a", "files/b", "manifest.json"]);
    expect(c.manifest.cut).toEqual([
      { path: "c", reason: "too_many", size: 3 },
      { path: "d", reason: "too_many", size: 3 },
    ]);
    expect(c.manifest.limits).toEqual({ maxBytes: 64 * 1024 * 1024, maxFiles: 2 });
  });

  it("past the byte bound: the file that would pass it is cut `too_large`, smaller ones after it kept", async () => {
    writeFileSync(join(out, "a"), "a".repeat(10));
    writeFileSync(join(out, "b"), "b".repeat(100));
    writeFileSync(join(out, "c"), "c".repeat(10));
    const c = await collect(out, ["--max-bytes", "25"]);
    expect(c.manifest.files.map((f) => f.path)).toEqual(["a", "c"]);
    expect(c.manifest.cut).toEqual([{ path: "b", reason: "too_large", size: 100 }]);
    expect(names(c)).toEqual(["files/a", "files/c", "manifest.json"]);
  });

  it("countless cuts: the list stops at the bound and the manifest says it is incomplete", async () => {
    for (let i = 0; i < 5; i++) symlinkSync("/etc/passwd", join(out, `l${i}`));
    const c = await collect(out, ["--max-files", "2"]);
    expect(c.manifest.cut.map((x) => x.path)).toEqual(["l0", "l1"]);
    expect(c.manifest.incomplete).toBe(true);
  });
});

describe("what is collected", () => {
  it("each file's bytes and sha256, depth first in byte order, the manifest last", async () => {
    mkdirSync(join(out, "a"));
    mkdirSync(join(out, "b"));
    writeFileSync(join(out, "a", "y.txt"), "why\n");
    writeFileSync(join(out, "a.txt"), "eh\n");
    writeFileSync(join(out, "b", "x.bin"), Buffer.alloc(200_000, 9));
    writeFileSync(join(out, "empty"), "");
    const c = await collect(out);
    expect(names(c)).toEqual([
      "files/a/y.txt",
      "files/a.txt",
      "files/b/x.bin",
      "files/empty",
      "manifest.json",
    ]);
    expect(c.manifest).toEqual({
      files: [
        { path: "a/y.txt", size: 4, sha256: sha256("why\n") },
        { path: "a.txt", size: 3, sha256: sha256("eh\n") },
        { path: "b/x.bin", size: 200_000, sha256: sha256(Buffer.alloc(200_000, 9)) },
        { path: "empty", size: 0, sha256: sha256("") },
      ],
      cut: [],
      limits: { maxBytes: 64 * 1024 * 1024, maxFiles: 1000 },
      missing: false,
    });
    for (const f of c.manifest.files) {
      expect(sha256((c.entries.find((e) => e.name === `files/${f.path}`) as { bytes: Buffer }).bytes)).toBe(
        f.sha256,
      );
    }
  });

  it("a missing $BW_OUT: `missing: true`, an archive of the manifest alone, exit 0", async () => {
    const c = await collect(join(base, "never-made"));
    expect(c.code).toBe(COLLECT_EXIT.ok);
    expect(names(c)).toEqual(["manifest.json"]);
    expect(c.manifest).toEqual({
      files: [],
      cut: [],
      limits: { maxBytes: 64 * 1024 * 1024, maxFiles: 1000 },
      missing: true,
    });
  });

  it("a FIFO is cut `special` without being opened (collect would block on it)", async () => {
    writeFileSync(join(out, "ok"), "ok");
    expect(spawnSync("mkfifo", [join(out, "pipe")]).status).toBe(0);
    const c = await collect(out);
    expect(c.manifest.cut).toEqual([{ path: "pipe", reason: "special", size: null }]);
    expect(names(c)).toEqual(["files/ok", "manifest.json"]);
  });

  it("a name that is not UTF-8 is cut `unreadable`: the manifest could not name it faithfully", async () => {
    writeFileSync(Buffer.concat([Buffer.from(`${out}/bad-`), Buffer.from([0xff, 0xfe])]), "x");
    const c = await collect(out);
    expect(c.manifest.cut).toEqual([{ path: "bad-\uFFFD\uFFFD", reason: "unreadable", size: null }]);
    expect(names(c)).toEqual(["manifest.json"]);
  });

  it("a tree deeper than any recursion would like", async () => {
    let dir = out;
    for (let i = 0; i < 400; i++) dir = join(dir, "d");
    mkdirSync(dir, { recursive: true });
    writeFileSync(join(dir, "bottom"), "deep");
    const c = await collect(out);
    expect(c.manifest.files).toEqual([
      { path: `${"d/".repeat(400)}bottom`, size: 4, sha256: sha256("deep") },
    ]);
  });

  it.runIf(process.getuid?.() === 0)(
    "as the execute uid: what it may not read is cut `unreadable`, the rest collected",
    async () => {
      writeFileSync(join(out, "mine"), "readable");
      chmodSync(join(out, "mine"), 0o644);
      writeFileSync(join(out, "secret"), "root only");
      chmodSync(join(out, "secret"), 0o600);
      mkdirSync(join(out, "closed"), { mode: 0o700 });
      writeFileSync(join(out, "closed", "inside"), "hidden");
      const c = await collect(out, [], { uid: 1000 });
      expect(c.manifest.files.map((f) => f.path)).toEqual(["mine"]);
      expect(c.manifest.cut).toEqual([
        { path: "closed", reason: "unreadable", size: null },
        { path: "secret", reason: "unreadable", size: 9 },
      ]);
      expect(c.tar.includes("root only")).toBe(false);
    },
  );
});

describe("the command line", () => {
  it("a bad bound or no directory: exit 1, a message on stderr, nothing on stdout", () => {
    for (const args of [["--max-bytes", "-1", out], [out, "--max-files", "x"], []]) {
      const run = spawnSync(process.execPath, [COLLECT, ...args]);
      expect(run.status).toBe(COLLECT_EXIT.failed);
      expect(run.stdout.length).toBe(0);
      expect(run.stderr.toString()).toMatch(/^usage: collect\.cjs/);
    }
  });
});
