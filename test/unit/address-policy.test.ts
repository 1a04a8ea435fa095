import { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { describe, expect, it } from "vitest";

// Case A12: the resolved-address check, as a table (after smokescreen's classifyAddr tests).
// Pure: nothing here dials anything.

const policy = createAddressPolicy({ ownAddresses: ["198.51.100.7", "2606:4700:10::6816:1"] });

const DENIED: Array<[string, RegExp]> = [
  ["0.0.0.0", /this network/],
  ["0.1.2.3", /this network/],
  ["10.0.0.1", /private/],
  ["10.255.255.255", /private/],
  ["100.64.0.1", /carrier-grade NAT/],
  ["100.127.255.254", /carrier-grade NAT/],
  ["127.0.0.1", /loopback/],
  ["127.255.255.254", /loopback/],
  ["169.254.169.254", /link-local/],
  ["172.16.0.1", /private/],
  ["172.31.255.255", /private/],
  ["192.0.0.170", /IETF/],
  ["192.0.2.1", /documentation/],
  ["192.88.99.1", /6to4 relay/],
  ["192.168.0.1", /private/],
  ["198.18.0.1", /benchmarking/],
  ["198.51.100.1", /documentation/],
  ["203.0.113.9", /documentation/],
  ["224.0.0.1", /multicast/],
  ["239.255.255.250", /multicast/],
  ["240.0.0.1", /reserved/],
  ["255.255.255.255", /broadcast/],
  ["::", /./],
  ["::1", /./],
  ["0:0:0:0:0:0:0:1", /./],
  ["100::1", /discard/],
  ["2001::1", /Teredo/],
  ["2001:0:4136:e378:8000:63bf:3fff:fdd2", /Teredo/],
  ["2001:db8::1", /documentation/],
  ["fc00::1", /unique local/],
  ["fd00:ec2::254", /unique local/],
  ["fe80::1", /link-local/],
  ["FE80::1", /link-local/],
  ["fec0::1", /site-local/],
  ["ff02::1", /multicast/],
  // IPv4 embedded in IPv6: mapped, compatible, NAT64 (well-known and local-use), 6to4.
  ["::ffff:127.0.0.1", /embeds 127\.0\.0\.1: loopback/],
  ["::ffff:7f00:1", /embeds 127\.0\.0\.1: loopback/],
  ["::ffff:a9fe:a9fe", /embeds 169\.254\.169\.254/],
  ["::ffff:10.1.2.3", /embeds 10\.1\.2\.3: private/],
  ["::127.0.0.1", /embeds 127\.0\.0\.1/],
  ["64:ff9b::7f00:1", /embeds 127\.0\.0\.1: loopback/],
  ["64:ff9b::10.0.0.1", /embeds 10\.0\.0\.1: private/],
  ["64:ff9b:1::a9fe:a9fe", /embeds 169\.254\.169\.254/],
  ["2002:7f00:1::", /embeds 127\.0\.0\.1: loopback/],
  ["2002:a9fe:a9fe::1", /embeds 169\.254\.169\.254/],
  // The proxy's own addresses, however they are spelled.
  ["198.51.100.7", /own address/],
  ["2606:4700:10::6816:1", /own address/],
  ["2606:4700:10:0:0:0:6816:1", /own address/],
  ["2606:4700:10::6816:0001", /own address/],
  ["::ffff:198.51.100.7", /own address/],
  // Not addresses at all.
  ["localhost", /not an IP address/],
  ["127.1", /not an IP address/],
  ["", /not an IP address/],
];

const ALLOWED = [
  "1.1.1.1",
  "8.8.8.8",
  "93.184.216.34",
  "2606:4700::1111",
  "2a00:1450:4001::200e",
  "::ffff:8.8.8.8",
];

describe("case A12: createAddressPolicy", () => {
  for (const [ip, why] of DENIED) {
    it(`denies ${ip || "(empty)"}`, () => {
      const v = policy.check(ip);
      expect(v.allowed).toBe(false);
      if (!v.allowed) expect(v.reason).toMatch(why);
    });
  }

  for (const ip of ALLOWED) {
    it(`allows ${ip}`, () => {
      expect(policy.check(ip)).toEqual({ allowed: true });
    });
  }

  it("test hosts are allowed only through the explicit test-only setting, and only those", () => {
    const plain = createAddressPolicy();
    const tests = createAddressPolicy({ allowCidrs: ["127.0.0.2/31", "127.0.0.4/30"] });
    for (const ip of ["127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.7"]) {
      expect(plain.check(ip).allowed, ip).toBe(false);
      expect(tests.check(ip).allowed, ip).toBe(true);
    }
    for (const ip of ["127.0.0.1", "127.0.0.8", "127.0.1.2", "::1", "10.0.0.1", "169.254.169.254"]) {
      expect(tests.check(ip).allowed, ip).toBe(false);
    }
  });

  it("the proxy's own address is denied even inside the test allowance", () => {
    const p = createAddressPolicy({ allowCidrs: ["127.0.0.4/30"], ownAddresses: ["127.0.0.6"] });
    expect(p.check("127.0.0.5")).toEqual({ allowed: true });
    expect(p.check("127.0.0.6")).toEqual({ allowed: false, reason: "the proxy's own address" });
    expect(p.check("::ffff:127.0.0.6").allowed).toBe(false);
  });
});
