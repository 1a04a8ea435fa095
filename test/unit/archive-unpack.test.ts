import { spawnSync } from "node:child_process";
import {
  chmodSync,
  linkSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { checkBundle } from "@benchwright/shared/archive/bundle";
import { BUNDLE_DEFAULTS, UNPACK_EXIT, UnpackResult } from "@benchwright/shared/contract/bundle";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { BAD_BUNDLES, gnuTar, packGz, streamOf, zeroBomb } from "./archive-fixtures";

// bw-unpack (proxy-image/dist/unpack.cjs, built by the unit project's global setup) run as a
// child process, as the agent runs it: a .tar.gz on stdin, one UnpackResult line on stdout. Each
// test unpacks into <parent>/work beside <parent>/outside, where an escape would land, and
// asserts that nothing outside work changed, whatever the bundle did.

const UNPACK = resolve(import.meta.dirname, "../../proxy-image/dist/unpack.cjs");

let scratch: string;
let parent: string;
let work: string;
let outside: string;

beforeAll(() => {
  scratch = mkdtempSync(join(tmpdir(), "bw-unpack-src-"));
});
afterAll(() => rmSync(scratch, { recursive: true, force: true }));
beforeEach(() => {
  parent = mkdtempSync(join(tmpdir(), "bw-unpack-"));
  work = join(parent, "work");
  outside = join(parent, "outside");
  mkdirSync(outside);
  writeFileSync(join(outside, "sentinel"), "untouched\n");
  return () => rmSync(parent, { recursive: true, force: true });
});

function unpack(
  bytes: Uint8Array,
  args: string[] = [],
  dir = work,
): { code: number | null; result: unknown; lines: number; stderr: string } {
  const run = spawnSync(process.execPath, [UNPACK, dir, ...args], { input: bytes, timeout: 60_000 });
  const stdout = run.stdout.toString();
  const lines = stdout.split("\n").filter((l) => l !== "");
  let result: unknown = null;
  try {
    result = JSON.parse(lines.at(-1) ?? "");
  } catch {}
  return { code: run.status, result, lines: lines.length, stderr: run.stderr.toString() };
}

/** Everything under `dir` but `work`: path, type, size and content, to compare before and after. */
function outsideWork(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const name of readdirSync(d).sort()) {
      const path = join(d, name);
      const r = rel === "" ? name : `${rel}/${name}`;
      if (r === "work") continue;
      const st = lstatSync(path);
      if (st.isDirectory()) {
        out.push(`${r}/`);
        walk(path, r);
      } else if (st.isSymbolicLink()) out.push(`${r} -> ${readlinkSync(path)}`);
      else out.push(`${r} ${st.size} ${readFileSync(path, "utf8")}`);
    }
  };
  walk(dir, "");
  return out;
}

/** The tree under `dir` as lines: directories, files with mode and content, symlinks. */
function listing(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const name of readdirSync(d).sort()) {
      const path = join(d, name);
      const r = rel === "" ? name : `${rel}/${name}`;
      const st = lstatSync(path);
      if (st.isDirectory()) {
        out.push(`${r}/`);
        walk(path, r);
      } else if (st.isSymbolicLink()) out.push(`${r} -> ${readlinkSync(path)}`);
      else out.push(`${r} ${(st.mode & 0o111 ? 0o755 : 0o644).toString(8)} ${readFileSync(path, "hex")}`);
    }
  };
  walk(dir, "");
  return out;
}

describe("a bundle unpacked", () => {
  it("GNU tar's archive of a benchmark folder comes out as it went in, counted as the check counts", async () => {
    const src = join(scratch, "bench");
    mkdirSync(join(src, "lib", "pkg"), { recursive: true });
    mkdirSync(join(src, "bin"));
    writeFileSync(join(src, "task_impl.py"), "print('hello')\n");
    writeFileSync(join(src, "setup.sh"), "#!/bin/sh\necho setup\n");
    chmodSync(join(src, "setup.sh"), 0o755);
    writeFileSync(join(src, "lib", "pkg", "data.bin"), Buffer.alloc(100_000, 0xab));
    symlinkSync("../lib/pkg/data.bin", join(src, "bin", "data"));
    symlinkSync("lib", join(src, "lib64"));
    linkSync(join(src, "task_impl.py"), join(src, "task_copy.py"));
    const long = join(src, "n".repeat(120), "m".repeat(120));
    mkdirSync(long, { recursive: true });
    writeFileSync(join(long, "deep.txt"), "deep\n");
    const bytes = gnuTar(src, ["."]);

    const run = unpack(bytes);
    expect(run.code).toBe(UNPACK_EXIT.ok);
    expect(run.lines).toBe(1);
    expect(UnpackResult.parse(run.result)).toEqual(await checkBundle(streamOf(bytes), BUNDLE_DEFAULTS));
    expect(listing(work)).toEqual(listing(src));
    // The hardlink is one file, as in the source.
    expect(lstatSync(join(work, "task_copy.py")).ino).toBe(lstatSync(join(work, "task_impl.py")).ino);
    expect(outsideWork(parent)).toEqual(["outside/", "outside/sentinel 10 untouched\n"]);
  });

  it("modes are 0o755 or 0o644 (no setuid, setgid, sticky), owned by the uid that unpacks", async () => {
    const bytes = await packGz([
      { header: { name: "suid", size: 1, mode: 0o4755, uid: 1234, gid: 1234 }, body: "s" },
      { header: { name: "sgid", size: 1, mode: 0o2711 }, body: "g" },
      { header: { name: "private", size: 1, mode: 0o600 }, body: "p" },
      { header: { name: "world", size: 1, mode: 0o777 }, body: "w" },
      { header: { name: "sticky/", type: "directory", size: 0, mode: 0o1777 } },
    ]);
    expect(unpack(bytes).code).toBe(UNPACK_EXIT.ok);
    const mode = (name: string) => lstatSync(join(work, name)).mode & 0o7777;
    expect(["suid", "sgid", "private", "world"].map((n) => mode(n).toString(8))).toEqual([
      "755",
      "755",
      "644",
      "755",
    ]);
    expect(mode("sticky") & 0o7000).toBe(0);
    expect(lstatSync(join(work, "suid")).uid).toBe(process.getuid?.());
  });

  it("into a directory that does not exist yet: it is made", async () => {
    const dir = join(parent, "new", "deeper");
    const run = unpack(await packGz([{ header: { name: "a", size: 1 }, body: "a" }]), [], dir);
    expect(run.result).toEqual({ ok: true, files: 1, bytes: 1 });
    expect(readFileSync(join(dir, "a"), "utf8")).toBe("a");
  });
});

