import { ArchiveError, tarGzEntries } from "@benchwright/shared/archive/entries";
import { entrySegments } from "@benchwright/shared/archive/paths";
import {
  ARTIFACT_DEFAULTS,
  type ArtifactSummary,
  CollectManifest,
} from "@benchwright/shared/contract/bundle";
import { and, asc, eq, isNotNull, isNull } from "drizzle-orm";
import type { Owner } from "../auth/owner";
import { derivedId } from "../crypto/api-keys";
import { runArtifacts, runs } from "../db/schema";
import type { Db } from "../db/types";
import { fail, ok, type Result } from "../errors";

// Results out: the files a run's commands left under $BW_OUT, as bw-collect packed them in the
// sandbox (a .tar.gz of `files/<path>` entries, then `manifest.json`: contract/bundle.ts). That
// archive comes from inside the run, so nothing in it is taken on trust: every bound is the
// broker's own (what it asked bw-collect for), each file is hashed here and must match what the
// manifest lists, and a file the manifest does not list is no artifact. Each artifact's bytes go
// to R2 at artifactKey(); its row, and a row per cut entry, to run_artifacts.

export type ArtifactRow = typeof runArtifacts.$inferSelect;

/** Where an artifact's bytes are in R2 (the FILES binding). */
export const artifactKey = (runId: string, artifactId: string) => `artifacts/${runId}/${artifactId}`;

/** The most a manifest may take (it lists at most maxFiles files and maxFiles cut entries). */
export const MAX_MANIFEST_BYTES = 16 * 1024 * 1024;
/** Rows written per insert. */
const INSERT_BATCH = 500;

/** Why an archive was not stored; nothing of it was kept. */
export class ArtifactArchiveError extends Error {
  constructor(
    /** invalid: not a bw-collect archive; too_large: past the bounds; inconsistent: files and manifest disagree. */
    readonly code: "archive_invalid" | "archive_too_large" | "archive_inconsistent",
    message: string,
  ) {
    super(message);
    this.name = "ArtifactArchiveError";
  }
}

export interface ArtifactLimits {
  maxBytes: number;
  maxFiles: number;
}

export interface StoreArtifacts {
  runId: string;
  environmentId: string;
  sandboxId: string;
  /** "work", or the task's name. */
  sandboxName: string;
  archive: ReadableStream<Uint8Array>;
  /** What bw-collect was asked for (default ARTIFACT_DEFAULTS): the bounds this reading keeps. */
  limits?: ArtifactLimits;
}

interface Written {
  id: string;
  path: string;
  size: number;
  sha256: string;
}

/**
 * Stores one sandbox's archive. Idempotent: a sandbox whose artifacts are stored already is not
 * stored again (the archive is cancelled; the summary is of the rows). Anything wrong with the
 * archive throws ArtifactArchiveError and leaves nothing behind.
 */
export async function storeArtifacts(
  env: { FILES: R2Bucket },
  db: Db,
  input: StoreArtifacts,
): Promise<ArtifactSummary> {
  const limits = input.limits ?? ARTIFACT_DEFAULTS;
  const before = await db
    .select()
    .from(runArtifacts)
    .where(and(eq(runArtifacts.runId, input.runId), eq(runArtifacts.sandboxId, input.sandboxId)));
  if (before.length > 0) {
    await input.archive.cancel().catch(() => {});
    return summaryOf(before, false);
  }
  const written: Written[] = [];
  try {
    const manifest = await readArchive(env.FILES, input, limits, written);
    const rows = await rowsOf(input, manifest, written);
    // Entries the manifest does not list (bw-collect cut them after copying): no artifacts.
    const listed = new Set(manifest.files.map((f) => f.path));
    const unlisted = written.filter((w) => !listed.has(w.path));
    if (unlisted.length > 0) await env.FILES.delete(unlisted.map((w) => artifactKey(input.runId, w.id)));
    await db.transaction(async (tx) => {
      for (let at = 0; at < rows.length; at += INSERT_BATCH) {
        await tx
          .insert(runArtifacts)
          .values(rows.slice(at, at + INSERT_BATCH))
          .onConflictDoNothing();
      }
    });
    return summaryOf(rows, manifest.incomplete === true);
  } catch (e) {
    await Promise.all(written.map((w) => env.FILES.delete(artifactKey(input.runId, w.id)).catch(() => {})));
    if (e instanceof ArchiveError) {
      throw new ArtifactArchiveError(
        e.code === "too_large" ? "archive_too_large" : "archive_invalid",
        e.message,
      );
    }
    throw e;
  }
}

