import {
  canonicalHost,
  isCanonicalPattern,
  isIpLiteral,
  parseHostPatternSyntax,
  splitHostPort,
} from "@benchwright/shared/contract/host-name";
import { hostMatches, parseHostPattern, patternCovers } from "@benchwright/shared/policy/host";
import { suffixEntryBelow } from "@benchwright/shared/policy/public-suffix";
import { STARTER_PACK_HOSTS } from "@benchwright/shared/policy/starter-pack";
import fc from "fast-check";
import { parse as parseDomain } from "tldts";
import { describe, expect, it } from "vitest";

describe("canonicalHost", () => {
  // case A11: every spelling of loopback gets one name, so a pattern for it cannot be dodged.
  it.each([
    ["127.0.0.1", "127.0.0.1"],
    ["127.1", "127.0.0.1"],
    ["0177.0.0.1", "127.0.0.1"],
    ["0x7f.1", "127.0.0.1"],
    ["0x7F.0.0.1", "127.0.0.1"],
    ["2130706433", "127.0.0.1"],
    ["127.0.0.1.", "127.0.0.1"],
    ["１２７.０.０.１", "127.0.0.1"],
    ["[::ffff:7f00:1]", "127.0.0.1"],
    ["[::FFFF:127.0.0.1]", "127.0.0.1"],
    ["[0:0:0:0:0:0:0:1]", "[::1]"],
    ["[0000::0001]", "[::1]"],
    ["[::1]:8080", "[::1]"],
  ])("case A11: %s canonicalises to the loopback form %s", (input, expected) => {
    expect(canonicalHost(input)).toBe(expected);
    expect(isIpLiteral(input)).toBe(true);
  });

  // case A11: a pattern for loopback matches every spelling of it.
  it.each(["127.1", "0177.0.0.1", "0x7f.1", "2130706433", "[::ffff:7f00:1]", "127.0.0.1:443"])(
    "case A11: pattern 127.0.0.1 matches %s",
    (input) => {
      expect(hostMatches("127.0.0.1", input)).toBe(true);
    },
  );
  it("case A11: pattern [::1] matches [0:0:0:0:0:0:0:1]", () => {
    expect(hostMatches("[::1]", "[0:0:0:0:0:0:0:1]")).toBe(true);
    expect(hostMatches("127.0.0.1", "[0:0:0:0:0:0:0:1]")).toBe(false);
  });

  // case A14: case, trailing dot, default port, IPv6 case, IDN.
  it.each([
    ["EXAMPLE.com", "example.com"],
    ["example.com.", "example.com"],
    ["Example.COM.:443", "example.com"],
    ["example.com:80", "example.com"],
    ["example.com:8443", "example.com"],
    ["[2001:DB8::A]", "[2001:db8::a]"],
    ["[2001:0db8:0000:0000:0000:0000:0000:000a]:443", "[2001:db8::a]"],
    ["2001:db8::a", "[2001:db8::a]"],
    ["bücher.example", "xn--bcher-kva.example"],
    ["BÜCHER.example.", "xn--bcher-kva.example"],
    ["xn--bcher-kva.example", "xn--bcher-kva.example"],
    ["a_b.example.com", "a_b.example.com"],
  ])("case A14: %s → %s", (input, expected) => {
    expect(canonicalHost(input)).toBe(expected);
  });

  it.each([
    "",
    " ",
    "a b.com",
    " example.com",
    "example.com\u0000.evil",
    "example.com\r\nX: y",
    "example.com\n",
    "user@example.com",
    "user:pass@example.com",
    "example.com/path",
    "example.com\\path",
    "example.com?q",
    "example.com#f",
    "ex%41mple.com",
    "http://example.com",
    "a..b.com",
    ".example.com",
    "example.com..",
    ".",
    `${"a".repeat(64)}.com`,
    `${"a.".repeat(126)}ab`,
    "example.com:",
    "example.com:0",
    "example.com:65536",
    "example.com:+443",
    "example.com:443:443",
    "[::1",
    "::1]",
    "[::1]x",
    "[::1]:",
    "[fe80::1%25eth0]",
    "[example.com]",
    "1.2.3.4.5",
    "256.0.0.1",
    "example.123",
    "*.example.com",
    "xn--zz.com",
    "exa\u2028mple.com",
    "exa\u00a0mple.com",
  ])("refuses %j", (input) => {
    expect(canonicalHost(input)).toBeNull();
    expect(splitHostPort(input)).toBeNull();
  });

  it("accepts a 253-character name and refuses 254", () => {
    const name253 = `${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(61)}`;
    expect(name253).toHaveLength(253);
    expect(canonicalHost(name253)).toBe(name253);
    expect(canonicalHost(`${name253}.`)).toBe(name253);
    expect(canonicalHost(`e${name253}`)).toBeNull();
  });

  it("is idempotent", () => {
    const label = fc.stringMatching(/^[a-zA-Z0-9_-]{1,10}$/);
    const name = fc.array(label, { minLength: 1, maxLength: 5 }).map((l) => l.join("."));
    const anyHost = fc.oneof(
      name,
      fc.string(),
      fc.ipV4(),
      fc.ipV4Extended(),
      fc.ipV6().map((a) => `[${a}]`),
    );
    fc.assert(
      fc.property(anyHost, (input) => {
        const once = canonicalHost(input);
        if (once !== null) expect(canonicalHost(once)).toBe(once);
      }),
    );
  });
});

