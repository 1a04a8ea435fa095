import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { vaultRules } from "../../src/db/schema";
import { expectProblem, newTenant, type Tenant, withDb } from "./harness";

// Rules over the API: schemes, host patterns as saved (A14, A16), the implicit allow entry,
// conflicts with block entries, and the user's order (first match wins).

const RULE_FIELDS = ["createdAt", "host", "id", "inject", "position", "secret", "updatedAt"];

async function tenantWithSecret(...names: string[]): Promise<Tenant> {
  const t = await newTenant();
  for (const name of names.length > 0 ? names : ["KEY"]) {
    const res = await t.api("POST", "/v1/vault/secrets", { name, value: `value-of-${name}` });
    expect(res.status, res.text).toBe(201);
  }
  return t;
}

async function addRule(t: Tenant, host: string, secret = "KEY", extra: Record<string, unknown> = {}) {
  const res = await t.api("POST", "/v1/vault/rules", {
    host,
    secret,
    inject: { scheme: "bearer" },
    ...extra,
  });
  expect(res.status, res.text).toBe(201);
  return res.json;
}

async function hosts(
  t: Tenant,
): Promise<{ id: string; pattern: string; action: string; implicit: boolean }[]> {
  const res = await t.api("GET", "/v1/vault/hosts");
  expect(res.status).toBe(200);
  return res.json.hosts;
}

const entryFor = async (t: Tenant, pattern: string) => (await hosts(t)).find((h) => h.pattern === pattern);

