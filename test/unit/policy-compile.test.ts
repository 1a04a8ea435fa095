import { canonicalHost } from "@benchwright/shared/contract/host-name";
import { type HostAction, InjectSpec, PolicyDocument } from "@benchwright/shared/contract/policy";
import {
  buildPolicyIndex,
  compilePolicy,
  refusedRule,
  type VaultSnapshot,
} from "@benchwright/shared/policy/compile";
import { hostMatches } from "@benchwright/shared/policy/host";
import fc from "fast-check";
import { describe, expect, it } from "vitest";

const bearer = { scheme: "bearer", name: "authorization" } as const;

function vault(partial: Partial<VaultSnapshot>): VaultSnapshot {
  return { version: 1, default: "allow", hosts: [], rules: [], ...partial };
}

const rule = (host: string, secret = "KEY") => ({ host, secret, inject: bearer });

describe("compilePolicy: routing", () => {
  it("an exact rule and an exact block entry need only the hosts file", () => {
    const doc = compilePolicy(
      vault({ hosts: [{ pattern: "evil.example", action: "block" }], rules: [rule("api.example.com")] }),
    );
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
    expect(doc.enforce).toBe(true);
    expect(doc.note).toBeNull();
  });

  it.each<[string, Partial<VaultSnapshot>, "direct" | "local", string[]]>([
    ["block default", { default: "block" }, "direct", ["block_default"]],
    [
      "wildcard block entry",
      { hosts: [{ pattern: "*.evil.example", action: "block" }] },
      "direct",
      ["wildcard_block"],
    ],
    ["wildcard rule", { rules: [rule("*.internal.example")] }, "direct", ["wildcard_rule"]],
    [
      "IP literal block entry",
      { hosts: [{ pattern: "10.1.2.3", action: "block" }] },
      "direct",
      ["ip_literal"],
    ],
    ["IPv6 literal rule", { rules: [rule("[2001:db8::1]")] }, "direct", ["ip_literal"]],
    ["local egress", {}, "local", ["local_egress"]],
    [
      "all of them, in the fixed order",
      {
        default: "block",
        hosts: [
          { pattern: "*.evil.example", action: "block" },
          { pattern: "10.1.2.3", action: "block" },
        ],
        rules: [rule("*.internal.example")],
      },
      "local",
      ["block_default", "wildcard_block", "wildcard_rule", "ip_literal", "local_egress"],
    ],
  ])("%s → catch-all", (_name, partial, egress, reasons) => {
    const doc = compilePolicy(vault(partial), { egress });
    expect(doc.routing).toEqual({ mode: "catch-all", reasons });
    expect(doc.hostsFile).toEqual([]);
    expect(doc.enforce).toBe(true);
    expect(doc.note).toBeNull();
  });

  it("wildcard and IP allow entries alone do not switch on catch-all", () => {
    const doc = compilePolicy(
      vault({
        hosts: [
          { pattern: "*.ok.example", action: "allow" },
          { pattern: "10.1.2.3", action: "allow" },
        ],
        rules: [rule("api.example.com")],
      }),
    );
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
  });
});

describe("compilePolicy: nothing to enforce", () => {
  it("an empty vault with an allow default runs without a proxy, and says so", () => {
    const doc = compilePolicy(vault({ hosts: [{ pattern: "pypi.org", action: "allow" }] }));
    expect(doc.enforce).toBe(false);
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
    expect(doc.note).toMatch(/without a proxy.*nothing to do/);
    expect(doc.hostsFile).toEqual([]);
  });

  it.each<[string, Partial<VaultSnapshot>]>([
    ["a rule", { rules: [rule("api.example.com")] }],
    ["a block entry", { hosts: [{ pattern: "evil.example", action: "block" }] }],
    ["a block default", { default: "block" }],
  ])("%s gives the proxy something to do", (_name, partial) => {
    const doc = compilePolicy(vault(partial));
    expect(doc.enforce).toBe(true);
    expect(doc.note).toBeNull();
  });

  it("local egress needs the proxy even for an empty vault", () => {
    const doc = compilePolicy(vault({}), { egress: "local" });
    expect(doc.enforce).toBe(true);
    expect(doc.note).toBeNull();
  });
});

