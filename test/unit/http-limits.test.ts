import { limitVerdict, normalisePath, pathInside } from "@benchwright/shared/contract/http-limits";
import { PathLimit } from "@benchwright/shared/contract/policy";
import { deriveFields } from "@benchwright/shared/contract/policy-routing";
import { describe, expect, it } from "vitest";

// The method and path limits' own rules (cases N3, N4): the normalised form a path is compared
// in, what cannot be normalised, and how a limit matches. The proxy's tests (test/proxy/
// request-limits.test.ts) hold the same cases end to end.

const ok = (path: string) => ({ ok: true, path });
const refused = (raw: string) => expect(normalisePath(raw).ok, raw).toBe(false);

describe("normalisePath", () => {
  it("keeps a plain path, drops the query", () => {
    expect(normalisePath("/repos/a/b")).toEqual(ok("/repos/a/b"));
    expect(normalisePath("/repos/a?x=/../../admin")).toEqual(ok("/repos/a"));
    expect(normalisePath("/")).toEqual(ok("/"));
    expect(normalisePath("/repos/")).toEqual(ok("/repos/"));
  });

  it("resolves dot segments, encoded in any case (case N4)", () => {
    // case N4
    expect(normalisePath("/repos/%2e%2e/admin")).toEqual(ok("/admin"));
    expect(normalisePath("/repos/%2E%2E/admin")).toEqual(ok("/admin"));
    expect(normalisePath("/repos/.%2E/admin")).toEqual(ok("/admin"));
    expect(normalisePath("/repos/./a/./b")).toEqual(ok("/repos/a/b"));
    expect(normalisePath("/repos/a/..")).toEqual(ok("/repos/"));
    expect(normalisePath("/repos/a/.")).toEqual(ok("/repos/a/"));
  });

  it("collapses empty segments (case N4)", () => {
    // case N4
    expect(normalisePath("//repos//a///b")).toEqual(ok("/repos/a/b"));
    expect(normalisePath("/repos//")).toEqual(ok("/repos/"));
    expect(normalisePath("//")).toEqual(ok("/"));
  });

  it("cuts ;params from each segment, before dot segments (case N4)", () => {
    // case N4
    expect(normalisePath("/repos;v=1/a;b/c")).toEqual(ok("/repos/a/c"));
    expect(normalisePath("/repos/..;/admin")).toEqual(ok("/admin"));
    expect(normalisePath("/repos/%2e%2e;x=1/admin")).toEqual(ok("/admin"));
  });

  it("refuses what cannot be normalised safely (case N4)", () => {
    // case N4
    refused("/repos%2F..%2Fadmin");
    refused("/repos%2f..");
    refused("/repos%5C..%5Cadmin");
    refused("/repos%5c");
    refused("/repos\\..\\admin");
    refused("/repos/..%3B/admin");
    refused("/repos/%252e%252e/admin");
    refused("/repos/%00");
    refused("/repos/%0a");
    refused("/repos/%zz");
    refused("/repos/%2");
    refused("/repos/a#b");
    refused("/repos/a b");
    refused("/repos/\u0001");
    refused("/repos/é");
    refused("repos/a");
    refused("*");
  });

  it("refuses a .. that climbs above the root (case N4)", () => {
    // case N4
    refused("/..");
    refused("/../repos");
    refused("/repos/../../repos");
    refused("/%2e%2e/repos");
    refused("/..;/repos");
  });

  it("decodes safe escapes and keeps the rest encoded, uppercased", () => {
    expect(normalisePath("/%72epos/%41%7e")).toEqual(ok("/repos/A~"));
    expect(normalisePath("/a%20b/%c3%a9/%3f")).toEqual(ok("/a%20b/%C3%A9/%3F"));
  });

  it("never folds case (case N4)", () => {
    // case N4
    expect(normalisePath("/Repos/A")).toEqual(ok("/Repos/A"));
  });
});