async function order(t: Tenant): Promise<string[]> {
  const res = await t.api("GET", "/v1/vault/rules");
  expect(res.status).toBe(200);
  expect(res.json.rules.map((r: { position: number }) => r.position)).toEqual(
    res.json.rules.map((_: unknown, i: number) => i),
  );
  return res.json.rules.map((r: { id: string }) => r.id);
}

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

  it("basic defaults to the authorization header", async () => {
    const t = await tenantWithSecret();
    const res = await t.api("POST", "/v1/vault/rules", {
      host: "registry.example.com",
      secret: "KEY",
      inject: { scheme: "basic" },
    });
    expect(res.status).toBe(201);
    expect(res.json.inject).toEqual({ scheme: "basic", name: "authorization" });
  });

  it("bearer with a named header stores the header name in lowercase", async () => {
    const t = await tenantWithSecret();
    const res = await t.api("POST", "/v1/vault/rules", {
      host: "api.example.com",
      secret: "KEY",
      inject: { scheme: "bearer", name: "X-Upstream-Authorization" },
    });
    expect(res.status).toBe(201);
    expect(res.json.inject).toEqual({ scheme: "bearer", name: "x-upstream-authorization" });
  });

  it("raw sets the named header (lowercased)", async () => {
    const t = await tenantWithSecret();
    const res = await t.api("POST", "/v1/vault/rules", {
      host: "api.anthropic.com",
      secret: "KEY",
      inject: { scheme: "raw", name: "X-Api-Key" },
    });
    expect(res.status).toBe(201);
    expect(res.json.inject).toEqual({ scheme: "raw", name: "x-api-key" });
  });

  it("query sets the named parameter, case kept", async () => {
    const t = await tenantWithSecret();
    const res = await t.api("POST", "/v1/vault/rules", {
      host: "maps.example.com",
      secret: "KEY",
      inject: { scheme: "query", name: "apiKey" },
    });
    expect(res.status).toBe(201);
    expect(res.json.inject).toEqual({ scheme: "query", name: "apiKey" });
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

describe("rules: conflicts with host entries", () => {
  it("a rule on a host with an exact block entry → 409 rule_host_blocked", async () => {
    const t = await tenantWithSecret();
    await t.api("POST", "/v1/vault/hosts", { pattern: "api.example.com", action: "block" });
    const res = expectProblem(
      await t.api("POST", "/v1/vault/rules", {
        host: "API.example.com",
        secret: "KEY",
        inject: { scheme: "bearer" },
      }),
      409,
      "rule_host_blocked",
    );
    expect(res.json.detail).toContain("api.example.com");
    expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
    expect(await hosts(t)).toEqual([
      expect.objectContaining({ pattern: "api.example.com", action: "block" }),
    ]);
  });

  it.each([
    ["*.example.com", "api.example.com"],
    ["*.example.com", "deep.api.example.com"],
    ["*.example.com", "*.api.example.com"],
    ["*.example.com", "*.example.com"],
  ])("a wildcard block %s covers a rule on %s → 409 rule_host_blocked", async (block, host) => {
    const t = await tenantWithSecret();
    await t.api("POST", "/v1/vault/hosts", { pattern: block, action: "block" });
    const res = expectProblem(
      await t.api("POST", "/v1/vault/rules", { host, secret: "KEY", inject: { scheme: "bearer" } }),
      409,
      "rule_host_blocked",
    );
    expect(res.json.detail).toContain(block);
  });

  it("a wildcard block does not cover its bare domain nor a look-alike (case A15)", async () => {
    const t = await tenantWithSecret();
    await t.api("POST", "/v1/vault/hosts", { pattern: "*.example.com", action: "block" });
    await addRule(t, "example.com");
    await addRule(t, "evil-example.com");
    await addRule(t, "example.com.evil.net");
  });

  it("PATCH a rule's host onto a blocked host → 409 rule_host_blocked, rule unchanged", async () => {
    const t = await tenantWithSecret();
    await t.api("POST", "/v1/vault/hosts", { pattern: "*.blocked.example", action: "block" });
    const rule = await addRule(t, "api.example.com");
    expectProblem(
      await t.api("PATCH", `/v1/vault/rules/${rule.id}`, { host: "a.blocked.example" }),
      409,
      "rule_host_blocked",
    );
    expect((await t.api("GET", `/v1/vault/rules/${rule.id}`)).json.host).toBe("api.example.com");
  });

  it.each([
    ["api.example.com", "api.example.com"],
    ["api.example.com", "API.EXAMPLE.COM."],
    ["api.example.com", "*.example.com"],
    ["a.b.example.com", "*.example.com"],
    ["*.api.example.com", "*.example.com"],
  ])("with a rule on %s, blocking %s → 409 rule_host_blocked, entry unchanged", async (host, block) => {
    const t = await tenantWithSecret();
    const rule = await addRule(t, host);
    const res = expectProblem(
      await t.api("POST", "/v1/vault/hosts", { pattern: block, action: "block" }),
      409,
      "rule_host_blocked",
    );
    expect(res.json.detail).toContain(rule.id);
    expect(await hosts(t)).toEqual([expect.objectContaining({ pattern: host, action: "allow" })]);
  });

  it("PATCH the implicit entry to block → 409 rule_host_blocked", async () => {
    const t = await tenantWithSecret();
    await addRule(t, "api.example.com");
    const entry = await entryFor(t, "api.example.com");
    expectProblem(
      await t.api("PATCH", `/v1/vault/hosts/${entry?.id}`, { action: "block" }),
      409,
      "rule_host_blocked",
    );
    expect(await entryFor(t, "api.example.com")).toMatchObject({ action: "allow", implicit: true });
  });

  it("deleting the host entry a rule needs → 409 host_has_rule; the rule's delete takes it", async () => {
    const t = await tenantWithSecret();
    const rule = await addRule(t, "api.example.com");
    const entry = await entryFor(t, "api.example.com");
    const res = expectProblem(await t.api("DELETE", `/v1/vault/hosts/${entry?.id}`), 409, "host_has_rule");
    expect(res.json.detail).toContain(rule.id);
    expect(await entryFor(t, "api.example.com")).toBeDefined();

    // Also when the user made it explicit.
    await t.api("POST", "/v1/vault/hosts", { pattern: "api.example.com", action: "allow" });
    expectProblem(await t.api("DELETE", `/v1/vault/hosts/${entry?.id}`), 409, "host_has_rule");
  });

  it("blocking an unrelated host is fine", async () => {
    const t = await tenantWithSecret();
    await addRule(t, "api.example.com");
    const res = await t.api("POST", "/v1/vault/hosts", { pattern: "*.other.example", action: "block" });
    expect(res.status).toBe(200);
  });
});

describe("rules: order (first match wins)", () => {
  it("new rules go last; position on create inserts; positions stay 0..n-1", async () => {
    const t = await tenantWithSecret();
    const a = await addRule(t, "a.example.com");
    const b = await addRule(t, "b.example.com");
    const c = await addRule(t, "c.example.com");
    expect([a.position, b.position, c.position]).toEqual([0, 1, 2]);
    expect(await order(t)).toEqual([a.id, b.id, c.id]);

    const first = await addRule(t, "first.example.com", "KEY", { position: 0 });
    expect(first.position).toBe(0);
    const middle = await addRule(t, "middle.example.com", "KEY", { position: 2 });
    expect(middle.position).toBe(2);
    expect(await order(t)).toEqual([first.id, a.id, middle.id, b.id, c.id]);

    // A position past the end means last.
    const last = await addRule(t, "last.example.com", "KEY", { position: 99 });
    expect(last.position).toBe(5);
    expect(await order(t)).toEqual([first.id, a.id, middle.id, b.id, c.id, last.id]);
  });

  it("PATCH position moves one rule; delete closes the gap", async () => {
    const t = await tenantWithSecret();
    const a = await addRule(t, "a.example.com");
    const b = await addRule(t, "b.example.com");
    const c = await addRule(t, "c.example.com");
    const d = await addRule(t, "d.example.com");

    const moved = await t.api("PATCH", `/v1/vault/rules/${d.id}`, { position: 1 });
    expect(moved.status).toBe(200);
    expect(moved.json.position).toBe(1);
    expect(await order(t)).toEqual([a.id, d.id, b.id, c.id]);

    await t.api("PATCH", `/v1/vault/rules/${a.id}`, { position: 3 });
    expect(await order(t)).toEqual([d.id, b.id, c.id, a.id]);

    await t.api("PATCH", `/v1/vault/rules/${c.id}`, { position: 50 });
    expect(await order(t)).toEqual([d.id, b.id, a.id, c.id]);

    expect((await t.api("DELETE", `/v1/vault/rules/${b.id}`)).status).toBe(204);
    expect(await order(t)).toEqual([d.id, a.id, c.id]);
  });

  it("PUT /v1/vault/rules/order applies a full permutation", async () => {
    const t = await tenantWithSecret();
    const ids = [];
    for (const h of ["a", "b", "c", "d"]) ids.push((await addRule(t, `${h}.example.com`)).id);
    const wanted = [ids[2], ids[0], ids[3], ids[1]];
    const res = await t.api("PUT", "/v1/vault/rules/order", { ids: wanted });
    expect(res.status).toBe(200);
    expect(res.json.rules.map((r: { id: string }) => r.id)).toEqual(wanted);
    expect(res.json.rules.map((r: { position: number }) => r.position)).toEqual([0, 1, 2, 3]);
    expect(await order(t)).toEqual(wanted);
  });

  it("an empty order for an empty vault is fine", async () => {
    const t = await tenantWithSecret();
    const res = await t.api("PUT", "/v1/vault/rules/order", { ids: [] });
    expect(res.status).toBe(200);
    expect(res.json).toEqual({ rules: [] });
  });

  it("invalid orders → 400 invalid_order, order unchanged", async () => {
    // case C1: another tenant's rule id is just an id this vault does not have.
    const other = await tenantWithSecret();
    const foreign = (await addRule(other, "x.example.com")).id;
    const t = await tenantWithSecret();
    const a = (await addRule(t, "a.example.com")).id;
    const b = (await addRule(t, "b.example.com")).id;
    const c = (await addRule(t, "c.example.com")).id;
    const bad: [string, string[]][] = [
      ["missing id", [a, b]],
      ["duplicate", [a, b, b]],
      ["duplicate with all present", [a, b, c, c]],
      ["foreign id in place of one", [a, b, foreign]],
      ["foreign id added", [a, b, c, foreign]],
      ["unknown id", [a, b, "rul_0123456789abcdef"]],
      ["empty", []],
    ];
    for (const [label, ids] of bad) {
      const res = await t.api("PUT", "/v1/vault/rules/order", { ids });
      expect(res.json?.code, label).toBe("invalid_order");
      expectProblem(res, 400, "invalid_order");
    }
    expect(await order(t)).toEqual([a, b, c]);
    expect(await order(other)).toEqual([foreign]);
    expectProblem(await t.api("PUT", "/v1/vault/rules/order", { ids: "a,b,c" }), 400, "invalid_request");
    expectProblem(
      await t.api("PUT", "/v1/vault/rules/order", { ids: [a, b, c], x: 1 }),
      400,
      "unknown_field",
    );
  });

  it("first match wins, visible in the policy preview's rules[].index", async () => {
    const t = await tenantWithSecret("NARROW", "BROAD");
    const broad = await addRule(t, "*.example.com", "BROAD");
    const narrow = await addRule(t, "api.example.com", "NARROW");
    const before = await t.api("GET", "/v1/vault/policy-preview");
    expect(before.status).toBe(200);
    expect(
      before.json.rules.map((r: { index: number; host: string; secret: string }) => [
        r.index,
        r.host,
        r.secret,
      ]),
    ).toEqual([
      [0, "*.example.com", "BROAD"],
      [1, "api.example.com", "NARROW"],
    ]);

    await t.api("PUT", "/v1/vault/rules/order", { ids: [narrow.id, broad.id] });
    const after = await t.api("GET", "/v1/vault/policy-preview");
    expect(after.json.rules.map((r: { index: number; secret: string }) => [r.index, r.secret])).toEqual([
      [0, "NARROW"],
      [1, "BROAD"],
    ]);

    await t.api("PATCH", `/v1/vault/rules/${broad.id}`, { position: 0 });
    const patched = await t.api("GET", "/v1/vault/policy-preview");
    expect(patched.json.rules.map((r: { secret: string }) => r.secret)).toEqual(["BROAD", "NARROW"]);
  });
});

describe("case I8: a wildcard rule over a domain with suffix-list entries below it", () => {
  it.each([
    ["*.amazonaws.com", "amazonaws.com"],
    ["*.windows.net", "windows.net"],
    ["*.core.windows.net", "core.windows.net"],
  ])("case I8: refuses %j when saved: 400 invalid_host_pattern, nothing stored", async (host, rest) => {
    const t = await tenantWithSecret();
    const res = expectProblem(
      await t.api("POST", "/v1/vault/rules", { host, secret: "KEY", inject: { scheme: "bearer" } }),
      400,
      "invalid_host_pattern",
    );
    expect(res.json.detail).toContain(`the public suffix list has entries under ${rest}`);
    expect(res.json.detail).toContain("name the exact host");
    expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
    expect(await hosts(t)).toEqual([]);
    // Blocking the same wildcard stays possible: it sends no credential anywhere.
    const block = await t.api("POST", "/v1/vault/hosts", { pattern: host, action: "block" });
    expect(block.status, block.text).toBe(200);
    expect(block.json).toMatchObject({ pattern: host, action: "block" });
  });

  it("case I8: an old row saved before the check never compiles: the preview says which rule", async () => {
    const t = await tenantWithSecret();
    const rule = await addRule(t, "*.api.example.com");
    expect((await t.api("GET", "/v1/vault/policy-preview")).status).toBe(200);
    // As a row written under the older checks would be.
    await withDb((db) =>
      db.update(vaultRules).set({ hostPattern: "*.amazonaws.com" }).where(eq(vaultRules.id, rule.id)),
    );
    const preview = expectProblem(
      await t.api("GET", "/v1/vault/policy-preview"),
      400,
      "invalid_host_pattern",
    );
    expect(preview.json.detail).toMatch(/rule 1 \(\*\.amazonaws\.com\): the public suffix list has entries/);
  });
});