describe("case H1 and case H2: refused by bw-unpack, nothing written outside its directory", () => {
  for (const bad of BAD_BUNDLES) {
    it(`${bad.attack ? `case ${bad.attack}` : "invalid"}: ${bad.name} → ${bad.code}`, async () => {
      const before = outsideWork(parent);
      const limits = bad.limits ?? BUNDLE_DEFAULTS;
      const run = unpack(await bad.make(scratch, outside), [
        "--max-bytes",
        String(limits.maxUnpackedBytes),
        "--max-files",
        String(limits.maxFiles),
      ]);
      expect(run.code).toBe(UNPACK_EXIT.refused);
      expect(run.lines).toBe(1);
      expect(UnpackResult.parse(run.result)).toMatchObject({ ok: false, code: bad.code });
      expect(outsideWork(parent)).toEqual(before);
    });
  }
});

describe("case H1: the writing does not trust the check alone", () => {
  it("a symlink already in the directory is never written through (lib -> ../outside, then lib/x)", async () => {
    mkdirSync(work);
    symlinkSync("../outside", join(work, "lib"));
    const run = unpack(await packGz([{ header: { name: "lib/x", size: 5 }, body: "owned" }]));
    expect(run.code).toBe(UNPACK_EXIT.failed);
    expect(run.lines).toBe(0);
    expect(run.stderr).toContain("lib is in the way: not a directory");
    expect(outsideWork(parent)).toEqual(["outside/", "outside/sentinel 10 untouched\n"]);
  });

  it("a symlink already in the directory is never opened as the file (sentinel -> ../outside/sentinel)", async () => {
    mkdirSync(work);
    symlinkSync("../outside/sentinel", join(work, "sentinel"));
    const run = unpack(await packGz([{ header: { name: "sentinel", size: 5 }, body: "owned" }]));
    expect(run.code).toBe(UNPACK_EXIT.failed);
    expect(run.stderr).toContain("EEXIST");
    expect(readFileSync(join(outside, "sentinel"), "utf8")).toBe("untouched\n");
  });

  it("a file already there is not overwritten", async () => {
    mkdirSync(work);
    writeFileSync(join(work, "keep"), "mine\n");
    const run = unpack(await packGz([{ header: { name: "keep", size: 6 }, body: "yours\n" }]));
    expect(run.code).toBe(UNPACK_EXIT.failed);
    expect(readFileSync(join(work, "keep"), "utf8")).toBe("mine\n");
  });

  it("what a refused bundle wrote before the refused entry stays, inside the directory only", async () => {
    const run = unpack(
      await packGz([
        { header: { name: "sub/keep", size: 1 }, body: "k" },
        { header: { name: "a", type: "symlink", linkname: "sub", size: 0 } },
        { header: { name: "a/x", size: 1 }, body: "x" },
      ]),
    );
    expect(run.result).toMatchObject({ ok: false, code: "bundle_link_escape" });
    expect(listing(work)).toEqual(["a -> sub", "sub/", "sub/keep 644 6b"]);
  });

  it("a directory given as a symlink is refused before anything is read", async () => {
    symlinkSync(outside, work);
    const run = unpack(await packGz([{ header: { name: "x", size: 1 }, body: "x" }]));
    expect(run.code).toBe(UNPACK_EXIT.failed);
    expect(run.stderr).toContain("is not a directory");
    expect(outsideWork(parent)).toEqual(["outside/", "outside/sentinel 10 untouched\n"]);
    expect(lstatSync(work).isSymbolicLink()).toBe(true);
  });
});

describe("case H2: a bomb on stdin", () => {
  it("1 GiB of zeros is refused at its header, nothing written, and bw-unpack exits without the rest", async () => {
    const run = unpack(await zeroBomb());
    expect(run.code).toBe(UNPACK_EXIT.refused);
    expect(run.result).toMatchObject({ ok: false, code: "bundle_too_large" });
    expect(readdirSync(work)).toEqual([]);
  });
});

describe("the command line", () => {
  it("a bad bound or a missing directory: exit 1, a message on stderr, nothing on stdout", () => {
    for (const args of [[work, "--max-bytes", "lots"], [work, "--max-files"], [], [work, "extra"]]) {
      const run = spawnSync(process.execPath, [UNPACK, ...args], { input: "" });
      expect(run.status).toBe(UNPACK_EXIT.failed);
      expect(run.stdout.toString()).toBe("");
      expect(run.stderr.toString()).toMatch(/^usage: unpack\.cjs/);
    }
  });
});
