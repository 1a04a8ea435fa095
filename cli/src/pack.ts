import { createHash } from "node:crypto";
import { constants, type Stats } from "node:fs";
import { lstat, open, readdir, readFile, readlink, realpath } from "node:fs/promises";
import { dirname, isAbsolute, join, relative, sep } from "node:path";
import ignore, { type Ignore } from "ignore";
import { createTarPacker, type TarHeader } from "modern-tar";

// `runs launch --from FOLDER`: the folder packed into the .tar.gz that POST /v1/bundles takes.
//
// What goes in: every file of the folder that its .gitignore files do not exclude (as `git add`
// would see it; nested .gitignore files too, the deeper one deciding), narrowed to the spec's
// `files` patterns when it has them; never `.git`; the spec file always. What stops the pack
// (nothing is sent): a file that looks like a credential and was not named with
// --include-secret-file, a symlink that points outside the folder, a device, FIFO or socket, a
// `files` pattern that matches nothing. The same folder gives the same bytes, so the same
// sha256: entries in byte order of their paths, mtime 0, owner 0:0 without names, modes 0644 or
// 0755 (files with any execute bit), 0755 for directories.

/** Names that look like credentials (gitignore syntax, matched against a file's own name). */
export const CREDENTIAL_PATTERNS = [
  ".env",
  ".env.*",
  "*.pem",
  "*.key",
  "id_*",
  ".npmrc",
  ".pypirc",
  ".netrc",
  "credentials*.json",
] as const;

const credentials = ignore({ ignorecase: true, allowRelativePaths: true }).add([...CREDENTIAL_PATTERNS]);

/** The pattern a file's name matches, if it looks like a credential. */
export function credentialPattern(name: string): string | null {
  const verdict = credentials.test(name);
  return verdict.ignored ? (verdict.rule?.pattern ?? null) : null;
}

/** Why the pack stopped: every offending path, each with its reason; nothing was sent. */
export class PackRefused extends Error {
  constructor(
    readonly folder: string,
    readonly problems: { path: string; why: string }[],
    readonly advice: string[],
  ) {
    super(
      [`refusing to pack ${folder}:`, ...problems.map((p) => `  ${p.path}  ${p.why}`), ...advice].join("\n"),
    );
  }
}

export interface PackOptions {
  /** The spec's `files`: gitignore-style patterns of what to pack; all of the folder when absent. */
  files?: readonly string[];
  /** Paths (relative to the folder) packed although they look like credentials. */
  includeSecretFiles?: readonly string[];
  /** Packed always (the spec file), whatever `files` says. */
  always?: readonly string[];
}

export interface Packed {
  /** The .tar.gz. */
  archive: Uint8Array;
  sha256: string;
  /** The paths packed (files and symlinks, not directories), in archive order. */
  paths: string[];
  /** Sum of the files' sizes. */
  bytes: number;
}

interface Entry {
  path: string;
  abs: string;
  kind: "file" | "symlink";
  mode: number;
  linkname?: string;
}

interface Found {
  entries: Entry[];
  problems: { path: string; why: string }[];
  secretFiles: string[];
  /** Credential-looking files (not symlinks) that were refused, for the advice. */
  refusedSecrets: string[];
}

/** One .gitignore's rules, and the folder-relative directory they belong to ("" for the root). */
interface Rules {
  base: string;
  rules: Ignore;
}

const posix = (p: string) => p.split(sep).join("/");

/**
 * The spec's `files`: gitignore-style patterns of what to pack, read in order, the last that
 * matches a path deciding (a `!` pattern leaves out what an earlier one took in, also below a
 * directory an earlier one took in: unlike .gitignore, where a `!` cannot reach under an
 * excluded directory). A pattern that matches a directory matches everything under it.
 */
