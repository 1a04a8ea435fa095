import { describe, expect, it } from "vitest";
import { expectProblem } from "./harness";
import { addRule, entryFor, hosts, RULE_FIELDS, tenantWithSecret } from "./vault-fixtures";

// Rules over the API: schemes, host patterns as saved (A14, A16), the implicit allow entry,
// conflicts with block entries, and the user's order (first match wins).

describe("rules: create with each scheme", () => {
  it("bearer defaults to the authorization header; the response has no secret value", async () => {
    const t = await tenantWithSecret();
    const res = await t.api("POST", "/v1/vault/rules", {
      host: "api.example.com",
      secret: "KEY",
      inject: { scheme: "bearer" },
    });
    expect(res.status).toBe(201);
    expect(Object.keys(res.json).sort()).toEqual(RULE_FIELDS);
    expect(res.json).toMatchObject({
      host: "api.example.com",
      secret: "KEY",
      position: 0,
      inject: { scheme: "bearer", name: "authorization" },
    });
    expect(res.json.id).toMatch(/^rul_/);
    expect(res.text).not.toContain("value-of-KEY");
    const read = await t.api("GET", `/v1/vault/rules/${res.json.id}`);
    expect(read.json).toEqual(res.json);
  });

  it.each([
    [
      "basic defaults to the authorization header",
      "registry.example.com",
      { scheme: "basic" },
      { scheme: "basic", name: "authorization" },
    ],
    [
      "bearer with a named header stores the header name in lowercase",
      "api.example.com",
      { scheme: "bearer", name: "X-Upstream-Authorization" },
      { scheme: "bearer", name: "x-upstream-authorization" },
    ],
    [
      "raw sets the named header (lowercased)",
      "api.anthropic.com",
      { scheme: "raw", name: "X-Api-Key" },
      { scheme: "raw", name: "x-api-key" },
    ],
    [
      "query sets the named parameter, case kept",
      "maps.example.com",
      { scheme: "query", name: "apiKey" },
      { scheme: "query", name: "apiKey" },
    ],
  ])("%s", async (_title, host, inject, saved) => {
    const t = await tenantWithSecret();
    const res = await t.api("POST", "/v1/vault/rules", { host, secret: "KEY", inject });
    expect(res.status).toBe(201);
    expect(res.json.inject).toEqual(saved);
  });

  it.each(["raw", "query"])(
    "%s without inject.name → 400 invalid_request, nothing stored",
    async (scheme) => {
      const t = await tenantWithSecret();
      const res = expectProblem(
        await t.api("POST", "/v1/vault/rules", {
          host: "api.example.com",
          secret: "KEY",
          inject: { scheme },
        }),
        400,
        "invalid_request",
      );
      expect(res.json.detail).toContain("inject.name");
      expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
      expect(await hosts(t)).toEqual([]);
    },
  );

  it.each([
    ["raw", "Content-Length", "a header that frames the request"],
    ["raw", "Transfer-Encoding", "a header that frames the request"],
    ["bearer", "Host", "the Host header"],
    ["raw", "Connection", "a hop-by-hop header"],
    ["raw", "X Api Key", "a header name with spaces"],
    ["raw", "X-Key\r\nX-Evil", "a header name with CR LF"],
    ["raw", "X-Käy", "a non-ASCII header name"],
    ["query", "a&b", "a query name with &"],
    ["query", "a=b", "a query name with ="],
    ["query", "a b", "a query name with a space"],
    ["query", "a#b", "a query name with #"],
  ])("%s with inject.name %j (%s) → 400 invalid_request, nothing stored", async (scheme, name) => {
    // Such a rule could not go into a policy document (the contract refuses it), so it must not
    // be saved either: it would break every policy compile for the vault.
    const t = await tenantWithSecret();
    expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "api.example.com",
        secret: "KEY",
        inject: { scheme, name },
      }),
      400,
      "invalid_request",
    );
    expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
    expect((await t.api("GET", "/v1/vault/policy-preview")).status).toBe(200);
  });

  it("an unknown scheme → 400 invalid_request; an unknown field → 400 unknown_field (case C3)", async () => {
    const t = await tenantWithSecret();
    expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "api.example.com",
        secret: "KEY",
        inject: { scheme: "cookie", name: "session" },
      }),
      400,
      "invalid_request",
    );
    expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "api.example.com",
        secret: "KEY",
        inject: { scheme: "bearer" },
        userId: "usr_other",
      }),
      400,
      "unknown_field",
    );
    expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "api.example.com",
        secret: "KEY",
        inject: { scheme: "bearer", value: "inline-secret" },
      }),
      400,
      "unknown_field",
    );
    expectProblem(
      await t.api("POST", "/v1/vault/rules", { host: "api.example.com", secret: "KEY" }),
      400,
      "invalid_request",
    );
    expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "api.example.com",
        secret: "KEY",
        inject: { scheme: "bearer" },
        position: -1,
      }),
      400,
      "invalid_request",
    );
  });

  it("an unknown secret → 400 unknown_secret, nothing stored", async () => {
    const t = await tenantWithSecret();
    const res = expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "api.example.com",
        secret: "NO_SUCH_SECRET",
        inject: { scheme: "bearer" },
      }),
      400,
      "unknown_secret",
    );
    expect(res.json.detail).toContain("NO_SUCH_SECRET");
    expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
    expect(await hosts(t)).toEqual([]);
  });

  it("another tenant's secret is an unknown secret (case C1)", async () => {
    await tenantWithSecret("THEIRS");
    const t = await tenantWithSecret();
    expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "api.example.com",
        secret: "THEIRS",
        inject: { scheme: "bearer" },
      }),
      400,
      "unknown_secret",
    );
  });
});

