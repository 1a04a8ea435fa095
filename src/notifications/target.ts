import { canonicalHost, isCanonicalIp } from "@benchwright/shared/contract/host-name";
import type { TargetPolicy } from "@benchwright/shared/contract/notification-targets";
import { matchesCanonical } from "@benchwright/shared/policy/host";

// Where a notification may be sent. The URL is the user's but the fetch is ours, from inside
// the platform, so the URL must name a public web host: https, a DNS name (never an IP literal
// in any spelling), not a local or internal name, and not one the operator's deny list covers.
// Checked when the URL is registered and again before every attempt (the operator's list may
// have grown since). What a public name resolves to is not checked here: a Worker's fetch has
// no DNS of its own to consult, and on Cloudflare it cannot reach private addresses anyway
// (docs/operator-guide.md, "Run-end notifications"); wrangler dev can, which is why local
// deployments are for development only.

/** Names that are local or internal by convention (RFC 6761, 6762, 8375; ICANN's .internal). */
const ALWAYS_DENIED = [
  "localhost",
  "*.localhost",
  "*.local",
  "*.internal",
  "*.arpa",
  "*.test",
  "*.invalid",
  "*.example",
  "*.onion",
];

export type TargetCheck = { ok: true; url: URL } | { ok: false; reason: string };

const refused = (reason: string): TargetCheck => ({ ok: false, reason });

/** Is `raw` a URL this deployment may POST a notification to? Reasons never quote the URL. */
export function checkTarget(raw: string, policy: TargetPolicy): TargetCheck {
  let url: URL;
  try {
    url = new URL(raw);
  } catch {
    return refused("it is not an absolute URL");
  }
  if (url.protocol !== "https:") return refused("only https URLs are allowed");
  if (url.username || url.password)
    return refused("it carries a user name or password; put no credentials in it");
  if (url.hash) return refused("it has a #fragment, which is never sent; remove it");
  // The WHATWG parser already turned any IPv4 spelling (0x7f.1, 2130706433) into dotted decimal.
  const host = canonicalHost(url.hostname);
  if (host === null) return refused("its host is not a valid host name");
  if (isCanonicalIp(host)) {
    // Only as the suite writes it (other spellings of loopback stay refused, even in tests).
    if (policy.admitLoopback && /^https:\/\/127\.0\.0\.1:\d+\//.test(raw)) return { ok: true, url };
    return refused("its host is an IP address; use a DNS name");
  }
  for (const pattern of ALWAYS_DENIED) {
    if (matchesCanonical(pattern, host)) return refused(`${host} is a local or reserved name`);
  }
  if (!host.includes(".")) return refused("its host is a single-label name, which is not a public host");
  for (const pattern of policy.deny) {
    if (matchesCanonical(pattern, host)) return refused(`${host} is on this deployment's deny list`);
  }
  return { ok: true, url };
}