describe("compilePolicy: document", () => {
  it("hostsFile holds the sorted unique exact hosts of rules and block entries", () => {
    const doc = compilePolicy(
      vault({
        hosts: [
          { pattern: "z-evil.example", action: "block" },
          { pattern: "api.example.com", action: "allow" },
          { pattern: "pypi.org", action: "allow" },
          { pattern: "a-evil.example", action: "block" },
        ],
        rules: [rule("api.example.com", "A"), rule("b.example.com", "B"), rule("api.example.com", "C")],
      }),
    );
    expect(doc.hostsFile).toEqual(["a-evil.example", "api.example.com", "b.example.com", "z-evil.example"]);
  });

  it("numbers rules by position and carries names, never values", () => {
    const doc = compilePolicy(
      vault({
        version: 7,
        rules: [
          rule("a.example.com", "FIRST"),
          { host: "b.example.com", secret: "SECOND", inject: { scheme: "query", name: "api_key" } },
        ],
      }),
    );
    expect(doc.version).toBe(7);
    expect(doc.schema).toBe(1);
    expect(doc.rules.map((r) => [r.index, r.host, r.secret])).toEqual([
      [0, "a.example.com", "FIRST"],
      [1, "b.example.com", "SECOND"],
    ]);
    expect(PolicyDocument.parse(JSON.parse(JSON.stringify(doc)))).toEqual(doc);
  });

  it("throws on a snapshot whose pattern is not canonical", () => {
    expect(() => compilePolicy(vault({ rules: [rule("API.example.com")] }))).toThrow();
    expect(() => compilePolicy(vault({ hosts: [{ pattern: "*", action: "block" }] }))).toThrow();
  });
});

describe("PolicyDocument schema", () => {
  const good = () =>
    JSON.parse(
      JSON.stringify(
        compilePolicy(
          vault({ hosts: [{ pattern: "evil.example", action: "block" }], rules: [rule("api.example.com")] }),
        ),
      ),
    );

  it("accepts a compiled document", () => {
    expect(PolicyDocument.safeParse(good()).success).toBe(true);
  });

  // case E4 (input side): a malformed document does not parse, so the proxy denies everything.
  // biome-ignore lint/suspicious/noExplicitAny: the test mutates the parsed JSON freely
  type Json = any;
  it.each<[string, (d: Json) => void]>([
    [
      "unknown top-level field",
      (d) => {
        d.extra = true;
      },
    ],
    [
      "unknown field in a host entry",
      (d) => {
        d.hosts[0].comment = "x";
      },
    ],
    [
      "unknown field in a rule",
      (d) => {
        d.rules[0].value = "sk-secret";
      },
    ],
    [
      "unknown field in inject",
      (d) => {
        d.rules[0].inject.value = "sk-secret";
      },
    ],
    [
      "unknown field in routing",
      (d) => {
        d.routing.extra = 1;
      },
    ],
    [
      "unknown host action",
      (d) => {
        d.hosts[0].action = "deny";
      },
    ],
    [
      "unknown default action",
      (d) => {
        d.default = "allow-all";
      },
    ],
    [
      "unknown routing reason",
      (d) => {
        d.routing.reasons = ["because"];
      },
    ],
    [
      "unknown inject scheme",
      (d) => {
        d.rules[0].inject.scheme = "cookie";
      },
    ],
    [
      "another schema version",
      (d) => {
        d.schema = 2;
      },
    ],
    [
      "missing hosts",
      (d) => {
        delete d.hosts;
      },
    ],
    [
      "negative version",
      (d) => {
        d.version = -1;
      },
    ],
    [
      "rule index not its position",
      (d) => {
        d.rules[0].index = 3;
      },
    ],
    [
      "non-canonical pattern",
      (d) => {
        d.hosts[0].pattern = "EVIL.example";
      },
    ],
    [
      "lone wildcard pattern",
      (d) => {
        d.hosts[0].pattern = "*";
      },
    ],
    [
      "routing that does not follow from the entries",
      (d) => {
        d.default = "block";
      },
    ],
    [
      "catch-all claimed without reason",
      (d) => {
        d.routing.mode = "catch-all";
      },
    ],
    [
      "enforce off while entries exist",
      (d) => {
        d.enforce = false;
      },
    ],
    [
      "hosts file missing a host",
      (d) => {
        d.hostsFile = ["api.example.com"];
      },
    ],
    [
      "hosts file with an extra host",
      (d) => {
        d.hostsFile.push("zzz.example");
      },
    ],
    [
      "reserved header as injection target",
      (d) => {
        d.rules[0].inject = { scheme: "raw", name: "Host" };
      },
    ],
  ])("case E4: rejects %s", (_name, mutate) => {
    const doc = good();
    mutate(doc);
    expect(PolicyDocument.safeParse(doc).success).toBe(false);
  });
});