describe("rules: host patterns as saved", () => {
  // case A16 (and A14's "a non-punycode pattern is refused when saved"): each refused with a
  // message that says what is wrong and, where it can, what to write instead.
  it.each([
    ["*", /a lone \* would match every host/],
    ["*.", /a lone \* would match every host/],
    ["*.com", /would match every host under the top-level domain com/],
    ["*.co.uk", /co\.uk is a public suffix/],
    ["*example.com", /wildcard must be a whole label on its own.*write \*\.example\.com/],
    ["api.*.example.com", /not in the middle/],
    ["*.*.example.com", /only one wildcard is allowed/],
    ["example.*", /cannot stand for the top-level domain/],
    ["bücher.example", /must be written in punycode.*use xn--bcher-kva\.example/],
    ["*.bücher.example", /must be written in punycode.*use \*\.xn--bcher-kva\.example/],
    ["https://x.com", /without the scheme https:\/\/: use x\.com/],
    ["x.com/path", /paths, queries and fragments are not part of a host pattern: use x\.com/],
    ["user@x.com", /user names are not part of a host pattern/],
    ["x.com:8080", /ports are not part of a host pattern.*remove :8080/],
    ["api example.com", /contains whitespace/],
    ["a..example.com", /empty label/],
    ["-a.example.com", /starts or ends with a hyphen/],
    ["a_b.example.com", /underscore/],
    ["0x7f.1", /plain dotted decimal: use 127\.0\.0\.1/],
    ["*.1.2.3.4", /wildcard cannot be applied to an IP address/],
    ["*.github.io", /shared domain/],
  ])("refuses %j: 400 invalid_host_pattern", async (host, message) => {
    const t = await tenantWithSecret();
    const res = expectProblem(
      await t.api("POST", "/v1/vault/rules", { host, secret: "KEY", inject: { scheme: "bearer" } }),
      400,
      "invalid_host_pattern",
    );
    expect(res.json.detail).toMatch(message);
    expect(res.json.detail.startsWith(JSON.stringify(host))).toBe(true);
    expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
    expect(await hosts(t)).toEqual([]);
  });

  // case A14: the saved pattern is the canonical one.
  it.each([
    ["API.Example.COM.", "api.example.com"],
    ["example.com:443", "example.com"],
    ["example.com:80", "example.com"],
    ["*.Internal.Example.", "*.internal.example"],
    ["xn--bcher-kva.example", "xn--bcher-kva.example"],
    ["[2001:DB8:0:0:0:0:0:1]", "[2001:db8::1]"],
    ["203.0.113.7:443", "203.0.113.7"],
  ])("saves %j as %j, with its implicit entry under the same name", async (input, canonical) => {
    const t = await tenantWithSecret();
    const rule = await addRule(t, input);
    expect(rule.host).toBe(canonical);
    expect((await hosts(t)).map((h) => h.pattern)).toEqual([canonical]);
  });

  it("two spellings of one host share one implicit entry", async () => {
    const t = await tenantWithSecret();
    await addRule(t, "API.example.com");
    await addRule(t, "api.example.com.:443");
    const list = await hosts(t);
    expect(list).toHaveLength(1);
    expect(list[0]).toMatchObject({ pattern: "api.example.com", action: "allow", implicit: true });
  });
});

