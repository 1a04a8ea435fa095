import { execFileSync, spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, symlinkSync, utimesSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { checkBundle } from "@benchwright/shared/archive/bundle";
import { BUNDLE_DEFAULTS } from "@benchwright/shared/contract/bundle";
import { unpackTar } from "modern-tar";
import { afterAll, describe, expect, it } from "vitest";
import { CREDENTIAL_PATTERNS, credentialPattern, PackRefused, packFolder } from "../../cli/src/pack";

// `runs launch --from FOLDER`'s packing (cli/src/pack.ts), on real folders: what goes in (as git
// would add it, `files` narrowing it), what stops the pack (credential-looking names, symlinks
// out of the folder, special files), and the same bytes for the same folder.

const made: string[] = [];
afterAll(() => {
  for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/** A folder of files: path → content (a string) or a symlink ({ link: target }). */
function folder(files: Record<string, string | { link: string }>): string {
  const root = mkdtempSync(join(tmpdir(), "bw-pack-"));
  made.push(root);
  for (const [path, content] of Object.entries(files)) {
    const abs = join(root, path);
    mkdirSync(dirname(abs), { recursive: true });
    if (typeof content === "string") writeFileSync(abs, content);
    else symlinkSync(content.link, abs);
  }
  return root;
}

async function entries(archive: Uint8Array) {
  const tar = new Uint8Array(
    await new Response(
      new Blob([archive]).stream().pipeThrough(new DecompressionStream("gzip")),
    ).arrayBuffer(),
  );
  return unpackTar(tar);
}

async function refusal(promise: Promise<unknown>): Promise<PackRefused> {
  const error = await promise.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(PackRefused);
  return error as PackRefused;
}

const SPEC = { "benchwright.json": '{"commands":["true"]}' };
const always = ["benchwright.json"];

describe("what is packed", () => {
  it("honours .gitignore files as git does: nested ones, negation, directory patterns", async () => {
    const root = folder({
      ...SPEC,
      ".gitignore": "build/\n*.log\n!keep.log\n/top-only.txt\n",
      "a.log": "x",
      "keep.log": "k",
      "top-only.txt": "t",
      "src/top-only.txt": "not anchored here",
      "build/out.bin": "b",
      "src/build/also.bin": "b",
      "src/main.py": "print(1)\n",
      "src/.gitignore": "generated.py\n!debug.log\n",
      "src/generated.py": "g",
      "src/debug.log": "d",
      "src/deep/ok.txt": "ok",
      "...": "a name of dots is a name",
    });
    const packed = await packFolder(root, { always });
    // git's own answer, from a repository made over the same folder.
    execFileSync("git", ["init", "-q"], { cwd: root });
    const git = execFileSync(
      "git",
      ["-c", "core.excludesFile=/dev/null", "ls-files", "--others", "--cached", "--exclude-standard"],
      { cwd: root, encoding: "utf8" },
    )
      .split("\n")
      .filter(Boolean)
      .sort();
    expect(packed.paths).toEqual(git);
    expect(packed.paths).toEqual([
      "...",
      ".gitignore",
      "benchwright.json",
      "keep.log",
      "src/.gitignore",
      "src/debug.log",
      "src/deep/ok.txt",
      "src/main.py",
      "src/top-only.txt",
    ]);
  });

  it("never packs .git, not even when .gitignore un-ignores it", async () => {
    const root = folder({
      ...SPEC,
      ".gitignore": "!.git\n",
      ".git/HEAD": "ref: x",
      "sub/.git": "gitdir: ../x",
    });
    const packed = await packFolder(root, { always });
    expect(packed.paths).toEqual([".gitignore", "benchwright.json"]);
  });

  it("packs only what the spec's `files` patterns match, the spec file always, .gitignore still applying", async () => {
    const root = folder({
      ...SPEC,
      ".gitignore": "*.pyc\n",
      "setup.sh": "true",
      "task_impl.py": "pass",
      "lib/util.py": "pass",
      "lib/util.pyc": "x",
      "lib/tests/test_util.py": "pass",
      "notes/todo.txt": "later",
      "sub/task_impl.py": "a name matches at any depth",
    });
    const packed = await packFolder(root, {
      always,
      files: ["setup.sh", "/task_impl.py", "lib/", "!lib/tests/"],
    });
    expect(packed.paths).toEqual(["benchwright.json", "lib/util.py", "setup.sh", "task_impl.py"]);
    const names = (await entries(packed.archive)).map((e) => e.header.name);
    expect(names).toEqual(["benchwright.json", "lib/", "lib/util.py", "setup.sh", "task_impl.py"]);
  });

  it("refuses a `files` pattern that matches nothing (a typo, or a file .gitignore excludes)", async () => {
    const root = folder({ ...SPEC, ".gitignore": "data/\n", "task.py": "", "data/x.csv": "1" });
    const refused = await refusal(packFolder(root, { always, files: ["task.py", "tsak_impl.py", "data/"] }));
    expect(refused.problems.map((p) => p.path)).toEqual(["tsak_impl.py", "data/"]);
    expect(refused.message).toContain("matches no file");
  });

  it("keeps a symlink inside the folder as a relative link; an absolute one inside is rewritten", async () => {
    const root = folder({ ...SPEC, "data/real.txt": "r", rel: { link: "data/real.txt" } });
    symlinkSync(join(root, "data", "real.txt"), join(root, "data", "abs"));
    symlinkSync("missing-but-inside", join(root, "dangling"));
    const packed = await packFolder(root, { always });
    const links = (await entries(packed.archive))
      .filter((e) => e.header.type === "symlink")
      .map((e) => [e.header.name, e.header.linkname]);
    expect(links).toEqual([
      ["dangling", "missing-but-inside"],
      ["data/abs", "real.txt"],
      ["rel", "data/real.txt"],
    ]);
  });

  it("round-trips: each file's bytes and execute bit as on disk", async () => {
    const root = folder({ ...SPEC, "run.sh": "#!/bin/sh\necho hi\n", "data/blob.bin": "\u0000\u0001binary" });
    execFileSync("chmod", ["0750", join(root, "run.sh")]);
    const packed = await packFolder(root, { always });
    const got = await entries(packed.archive);
    const byName = new Map(got.map((e) => [e.header.name, e]));
    expect(new TextDecoder().decode(byName.get("run.sh")?.data)).toBe("#!/bin/sh\necho hi\n");
    expect(byName.get("run.sh")?.header.mode).toBe(0o755);
    expect(byName.get("data/blob.bin")?.header.mode).toBe(0o644);
    expect(byName.get("data/")?.header.type).toBe("directory");
    expect(packed.bytes).toBe(21 + 18 + 8);
  });
});

describe("what the API will take", () => {
  it("a packed folder passes the bundle check the Worker and bw-unpack run (shared/archive)", async () => {
    const root = folder({
      ...SPEC,
      "run.sh": "#!/bin/sh\n",
      "data/real.txt": "r",
      "data/rel": { link: "real.txt" },
      up: { link: "data/../data/real.txt" },
      [`deep/${"long-directory-name/".repeat(12)}file.txt`]: "past the 255 bytes of a ustar name and prefix",
    });
    symlinkSync(join(root, "data"), join(root, "abs-dir"));
    const packed = await packFolder(root, { always });
    const verdict = await checkBundle(new Blob([packed.archive]).stream(), {
      maxUnpackedBytes: BUNDLE_DEFAULTS.maxUnpackedBytes,
      maxFiles: BUNDLE_DEFAULTS.maxFiles,
    });
    expect(verdict).toEqual({ ok: true, files: expect.any(Number), bytes: packed.bytes });
  });
});

describe("the same folder, the same sha256", () => {
  it("ignores mtimes, creation order and owners; changes with content", async () => {
    const files = {
      ...SPEC,
      "b.txt": "b",
      "a/z.txt": "z",
      "a/y.txt": "y",
      [`deep/${"long-directory-name/".repeat(8)}file.txt`]: "a path past the 100 bytes of a ustar name",
    };
    const one = folder(files);
    const reversed = Object.fromEntries(Object.entries(files).reverse());
    const two = folder(reversed);
    utimesSync(join(two, "b.txt"), new Date(2001, 1, 1), new Date(2001, 1, 1));
    const [p1, p1again, p2] = [
      await packFolder(one, { always }),
      await packFolder(one, { always }),
      await packFolder(two, { always }),
    ];
    expect(p1.sha256).toMatch(/^[0-9a-f]{64}$/);
    expect(p1again.sha256).toBe(p1.sha256);
    expect(p2.sha256).toBe(p1.sha256);
    for (const e of await entries(p1.archive)) {
      expect(e.header).toMatchObject({ uid: 0, gid: 0, uname: "", gname: "" });
      expect(e.header.mtime?.getTime()).toBe(0);
    }
    writeFileSync(join(two, "b.txt"), "B");
    expect((await packFolder(two, { always })).sha256).not.toBe(p1.sha256);
  });
});

describe("what stops the pack", () => {
  it("refuses every file that looks like a credential, names each and says how to include it", async () => {
    const root = folder({
      ...SPEC,
      ".env": "A=1",
      "config/.env.production": "A=1",
      "certs/server.pem": "-----BEGIN",
      "certs/tls.key": "k",
      "keys/id_ed25519": "k",
      "keys/ID_RSA.pub": "k",
      ".npmrc": "//registry/:_authToken=x",
      ".pypirc": "[pypi]",
      ".netrc": "machine x",
      "gcp/credentials-prod.json": "{}",
      "task.py": "fine",
    });
    const refused = await refusal(packFolder(root, { always }));
    expect(refused.problems.map((p) => p.path)).toEqual([
      ".env",
      ".netrc",
      ".npmrc",
      ".pypirc",
      "certs/server.pem",
      "certs/tls.key",
      "config/.env.production",
      "gcp/credentials-prod.json",
      "keys/ID_RSA.pub",
      "keys/id_ed25519",
    ]);
    expect(refused.message).toContain("keys/id_ed25519  looks like a credential (id_*)");
    expect(refused.message).toContain("--include-secret-file config/.env.production");
    // Every listed pattern is one the check uses, and each catches what it says.
    expect(CREDENTIAL_PATTERNS.every((p) => credentialPattern(p.replace("*", "x")) === p)).toBe(true);
  });

  it("packs a credential-looking file named with includeSecretFiles, and only that one", async () => {
    const root = folder({ ...SPEC, ".env.example": "A=", "deploy.key": "k" });
    const refused = await refusal(packFolder(root, { always, includeSecretFiles: [".env.example"] }));
    expect(refused.problems.map((p) => p.path)).toEqual(["deploy.key"]);
    const packed = await packFolder(root, { always, includeSecretFiles: ["./.env.example", "deploy.key"] });
    expect(packed.paths).toEqual([".env.example", "benchwright.json", "deploy.key"]);
  });

  it("refuses includeSecretFiles naming a file it would not refuse (a typo is not silent)", async () => {
    const root = folder({ ...SPEC, ".gitignore": ".env\n", ".env": "A=1", "ok.txt": "" });
    // .env is gitignored: never considered, so naming it includes nothing.
    expect((await packFolder(root, { always })).paths).toEqual([".gitignore", "benchwright.json", "ok.txt"]);
    const refused = await refusal(packFolder(root, { always, includeSecretFiles: [".env", "ok.txt"] }));
    expect(refused.problems.map((p) => p.path)).toEqual([".env", "ok.txt"]);
  });

  it("refuses symlinks pointing outside the folder: absolute, relative, through another link", async () => {
    const outside = folder({ "secret.txt": "outside" });
    const root = folder({
      ...SPEC,
      abs: { link: join(outside, "secret.txt") },
      "sub/up": { link: "../../" },
      inner: { link: "sub/up" },
      etc: { link: "/etc" },
      ok: { link: "benchwright.json" },
    });
    // inner -> sub/up stays inside as written, but resolves outside through sub/up.
    const refused = await refusal(packFolder(root, { always }));
    expect(refused.problems.map((p) => p.path)).toEqual(["abs", "etc", "inner", "sub/up"]);
    expect(refused.message).toContain("is a symlink pointing outside the folder");
  });

  it("refuses a FIFO", async () => {
    const root = folder({ ...SPEC });
    const made = spawnSync("mkfifo", [join(root, "pipe")]);
    expect(made.status).toBe(0);
    const refused = await refusal(packFolder(root, { always }));
    expect(refused.problems).toEqual([
      { path: "pipe", why: "is not a regular file, directory or symlink (a device, FIFO or socket)" },
    ]);
  });
});
