import { z } from "zod";

// Benchmark code in (bundles) and results out (artifacts): the shapes the Worker, the broker, the
// backends and the two in-sandbox programs (proxy-image/src: bw-unpack, bw-collect) agree on.
// Pure zod (no node: imports): workerd loads it too.
//
// A bundle is a .tar.gz the user uploads (POST /v1/bundles), stored by its sha256 per
// environment, unpacked into each work and task sandbox's working directory before setup by
// bw-unpack, which runs as the execute stage's uid and re-checks every entry the Worker checked
// at upload. Artifacts are the files a run's commands leave under $BW_OUT, packed by bw-collect
// (execute uid; never follows a symlink) into a .tar.gz of `files/<path>` entries followed by
// one `manifest.json` entry (CollectManifest).

/** Why a bundle is refused: each its own stable problem+json code. */
export const BundleCode = z.enum([
  /** Not a gzip-compressed tar, or a tar that does not parse. */
  "bundle_invalid",
  /** A `..` segment in an entry's path. */
  "bundle_path_traversal",
  /** An entry's path is absolute. */
  "bundle_absolute_path",
  /** A symlink or hardlink whose target is absolute or leaves the tree. */
  "bundle_link_escape",
  /** A device, FIFO or other special file. */
  "bundle_special_file",
  /** Unpacked, the entries would exceed the size bound (a decompression bomb, or just too big). */
  "bundle_too_large",
  /** More entries than the count bound. */
  "bundle_too_many_files",
]);
export type BundleCode = z.infer<typeof BundleCode>;

/** The bounds on an unpacked bundle (Worker settings; bw-unpack gets the same on its command line). */
export const BUNDLE_DEFAULTS = {
  /** The uploaded .tar.gz: 64 MiB. */
  maxUploadBytes: 64 * 1024 * 1024,
  /** Sum of the entries' sizes unpacked: 512 MiB. */
  maxUnpackedBytes: 512 * 1024 * 1024,
  maxFiles: 20_000,
} as const;

/** The bounds of an upload (settings BUNDLE_MAX_*): the .tar.gz, and what it unpacks to. */
export interface UploadLimits {
  readonly maxUploadBytes: number;
  readonly maxUnpackedBytes: number;
  readonly maxFiles: number;
}

/** A bundle's name in a run spec and in URLs: the sha256 of the .tar.gz, 64 lower-case hex. */
export const BundleHash = z.string().regex(/^[0-9a-f]{64}$/, "a sha256: 64 lower-case hex digits");

/** What bw-unpack prints (one JSON line on stdout) and the agent answers. */
export const UnpackResult = z.discriminatedUnion("ok", [
  z.strictObject({ ok: z.literal(true), files: z.number().int(), bytes: z.number().int() }),
  z.strictObject({
    ok: z.literal(false),
    code: BundleCode,
    /** Plain words; names the entry. */
    message: z.string(),
  }),
]);
export type UnpackResult = z.infer<typeof UnpackResult>;

/**
 * bw-unpack's exit codes. `failed`: not the bundle's doing (bad arguments, <dir> not a directory,
 * the disk, a file already in the way); a message on stderr and nothing on stdout.
 */
export const UNPACK_EXIT = { ok: 0, failed: 1, refused: 2 } as const;

/** bw-collect's exit codes. `failed`: what stdout holds is no archive to use; stderr says why. */
export const COLLECT_EXIT = { ok: 0, failed: 1 } as const;

/** Where the commands leave results, per sandbox ($BW_OUT). */
export const DEFAULT_OUT_DIR = "/home/sandbox/out";

/** The bounds on what is collected from one sandbox's $BW_OUT. */
export const ARTIFACT_DEFAULTS = {
  maxBytes: 64 * 1024 * 1024,
  maxFiles: 1_000,
} as const;

export const CutReason = z.enum([
  /** Over the byte bound (this file would have passed it). */
  "too_large",
  /** Over the count bound. */
  "too_many",
  /** A symlink: never followed. */
  "symlink",
  /** Not a regular file or directory (device, FIFO, socket). */
  "special",
  /**
   * Could not be read as the execute stage's uid, or changed while it was read (its archive entry,
   * if any, is then no artifact: only what `files` lists is), or a name that is not UTF-8.
   */
  "unreadable",
]);
export type CutReason = z.infer<typeof CutReason>;

/**
 * The last entry of bw-collect's archive. Paths are relative to $BW_OUT, `/`-separated. It is the
 * truth about the archive: a `files/<path>` entry is an artifact only when `files` lists its path
 * (with the sha256 its bytes must have).
 */
export const CollectManifest = z.strictObject({
  files: z.array(z.strictObject({ path: z.string(), size: z.number().int(), sha256: BundleHash })),
  cut: z.array(z.strictObject({ path: z.string(), reason: CutReason, size: z.number().int().nullable() })),
  limits: z.strictObject({ maxBytes: z.number().int(), maxFiles: z.number().int() }),
  /** $BW_OUT did not exist (the commands wrote nothing): not an error. */
  missing: z.boolean(),
  /**
   * Present (true) only when the walk stopped early: more entries under $BW_OUT than it visits
   * (10 × maxFiles, at least 10 000), or `cut` full (maxFiles entries). What came after is in
   * neither list. Optional so that a manifest without it still parses.
   */
  incomplete: z.literal(true).optional(),
});
export type CollectManifest = z.infer<typeof CollectManifest>;

/** What a collect stored for a sandbox (the broker's answer): files kept, their bytes, entries cut. */
export interface ArtifactSummary {
  files: number;
  bytes: number;
  cut: number;
  /** bw-collect stopped listing early (more was cut than the rows say). */
  incomplete: boolean;
}
