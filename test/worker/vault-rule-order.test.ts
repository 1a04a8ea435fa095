import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { vaultRules } from "../../src/db/schema";
import { expectProblem, withDb } from "./harness";
import { addRule, entryFor, hosts, order, tenantWithSecret } from "./vault-fixtures";

// Rules over the API: schemes, host patterns as saved (A14, A16), the implicit allow entry,
// conflicts with block entries, and the user's order (first match wins).

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
