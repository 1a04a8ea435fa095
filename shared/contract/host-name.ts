import punycode from "punycode/punycode.js";

// Host canonicalisation and the host-pattern grammar: what a host string in the wire contract
// is. Pure: only globals common to Workers and Node (URL). Every policy decision compares
// canonical forms, so a host has exactly one name here however the agent spells it (cases A11,
// A14). The judgments made of a pattern when it is saved (public suffixes) and matching are
// policy (policy/host.ts); this is the grammar alone, so the schemas can check it.

const MAX_HOST_LENGTH = 253;
const MAX_LABEL_LENGTH = 63;
// Anything longer is refused before any parsing work is spent on it.
const MAX_INPUT_LENGTH = 1024;

/** A canonical IPv4 address: four decimal octets, no leading zeros. */
const IPV4 =
  /^(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$/;
/** WHATWG's serialisation of an IPv4-mapped IPv6 address (::ffff:0:0/96). */
const MAPPED_IPV4 = /^\[::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})\]$/;
/** A label of a canonical host at request time (lenient: underscores and edge hyphens occur). */
const REQUEST_LABEL = /^[a-z0-9_-]{1,63}$/;
/** A label of a saved pattern (strict LDH). */
const PATTERN_LABEL = /^[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$/;
/** A canonical name pattern made of LDH labels, optionally after `*.`. */
const CANONICAL_NAME_PATTERN =
  /^(?:\*\.)?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?\.)*[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$/;
/** WHATWG reads a host as IPv4 when its last label is a number (decimal, octal or 0x-hex). */
const NUMERIC_LABEL = /^(?:[0-9]+|0x[0-9a-f]*)$/i;
// Raw input: ASCII letters, digits, '.', '-', '_', or non-ASCII (IDN). Everything else — NUL, CR,
// LF, space, '/', '\', '@', '%', '?', '#', ':' — is refused before the URL parser sees it, so
// userinfo, paths, percent-escapes or a second authority cannot ride along.
const RAW_NAME = /^[A-Za-z0-9._\-\u0080-\uFFFF]+$/;
// Unicode controls and separators are refused too, rather than left to UTS 46 mapping.
const UNICODE_CONTROL_OR_SPACE = /[\p{Cc}\p{Zs}\p{Zl}\p{Zp}]/u;
const RAW_IPV6 = /^[0-9A-Fa-f:.]+$/;

export interface HostAndPort {
  /** Canonical host (see canonicalHost). */
  host: string;
  /** The port if one was given, else null. */
  port: number | null;
}

/**
 * Splits `host[:port]` (IPv6 in brackets: `[::1]:8080`; a bare IPv6 address is taken as a host
 * without port) and canonicalises the host. Null when either part is invalid; a port must be
 * 1-5 decimal digits in 1..65535 (an empty port, as in `example.com:`, is refused).
 */
export function splitHostPort(input: string): HostAndPort | null {
  if (typeof input !== "string" || input.length === 0 || input.length > MAX_INPUT_LENGTH) return null;
  let rawHost: string;
  let rawPort: string | null = null;
  if (input.startsWith("[")) {
    const close = input.indexOf("]");
    if (close === -1) return null;
    rawHost = input.slice(0, close + 1);
    const rest = input.slice(close + 1);
    if (rest !== "") {
      if (!rest.startsWith(":")) return null;
      rawPort = rest.slice(1);
    }
  } else {
    const at = input.indexOf(":");
    if (at !== -1 && input.indexOf(":", at + 1) === -1) {
      rawHost = input.slice(0, at);
      rawPort = input.slice(at + 1);
    } else {
      rawHost = input;
    }
  }
  let port: number | null = null;
  if (rawPort !== null) {
    if (!/^[0-9]{1,5}$/.test(rawPort)) return null;
    port = Number(rawPort);
    if (port < 1 || port > 65535) return null;
  }
  const host = canonicalName(rawHost);
  return host === null ? null : { host, port };
}

/**
 * The request-time canonical form of a host as seen in SNI, `Host` or a CONNECT target, with or
 * without a port (the port is dropped; use splitHostPort to keep it). Lowercase, one trailing dot
 * removed, IDN as punycode, IPv4 in any spelling as dotted decimal (`0x7f.1` → `127.0.0.1`),
 * IPv6 compressed in brackets (`[0:0:0:0:0:0:0:1]` → `[::1]`). An IPv4-mapped IPv6 address is
 * the IPv4 endpoint itself, so it gets the IPv4 name (`[::ffff:7f00:1]` → `127.0.0.1`) and a
 * block or rule for an IPv4 address cannot be side-stepped through it. Null when not a host.
 */
export function canonicalHost(input: string): string | null {
  return splitHostPort(input)?.host ?? null;
}

/** Canonicalises a host without port: bracketed or bare IPv6, IPv4 in any spelling, or a name. */
function canonicalName(raw: string): string | null {
  const plain = plainName(raw);
  if (plain !== null) return plain;
  if (raw.startsWith("[") || raw.includes(":")) {
    const inner = raw.startsWith("[") && raw.endsWith("]") ? raw.slice(1, -1) : raw;
    if (!RAW_IPV6.test(inner) || inner.split(":").length < 3) return null;
    return canonicalIpv6(inner);
  }
  if (!RAW_NAME.test(raw) || UNICODE_CONTROL_OR_SPACE.test(raw)) return null;
  const parsed = whatwgHost(raw);
  if (parsed === null) return null;
  if (parsed.startsWith("[")) return null;
  if (IPV4.test(parsed)) return parsed;
  const name = parsed.endsWith(".") ? parsed.slice(0, -1) : parsed;
  if (name.length === 0 || name.length > MAX_HOST_LENGTH) return null;
  for (const label of name.split(".")) {
    if (!REQUEST_LABEL.test(label)) return null;
  }
  return name;
}

/**
 * The canonical form of a name the URL parse below would give back as it is, up to ASCII case:
 * labels of 1-63 letters, digits, `-` and `_`, at most 253 characters, no `xn--` (punycode gets
 * checked), a last label that is not a number (WHATWG would read the host as IPv4). Null for
 * anything else, which takes the full path. Nearly every host a request names is one; the parse
 * it skips was most of a policy decision's time.
 */
function plainName(raw: string): string | null {
  const n = raw.length;
  if (n === 0 || n > MAX_HOST_LENGTH) return null;
  let label = 0;
  let lastDot = -1;
  let upper = false;
  for (let i = 0; i < n; i++) {
    const c = raw.charCodeAt(i);
    if (c === 0x2e) {
      if (label === 0) return null;
      label = 0;
      lastDot = i;
      continue;
    }
    if (c >= 0x41 && c <= 0x5a) upper = true;
    else if (!((c >= 0x61 && c <= 0x7a) || (c >= 0x30 && c <= 0x39) || c === 0x2d || c === 0x5f)) return null;
    if (++label > MAX_LABEL_LENGTH) return null;
  }
  if (label === 0) return null;
  const name = upper ? raw.toLowerCase() : raw;
  if (name.includes("xn--")) return null;
  // A numeric label (decimal, octal, 0x-hex) starts with a digit.
  const first = name.charCodeAt(lastDot + 1);
  if (first >= 0x30 && first <= 0x39 && NUMERIC_LABEL.test(name.slice(lastDot + 1))) return null;
  return name;
}

function canonicalIpv6(inner: string): string | null {
  const parsed = whatwgHost(`[${inner}]`);
  if (parsed === null || !parsed.startsWith("[")) return null;
  const mapped = MAPPED_IPV4.exec(parsed);
  if (mapped) {
    const high = Number.parseInt(mapped[1] ?? "", 16);
    const low = Number.parseInt(mapped[2] ?? "", 16);
    return `${high >> 8}.${high & 0xff}.${low >> 8}.${low & 0xff}`;
  }
  return parsed;
}

/**
 * The WHATWG URL host parser (UTS 46, IPv4 number forms, IPv6 compression), or null; its every
 * `xn--` label checked to be real punycode (validAceLabel).
 */
function whatwgHost(host: string): string | null {
  const parsed = urlHostname(host);
  if (parsed === null || parsed.startsWith("[")) return parsed;
  return parsed.split(".").every((l) => !l.startsWith("xn--") || validAceLabel(l)) ? parsed : null;
}

function urlHostname(host: string): string | null {
  try {
    const url = new URL(`http://${host}/`);
    // Belt and braces: the input was screened, so nothing but the host may have been parsed.
    if (url.username !== "" || url.password !== "" || url.port !== "" || url.pathname !== "/") return null;
    return url.hostname === "" ? null : url.hostname;
  } catch {
    return null;
  }
}

/**
 * An `xn--` label names a non-ASCII name that encodes back to exactly it (RFC 5891 §5.4). URL
 * parsers no longer check this (the URL standard dropped it; Node 24's parser takes `xn--zz`), and
 * two tools that decode a bogus label differently would disagree on which host it is.
 */
function validAceLabel(label: string): boolean {
  let unicode: string;
  try {
    unicode = punycode.decode(label.slice(4));
  } catch {
    return false;
  }
  return /[^\p{ASCII}]/u.test(unicode) && urlHostname(unicode) === label;
}

/** True for an IPv4 or IPv6 literal in any spelling (`127.1`, `[::1]`, `::1`). */
export function isIpLiteral(host: string): boolean {
  const canonical = canonicalHost(host);
  return canonical !== null && isCanonicalIp(canonical);
}

/** True for an IP literal already in canonical form (as canonicalHost and parseHostPattern give it). */
export function isCanonicalIp(host: string): boolean {
  return host.startsWith("[") || IPV4.test(host);
}

// ---- patterns ----

export type HostPatternResult = { ok: true; pattern: string } | { ok: false; message: string };

const refuse = (message: string): HostPatternResult => ({ ok: false, message });

/**
 * True when `pattern` is already a pattern in canonical form by the grammar alone (no public
 * suffix check): what a stored policy document may contain.
 */
export function isCanonicalPattern(pattern: string): boolean {
  // Fast path for the common shape (documents can hold 100,000 patterns); anything unusual —
  // IP literals, numeric last labels, punycode — takes the full check.
  if (
    pattern.length <= MAX_HOST_LENGTH &&
    CANONICAL_NAME_PATTERN.test(pattern) &&
    !pattern.includes("xn--")
  ) {
    if (!NUMERIC_LABEL.test(pattern.slice(pattern.lastIndexOf(".") + 1))) return true;
  }
  const parsed = parseHostPatternSyntax(pattern);
  return parsed.ok && parsed.pattern === pattern;
}

/** True when `host` is a canonical exact host name: not a wildcard, not an IP literal. */
export function isCanonicalHostName(host: string): boolean {
  return !host.startsWith("*.") && !isCanonicalIp(host) && isCanonicalPattern(host);
}

/**
 * parseHostPattern without the public-suffix checks: the grammar and canonical form only (what a
 * stored document is checked against, so that a newer suffix list cannot invalidate it).
 */
export function parseHostPatternSyntax(input: string): HostPatternResult {
  if (typeof input !== "string" || input.length === 0) return refuse("the host pattern is empty");
  if (input.length > MAX_INPUT_LENGTH) return refuse(`the host pattern is ${input.length} characters long`);
  // biome-ignore lint/suspicious/noControlCharactersInRegex: matching control characters is the point
  const control = /[\u0000-\u001f\u007f-\u009f]/.exec(input);
  if (control) {
    const code = control[0].charCodeAt(0).toString(16).padStart(4, "0").toUpperCase();
    return refuse(`contains a control character (U+${code})`);
  }
  if (/\s/u.test(input))
    return refuse("contains whitespace; write the host name alone, e.g. api.example.com");
  const scheme = /^[A-Za-z][A-Za-z0-9+.-]*:\/\//.exec(input);
  if (scheme) {
    const authority = input.slice(scheme[0].length).split(/[/?#]/)[0] ?? "";
    return refuse(`write the host name without the scheme ${scheme[0]}${suggest(authority)}`);
  }
  const pathStart = input.search(/[/?#\\]/);
  if (pathStart !== -1) {
    return refuse(
      `paths, queries and fragments are not part of a host pattern${suggest(input.slice(0, pathStart))}`,
    );
  }
  if (input.includes("@"))
    return refuse("user names are not part of a host pattern; write the host name alone");
  if (input.includes("%")) return refuse("percent-escapes are not allowed in a host pattern");

  const split = splitPatternPort(input);
  if (!split.ok) return split;
  let host = split.pattern;
  if (host.startsWith("[") || host.includes(":")) return ipv6Pattern(host);
  if (host.endsWith(".")) host = host.slice(0, -1);
  if (host === "") return refuse("the host pattern is empty");

  const wildcard = wildcardPart(host);
  if (!wildcard.ok) return wildcard;
  const rest = wildcard.pattern;
  const isWildcard = rest !== host;
  const prefix = isWildcard ? "*." : "";
  if (rest === "") return refuse("nothing follows *.; write the domain, e.g. *.example.com");

  if (/[^\x20-\x7e]/.test(rest)) {
    const ascii = whatwgHost(rest);
    if (ascii === null || ascii.startsWith("[") || IPV4.test(ascii)) {
      return refuse("is not a valid internationalised domain name");
    }
    const suggestion = prefix + (ascii.endsWith(".") ? ascii.slice(0, -1) : ascii);
    return refuse(`non-ASCII names must be written in punycode (ASCII): use ${suggestion}`);
  }
  const lower = rest.toLowerCase();
  const labels = lower.split(".");
  if (NUMERIC_LABEL.test(labels[labels.length - 1] ?? "")) {
    if (isWildcard) return refuse("a wildcard cannot be applied to an IP address; list each address exactly");
    return ipv4Pattern(lower);
  }
  for (const label of labels) {
    const problem = labelProblem(label);
    if (problem !== null) return refuse(problem);
  }
  const pattern = prefix + lower;
  if (pattern.length > MAX_HOST_LENGTH) {
    return refuse(`is ${pattern.length} characters long; a host name has at most ${MAX_HOST_LENGTH}`);
  }
  // The URL parser validates punycode (xn-- labels) and must agree with our form exactly.
  if (whatwgHost(lower) !== lower) {
    const bad = labels.find((l) => l.startsWith("xn--") && whatwgHost(l) !== l);
    return refuse(bad ? `the label ${bad} is not valid punycode` : "is not a valid host name");
  }
  return { ok: true, pattern };
}

const suggest = (candidate: string): string => {
  const parsed = parseHostPatternSyntax(candidate);
  return parsed.ok ? `: use ${parsed.pattern}` : "";
};

/** Strips a default port (80, 443) and refuses any other. The host part is returned unchanged. */
function splitPatternPort(input: string): HostPatternResult {
  let host = input;
  let port: string | null = null;
  if (input.startsWith("[") || input.startsWith("*.[")) {
    const match = /^(\*\.)?(\[[^\]]*\])(?::(.*))?$/.exec(input);
    if (!match) return refuse("an IPv6 address must be written in brackets, e.g. [2001:db8::1]");
    if (match[1]) return refuse("a wildcard cannot be applied to an IP address; list each address exactly");
    host = match[2] ?? "";
    port = match[3] ?? null;
  } else if (input.split(":").length === 2) {
    const at = input.indexOf(":");
    host = input.slice(0, at);
    port = input.slice(at + 1);
  }
  if (port === null || port === "80" || port === "443") return { ok: true, pattern: host };
  return refuse(
    `ports are not part of a host pattern (the pattern applies to ports 80 and 443); remove :${port}`,
  );
}

function ipv6Pattern(host: string): HostPatternResult {
  if (host.startsWith("*.")) {
    return refuse("a wildcard cannot be applied to an IP address; list each address exactly");
  }
  const inner = host.startsWith("[") && host.endsWith("]") ? host.slice(1, -1) : host;
  const canonical = RAW_IPV6.test(inner) && inner.split(":").length >= 3 ? canonicalIpv6(inner) : null;
  if (canonical === null) return refuse("is not a valid IPv6 address");
  return { ok: true, pattern: canonical };
}

function ipv4Pattern(host: string): HostPatternResult {
  const parsed = whatwgHost(host);
  if (parsed === null || !IPV4.test(parsed)) {
    return refuse(
      "is not a valid IPv4 address (a host whose last label is a number is read as an IP address)",
    );
  }
  // Octal, hex and short forms mean different things to different tools: insist on the plain one.
  if (parsed !== host) return refuse(`write the IPv4 address in plain dotted decimal: use ${parsed}`);
  return { ok: true, pattern: parsed };
}

/** Separates a leading `*.` from the rest; refuses every other use of `*`. */
function wildcardPart(host: string): HostPatternResult {
  if (!host.includes("*")) return { ok: true, pattern: host };
  if (host === "*" || host === "*.") {
    return refuse("a lone * would match every host; list hosts, or set the default action instead");
  }
  const labels = host.split(".");
  const first = labels[0] ?? "";
  const rest = labels.slice(1);
  if (first === "*" && !rest.some((l) => l.includes("*"))) return { ok: true, pattern: rest.join(".") };
  if (first === "*" && rest.some((l) => l === "*")) {
    return refuse("only one wildcard is allowed, as the whole leftmost label (e.g. *.example.com)");
  }
  if (first.includes("*") && first !== "*") {
    // `*example.com` most likely means "example.com and its subdomains": say what to write.
    const base = first.startsWith("*") ? host.replace(/^\*+\.?/, "") : "";
    const parsedBase = base === "" ? null : parseHostPatternSyntax(base);
    const hint =
      parsedBase?.ok && !parsedBase.pattern.startsWith("*.")
        ? `: write *.${parsedBase.pattern} (which does not match ${parsedBase.pattern} itself)`
        : "";
    return refuse(`the wildcard must be a whole label on its own, followed by a dot${hint}`);
  }
  const last = labels[labels.length - 1] ?? "";
  if (last.includes("*")) {
    return refuse(
      "a wildcard cannot stand for the top-level domain (as in example.*); list each domain exactly",
    );
  }
  return refuse(
    "a wildcard is only allowed as the whole leftmost label (e.g. *.example.com), not in the middle",
  );
}

function labelProblem(label: string): string | null {
  if (label === "") return "has an empty label (two dots in a row, or a leading dot)";
  if (label.length > MAX_LABEL_LENGTH) {
    const start = label.slice(0, 16);
    return `the label ${start}... is ${label.length} characters long; the limit is ${MAX_LABEL_LENGTH}`;
  }
  if (PATTERN_LABEL.test(label)) return null;
  if (label.includes("_"))
    return `the label ${label} contains an underscore, which host names may not contain`;
  if (label.startsWith("-") || label.endsWith("-")) return `the label ${label} starts or ends with a hyphen`;
  const bad = /[^a-z0-9-]/.exec(label)?.[0] ?? "";
  return `contains ${JSON.stringify(bad)}, which host names may not contain (letters, digits and - only)`;
}
