import { buildPolicyIndex, compilePolicy, type VaultSnapshot } from "@benchwright/shared/policy/compile";
import { describe, expect, it } from "vitest";

// PolicyIndex.decide is decideHost, then matchRule unless blocked, in one walk: the proxy's one
// question per request. Asked of a vault whose entries overlap every way they can (exact and
// wildcard host entries and rules on the same names, block and allow nested, IP literals), it must
// answer exactly as the two lookups it stands for.

const vault: VaultSnapshot = {
  version: 1,
  default: "allow",
  hosts: [
    { pattern: "api.example.com", action: "allow" },
    { pattern: "*.example.com", action: "block" },
    { pattern: "*.deep.example.com", action: "allow", via: "tunnel" },
    { pattern: "bad.deep.example.com", action: "block" },
    { pattern: "*.ok.test", action: "allow" },
    { pattern: "127.0.0.9", action: "block" },
    { pattern: "[2001:db8::1]", action: "block" },
  ],
  rules: [
    { host: "*.deep.example.com", secret: "A", inject: { scheme: "bearer", name: "authorization" } },
    { host: "x.deep.example.com", secret: "B", inject: { scheme: "bearer", name: "authorization" } },
    { host: "api.example.com", secret: "C", inject: { scheme: "raw", name: "x-key" } },
    { host: "*.ok.test", secret: "D", inject: { scheme: "raw", name: "x-key" } },
    { host: "plain.test", secret: "E", inject: { scheme: "raw", name: "x-key" } },
    { host: "*.a.ok.test", secret: "F", inject: { scheme: "raw", name: "x-key" } },
  ],
};

const hosts = [
  "api.example.com",
  "API.Example.COM",
  "api.example.com.",
  "other.example.com",
  "example.com",
  "x.deep.example.com",
  "y.x.deep.example.com",
  "deep.example.com",
  "bad.deep.example.com",
  "a.ok.test",
  "b.a.ok.test",
  "ok.test",
  "plain.test",
  "elsewhere.test",
  "127.0.0.9",
  "0x7f.0.0.9",
  "[::ffff:127.0.0.9]",
  "[2001:db8:0::1]",
  "127.0.0.1",
  "bücher.example.com",
  "xn--bcher-kva.ok.test",
  "bad host",
  "",
];

describe("PolicyIndex.decide", () => {
  for (const egress of ["direct", "local"] as const) {
    it(`answers as decideHost then matchRule (egress ${egress})`, () => {
      const index = buildPolicyIndex(compilePolicy(vault, { egress }));
      for (const host of hosts) {
        const decision = index.decideHost(host);
        const rule = decision.action === "block" ? null : index.matchRule(host);
        expect(index.decide(host), host).toEqual({ host: decision, rule });
      }
    });
  }
});