describe("InjectSpec", () => {
  it.each([
    [{ scheme: "bearer" }, { scheme: "bearer", name: "authorization" }],
    [{ scheme: "basic" }, { scheme: "basic", name: "authorization" }],
    [
      { scheme: "bearer", name: "X-Auth" },
      { scheme: "bearer", name: "x-auth" },
    ],
    [
      { scheme: "raw", name: "X-Api-Key" },
      { scheme: "raw", name: "x-api-key" },
    ],
    [
      { scheme: "query", name: "API_key" },
      { scheme: "query", name: "API_key" },
    ],
  ])("accepts %j", (input, expected) => {
    expect(InjectSpec.parse(input)).toEqual(expected);
  });

  it.each([
    { scheme: "raw" },
    { scheme: "query" },
    { scheme: "raw", name: "" },
    { scheme: "raw", name: "x api" },
    { scheme: "raw", name: "x:api" },
    { scheme: "raw", name: "x-api\r\nevil: 1" },
    { scheme: "raw", name: "Content-Length" },
    { scheme: "raw", name: "transfer-encoding" },
    { scheme: "query", name: "a&b" },
    { scheme: "query", name: "a=b" },
    { scheme: "query", name: "a#b" },
    { scheme: "query", name: "a b" },
    { scheme: "query", name: "ключ" },
    { scheme: "bearer", name: "authorization", extra: 1 },
    { scheme: "digest", name: "authorization" },
  ])("rejects %j", (input) => {
    expect(InjectSpec.safeParse(input).success).toBe(false);
  });
});

