import { BlockList, isIPv4, isIPv6 } from "node:net";
import { embeddedIpv4, NON_PUBLIC_V4, NON_PUBLIC_V6 } from "@benchwright/shared/policy/addresses";

// Which resolved addresses the proxy, and the user's egress agent, may connect to (case A12).
// Checked on the address actually dialled, after resolution, so neither a hostname nor a spelling
// of an IP can smuggle a connection into private space, the metadata service or the proxy itself.
// The ranges are the platform's one table (shared/policy/addresses.ts), shared with the firewalls
// of the backends. In shared/node/ because it needs node:net (BlockList): the Worker never
// imports it, and its typecheck does not include this folder.

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

export function createAddressPolicy(options: AddressPolicyOptions = {}) {
  const deny = new BlockList();
  const reasons: Array<[BlockList, string]> = [];
  for (const { cidr, why } of [...NON_PUBLIC_V4, ...NON_PUBLIC_V6]) {
    const one = new BlockList();
    addCidr(one, cidr);
    reasons.push([one, why]);
    addCidr(deny, cidr);
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
