import { parseDenyList } from "@benchwright/shared/contract/notification-targets";
import { describe, expect, it } from "vitest";
import { checkTarget } from "../../src/notifications/target";

// Where a run-end notification may go (src/notifications/target.ts): the rules that the worker
// tests cannot vary, since they run under one configuration (the deny list, loopback off).

const deployed = {
  deny: parseDenyList("*.corp.example.com, hooks.blocked.example.org"),
  admitLoopback: false,
};
const reason = (url: string, policy = deployed) => {
  const checked = checkTarget(url, policy);
  return checked.ok ? "ok" : checked.reason;
};

describe("notification targets", () => {
  it("admits a public https URL, and keeps its path and query", () => {
    const checked = checkTarget("https://Hooks.Example.com:8443/a/b?c=d", deployed);
    expect(checked.ok && checked.url.href).toBe("https://hooks.example.com:8443/a/b?c=d");
  });

  it("refuses what the operator's deny list covers, exact or by wildcard", () => {
    expect(reason("https://ci.corp.example.com/x")).toBe(
      "ci.corp.example.com is on this deployment's deny list",
    );
    expect(reason("https://hooks.blocked.example.org/x")).toBe(
      "hooks.blocked.example.org is on this deployment's deny list",
    );
    expect(reason("https://HOOKS.blocked.example.org./x")).toBe(
      "hooks.blocked.example.org is on this deployment's deny list",
    );
    expect(reason("https://corp.example.com/x")).toBe("ok");
  });

  it("refuses loopback unless the test-only setting admits the suite's own spelling of it", () => {
    expect(reason("https://127.0.0.1:8443/x")).toBe("its host is an IP address; use a DNS name");
    const testing = { deny: [], admitLoopback: true };
    expect(reason("https://127.0.0.1:8443/x", testing)).toBe("ok");
    for (const other of [
      "https://127.0.0.1/x",
      "https://127.1:8443/x",
      "https://[::ffff:127.0.0.1]:8443/x",
    ]) {
      expect(reason(other, testing)).toBe("its host is an IP address; use a DNS name");
    }
    expect(reason("http://127.0.0.1:8443/x", testing)).toBe("only https URLs are allowed");
  });

  it("refuses a fragment, and never quotes the URL's path or query in a reason", () => {
    expect(reason("https://hooks.example.com/x#frag")).toContain("#fragment");
    expect(reason("https://localhost/secret-path?token=abc")).not.toMatch(/secret-path|token/);
  });

  it("a deny-list entry that is not a host pattern fails the configuration, naming it", () => {
    expect(() => parseDenyList("good.example.com, bad!host.com")).toThrow(
      /bad!host.com is not a host pattern/,
    );
    expect(parseDenyList(undefined)).toEqual([]);
  });
});
