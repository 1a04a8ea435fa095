import { describe, expect, it } from "vitest";
import { loggedIn } from "./browser";
import { newTenant } from "./harness";
import { findNeedles, newCanary } from "./leaks";
import { recording, VAULT } from "./pages-fixtures";

// Case C1 on the vault page (src/pages/vault/): one tenant's session never reads or changes
// another's vault, whatever ids it posts, and never sees the other's secret value.

describe("vault page: tenant isolation (C1)", { timeout: 60_000 }, () => {
  it("B's page never shows A's vault; B posting A's ids changes nothing in A's vault", async () => {
    const a = await newTenant();
    const tag = crypto.randomUUID().slice(0, 8);
    const aName = `A_SECRET_${tag}`;
    const aValue = newCanary("tenantA");
    expect((await a.api("POST", "/v1/vault/secrets", { name: aName, value: aValue })).status).toBe(201);
    for (const host of [`one.a-${tag}.example`, `two.a-${tag}.example`]) {
      const r = await a.api("POST", "/v1/vault/rules", { host, secret: aName, inject: { scheme: "bearer" } });
      expect(r.status).toBe(201);
    }
    const block = await a.api("POST", "/v1/vault/hosts", {
      pattern: `evil.a-${tag}.example`,
      action: "block",
    });
    expect(block.status).toBe(200);
    const spare = await a.api("POST", "/v1/vault/secrets", {
      name: `A_SPARE_${tag}`,
      value: "spare-value-a",
    });
    const aSnapshot = async () => ({
      secrets: (await a.api("GET", "/v1/vault/secrets")).json,
      rules: (await a.api("GET", "/v1/vault/rules")).json,
      hosts: (await a.api("GET", "/v1/vault/hosts")).json,
      settings: (await a.api("GET", "/v1/vault/settings")).json,
    });
    const before = await aSnapshot();
    const [rule1, rule2] = before.rules.rules as { id: string }[];
    const hostIds = (before.hosts.hosts as { id: string }[]).map((h) => h.id);

    const bTenant = await newTenant();
    const b = recording(await loggedIn(bTenant));
    const page = await b.get(VAULT);
    expect(page.html).not.toContain(tag);
    const foreign: [string, Record<string, string>, RegExp][] = [
      [
        `${VAULT}/secrets/${spare.json.id}/replace`,
        { value: "overwritten-by-b" },
        /^No secret sec_\w+ in this vault\.$/,
      ],
      [`${VAULT}/secrets/${spare.json.id}/delete`, {}, /^No secret sec_\w+ in this vault\.$/],
      [
        `${VAULT}/rules/${rule1?.id}`,
        { host: "b.example", secret: aName, scheme: "bearer" },
        /^No rule rul_\w+ in this vault\.$/,
      ],
      [`${VAULT}/rules/${rule2?.id}/move`, { direction: "up" }, /^No rule rul_\w+ in this vault\.$/],
      [`${VAULT}/rules/${rule1?.id}/delete`, {}, /^No rule rul_\w+ in this vault\.$/],
      ...hostIds.flatMap((id): [string, Record<string, string>, RegExp][] => [
        [`${VAULT}/hosts/${id}`, { action: "allow" }, /^No host entry hst_\w+ in this vault\.$/],
        [`${VAULT}/hosts/${id}/limits`, { methods: "GET" }, /^No host entry hst_\w+ in this vault\.$/],
        [`${VAULT}/hosts/${id}/delete`, {}, /^No host entry hst_\w+ in this vault\.$/],
      ]),
    ];
    for (const [path, fields, error] of foreign) {
      const res = await b.submit(path, fields);
      expect(res.error ?? "", path).toMatch(error);
      expect(res.ok, path).toBeNull();
      expect(res.page.html, path).not.toContain(tag);
    }
    // A's rule's edit page from B: 404, nothing of A's shown.
    const edit = await b.get(`${VAULT}/rules/${rule1?.id}/edit`);
    expect(edit.status).toBe(404);
    expect(edit.html).not.toContain(tag);
    // B's own writes land in B's vault only, even naming A's secret.
    const named = await b.submit(`${VAULT}/rules`, { host: "b.example", secret: aName, scheme: "bearer" });
    expect(named.error).toBe(`No secret named ${aName}; create it first.`);
    await b.submit(`${VAULT}/default`, { default: "block" });
    await b.submit(`${VAULT}/starter-pack`, {});

    expect(await aSnapshot()).toEqual(before);
    expect(b.log.flatMap((text, i) => findNeedles(`B's response ${i}`, text, [aValue]))).toEqual([]);
    // And A's page shows A's vault.
    const aPage = await (await loggedIn(a)).get(VAULT);
    expect(aPage.html).toContain(aName);
    expect(aPage.html).toContain(`evil.a-${tag}.example`);
    expect(aPage.html).not.toContain(aValue);
  });
});
