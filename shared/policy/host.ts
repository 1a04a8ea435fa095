import { parse as parseDomain } from "tldts";
import {
  canonicalHost,
  type HostPatternResult,
  isCanonicalIp,
  parseHostPatternSyntax,
} from "../contract/host-name";
import { suffixEntryBelow } from "./public-suffix";

// What policy makes of a host pattern beyond its grammar (contract/host-name.ts): whether it may
// be saved (public suffixes, cases A15, A16, I8) and what it matches.

export type HostPatternUse = "host-entry" | "rule";

const refuse = (message: string): HostPatternResult => ({ ok: false, message });

/**
 * Checks and canonicalises a host pattern as the user saves it: an exact host name, an IP
 * literal, or `*.` followed by a host name (the wildcard is the whole leftmost label and stands
 * for one or more labels). Case, one trailing dot and a default port (:80, :443) are normalised
 * away; everything else questionable is refused with a message that says what to write instead.
 * A wildcard over a public suffix is refused; for a rule also over a shared (private-section)
 * suffix such as github.io, or over a domain with any suffix-list entry below it (amazonaws.com),
 * because a credential must not go to every tenant of such a domain.
 */
export function parseHostPattern(input: string, use: HostPatternUse): HostPatternResult {
  const syntax = parseHostPatternSyntax(input);
  if (!syntax.ok || !syntax.pattern.startsWith("*.")) return syntax;
  const rest = syntax.pattern.slice(2);
  const pattern = syntax.pattern;
  if (!rest.includes(".")) {
    return refuse(`${pattern} would match every host under the top-level domain ${rest}; name the domain`);
  }
  const icann = parseDomain(rest, { allowPrivateDomains: false });
  if (icann.publicSuffix === rest) {
    return refuse(
      `${rest} is a public suffix, so ${pattern} would match every domain registered under it; ` +
        `name the domain, e.g. *.example.${rest}`,
    );
  }
  if (use === "rule") {
    const shared = parseDomain(rest, { allowPrivateDomains: true });
    if (shared.publicSuffix === rest && shared.isPrivate === true) {
      return refuse(
        `${rest} is a shared domain where anyone can get a subdomain (public suffix list), so a ` +
          `credential for ${pattern} would go to every tenant of it; name the exact host, e.g. yours.${rest}`,
      );
    }
    // Case I8: a suffix list entry below R (`execute-api.<region>.amazonaws.com` under
    // `amazonaws.com`) means someone else's hosts match `*.R` too.
    const below = suffixEntryBelow(rest);
    if (below !== null) {
      return refuse(
        `the public suffix list has entries under ${rest} (e.g. ${below}) where anyone can get a ` +
          `subdomain, so a credential for ${pattern} could go to hosts other people control; ` +
          `name the exact host, or a wildcard under a domain you own`,
      );
    }
  }
  return syntax;
}

// ---- matching ----

/**
 * Does `pattern` (canonical, as parseHostPattern returns it) match `host`? The host is
 * canonicalised first; an invalid host matches nothing. `*.example.com` matches a host ending in
 * `.example.com` with at least one more label, never `example.com` itself and never an IP literal.
 */
export function hostMatches(pattern: string, host: string): boolean {
  const canonical = canonicalHost(host);
  return canonical !== null && matchesCanonical(pattern, canonical);
}

/** hostMatches for a host already in canonical form. */
export function matchesCanonical(pattern: string, host: string): boolean {
  if (!pattern.startsWith("*.")) return pattern === host;
  const suffix = pattern.slice(1);
  return host.length > suffix.length && host.endsWith(suffix) && !isCanonicalIp(host);
}

/** Does every host matched by `inner` also match `outer`? Both are canonical patterns. */
export function patternCovers(outer: string, inner: string): boolean {
  if (!outer.startsWith("*.")) return outer === inner;
  if (!inner.startsWith("*.")) return matchesCanonical(outer, inner);
  const outerRest = outer.slice(2);
  const innerRest = inner.slice(2);
  return innerRest === outerRest || innerRest.endsWith(`.${outerRest}`);
}

/**
 * The lookup keys of a canonical host for an index: the host itself, then (for names, not IP
 * literals) the remainder after each leftmost label, longest first — `a.b.c` → `b.c`, `c`. A
 * wildcard `*.R` matches the host exactly when R is one of these remainders.
 */
export function wildcardRemainders(host: string): string[] {
  if (isCanonicalIp(host)) return [];
  const out: string[] = [];
  for (let dot = host.indexOf("."); dot !== -1; dot = host.indexOf(".", dot + 1)) {
    out.push(host.slice(dot + 1));
  }
  return out;
}