/** Reads the archive: each `files/` entry to R2 as it streams by (hashed), then the manifest. */
async function readArchive(
  bucket: R2Bucket,
  input: StoreArtifacts,
  limits: ArtifactLimits,
  written: Written[],
): Promise<CollectManifest> {
  const inconsistent = (why: string) => new ArtifactArchiveError("archive_inconsistent", why);
  // Tar metadata and padding per entry (3 KiB is generous), the manifest, and a little room.
  const maxTarBytes = limits.maxBytes + (limits.maxFiles + 2) * 3 * 1024 + MAX_MANIFEST_BYTES + (1 << 20);
  let manifest: CollectManifest | null = null;
  let bytes = 0;
  const paths = new Set<string>();
  for await (const { header, body } of tarGzEntries(input.archive, { maxTarBytes })) {
    if (manifest) throw inconsistent("an entry after manifest.json");
    if ((header.type ?? "file") !== "file") throw inconsistent(`a ${header.type} entry`);
    if (header.name === "manifest.json") {
      if (header.size > MAX_MANIFEST_BYTES) {
        throw new ArtifactArchiveError("archive_too_large", `a manifest of ${header.size} bytes`);
      }
      manifest = parseManifest(await new Response(body).text());
      continue;
    }
    if (!header.name.startsWith("files/")) throw inconsistent("an entry outside files/");
    const path = canonicalPath(header.name.slice("files/".length));
    if (path === null) throw inconsistent("an entry whose path is not a plain relative path");
    if (paths.has(path)) throw inconsistent("a path twice");
    paths.add(path);
    if (paths.size > limits.maxFiles) {
      throw new ArtifactArchiveError("archive_too_large", `more than ${limits.maxFiles} files`);
    }
    bytes += header.size;
    if (bytes > limits.maxBytes) {
      throw new ArtifactArchiveError("archive_too_large", `more than ${limits.maxBytes} bytes of files`);
    }
    const id = await derivedId("art", input.runId, input.sandboxId, path);
    // Recorded before the write, so a failed write's object is removed too.
    const entry: Written = { id, path, size: header.size, sha256: "" };
    written.push(entry);
    entry.sha256 = await putHashed(bucket, artifactKey(input.runId, id), body, header.size);
  }
  if (!manifest) throw inconsistent("no manifest.json");
  return manifest;
}

/** Streams `body` (exactly `size` bytes) into R2 at `key`, hashing it on the way; its sha256. */
async function putHashed(
  bucket: R2Bucket,
  key: string,
  body: ReadableStream<Uint8Array>,
  size: number,
): Promise<string> {
  const digest = new crypto.DigestStream("SHA-256");
  const hasher = digest.getWriter();
  // One pipeline: R2's reading paces it, so no more than a chunk or two is ever held.
  const hashed = body.pipeThrough(
    new TransformStream<Uint8Array, Uint8Array>({
      async transform(chunk, controller) {
        await hasher.write(chunk);
        controller.enqueue(chunk);
      },
    }),
  );
  const sized = new FixedLengthStream(size);
  await Promise.all([
    bucket.put(key, sized.readable, { httpMetadata: { contentType: "application/octet-stream" } }),
    hashed.pipeTo(sized.writable),
  ]);
  await hasher.close();
  return hex(await digest.digest);
}

function parseManifest(text: string): CollectManifest {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new ArtifactArchiveError("archive_invalid", "manifest.json is not JSON");
  }
  const parsed = CollectManifest.safeParse(json);
  if (!parsed.success)
    throw new ArtifactArchiveError("archive_invalid", "manifest.json is not a CollectManifest");
  return parsed.data;
}

/** `path` if it is a plain relative path (names separated by single `/`), else null. */
function canonicalPath(path: string): string | null {
  const verdict = entrySegments(path);
  if (!verdict.ok || verdict.segments.length === 0 || verdict.segments.join("/") !== path) return null;
  return path;
}

/** The rows of an archive: each listed file (it must be the entry that was stored) and each cut. */
async function rowsOf(input: StoreArtifacts, manifest: CollectManifest, written: Written[]) {
  const limits = input.limits ?? ARTIFACT_DEFAULTS;
  const inconsistent = (why: string) => new ArtifactArchiveError("archive_inconsistent", why);
  if (manifest.files.length > limits.maxFiles || manifest.cut.length > limits.maxFiles) {
    throw new ArtifactArchiveError("archive_too_large", "a manifest past the count bound");
  }
  const byPath = new Map(written.map((w) => [w.path, w]));
  const base = {
    runId: input.runId,
    environmentId: input.environmentId,
    sandboxId: input.sandboxId,
    sandboxName: input.sandboxName,
  };
  const rows: (typeof runArtifacts.$inferInsert)[] = [];
  const seen = new Set<string>();
  for (const f of manifest.files) {
    const w = byPath.get(f.path);
    if (!w || seen.has(f.path)) throw inconsistent("a listed file the archive does not hold once");
    if (w.size !== f.size || w.sha256 !== f.sha256)
      throw inconsistent("a file whose bytes are not the listed ones");
    seen.add(f.path);
    rows.push({ ...base, id: w.id, path: f.path, size: f.size, sha256: f.sha256, cutReason: null });
  }
  for (const c of manifest.cut) {
    // "." is $BW_OUT itself (replaced by a symlink or a file).
    if ((c.path !== "." && canonicalPath(c.path) === null) || seen.has(c.path)) {
      throw inconsistent("a cut entry whose path is not a plain relative path, or listed twice");
    }
    if (c.size !== null && c.size < 0) throw inconsistent("a cut entry with a negative size");
    seen.add(c.path);
    const id = await derivedId("art", input.runId, input.sandboxId, c.path);
    rows.push({ ...base, id, path: c.path, size: c.size, sha256: null, cutReason: c.reason });
  }
  return rows;
}