class Selection {
  private readonly patterns: { negative: boolean; text: string; match: Ignore }[];
  constructor(patterns: readonly string[]) {
    this.patterns = patterns
      .filter((p) => p.trim() !== "" && !p.startsWith("#"))
      .map((text) => {
        const negative = text.startsWith("!");
        return {
          negative,
          text,
          match: ignore({ allowRelativePaths: true }).add(negative ? text.slice(1) : text),
        };
      });
  }
  selects(path: string): boolean {
    for (let i = this.patterns.length - 1; i >= 0; i--) {
      const p = this.patterns[i] as Selection["patterns"][number];
      if (p.match.ignores(path)) return !p.negative;
    }
    return false;
  }
  /** The patterns (not `!` ones) that match none of these paths. */
  unmatched(paths: readonly string[]): string[] {
    return this.patterns
      .filter((p) => !p.negative && !paths.some((x) => p.match.ignores(x)))
      .map((p) => p.text);
  }
}

function ignoredBy(stack: readonly Rules[], path: string, isDir: boolean): boolean {
  // The deepest .gitignore with an opinion decides (git's precedence); within one file, the
  // last matching line (the library's).
  for (let i = stack.length - 1; i >= 0; i--) {
    const { base, rules } = stack[i] as Rules;
    const rel = base === "" ? path : path.slice(base.length + 1);
    const verdict = rules.test(isDir ? `${rel}/` : rel);
    if (verdict.ignored) return true;
    if (verdict.unignored) return false;
  }
  return false;
}

