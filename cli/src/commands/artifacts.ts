import { createHash, randomBytes } from "node:crypto";
import { lstat, mkdir, open, rename, rm } from "node:fs/promises";
import { join, relative, resolve, sep } from "node:path";
import { ApiError, type Schemas } from "../api";
import { size } from "./bundles";
import { api, type Ctx, Failed, print, table } from "./shared";

// `benchwright runs artifacts RUN [--out DIR]`: the files a run's commands left under $BW_OUT,
// listed, and downloaded to DIR/<sandbox name>/<path>. The names come from the server, which is
// trusted less than the disk: a name that would land outside DIR (`..`, an absolute path, an
// empty or `.` segment, a backslash) is refused, nothing is written through a symlink already in
// DIR, and a file is in place only once its bytes hash to the listed sha256.

type Artifact = Schemas["Artifact"];
type CutArtifact = Schemas["CutArtifact"];

/** A name from the server that cannot be a file under DIR. */
export class UnsafeArtifactPath extends Error {}

function segments(text: string, what: string): string[] {
  if (text === "" || text.includes("\0") || text.includes("\\")) {
    throw new UnsafeArtifactPath(`${what} ${JSON.stringify(text)} is empty or holds a NUL or backslash`);
  }
  if (text.startsWith("/")) throw new UnsafeArtifactPath(`${what} ${JSON.stringify(text)} is absolute`);
  const parts = text.split("/");
  for (const p of parts) {
    if (p === "" || p === "." || p === "..") {
      throw new UnsafeArtifactPath(`${what} ${JSON.stringify(text)} has a "${p}" segment`);
    }
  }
  return parts;
}

/** Where an artifact goes under DIR, or UnsafeArtifactPath when its names would leave DIR. */
export function artifactTarget(outDir: string, sandboxName: string, path: string): string {
  const box = segments(sandboxName, "sandbox name");
  if (box.length !== 1) throw new UnsafeArtifactPath(`sandbox name ${JSON.stringify(sandboxName)} has a "/"`);
  const root = resolve(outDir);
  const target = join(root, ...box, ...segments(path, "path"));
  const rel = relative(root, target);
  // Belt and braces: the segments above already keep it inside.
  if (rel === "" || rel.startsWith(`..${sep}`) || rel === "..") {
    throw new UnsafeArtifactPath(`${sandboxName}/${path} would leave ${outDir}`);
  }
  return target;
}

/** Makes the directories from root down to dir, refusing any that exists as a symlink or a file. */
async function directoriesUnder(root: string, dir: string): Promise<void> {
  await mkdir(root, { recursive: true });
  let at = root;
  for (const part of relative(root, dir).split(sep).filter(Boolean)) {
    at = join(at, part);
    try {
      const st = await lstat(at);
      if (!st.isDirectory() || st.isSymbolicLink()) {
        throw new UnsafeArtifactPath(`${at} exists and is not a directory (a symlink is never followed)`);
      }
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      await mkdir(at);
    }
  }
}

/**
 * Streams one artifact to a temporary file beside its target, checks its length and sha256, and
 * renames it into place (a rename replaces a symlink at the target, never follows it).
 */
export async function saveArtifact(
  body: ReadableStream<Uint8Array>,
  root: string,
  target: string,
  expected: { size: number; sha256: string },
): Promise<void> {
  await directoriesUnder(resolve(root), join(target, ".."));
  const part = `${target}.bw-part-${randomBytes(6).toString("hex")}`;
  const file = await open(part, "wx", 0o644);
  const hash = createHash("sha256");
  let got = 0;
  try {
    for await (const chunk of body) {
      got += chunk.byteLength;
      if (got > expected.size) throw new Failed(`more bytes than the ${expected.size} listed`);
      hash.update(chunk);
      await file.write(chunk);
    }
    await file.close();
    const sha256 = hash.digest("hex");
    if (got !== expected.size) throw new Failed(`${got} bytes, not the ${expected.size} listed`);
    if (sha256 !== expected.sha256) throw new Failed(`sha256 ${sha256}, not the listed ${expected.sha256}`);
    await rename(part, target);
  } catch (error) {
    await file.close().catch(() => {});
    await rm(part, { force: true });
    throw error;
  }
}

const CUT_SAYS: Record<string, string> = {
  too_large: "over the size bound",
  too_many: "over the file-count bound",
  symlink: "a symlink (never followed)",
  special: "not a regular file (device, FIFO or socket)",
  unreadable: "could not be read",
};

function cutLines(cut: CutArtifact[]): string[] {
  if (cut.length === 0) return [];
  return [
    `not collected (${cut.length}):`,
    ...cut.map(
      (c) =>
        `  ${c.sandboxName}/${c.path}: ${CUT_SAYS[c.reason] ?? c.reason}${c.size !== null ? ` (${size(c.size)})` : ""}`,
    ),
  ];
}

export async function runsArtifacts(ctx: Ctx, id: string, opts: { out?: string }): Promise<void> {
  const client = api(ctx);
  const list = await client.call("get", "/v1/runs/{id}/artifacts", { params: { id } });
  const listing = () => [
    ...(list.artifacts.length === 0
      ? [`${id}: no artifacts (the commands left nothing under $BW_OUT)`]
      : table([
          ["SANDBOX", "PATH", "SIZE", "SHA256"],
          ...list.artifacts.map((a) => [a.sandboxName, a.path, size(a.size), a.sha256.slice(0, 16)]),
        ])),
    ...cutLines(list.cut),
  ];
  if (opts.out === undefined) {
    print(ctx, list, listing);
    return;
  }
  const out = opts.out;
  const failures: string[] = [];
  const taken = new Map<string, Artifact>();
  let saved = 0;
  for (const a of list.artifacts) {
    const name = `${a.sandboxName}/${a.path}`;
    let target: string;
    try {
      target = artifactTarget(out, a.sandboxName, a.path);
    } catch (error) {
      failures.push(`${JSON.stringify(name)}: refused: ${(error as Error).message}`);
      continue;
    }
    if (taken.has(target)) {
      failures.push(`${name}: refused: a second artifact with the same name (${a.id})`);
      continue;
    }
    taken.set(target, a);
    try {
      const res = await client.download("/v1/runs/{id}/artifacts/{artifactId}", { id, artifactId: a.id });
      if (!res.body) throw new Failed("no body");
      await saveArtifact(res.body, out, target, a);
      saved++;
      if (!ctx.json) ctx.out(`${relative(process.cwd(), target) || target}  ${size(a.size)}`);
    } catch (error) {
      if (!(error instanceof Failed || error instanceof UnsafeArtifactPath || error instanceof ApiError)) {
        throw error;
      }
      failures.push(`${name}: not saved: ${error.message}`);
    }
  }
  if (ctx.json) ctx.out(JSON.stringify(list, null, 2));
  else {
    for (const line of cutLines(list.cut)) ctx.out(line);
    ctx.out(`saved ${saved} of ${list.artifacts.length} artifacts under ${out}`);
  }
  if (failures.length > 0) {
    throw new Failed(
      [`${failures.length} artifacts not saved:`, ...failures.map((f) => `  ${f}`)].join("\n"),
    );
  }
}
