// The one table of destinations no sandbox reaches, and the one canonical form of an IP address.
// Pure (only the URL parser, common to Workers and Node): the proxy's resolved-address check
// (shared/node/address-policy.ts), the local agent's nftables (local-agent/network.ts) and the
// Kubernetes NetworkPolicy (src/broker/kubernetes/manifests.ts) all read NON_PUBLIC_V4 here, so
// they cannot drift apart. Ranges from IANA's special-purpose registries (as smokescreen's
// classifyAddr), plus cloud hosts' own services that sit on public addresses.

export interface AddressRange {
  cidr: string;
  why: string;
}

/** IPv4 ranges that are never a destination. No two overlap (nftables sets refuse overlaps). */
export const NON_PUBLIC_V4: readonly AddressRange[] = Object.freeze([
  { cidr: "0.0.0.0/8", why: "this network" },
  { cidr: "10.0.0.0/8", why: "private" },
  { cidr: "100.64.0.0/10", why: "carrier-grade NAT" },
  { cidr: "127.0.0.0/8", why: "loopback" },
  { cidr: "168.63.129.16/32", why: "Azure wire server (cloud metadata)" },
  { cidr: "169.254.0.0/16", why: "link-local (cloud metadata)" },
  { cidr: "172.16.0.0/12", why: "private" },
  { cidr: "192.0.0.0/24", why: "IETF protocol assignments" },
  { cidr: "192.0.2.0/24", why: "documentation" },
  { cidr: "192.88.99.0/24", why: "6to4 relay anycast" },
  { cidr: "192.168.0.0/16", why: "private" },
  { cidr: "198.18.0.0/15", why: "benchmarking" },
  { cidr: "198.51.100.0/24", why: "documentation" },
  { cidr: "203.0.113.0/24", why: "documentation" },
  { cidr: "224.0.0.0/4", why: "multicast" },
  { cidr: "240.0.0.0/4", why: "reserved / broadcast" },
]);

/** IPv6 ranges that are never a destination (IPv4 embedded in IPv6 is checked as IPv4). */
export const NON_PUBLIC_V6: readonly AddressRange[] = Object.freeze([
  { cidr: "::/128", why: "unspecified" },
  { cidr: "::1/128", why: "loopback" },
  { cidr: "100::/64", why: "discard-only" },
  { cidr: "2001::/32", why: "Teredo (embeds an IPv4 address)" },
  { cidr: "2001:db8::/32", why: "documentation" },
  { cidr: "fc00::/7", why: "unique local (private)" },
  { cidr: "fe80::/10", why: "link-local" },
  { cidr: "fec0::/10", why: "site-local" },
  { cidr: "ff00::/8", why: "multicast" },
]);

const IPV4 =
  /^(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])(?:\.(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])){3}$/;

/** The eight 16-bit words of an IPv6 address (with or without brackets), or null. */
export function ipv6Words(ip: string): number[] | null {
  const inner = ip.startsWith("[") && ip.endsWith("]") ? ip.slice(1, -1) : ip;
  if (!/^[0-9A-Fa-f:.]+$/.test(inner) || !inner.includes(":")) return null;
  let compressed: string;
  try {
    // The WHATWG parser validates and serialises (lowercase, compressed, dotted tail as hex).
    compressed = new URL(`http://[${inner}]/`).hostname.slice(1, -1);
  } catch {
    return null;
  }
  const [head = "", tail] = compressed.split("::");
  const h = head ? head.split(":") : [];
  const t = tail ? tail.split(":") : [];
  const fill = tail === undefined ? [] : new Array<string>(8 - h.length - t.length).fill("0");
  const words = [...h, ...fill, ...t].map((w) => Number.parseInt(w, 16));
  return words.length === 8 && words.every((w) => w >= 0 && w <= 0xffff) ? words : null;
}

/**
 * The IPv4 address an IPv6 address carries: IPv4-mapped (::ffff:0:0/96), IPv4-compatible
 * (::/96), NAT64 (64:ff9b::/96 and the local-use 64:ff9b:1::/48) and 6to4 (2002::/16). Null
 * for any other address.
 */
export function embeddedIpv4(ip: string): string | null {
  const w = ipv6Words(ip);
  if (!w) return null;
  const [w0, w1, w2, w3, w4, w5, w6, w7] = w as [
    number,
    number,
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  const v4 = (hi: number, lo: number) => `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  if (w0 === 0 && w1 === 0 && w2 === 0 && w3 === 0 && w4 === 0 && (w5 === 0xffff || w5 === 0))
    return v4(w6, w7);
  if (w0 === 0x64 && w1 === 0xff9b && w2 === 0 && w3 === 0 && w4 === 0 && w5 === 0) return v4(w6, w7);
  if (w0 === 0x64 && w1 === 0xff9b && w2 === 1) return v4(w6, w7);
  if (w0 === 0x2002) return v4(w1, w2);
  return null;
}

/**
 * One name per address, to compare a resolved address with an IP-literal entry (case I5):
 * dotted decimal for IPv4 and for every IPv6 spelling that carries one (mapped, compatible,
 * NAT64, 6to4), else the compressed IPv6 form without brackets. Null when not an address.
 */
export function addressKey(ip: string): string | null {
  if (IPV4.test(ip)) return ip;
  const words = ipv6Words(ip);
  if (!words) return null;
  // `::` and `::1` are themselves, not 0.0.0.0 and 0.0.0.1 in the IPv4-compatible spelling.
  const compatZero = words.slice(0, 7).every((x) => x === 0);
  const inner = compatZero ? null : embeddedIpv4(ip);
  if (inner) return inner;
  return new URL(`http://[${words.map((x) => x.toString(16)).join(":")}]/`).hostname.slice(1, -1);
}