describe("splitHostPort", () => {
  it.each([
    ["example.com", { host: "example.com", port: null }],
    ["Example.com:443", { host: "example.com", port: 443 }],
    ["example.com:8080", { host: "example.com", port: 8080 }],
    ["[::1]:8080", { host: "[::1]", port: 8080 }],
    ["[::1]", { host: "[::1]", port: null }],
    ["::1", { host: "[::1]", port: null }],
    ["127.1:65535", { host: "127.0.0.1", port: 65535 }],
  ])("%s", (input, expected) => {
    expect(splitHostPort(input)).toEqual(expected);
  });
});

describe("parseHostPattern", () => {
  // case A14: a saved pattern is canonical in the same way as a request's host.
  it.each([
    ["api.example.com", "api.example.com"],
    ["API.Example.COM", "api.example.com"],
    ["api.example.com.", "api.example.com"],
    ["api.example.com:443", "api.example.com"],
    ["api.example.com:80", "api.example.com"],
    ["*.Example.com.", "*.example.com"],
    ["*.example.com:443", "*.example.com"],
    ["xn--bcher-kva.example", "xn--bcher-kva.example"],
    ["XN--BCHER-KVA.example", "xn--bcher-kva.example"],
    ["127.0.0.1", "127.0.0.1"],
    ["[2001:DB8::A]", "[2001:db8::a]"],
    ["[2001:db8:0:0:0:0:0:a]:443", "[2001:db8::a]"],
    ["2001:db8::a", "[2001:db8::a]"],
    ["[::ffff:10.0.0.1]", "10.0.0.1"],
    ["localhost", "localhost"],
    ["*.internal.example", "*.internal.example"],
    ["*.example.co.uk", "*.example.co.uk"],
    ["a-b.example.com", "a-b.example.com"],
    ["123.example.com", "123.example.com"],
  ])("case A14: accepts %s as %s", (input, expected) => {
    expect(parseHostPattern(input, "rule")).toEqual({ ok: true, pattern: expected });
    expect(parseHostPattern(input, "host-entry")).toEqual({ ok: true, pattern: expected });
    expect(isCanonicalPattern(expected)).toBe(true);
  });

  // case A14: a non-punycode pattern is refused, and the message says what to write.
  it.each([
    ["bücher.example", "use xn--bcher-kva.example"],
    ["*.bücher.example", "use *.xn--bcher-kva.example"],
    ["Bücher.Example.", "use xn--bcher-kva.example"],
    ["例え.jp", "use xn--r8jz45g.jp"],
  ])("case A14: refuses non-ASCII %s (%s)", (input, hint) => {
    const result = parseHostPattern(input, "host-entry");
    expect(result.ok).toBe(false);
    if (!result.ok) {
      expect(result.message).toContain("punycode");
      expect(result.message).toContain(hint);
    }
  });

  // case A16: each refusal is specific about what is wrong.
  it.each<[string, RegExp]>([
    ["*", /lone \* would match every host/],
    ["*.com", /top-level domain com/],
    ["*.com.", /top-level domain com/],
    ["*.co.uk", /co\.uk is a public suffix/],
    ["*example.com", /whole label.*write \*\.example\.com/],
    ["**.example.com", /whole label/],
    ["api*.example.com", /whole label/],
    ["api.*.example.com", /leftmost label/],
    ["example.*", /top-level domain \(as in example\.\*\)/],
    ["*.*.example.com", /only one wildcard/],
    ["*.127.0.0.1", /wildcard cannot be applied to an IP address/],
    ["*.[::1]", /wildcard cannot be applied to an IP address/],
    ["0x7f.1", /plain dotted decimal: use 127\.0\.0\.1/],
    ["010.0.0.1", /plain dotted decimal: use 8\.0\.0\.1/],
    ["256.1.1.1", /not a valid IPv4 address/],
    ["example.123", /not a valid IPv4 address/],
    ["", /empty/],
    ["a..example.com", /empty label/],
    [".example.com", /empty label/],
    ["example.com..", /empty label/],
    [`${"a".repeat(64)}.com`, /64 characters long; the limit is 63/],
    [`${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(62)}`, /254 characters long/],
    ["-api.example.com", /starts or ends with a hyphen/],
    ["api-.example.com", /starts or ends with a hyphen/],
    ["my_api.example.com", /underscore/],
    ["api.example.com:8080", /ports are not part of a host pattern/],
    ["[::1]:8080", /ports are not part of a host pattern/],
    ["api.example.com:", /ports are not part of a host pattern/],
    ["api .example.com", /whitespace/],
    [" api.example.com", /whitespace/],
    ["api.example.com\u0000.evil", /control character \(U\+0000\)/],
    ["api.example.com\r\n", /control character \(U\+000D\)/],
    ["https://api.example.com", /without the scheme https:\/\/: use api\.example\.com/],
    ["https://api.example.com/v1", /without the scheme https:\/\/: use api\.example\.com/],
    ["api.example.com/v1", /paths.*not part of a host pattern: use api\.example\.com/],
    ["api.example.com?x=1", /not part of a host pattern/],
    ["user@api.example.com", /user names are not part/],
    ["api.ex%61mple.com", /percent-escapes/],
    ["api!.example.com", /contains "!"/],
    ["xn--zz.example.com", /xn--zz is not valid punycode/],
    ["[::1", /brackets/],
    ["[not-ipv6]", /not a valid IPv6 address/],
  ])("case A16: refuses %j", (input, message) => {
    const result = parseHostPattern(input, "host-entry");
    expect(result.ok).toBe(false);
    if (!result.ok) expect(result.message).toMatch(message);
    expect(parseHostPattern(input, "rule").ok).toBe(false);
  });

  // case A16: a shared (private-section) suffix is fine to block, not to send a credential to.
  it.each(["*.github.io", "*.herokuapp.com", "*.s3.amazonaws.com", "*.blogspot.com"])(
    "case A16: %s is refused for a rule, accepted for a host entry",
    (input) => {
      const rule = parseHostPattern(input, "rule");
      expect(rule.ok).toBe(false);
      if (!rule.ok) expect(rule.message).toMatch(/shared domain.*every tenant/);
      expect(parseHostPattern(input, "host-entry")).toEqual({ ok: true, pattern: input });
    },
  );

  it("case A16: an exact host on a shared domain is fine for a rule", () => {
    expect(parseHostPattern("me.github.io", "rule")).toEqual({ ok: true, pattern: "me.github.io" });
  });

  it("is idempotent on what it accepts", () => {
    const label = fc.stringMatching(/^[a-zA-Z0-9-]{1,8}$/);
    const input = fc
      .tuple(fc.boolean(), fc.array(label, { minLength: 1, maxLength: 4 }), fc.constantFrom("", ".", ":443"))
      .map(([wild, labels, tail]) => `${wild ? "*." : ""}${labels.join(".")}${tail}`);
    fc.assert(
      fc.property(input, (raw) => {
        const first = parseHostPattern(raw, "host-entry");
        if (!first.ok) return;
        expect(parseHostPattern(first.pattern, "host-entry")).toEqual(first);
        expect(isCanonicalPattern(first.pattern)).toBe(true);
      }),
    );
  });
});