describe("pathInside", () => {
  it("a prefix ends on a segment boundary", () => {
    expect(pathInside("/repos", "/repos")).toBe(true);
    expect(pathInside("/repos", "/repos/x")).toBe(true);
    expect(pathInside("/repos", "/reposx")).toBe(false);
    expect(pathInside("/repos/", "/repos/x")).toBe(true);
    expect(pathInside("/repos/", "/repos")).toBe(false);
    expect(pathInside("/", "/anything/at/all")).toBe(true);
  });

  it("a glob: * within a segment, ** across segments, over the whole path", () => {
    expect(pathInside("/repos/*/issues", "/repos/a/issues")).toBe(true);
    expect(pathInside("/repos/*/issues", "/repos/a/b/issues")).toBe(false);
    expect(pathInside("/repos/*/issues", "/repos/a/issues/1")).toBe(false);
    expect(pathInside("/repos/**/issues", "/repos/a/b/issues")).toBe(true);
    expect(pathInside("/v1/*.json", "/v1/a.json")).toBe(true);
    expect(pathInside("/v1/*.json", "/v1/axjson")).toBe(false);
    expect(pathInside("/v1/**", "/v1/a/b")).toBe(true);
    expect(pathInside("/v1/**", "/v2/a")).toBe(false);
  });

  it("is case-sensitive (case N4)", () => {
    // case N4
    expect(pathInside("/repos", "/Repos/x")).toBe(false);
    expect(pathInside("/repos/*", "/REPOS/x")).toBe(false);
  });

  it("matches only what PathLimit accepts as a limit", () => {
    for (const limit of ["/repos", "/repos/", "/repos/*/issues", "/v1/**"]) {
      expect(PathLimit.safeParse(limit).success, limit).toBe(true);
    }
  });
});

describe("limitVerdict", () => {
  const limits = { methods: ["GET", "HEAD"], paths: ["/repos"] };

  it("passes what is inside both limits, refuses by the first it is outside (case N3)", () => {
    // case N3
    expect(limitVerdict(limits, "GET", "/repos/a?x=1")).toBeNull();
    expect(limitVerdict(limits, "POST", "/repos/a")).toBe("method");
    expect(limitVerdict(limits, "get", "/repos/a")).toBe("method");
    expect(limitVerdict(limits, "GET", "/admin")).toBe("path");
    expect(limitVerdict(limits, "POST", "/admin")).toBe("method");
  });

  it("no path steps outside a prefix by its spelling (case N4)", () => {
    // case N4
    expect(limitVerdict(limits, "GET", "/repos/%2e%2e/admin")).toBe("path");
    expect(limitVerdict(limits, "GET", "/repos/%2E%2E/admin")).toBe("path");
    expect(limitVerdict(limits, "GET", "/repos/..;/admin")).toBe("path");
    expect(limitVerdict(limits, "GET", "//repos/../admin")).toBe("path");
    expect(limitVerdict(limits, "GET", "/repos%2F..%2Fadmin")).toBe("unnormalisable_path");
    expect(limitVerdict(limits, "GET", "/repos%5C..%5Cadmin")).toBe("unnormalisable_path");
    expect(limitVerdict(limits, "GET", "/repos\\..\\admin")).toBe("unnormalisable_path");
    expect(limitVerdict(limits, "GET", "/Repos/a")).toBe("path");
    // A spelling the normalisation resolves to inside is let through.
    expect(limitVerdict(limits, "GET", "//repos//%61")).toBeNull();
  });

  it("an unnormalisable path is refused under any path limit, none without one", () => {
    expect(limitVerdict({ methods: null, paths: ["/"] }, "GET", "/a%2Fb")).toBe("unnormalisable_path");
    expect(limitVerdict({ methods: ["GET"], paths: null }, "GET", "/a%2Fb")).toBeNull();
    expect(limitVerdict({ methods: null, paths: null }, "DELETE", "/../x")).toBeNull();
  });
});

describe("routing of a limited host", () => {
  it("case N3: an exact limited host is redirected by the hosts file under default routing", () => {
    // case N3
    const derived = deriveFields(
      {
        default: "allow",
        hosts: [
          { pattern: "api.example.com", action: "allow", methods: ["GET"], paths: null },
          { pattern: "free.example.com", action: "allow" },
        ],
        rules: [],
      },
      "direct",
    );
    expect(derived).toEqual({
      routing: { mode: "default", reasons: [] },
      enforce: true,
      hostsFile: ["api.example.com"],
    });
  });
});
