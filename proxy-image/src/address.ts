import { BlockList, isIPv4, isIPv6 } from "node:net";

// Which resolved addresses the proxy may connect to (case A12). Checked on the address actually
// dialled, after resolution, so neither a hostname nor a spelling of an IP can smuggle a
// connection into private space, the metadata service or the proxy itself.
// Ranges from IANA's special-purpose registries, as smokescreen's classifyAddr does.

const V4_DENY: Array<[string, number, string]> = [
  ["0.0.0.0", 8, "this network"],
  ["10.0.0.0", 8, "private"],
  ["100.64.0.0", 10, "carrier-grade NAT"],
  ["127.0.0.0", 8, "loopback"],
  ["169.254.0.0", 16, "link-local (cloud metadata)"],
  ["172.16.0.0", 12, "private"],
  ["192.0.0.0", 24, "IETF protocol assignments"],
  ["192.0.2.0", 24, "documentation"],
  ["192.88.99.0", 24, "6to4 relay anycast"],
  ["192.168.0.0", 16, "private"],
  ["198.18.0.0", 15, "benchmarking"],
  ["198.51.100.0", 24, "documentation"],
  ["203.0.113.0", 24, "documentation"],
  ["224.0.0.0", 4, "multicast"],
  ["240.0.0.0", 4, "reserved / broadcast"],
];
const V6_DENY: Array<[string, number, string]> = [
  ["::", 128, "unspecified"],
  ["::1", 128, "loopback"],
  ["100::", 64, "discard-only"],
  ["2001::", 32, "Teredo (embeds an IPv4 address)"],
  ["2001:db8::", 32, "documentation"],
  ["fc00::", 7, "unique local (private)"],
  ["fe80::", 10, "link-local"],
  ["fec0::", 10, "site-local"],
  ["ff00::", 8, "multicast"],
];

export type AddressVerdict = { allowed: true } | { allowed: false; reason: string };

export interface AddressPolicyOptions {
  /** The proxy's own addresses: never a destination. */
  ownAddresses?: readonly string[];
  /**
   * Non-public ranges let through anyway. The proxy: only the test suite's own hosts
   * (BW_TEST_ALLOW_CIDRS, never set in production). The egress agent: the ranges the user names
   * with --allow-cidr (their own LAN, on their own machine).
   */
  allowCidrs?: readonly string[];
}

function addCidr(list: BlockList, cidr: string): void {
  const [net, bits] = cidr.split("/");
  if (!net || bits === undefined) throw new Error(`not a CIDR: ${cidr}`);
  list.addSubnet(net, Number(bits), isIPv6(net) ? "ipv6" : "ipv4");
}

/** IPv4 embedded in IPv4-mapped, NAT64 (64:ff9b::/96) and 6to4 (2002::/16) addresses. */
function embeddedIpv4(ip: string): string | null {
  const words = expandIpv6(ip);
  if (!words) return null;
  const v4 = (hi: number, lo: number) => `${hi >> 8}.${hi & 255}.${lo >> 8}.${lo & 255}`;
  const [w0, w1, w2, w3, w4, w5, w6, w7] = words as [
    number,
    number,
    number,
    number,
    number,
    number,
    number,
    number,
  ];
  if (w0 === 0 && w1 === 0 && w2 === 0 && w3 === 0 && w4 === 0 && (w5 === 0xffff || w5 === 0))
    return v4(w6, w7);
  if (w0 === 0x64 && w1 === 0xff9b && w2 === 0 && w3 === 0 && w4 === 0 && w5 === 0) return v4(w6, w7);
  if (w0 === 0x64 && w1 === 0xff9b && w2 === 1) return v4(w6, w7); // local-use NAT64
  if (w0 === 0x2002) return v4(w1, w2);
  return null;
}

function expandIpv6(ip: string): number[] | null {
  if (!isIPv6(ip)) return null;
  let text = ip.toLowerCase();
  const dotted = /(\d+\.\d+\.\d+\.\d+)$/.exec(text);
  if (dotted?.[1]) {
    const o = dotted[1].split(".").map(Number) as [number, number, number, number];
    text = text.replace(
      dotted[1],
      `${((o[0] << 8) | o[1]).toString(16)}:${((o[2] << 8) | o[3]).toString(16)}`,
    );
  }
  const [head = "", tail] = text.split("::");
  const h = head ? head.split(":") : [];
  const t = tail ? tail.split(":") : [];
  const fill = tail === undefined ? [] : new Array(8 - h.length - t.length).fill("0");
  const words = [...h, ...fill, ...t].map((w) => Number.parseInt(w, 16));
  return words.length === 8 ? words : null;
}

export function createAddressPolicy(options: AddressPolicyOptions = {}) {
  const deny = new BlockList();
  const reasons: Array<[BlockList, string]> = [];
  for (const [net, bits, why] of [...V4_DENY, ...V6_DENY]) {
    const one = new BlockList();
    one.addSubnet(net, bits, isIPv6(net) ? "ipv6" : "ipv4");
    reasons.push([one, why]);
    deny.addSubnet(net, bits, isIPv6(net) ? "ipv6" : "ipv4");
  }
  const allowed = new BlockList();
  for (const cidr of options.allowCidrs ?? []) addCidr(allowed, cidr);
  // A BlockList compares addresses, not spellings (`2001:db8:0::1` is `2001:db8::1`).
  const own = new BlockList();
  for (const a of options.ownAddresses ?? []) own.addAddress(a, isIPv6(a) ? "ipv6" : "ipv4");

  function check(ip: string): AddressVerdict {
    const family = isIPv4(ip) ? "ipv4" : isIPv6(ip) ? "ipv6" : null;
    if (!family) return { allowed: false, reason: "not an IP address" };
    if (own.check(ip, family)) return { allowed: false, reason: "the proxy's own address" };
    if (family === "ipv6") {
      const inner = embeddedIpv4(ip);
      if (inner) {
        const verdict = check(inner);
        return verdict.allowed ? verdict : { allowed: false, reason: `embeds ${inner}: ${verdict.reason}` };
      }
    }
    if (allowed.check(ip, family)) return { allowed: true };
    if (deny.check(ip, family)) {
      const why = reasons.find(([list]) => list.check(ip, family))?.[1] ?? "special-purpose range";
      return { allowed: false, reason: why };
    }
    return { allowed: true };
  }
  return { check };
}