describe("isCanonicalPattern", () => {
  // Its fast path must accept nothing that the full grammar check would not.
  it("agrees with parseHostPatternSyntax", () => {
    const slow = (p: string) => {
      const parsed = parseHostPatternSyntax(p);
      return parsed.ok && parsed.pattern === p;
    };
    const piece = fc.constantFrom(
      "a",
      "z",
      "0",
      "9",
      "-",
      ".",
      "*",
      "*.",
      "xn--",
      "0x",
      "_",
      "A",
      ":443",
      "[",
      "]",
    );
    const longLabel = fc.integer({ min: 60, max: 66 }).map((n) => "a".repeat(n));
    const candidate = fc
      .array(fc.oneof(piece, longLabel), { minLength: 1, maxLength: 12 })
      .map((p) => p.join(""));
    fc.assert(
      fc.property(candidate, (p) => {
        expect(isCanonicalPattern(p)).toBe(slow(p));
      }),
      { numRuns: 5000 },
    );
    for (const p of ["*.com", "a.example", "*.a-b.example", "1.2.3.4", "[::1]", "xn--bcher-kva.example"]) {
      expect(isCanonicalPattern(p)).toBe(true);
    }
    for (const p of ["*", "A.example", "a.example.", "*.1.2.3.4", "0x7f.1", "xn--zz.example", "a..b"]) {
      expect(isCanonicalPattern(p)).toBe(false);
    }
  });
});

