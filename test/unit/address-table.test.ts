import { BlockList } from "node:net";
import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { addressKey, embeddedIpv4, NON_PUBLIC_V4, NON_PUBLIC_V6 } from "@benchwright/shared/policy/addresses";
import { describe, expect, it } from "vitest";
import { proxyRuleset } from "../../local-agent/network";
import { proxyNetworkPolicy, workNetworkPolicy } from "../../src/broker/kubernetes/manifests";

// One table of non-public destinations (shared/policy/addresses.ts) and its three consumers: the
// proxy's resolved-address check, the local agent's nftables and the Kubernetes NetworkPolicy.
// Each consumer's output must hold every entry, so a range added to the table reaches all three.

/** The first and last address of an IPv4 CIDR. */
function ends(cidr: string): [string, string] {
  const [net = "", bits = "32"] = cidr.split("/");
  const base = net.split(".").reduce((n, o) => n * 256 + Number(o), 0);
  const size = 2 ** (32 - Number(bits));
  const ip = (n: number) => [24, 16, 8, 0].map((s) => Math.floor(n / 2 ** s) % 256).join(".");
  return [ip(base), ip(base + size - 1)];
}

describe("the non-public address table", () => {
  it("holds 198.18.0.0/15 and Azure's wire server, and no two IPv4 entries overlap", () => {
    const cidrs = NON_PUBLIC_V4.map((r) => r.cidr);
    expect(cidrs).toContain("198.18.0.0/15");
    expect(cidrs).toContain("168.63.129.16/32");
    // nftables refuses a set whose intervals overlap: the table must not have any.
    for (const [i, a] of NON_PUBLIC_V4.entries()) {
      const list = new BlockList();
      const [net, bits] = a.cidr.split("/");
      list.addSubnet(net as string, Number(bits), "ipv4");
      for (const b of NON_PUBLIC_V4.slice(i + 1)) {
        for (const end of ends(b.cidr)) expect(list.check(end, "ipv4"), `${a.cidr} / ${b.cidr}`).toBe(false);
      }
    }
  });

  it("the proxy denies the first and last address of every entry, giving the entry's reason", () => {
    const policy = createAddressPolicy();
    for (const { cidr, why } of NON_PUBLIC_V4) {
      for (const ip of ends(cidr))
        expect(policy.check(ip), `${ip} (${cidr})`).toEqual({ allowed: false, reason: why });
    }
    for (const { cidr, why } of NON_PUBLIC_V6) {
      const ip = cidr.split("/")[0] as string;
      const verdict = policy.check(ip);
      expect(verdict.allowed, ip).toBe(false);
      // `::` and `::1` read as IPv4-compatible addresses first (0.0.0.0/8): denied either way.
      if (!verdict.allowed)
        expect(verdict.reason).toMatch(ip === "::" || ip === "::1" ? /this network/ : why);
    }
    expect(policy.check("168.63.129.16")).toEqual({
      allowed: false,
      reason: "Azure wire server (cloud metadata)",
    });
    expect(policy.check("168.63.129.17")).toEqual({ allowed: true });
  });

  it("the local agent's nftables refuse every entry to direct traffic", () => {
    const rules = proxyRuleset(3, [{ i: 0, routing: "default" }]);
    const line = rules.split("\n").find((l) => l.includes("ip daddr { 0.0.0.0/8"));
    expect(line).toBeDefined();
    const set = /ip daddr \{ ([^}]*) \} reject/.exec(line ?? "")?.[1]?.split(", ");
    expect(set).toEqual(NON_PUBLIC_V4.map((r) => r.cidr));
  });

  it("the Kubernetes NetworkPolicies except every entry from the public internet", () => {
    const excepts = (policy: { spec: { egress: unknown[] } }) =>
      policy.spec.egress.flatMap((rule) =>
        ((rule as { to?: Array<{ ipBlock?: { except: string[] } }> }).to ?? []).flatMap((to) =>
          to.ipBlock ? [to.ipBlock.except] : [],
        ),
      );
    const proxy = excepts(proxyNetworkPolicy("ns", "run_1", "sbx_1"));
    const work = excepts(
      workNetworkPolicy({ ns: "ns", runId: "run_1", sandboxId: "sbx_2", kind: "work", routing: "default" }),
    );
    for (const found of [proxy, work]) {
      expect(found).toHaveLength(1);
      expect(found[0]).toEqual(NON_PUBLIC_V4.map((r) => r.cidr));
    }
  });
});

describe("case I5: one name per address", () => {
  it.each([
    ["93.184.216.34", "93.184.216.34"],
    ["::ffff:93.184.216.34", "93.184.216.34"],
    ["[::ffff:5db8:d822]", "93.184.216.34"],
    ["::93.184.216.34", "93.184.216.34"],
    ["64:ff9b::5db8:d822", "93.184.216.34"],
    ["64:FF9B:0:0:0:0:93.184.216.34", "93.184.216.34"],
    ["2002:5db8:d822::", "93.184.216.34"],
    ["2002:5db8:d822:1::7", "93.184.216.34"],
    ["2001:DB8:0::1", "2001:db8::1"],
    ["[2606:4700::1111]", "2606:4700::1111"],
    ["::1", "::1"],
    ["::", "::"],
  ])("%s is %s", (spelling, key) => {
    expect(addressKey(spelling)).toBe(key);
  });

  it.each(["example.com", "127.1", "0x7f.0.0.1", "1.2.3.4.5", "[::1", "::g", ""])(
    "%j is not an address",
    (s) => {
      expect(addressKey(s)).toBeNull();
    },
  );

  it("Teredo and ordinary IPv6 carry no IPv4 address", () => {
    expect(embeddedIpv4("2001:0:4136:e378:8000:63bf:3fff:fdd2")).toBeNull();
    expect(embeddedIpv4("2606:4700::1111")).toBeNull();
  });
});