describe("rules: the implicit allow entry", () => {
  it("appears with the rule (implicit: true) and goes with the last rule for the host", async () => {
    const t = await tenantWithSecret();
    const first = await addRule(t, "api.example.com");
    const entry = await entryFor(t, "api.example.com");
    expect(entry).toMatchObject({ action: "allow", implicit: true });
    expect(entry?.id).toMatch(/^hst_/);

    const second = await addRule(t, "api.example.com");
    expect(await hosts(t)).toHaveLength(1);

    expect((await t.api("DELETE", `/v1/vault/rules/${first.id}`)).status).toBe(204);
    expect(await entryFor(t, "api.example.com")).toMatchObject({ implicit: true });
    expect((await t.api("DELETE", `/v1/vault/rules/${second.id}`)).status).toBe(204);
    expect(await hosts(t)).toEqual([]);
    expectProblem(await t.api("GET", `/v1/vault/hosts/${entry?.id}`), 404, "not_found");
  });

  it("an entry the user saved with POST /v1/vault/hosts is explicit and stays after the rule goes", async () => {
    const t = await tenantWithSecret();
    const rule = await addRule(t, "api.example.com");
    const saved = await t.api("POST", "/v1/vault/hosts", { pattern: "api.example.com", action: "allow" });
    expect(saved.status).toBe(200);
    expect(saved.json).toMatchObject({ pattern: "api.example.com", action: "allow", implicit: false });
    expect(await hosts(t)).toHaveLength(1);

    expect((await t.api("DELETE", `/v1/vault/rules/${rule.id}`)).status).toBe(204);
    expect(await entryFor(t, "api.example.com")).toMatchObject({ action: "allow", implicit: false });
  });

  it("an explicit allow entry saved before the rule stays explicit", async () => {
    const t = await tenantWithSecret();
    await t.api("POST", "/v1/vault/hosts", { pattern: "api.example.com", action: "allow" });
    const rule = await addRule(t, "api.example.com");
    expect(await entryFor(t, "api.example.com")).toMatchObject({ implicit: false });
    await t.api("DELETE", `/v1/vault/rules/${rule.id}`);
    expect(await entryFor(t, "api.example.com")).toMatchObject({ action: "allow", implicit: false });
  });

  it("PATCH host moves the implicit entry; another rule on the old host keeps it", async () => {
    const t = await tenantWithSecret();
    const moving = await addRule(t, "old.example.com");
    const patched = await t.api("PATCH", `/v1/vault/rules/${moving.id}`, { host: "NEW.example.com" });
    expect(patched.status).toBe(200);
    expect(patched.json.host).toBe("new.example.com");
    expect(patched.json.inject).toEqual(moving.inject);
    expect((await hosts(t)).map((h) => [h.pattern, h.implicit])).toEqual([["new.example.com", true]]);

    const staying = await addRule(t, "old.example.com");
    await t.api("PATCH", `/v1/vault/rules/${staying.id}`, { host: "new.example.com" });
    expect((await hosts(t)).map((h) => h.pattern)).toEqual(["new.example.com"]);

    const third = await addRule(t, "shared.example.com");
    await addRule(t, "shared.example.com");
    await t.api("PATCH", `/v1/vault/rules/${third.id}`, { host: "elsewhere.example.com" });
    expect((await hosts(t)).map((h) => h.pattern)).toEqual([
      "elsewhere.example.com",
      "new.example.com",
      "shared.example.com",
    ]);
  });

  it("PATCH host onto a host with an explicit entry leaves that entry explicit", async () => {
    const t = await tenantWithSecret();
    await t.api("POST", "/v1/vault/hosts", { pattern: "kept.example.com", action: "allow" });
    const rule = await addRule(t, "moving.example.com");
    await t.api("PATCH", `/v1/vault/rules/${rule.id}`, { host: "kept.example.com" });
    expect(await hosts(t)).toEqual([
      expect.objectContaining({ pattern: "kept.example.com", implicit: false }),
    ]);
  });

  it("PATCH other fields: secret, inject; bad values are refused with the same codes as create", async () => {
    const t = await tenantWithSecret("KEY", "OTHER");
    const rule = await addRule(t, "api.example.com");
    const res = await t.api("PATCH", `/v1/vault/rules/${rule.id}`, {
      secret: "OTHER",
      inject: { scheme: "raw", name: "X-Key" },
    });
    expect(res.status).toBe(200);
    expect(res.json).toMatchObject({ secret: "OTHER", inject: { scheme: "raw", name: "x-key" } });
    expect(Date.parse(res.json.updatedAt)).toBeGreaterThanOrEqual(Date.parse(rule.updatedAt));

    const path = `/v1/vault/rules/${rule.id}`;
    expectProblem(await t.api("PATCH", path, { secret: "NOPE" }), 400, "unknown_secret");
    expectProblem(await t.api("PATCH", path, { inject: { scheme: "query" } }), 400, "invalid_request");
    expectProblem(await t.api("PATCH", path, { host: "*.com" }), 400, "invalid_host_pattern");
    expectProblem(await t.api("PATCH", path, { id: "rul_other" }), 400, "unknown_field");
    expectProblem(
      await t.api("PATCH", "/v1/vault/rules/rul_0123456789abcdef", { host: "a.example.com" }),
      404,
      "not_found",
    );
    expect((await t.api("GET", path)).json).toEqual(res.json);
  });

  it("a wildcard rule gets a wildcard implicit entry", async () => {
    const t = await tenantWithSecret();
    await addRule(t, "*.internal.example");
    expect(await hosts(t)).toEqual([
      expect.objectContaining({ pattern: "*.internal.example", action: "allow", implicit: true }),
    ]);
  });

  it("read and delete of an unknown rule → 404 not_found", async () => {
    const t = await tenantWithSecret();
    expectProblem(await t.api("GET", "/v1/vault/rules/rul_0123456789abcdef"), 404, "not_found");
    expectProblem(await t.api("DELETE", "/v1/vault/rules/rul_0123456789abcdef"), 404, "not_found");
  });
});