function summaryOf(
  rows: ReadonlyArray<{ cutReason?: ArtifactRow["cutReason"] | undefined; size?: number | null | undefined }>,
  incomplete: boolean,
): ArtifactSummary {
  const kept = rows.filter((r) => r.cutReason === null || r.cutReason === undefined);
  return {
    files: kept.length,
    bytes: kept.reduce((n, r) => n + (r.size ?? 0), 0),
    cut: rows.length - kept.length,
    incomplete,
  };
}

const hex = (buf: ArrayBuffer) =>
  [...new Uint8Array(buf)].map((b) => b.toString(16).padStart(2, "0")).join("");

// ---- reads, scoped to the caller's environment (another environment's run is a 404) ----

async function ownRunId(db: Db, p: Owner, runId: string): Promise<boolean> {
  const [row] = await db
    .select({ id: runs.id })
    .from(runs)
    .where(and(eq(runs.id, runId), eq(runs.environmentId, p.environmentId)));
  return row !== undefined;
}

/** The run's artifacts and what was cut, by sandbox name then path. */
export async function listArtifacts(
  db: Db,
  p: Owner,
  runId: string,
): Promise<Result<{ artifacts: ArtifactRow[]; cut: ArtifactRow[] }>> {
  if (!(await ownRunId(db, p, runId))) return fail("not_found", `No run ${runId}.`);
  const scope = and(eq(runArtifacts.runId, runId), eq(runArtifacts.environmentId, p.environmentId));
  const order = [asc(runArtifacts.sandboxName), asc(runArtifacts.sandboxId), asc(runArtifacts.path)];
  const [artifacts, cut] = await Promise.all([
    db
      .select()
      .from(runArtifacts)
      .where(and(scope, isNull(runArtifacts.cutReason)))
      .orderBy(...order),
    db
      .select()
      .from(runArtifacts)
      .where(and(scope, isNotNull(runArtifacts.cutReason)))
      .orderBy(...order),
  ]);
  return ok({ artifacts, cut });
}

/** One stored artifact of the run (not a cut entry: that has no bytes). */
export async function getArtifact(
  db: Db,
  p: Owner,
  runId: string,
  artifactId: string,
): Promise<Result<ArtifactRow>> {
  if (!(await ownRunId(db, p, runId))) return fail("not_found", `No run ${runId}.`);
  const [row] = await db
    .select()
    .from(runArtifacts)
    .where(
      and(
        eq(runArtifacts.id, artifactId),
        eq(runArtifacts.runId, runId),
        eq(runArtifacts.environmentId, p.environmentId),
        isNull(runArtifacts.cutReason),
      ),
    );
  return row ? ok(row) : fail("not_found", `Run ${runId} has no artifact ${artifactId}.`);
}

/**
 * A name to save an artifact as: its last path segment, in letters, digits, `.`, `-` and `_` only
 * (anything else `_`), no leading dot, at most 100 characters; "artifact" when nothing is left.
 */
export function downloadName(path: string): string {
  const last = path.split("/").at(-1) ?? "";
  const safe = last
    .replace(/[^A-Za-z0-9._-]/g, "_")
    .replace(/^\.+/, "")
    .slice(0, 100);
  return safe === "" ? "artifact" : safe;
}

/**
 * The answer to a download of one of the run's artifacts (the API's and the run page's): its
 * bytes as an attachment under a safe name, never something a browser would render.
 */
export async function artifactDownload(
  bucket: R2Bucket,
  db: Db,
  p: Owner,
  runId: string,
  artifactId: string,
): Promise<Result<Response>> {
  const found = await getArtifact(db, p, runId, artifactId);
  if (!found.ok) return found;
  const object = await bucket.get(artifactKey(found.value.runId, found.value.id));
  if (!object) return fail("not_found", `Artifact ${artifactId} has no stored bytes.`);
  return ok(
    new Response(object.body, {
      status: 200,
      headers: {
        "content-type": "application/octet-stream",
        "content-length": String(object.size),
        "content-disposition": `attachment; filename="${downloadName(found.value.path)}"`,
        "x-content-type-options": "nosniff",
        "cache-control": "private, no-store",
      },
    }),
  );
}