async function gitignoreOf(absDir: string): Promise<Ignore | null> {
  let text: string;
  try {
    text = await readFile(join(absDir, ".gitignore"), "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
  return ignore({ allowRelativePaths: true }).add(text);
}

function inside(root: string, target: string): boolean {
  const rel = relative(root, target);
  return rel === "" || (!rel.startsWith(`..${sep}`) && rel !== ".." && !isAbsolute(rel));
}

async function walk(root: string, options: PackOptions): Promise<Found> {
  const select = options.files ? new Selection(options.files) : null;
  const always = new Set(options.always ?? []);
  const allowedSecrets = new Set(
    (options.includeSecretFiles ?? []).map((p) => posix(p).replace(/^\.\//, "")),
  );
  const found: Found = { entries: [], problems: [], secretFiles: [], refusedSecrets: [] };

  const visit = async (absDir: string, relDir: string, stack: Rules[]): Promise<void> => {
    const own = await gitignoreOf(absDir);
    const rules = own ? [...stack, { base: relDir, rules: own }] : stack;
    const names = (await readdir(absDir)).sort();
    for (const name of names) {
      if (name === ".git") continue;
      const path = relDir === "" ? name : `${relDir}/${name}`;
      const abs = join(absDir, name);
      const st = await lstat(abs);
      if (st.isDirectory()) {
        if (!ignoredBy(rules, path, true)) await visit(abs, path, rules);
        continue;
      }
      if (!always.has(path)) {
        if (ignoredBy(rules, path, false)) continue;
        if (select && !select.selects(path)) continue;
      }
      await consider(root, path, abs, st, name, allowedSecrets, found);
    }
  };
  await visit(root, "", []);
  return found;
}

async function consider(
  root: string,
  path: string,
  abs: string,
  st: Stats,
  name: string,
  allowedSecrets: Set<string>,
  found: Found,
): Promise<void> {
  if (!st.isFile() && !st.isSymbolicLink()) {
    found.problems.push({
      path,
      why: "is not a regular file, directory or symlink (a device, FIFO or socket)",
    });
    return;
  }
  const pattern = credentialPattern(name);
  if (pattern !== null) {
    if (!allowedSecrets.has(path)) {
      found.problems.push({ path, why: `looks like a credential (${pattern})` });
      found.refusedSecrets.push(path);
      return;
    }
    found.secretFiles.push(path);
  }
  if (st.isFile()) {
    found.entries.push({ path, abs, kind: "file", mode: st.mode & 0o111 ? 0o755 : 0o644 });
    return;
  }
  // A symlink stays a symlink, with a relative target (an absolute one inside the folder is
  // rewritten). Its target must stay inside the folder as written and, where it resolves, as
  // the file system resolves it (a chain of links that leaves the folder counts as leaving).
  const target = await readlink(abs);
  const lexical = isAbsolute(target) ? target : join(dirname(abs), target);
  let real: string | null = null;
  try {
    real = await realpath(abs);
  } catch {}
  if (!inside(root, lexical) || (real !== null && !inside(root, real))) {
    found.problems.push({ path, why: `is a symlink pointing outside the folder (-> ${target})` });
    return;
  }
  const linkname = posix(relative(dirname(abs), lexical)) || ".";
  found.entries.push({ path, abs, kind: "symlink", mode: 0o777, linkname });
}

/** What `runs launch --from` would pack, without packing it (the same checks). */
export async function listFolder(folder: string, options: PackOptions = {}): Promise<Found> {
  const root = await realpath(folder);
  const found = await walk(root, options);
  const problems = [...found.problems];
  for (const p of options.includeSecretFiles ?? []) {
    const path = posix(p).replace(/^\.\//, "");
    if (!found.secretFiles.includes(path)) {
      problems.push({
        path,
        why: "was named with --include-secret-file but is not a credential-looking file this folder packs",
      });
    }
  }
  const considered = [...found.entries.map((e) => e.path), ...found.refusedSecrets];
  for (const pattern of new Selection(options.files ?? []).unmatched(considered)) {
    problems.push({
      path: pattern,
      why: "(a `files` pattern) matches no file the folder packs (mistyped, or excluded by .gitignore?)",
    });
  }
  return { ...found, problems };
}

/** Packs the folder, or throws PackRefused naming every offending file. */
export async function packFolder(folder: string, options: PackOptions = {}): Promise<Packed> {
  const found = await listFolder(folder, options);
  if (found.problems.length > 0) {
    const advice: string[] = [];
    if (found.refusedSecrets.length > 0) {
      advice.push(
        "Files that look like credentials are never packed unless named, one flag each (paths relative to",
        "the folder):",
        `  ${found.refusedSecrets.map((p) => `--include-secret-file ${p}`).join(" ")}`,
        "or leave them out: list them in .gitignore, or keep them out of the spec's `files`.",
      );
    }
    throw new PackRefused(folder, found.problems, advice);
  }
  const entries = found.entries.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  return packEntries(entries);
}

async function readRegular(abs: string): Promise<Buffer> {
  // O_NOFOLLOW: a file swapped for a symlink after the walk is refused, not followed.
  const handle = await open(abs, constants.O_RDONLY | constants.O_NOFOLLOW);
  try {
    return await handle.readFile();
  } finally {
    await handle.close();
  }
}

const EPOCH = new Date(0);
const fixed = { mtime: EPOCH, uid: 0, gid: 0, uname: "", gname: "" } satisfies Partial<TarHeader>;

async function packEntries(entries: Entry[]): Promise<Packed> {
  const { readable, controller } = createTarPacker();
  const gz = readable.pipeThrough(new CompressionStream("gzip"));
  const chunks: Uint8Array[] = [];
  const collected = (async () => {
    for await (const chunk of gz) chunks.push(chunk);
  })();
  let bytes = 0;
  try {
    const dirs = new Set<string>();
    for (const e of entries) {
      // A directory entry before the first thing in it (git does not keep empty directories).
      const parts = e.path.split("/");
      for (let i = 1; i < parts.length; i++) {
        const dir = parts.slice(0, i).join("/");
        if (dirs.has(dir)) continue;
        dirs.add(dir);
        await controller.add({ ...fixed, name: `${dir}/`, type: "directory", size: 0, mode: 0o755 }).close();
      }
      if (e.kind === "symlink") {
        await controller
          .add({ ...fixed, name: e.path, type: "symlink", size: 0, mode: e.mode, linkname: e.linkname })
          .close();
        continue;
      }
      const data = await readRegular(e.abs);
      bytes += data.byteLength;
      const body = controller.add({
        ...fixed,
        name: e.path,
        type: "file",
        size: data.byteLength,
        mode: e.mode,
      });
      const writer = body.getWriter();
      await writer.write(data);
      await writer.close();
    }
    controller.finalize();
  } catch (error) {
    controller.error(error);
    await collected.catch(() => {});
    throw error;
  }
  await collected;
  const archive = Buffer.concat(chunks);
  return {
    archive,
    sha256: createHash("sha256").update(archive).digest("hex"),
    paths: entries.map((e) => e.path),
    bytes,
  };
}
