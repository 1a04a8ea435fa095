// Method and path limits (cases N3, N4): which requests a limited host entry or rule lets
// through. The limits' grammar is policy.ts's (HttpMethod, PathLimit); this module says how a
// request is held to them. Pure: the proxy, the dry run and the vault pages share it.
//
// A path is compared in a normalised form, so that spellings an upstream reads as the same path
// (`%2e%2e`, `//`, `;params`, `%41`) cannot step outside a prefix; the request itself is
// forwarded as it was sent. What cannot be normalised without guessing how the upstream decodes
// it (an encoded slash or backslash, a double encoding, a control character) is refused whenever
// a path limit applies. Comparison is case-sensitive, methods included.

/** Whether an entry or rule carries any limit (a limited host is always terminated, N3). */
export const hasLimits = (x: { methods?: readonly string[] | null; paths?: readonly string[] | null }) =>
  (x.methods ?? null) !== null || (x.paths ?? null) !== null;

/** Which limit a refused request was outside; an unnormalisable path is refused whatever the limit (N4). */
export const LIMIT_KINDS = ["method", "path", "unnormalisable_path"] as const;
export type LimitKindName = (typeof LIMIT_KINDS)[number];

/** A host entry's or rule's limits: null lets everything through. */
export interface Limits {
  methods: readonly string[] | null;
  paths: readonly string[] | null;
}

export type NormalisedPath = { ok: true; path: string } | { ok: false; reason: string };

// Escapes decoded before comparing: RFC 3986's unreserved characters, and the sub-delimiters,
// ":" and "@" that a path may carry either way. Everything else stays encoded (hex uppercased),
// except the escapes refused below.
const DECODED = /^[A-Za-z0-9\-._~!$&'()*+,=:@]$/;
// Escapes refused: NUL and the other controls; "/", "\\" and ";" (the upstream may or may not
// split on them once decoded: `..%3B` is ".." to one that cuts parameters after decoding); and
// "%" (a double encoding, which an upstream may decode twice).
const REFUSED_ESCAPES: Record<string, string> = {
  "2F": "an encoded slash (%2F)",
  "5C": "an encoded backslash (%5C)",
  "3B": "an encoded semicolon (%3B)",
  "25": "an encoded percent sign (%25)",
};

/**
 * The path part of a request target (origin-form, `/a/b?q`) in the form limits compare: the part
 * before "?", escapes of safe characters decoded, `;params` cut from each segment, empty segments
 * dropped (a trailing "/" kept), "." and ".." resolved (RFC 3986 remove_dot_segments). Refused
 * (ok: false): not starting with "/", anything outside printable ASCII, "\" or "#", a malformed
 * escape, an escaped control, slash, backslash or percent sign, and a ".." above the root.
 */
export function normalisePath(raw: string): NormalisedPath {
  const query = raw.indexOf("?");
  const path = query === -1 ? raw : raw.slice(0, query);
  if (!path.startsWith("/")) return { ok: false, reason: "the path does not start with /" };
  if (!/^[\x21-\x7e]*$/.test(path)) return { ok: false, reason: "a control, space or non-ASCII character" };
  if (path.includes("\\")) return { ok: false, reason: "a backslash" };
  if (path.includes("#")) return { ok: false, reason: "a #" };
  const out: string[] = [];
  const raws = path.slice(1).split("/");
  for (let i = 0; i < raws.length; i++) {
    const last = i === raws.length - 1;
    // Parameters go first: `..;x` is ".." to the servers that honour them (Tomcat, Jetty).
    const semi = (raws[i] as string).indexOf(";");
    const decoded = decodeSegment(semi === -1 ? (raws[i] as string) : (raws[i] as string).slice(0, semi));
    if (!decoded.ok) return decoded;
    const segment = decoded.path;
    if (segment === "..") {
      if (out.length === 0) return { ok: false, reason: "a .. above the root" };
      out.pop();
      if (last) out.push("");
    } else if (segment === "." || segment === "") {
      if (last) out.push("");
    } else {
      out.push(segment);
    }
  }
  // Only a trailing segment may be empty (the "/" a path ends with).
  return { ok: true, path: `/${out.join("/")}` };
}

function decodeSegment(segment: string): NormalisedPath {
  let out = "";
  for (let i = 0; i < segment.length; i++) {
    const c = segment[i] as string;
    if (c !== "%") {
      out += c;
      continue;
    }
    const hex = segment.slice(i + 1, i + 3).toUpperCase();
    if (!/^[0-9A-F]{2}$/.test(hex)) return { ok: false, reason: "a malformed percent-escape" };
    const code = Number.parseInt(hex, 16);
    const refused = REFUSED_ESCAPES[hex];
    if (refused) return { ok: false, reason: refused };
    if (code < 0x20 || code === 0x7f) return { ok: false, reason: "an encoded control character" };
    const char = String.fromCharCode(code);
    out += DECODED.test(char) ? char : `%${hex}`;
    i += 2;
  }
  return { ok: true, path: out };
}

/**
 * Whether a normalised path is inside one path limit (policy.ts's PathLimit): without "*", a
 * prefix ending on a segment boundary; with "*", a glob over the whole path, "*" within one
 * segment (possibly empty) and "**" across segments.
 */
export function pathInside(limit: string, path: string): boolean {
  if (!limit.includes("*")) {
    if (limit.endsWith("/")) return path.startsWith(limit);
    return path === limit || path.startsWith(`${limit}/`);
  }
  let source = "^";
  for (let i = 0; i < limit.length; i++) {
    const c = limit[i] as string;
    if (c !== "*") source += c.replace(/[.+?^${}()|[\]\\]/g, "\\$&");
    else if (limit[i + 1] === "*") {
      source += ".*";
      while (limit[i + 1] === "*") i++;
    } else source += "[^/]*";
  }
  return new RegExp(`${source}$`).test(path);
}

/**
 * Which limit a request is outside, or null when it passes: the method first (exact, as sent:
 * "get" is not "GET"), then the path, normalised from the request target (`/a/b?q`). With a path
 * limit, a path that cannot be normalised is refused whatever the limit would say.
 */
export function limitVerdict(limits: Limits, method: string, target: string): LimitKindName | null {
  if (limits.methods !== null && !limits.methods.includes(method)) return "method";
  if (limits.paths === null) return null;
  const normalised = normalisePath(target);
  if (!normalised.ok) return "unnormalisable_path";
  return limits.paths.some((limit) => pathInside(limit, normalised.path)) ? null : "path";
}
