import type { BundleCode } from "../contract/bundle";

// How an entry's name and a link's target are judged: as a Linux extractor (bw-unpack) will meet
// them, and a little stricter wherever that costs a real bundle nothing. Pure (no node: imports):
// the Worker checks uploads with it too.

/** Linux's PATH_MAX: no longer path can be made, and it bounds what the checks keep per entry. */
export const MAX_PATH_BYTES = 4096;
/** Linux's NAME_MAX, per path segment. */
export const MAX_NAME_BYTES = 255;

export type PathRefusal = { ok: false; code: BundleCode; why: string };
export type PathVerdict = { ok: true; segments: string[] } | PathRefusal;

const utf8 = new TextEncoder();

/**
 * An entry's path as segments from the bundle's root (`./a//b/` → [a, b]; `.` → [], the root
 * itself). Refuses a `..` segment anywhere, even one that would stay inside (`a/../b`): no real
 * bundle needs it, and it is the one spelling every extractor resolves differently. A backslash
 * counts as a separator for the `..` and leading-separator checks only: on Linux it is a name's
 * character, but a Windows tool reading the same bundle would climb out with it.
 */
export function entrySegments(name: string): PathVerdict {
  if (name === "") return refuse("bundle_invalid", "an empty path");
  if (name.includes("\0")) return refuse("bundle_invalid", "a NUL in its path");
  if (isAbsolute(name)) return refuse("bundle_absolute_path", "an absolute path");
  if (utf8.encode(name).length > MAX_PATH_BYTES) return refuse("bundle_invalid", "a path over 4096 bytes");
  const segments: string[] = [];
  for (const segment of name.split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment.split("\\").includes("..")) return refuse("bundle_path_traversal", "a `..` segment");
    if (utf8.encode(segment).length > MAX_NAME_BYTES)
      return refuse("bundle_invalid", "a name over 255 bytes");
    segments.push(segment);
  }
  return { ok: true, segments };
}

/**
 * Why a symlink at `entry` (its segments) pointing at `target` could lead out of the tree, or
 * null when it cannot. The target resolves against the entry's own directory, which is a real
 * directory of the tree (a symlink may never be a parent of another entry: see tree.ts). The
 * sound rule is lexical and simple: `..` segments only at the start, no more of them than the
 * entry is deep, then names only. A `..` after a name is refused because the name may itself be
 * a symlink (`a -> .`, then `b -> a/../x` is `x` on paper and `../x` to the kernel); names only
 * lead to entries of the tree, and a symlink among them is held to this same rule.
 */
export function symlinkEscape(entry: readonly string[], target: string): PathRefusal | null {
  if (target === "") return refuse("bundle_invalid", "a symlink with an empty target");
  if (target.includes("\0")) return refuse("bundle_invalid", "a NUL in its link target");
  if (utf8.encode(target).length > MAX_PATH_BYTES)
    return refuse("bundle_invalid", "a link target over 4096 bytes");
  if (isAbsolute(target)) return refuse("bundle_link_escape", "a symlink to an absolute path");
  let up = 0;
  let descended = false;
  for (const segment of target.split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment === "..") {
      if (descended) return refuse("bundle_link_escape", "a symlink whose target climbs (`..`) after a name");
      up++;
    } else {
      descended = true;
    }
  }
  // The entry's directory is `entry.length - 1` deep below the root.
  if (up > entry.length - 1) return refuse("bundle_link_escape", "a symlink that leads out of the tree");
  return null;
}

/**
 * A hardlink's target as segments. Tar names a hardlink's target from the archive's root (GNU tar
 * writes `./a/b`), not from the entry's directory, so it is read like an entry's own path; any
 * way out is a link escape.
 */
export function hardlinkSegments(target: string): PathVerdict {
  const verdict = entrySegments(target);
  if (verdict.ok) {
    if (verdict.segments.length === 0) return refuse("bundle_link_escape", "a hardlink to the tree's root");
    return verdict;
  }
  if (verdict.code === "bundle_invalid") return verdict;
  return refuse("bundle_link_escape", `a hardlink whose target has ${verdict.why}`);
}

/** A leading `/` or `\` (POSIX root, Windows root or UNC share) or a Windows drive (`C:`). */
function isAbsolute(path: string): boolean {
  return path.startsWith("/") || path.startsWith("\\") || /^[A-Za-z]:/.test(path);
}

function refuse(code: BundleCode, why: string): PathRefusal {
  return { ok: false, code, why };
}