describe("hostMatches", () => {
  // case A15
  it.each<[string, string, boolean]>([
    ["*.example.com", "a.example.com", true],
    ["*.example.com", "a.b.example.com", true],
    ["*.example.com", "A.Example.COM.", true],
    ["*.example.com", "a.example.com:443", true],
    ["*.example.com", "example.com", false],
    ["*.example.com", "evil-example.com", false],
    ["*.example.com", "example.com.evil.net", false],
    ["*.example.com", "aexample.com", false],
    ["*.example.com", ".example.com", false],
    ["*.example.com", "a..example.com", false],
    ["*.example.com", "a.example.com/", false],
    ["*.example.com", "a.example.com\u0000.evil.net", false],
    ["example.com", "example.com", true],
    ["example.com", "EXAMPLE.COM.", true],
    ["example.com", "a.example.com", false],
    ["example.com", "example.co", false],
    ["*.0.1", "127.0.0.1", false],
    ["xn--bcher-kva.example", "bücher.example", true],
  ])("case A15: %s vs %s → %s", (pattern, host, expected) => {
    expect(hostMatches(pattern, host)).toBe(expected);
  });

  // case A15: property test against a reference matcher that works on label arrays.
  it("case A15: agrees with a label-by-label reference matcher", () => {
    const reference = (pattern: string, host: string): boolean => {
      const p = pattern.split(".");
      const h = host.split(".");
      if (p[0] !== "*") return p.length === h.length && p.every((l, i) => l === h[i]);
      const rest = p.slice(1);
      if (h.length < rest.length + 1) return false;
      const tail = h.slice(h.length - rest.length);
      return rest.every((l, i) => l === tail[i]);
    };
    // A small alphabet so that near-misses (evil-example, example.com.evil) come up often.
    const label = fc.constantFrom("a", "b", "example", "evil-example", "com", "evil", "net", "xn--bcher-kva");
    const host = fc.array(label, { minLength: 1, maxLength: 5 }).map((l) => l.join("."));
    const pattern = fc
      .tuple(fc.boolean(), fc.array(label, { minLength: 1, maxLength: 4 }))
      .map(([wild, l]) => {
        return `${wild ? "*." : ""}${l.join(".")}`;
      });
    fc.assert(
      fc.property(pattern, host, fc.boolean(), (p, h, dressed) => {
        // Dressing the host (case, trailing dot, default port) must not change the answer.
        const input = dressed ? `${h.toUpperCase()}.:443` : h;
        expect(hostMatches(p, input)).toBe(reference(p, h));
      }),
      { numRuns: 2000 },
    );
  });
});