describe("buildPolicyIndex", () => {
  it("an exact entry wins over a wildcard, the longest wildcard over a shorter one", () => {
    const index = buildPolicyIndex(
      compilePolicy(
        vault({
          default: "block",
          hosts: [
            { pattern: "*.example.com", action: "allow" },
            { pattern: "*.evil.example.com", action: "block" },
            { pattern: "ok.evil.example.com", action: "allow" },
            { pattern: "*.x.evil.example.com", action: "allow" },
          ],
        }),
      ),
    );
    expect(index.decideHost("a.example.com")).toEqual({
      action: "allow",
      pattern: "*.example.com",
      via: "direct",
    });
    expect(index.decideHost("a.evil.example.com")).toEqual({
      action: "block",
      pattern: "*.evil.example.com",
      via: "direct",
    });
    expect(index.decideHost("OK.evil.example.com.:443")).toEqual({
      action: "allow",
      pattern: "ok.evil.example.com",
      via: "direct",
    });
    expect(index.decideHost("a.ok.evil.example.com")).toEqual({
      action: "block",
      pattern: "*.evil.example.com",
      via: "direct",
    });
    expect(index.decideHost("b.x.evil.example.com")).toEqual({
      action: "allow",
      pattern: "*.x.evil.example.com",
      via: "direct",
    });
    expect(index.decideHost("example.com")).toEqual({ action: "block", pattern: null, via: "direct" });
    expect(index.decideHost("elsewhere.net")).toEqual({ action: "block", pattern: null, via: "direct" });
  });

  it("the default decides for unlisted hosts; an invalid host is blocked even under allow", () => {
    const index = buildPolicyIndex(
      compilePolicy(vault({ hosts: [{ pattern: "evil.example", action: "block" }] })),
    );
    expect(index.decideHost("fine.example")).toEqual({ action: "allow", pattern: null, via: "direct" });
    expect(index.decideHost("Evil.Example.")).toEqual({
      action: "block",
      pattern: "evil.example",
      via: "direct",
    });
    expect(index.decideHost("evil.example\u0000.ok")).toEqual({
      action: "block",
      pattern: null,
      via: "direct",
    });
    expect(index.decideHost("")).toEqual({ action: "block", pattern: null, via: "direct" });
  });

  it("case A11: a block on 127.0.0.1 holds for every spelling of it", () => {
    const index = buildPolicyIndex(
      compilePolicy(vault({ hosts: [{ pattern: "127.0.0.1", action: "block" }] })),
    );
    for (const spelling of ["127.1", "0177.0.0.1", "0x7f.1", "2130706433", "[::ffff:7f00:1]"]) {
      expect(index.decideHost(spelling)).toEqual({ action: "block", pattern: "127.0.0.1", via: "direct" });
    }
  });

  it("the first matching rule wins, whatever its kind", () => {
    const doc = compilePolicy(
      vault({
        rules: [
          rule("*.example.com", "WILD_FIRST"),
          rule("api.example.com", "EXACT_SECOND"),
          rule("other.net", "OTHER"),
          rule("*.b.other.net", "DEEP_WILD"),
          rule("*.other.net", "SHALLOW_WILD"),
          rule("other.net", "OTHER_DUPLICATE"),
        ],
      }),
    );
    const index = buildPolicyIndex(doc);
    expect(index.matchRule("api.example.com")?.rule.secret).toBe("WILD_FIRST");
    expect(index.matchRule("api.example.com")?.index).toBe(0);
    expect(index.matchRule("other.net")?.rule.secret).toBe("OTHER");
    expect(index.matchRule("a.b.other.net")?.rule.secret).toBe("DEEP_WILD");
    expect(index.matchRule("a.other.net")?.rule.secret).toBe("SHALLOW_WILD");
    expect(index.matchRule("example.com")).toBeNull();
    expect(index.matchRule("evil-example.com")).toBeNull();
    expect(index.matchRule("not a host")).toBeNull();
  });

  it("an exact rule before a wildcard rule wins for its host only", () => {
    const index = buildPolicyIndex(
      compilePolicy(vault({ rules: [rule("api.example.com", "EXACT"), rule("*.example.com", "WILD")] })),
    );
    expect(index.matchRule("api.example.com")?.rule.secret).toBe("EXACT");
    expect(index.matchRule("www.example.com")?.rule.secret).toBe("WILD");
  });

  it("handles 100,000 rules", () => {
    const rules = Array.from({ length: 100_000 }, (_, i) =>
      rule(i % 2 ? `h${i}.example.com` : `*.w${i}.example.com`),
    );
    const index = buildPolicyIndex(compilePolicy(vault({ rules })));
    expect(index.matchRule("h99999.example.com")?.index).toBe(99_999);
    expect(index.matchRule("a.b.w50000.example.com")?.index).toBe(50_000);
    expect(index.matchRule("h100000.example.com")).toBeNull();
  });

  // The index must agree with the obvious linear scan over the entries.
  it("agrees with a naive linear scan", () => {
    const label = fc.constantFrom("a", "b", "c", "example", "com");
    const name = fc.array(label, { minLength: 1, maxLength: 4 }).map((l) => l.join("."));
    const pattern = fc.tuple(fc.boolean(), name).map(([w, n]) => (w ? `*.${n}` : n));
    const action = fc.constantFrom<HostAction>("allow", "block");
    const snapshot = fc.record({
      default: action,
      hosts: fc.uniqueArray(fc.record({ pattern, action }), { selector: (h) => h.pattern, maxLength: 8 }),
      rules: fc.array(
        fc
          .record({ host: pattern, secret: fc.constantFrom("S1", "S2", "S3") })
          .map((r) => ({ ...r, inject: bearer })),
        { maxLength: 8 },
      ),
    });
    const naiveDecide = (v: VaultSnapshot, host: string) => {
      const exact = v.hosts.find((h) => h.pattern === host);
      if (exact) return { action: exact.action, pattern: exact.pattern, via: "direct" };
      const wild = v.hosts
        .filter((h) => h.pattern.startsWith("*.") && hostMatches(h.pattern, host))
        .sort((x, y) => y.pattern.length - x.pattern.length)[0];
      return wild
        ? { action: wild.action, pattern: wild.pattern, via: "direct" }
        : { action: v.default, pattern: null, via: "direct" };
    };
    const naiveRule = (v: VaultSnapshot, host: string) => {
      const index = v.rules.findIndex((r) => hostMatches(r.host, host));
      return index === -1 ? null : index;
    };
    fc.assert(
      fc.property(snapshot, fc.array(name, { minLength: 1, maxLength: 10 }), (partial, hosts) => {
        const v = vault(partial);
        const index = buildPolicyIndex(compilePolicy(v));
        for (const host of hosts) {
          expect(canonicalHost(host)).toBe(host);
          expect(index.decideHost(host)).toEqual(naiveDecide(v, host));
          expect(index.matchRule(host)?.index ?? null).toBe(naiveRule(v, host));
        }
      }),
      { numRuns: 1000 },
    );
  });
});

describe("case I8: a stored rule today's checks refuse is found before compiling", () => {
  it("case I8: a wildcard rule over amazonaws.com is named, with its position", () => {
    const rules = [
      { host: "api.example.com", secret: "A", inject: bearer },
      { host: "*.api.example.com", secret: "A", inject: bearer },
      { host: "*.amazonaws.com", secret: "B", inject: bearer },
    ];
    expect(refusedRule(rules)).toMatch(/^rule 3 \(\*\.amazonaws\.com\): the public suffix list has entries/);
    expect(refusedRule(rules.slice(0, 2))).toBeNull();
    expect(refusedRule([{ host: "*.github.io", secret: "A", inject: bearer }])).toMatch(/shared domain/);
  });
});