describe("patternCovers", () => {
  it.each<[string, string, boolean]>([
    ["*.a.com", "b.a.com", true],
    ["*.a.com", "*.b.a.com", true],
    ["*.a.com", "*.a.com", true],
    ["*.a.com", "a.com", false],
    ["*.a.com", "*.ba.com", false],
    ["*.b.a.com", "*.a.com", false],
    ["*.b.a.com", "c.a.com", false],
    ["a.com", "a.com", true],
    ["a.com", "*.a.com", false],
    ["b.a.com", "a.com", false],
    ["127.0.0.1", "127.0.0.1", true],
  ])("%s covers %s → %s", (outer, inner, expected) => {
    expect(patternCovers(outer, inner)).toBe(expected);
  });

  it("agrees with hostMatches over sample hosts", () => {
    const label = fc.constantFrom("a", "b", "c");
    const name = fc.array(label, { minLength: 1, maxLength: 4 }).map((l) => l.join("."));
    const pattern = fc.tuple(fc.boolean(), name).map(([w, n]) => (w ? `*.${n}` : n));
    fc.assert(
      fc.property(pattern, pattern, fc.array(name, { maxLength: 20 }), (outer, inner, hosts) => {
        if (!patternCovers(outer, inner)) return;
        for (const h of hosts) {
          if (hostMatches(inner, h)) expect(hostMatches(outer, h)).toBe(true);
        }
        // A wildcard's sample hosts, to exercise the wildcard-inside-wildcard case.
        const sample = inner.startsWith("*.") ? `z.${inner.slice(2)}` : inner;
        expect(hostMatches(outer, sample)).toBe(true);
      }),
    );
  });
});

describe("starter pack", () => {
  it("holds only exact hosts that pass as host entries, each once", () => {
    expect(new Set(STARTER_PACK_HOSTS).size).toBe(STARTER_PACK_HOSTS.length);
    for (const host of STARTER_PACK_HOSTS) {
      expect(parseHostPattern(host, "host-entry")).toEqual({ ok: true, pattern: host });
      expect(host.startsWith("*")).toBe(false);
      expect(isIpLiteral(host)).toBe(false);
    }
    expect(STARTER_PACK_HOSTS).toContain("registry.npmjs.org");
    expect(STARTER_PACK_HOSTS).toContain("files.pythonhosted.org");
  });
});

describe("case I8: a wildcard rule over a domain with public-suffix entries below it", () => {
  it.each([
    ["*.amazonaws.com", "amazonaws.com"],
    ["*.windows.net", "windows.net"],
    ["*.core.windows.net", "core.windows.net"],
  ])("case I8: %s is refused for a rule, accepted for a host entry", (input, rest) => {
    const rule = parseHostPattern(input, "rule");
    expect(rule.ok).toBe(false);
    if (!rule.ok) {
      expect(rule.message).toContain(`the public suffix list has entries under ${rest} (e.g. `);
      expect(rule.message).toContain("name the exact host");
    }
    expect(parseHostPattern(input, "host-entry")).toEqual({ ok: true, pattern: input });
  });

  it("case I8: execute-api.<region>.amazonaws.com is a private-section entry that *.amazonaws.com covers", () => {
    const host = "mine.execute-api.us-east-1.amazonaws.com";
    const parsed = parseDomain(host, { allowPrivateDomains: true });
    expect(parsed.publicSuffix).toBe("execute-api.us-east-1.amazonaws.com");
    expect(parsed.isPrivate).toBe(true);
    expect(hostMatches("*.amazonaws.com", host)).toBe(true);
  });

  it("case I8: the entry found lies strictly below the domain and is on the list", () => {
    for (const domain of ["amazonaws.com", "us-east-1.amazonaws.com", "core.windows.net", "co.uk", "com"]) {
      const entry = suffixEntryBelow(domain);
      expect(entry, domain).not.toBeNull();
      expect(entry?.endsWith(`.${domain}`), `${entry}`).toBe(true);
      // A name under the entry has the entry (a `*` label stands for any one label) as its suffix.
      const name = `x.${(entry ?? "").replace(/^\*\./, "y.")}`;
      expect(parseDomain(name, { allowPrivateDomains: true }).publicSuffix, name).toBe(
        (entry ?? "").replace(/^\*\./, "y."),
      );
    }
  });

  it.each(["*.example.com", "*.api.example.com", "*.openai.com", "*.internal.example"])(
    "case I8: %s has no entry below it and stays a valid rule",
    (input) => {
      expect(suffixEntryBelow(input.slice(2))).toBeNull();
      expect(parseHostPattern(input, "rule")).toEqual({ ok: true, pattern: input });
    },
  );
});
