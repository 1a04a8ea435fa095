import { describe, expect, it } from "vitest";
import { loggedIn } from "./browser";
import { newTenant } from "./harness";
import { apiOf, recording, routing, VAULT } from "./pages-fixtures";

// The vault page's rules, host policy and routing mode (src/pages/vault/rules.tsx, hosts.tsx,
// routing.tsx) through the real Worker and Postgres: adding, editing, moving and deleting rules,
// block entries and the default, the catch-all warning with its starter pack, and the service's
// refusals shown as the form's flash. Host paging and per-host routes are in pages-vault-hosts.

describe("vault page: rules, host policy, routing mode", { timeout: 60_000 }, () => {
  it("a rule and a block entry; a block default switches to catch-all with the warning and the starter pack", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const first = await b.get(VAULT);
    expect(first.html).toContain("No rules yet");
    expect(first.html).toContain("Add a secret first");
    expect(first.html).toContain("No host entries");
    expect(routing(first.html)).toContain("gets default routing");
    expect(routing(first.html)).toContain("goes without a proxy");

    await b.submit(`${VAULT}/secrets`, { name: "OR_KEY", value: "or-value-1" });
    const rule = await b.submit(`${VAULT}/rules`, {
      host: "API.OpenRouter.example.",
      secret: "OR_KEY",
      scheme: "bearer",
      header: "",
    });
    expect(rule.error).toBeNull();
    expect(rule.ok).toBe("Added rule #1: OR_KEY for api.openrouter.example.");
    expect((await apiOf(t).rules()).map((r) => [r.host, r.secret, r.inject])).toEqual([
      ["api.openrouter.example", "OR_KEY", { scheme: "bearer", name: "authorization" }],
    ]);
    expect(rule.page.html).toContain("bearer → authorization");
    // Its host got an implicit allow entry, shown as such.
    expect(rule.page.html).toContain("(for a rule)");

    const block = await b.submit(`${VAULT}/hosts`, { pattern: "evil.example", action: "block" });
    expect(block.ok).toBe("Blocked evil.example.");
    const hosts = await apiOf(t).hosts();
    expect(hosts.map((h) => [h.pattern, h.action])).toEqual([
      ["api.openrouter.example", "allow"],
      ["evil.example", "block"],
    ]);
    expect(routing(block.page.html)).toContain("gets default routing");
    expect(block.page.html).not.toContain("What catch-all costs");

    const blockDefault = await b.submit(`${VAULT}/default`, { default: "block" });
    expect(blockDefault.ok).toBe("Hosts no entry names are now blocked.");
    expect((await apiOf(t).settings()).default).toBe("block");
    const text = routing(blockDefault.page.html);
    expect(text).toContain("gets catch-all routing");
    expect(text).toContain("The default is block");
    expect(text).toContain("What catch-all costs");
    expect(text).toContain("Runs are slower");
    expect(text).toContain("must be allowed, or installs fail");
    expect(text).toContain("the redirect cannot be installed");
    expect(blockDefault.page.html).toMatch(/<option value="block" selected="">blocked<\/option>/);

    // The warning's starter pack button: allow entries added, the user's own entries untouched.
    const pack = await b.submit(`${VAULT}/starter-pack`, {});
    expect(pack.ok).toMatch(/^Starter pack: allowed \d+ hosts\.$/);
    const after = await apiOf(t).hosts();
    expect(after.length).toBeGreaterThan(20);
    expect(after.find((h) => h.pattern === "registry.npmjs.org")?.action).toBe("allow");
    expect(after.find((h) => h.pattern === "evil.example")?.action).toBe("block");
    expect(pack.page.html).toContain("registry.npmjs.org");
    const again = await b.submit(`${VAULT}/starter-pack`, {});
    expect(again.ok).toMatch(
      /^Starter pack: allowed 0 hosts; left \d+ hosts you already had an entry for as they were\.$/,
    );

    // Back to allow, and a wildcard block: catch-all for that reason alone, named; no package warning.
    await b.submit(`${VAULT}/default`, { default: "allow" });
    const wild = await b.submit(`${VAULT}/hosts`, { pattern: "*.tracker.example", action: "block" });
    const wildText = routing(wild.page.html);
    expect(wildText).toContain("gets catch-all routing");
    expect(wildText).toContain("A wildcard block entry");
    expect(wildText).toContain("*.tracker.example");
    expect(wildText).not.toContain("The default is block");
    expect(wildText).not.toContain("installs fail");
    expect(wildText).toContain("Runs are slower");
  });

  it("the service's refusals are the flash: blocked rule host, host a rule needs, bad patterns, bad forms", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    await b.submit(`${VAULT}/secrets`, { name: "K", value: "k-value-1" });
    await b.submit(`${VAULT}/rules`, { host: "api.k.example", secret: "K", scheme: "bearer" });
    const ruleHost = (await apiOf(t).hosts())[0];

    const blockRuleHost = await b.submit(`${VAULT}/hosts`, { pattern: "*.k.example", action: "block" });
    expect(blockRuleHost.error).toContain("injects a credential for this host");
    expect(blockRuleHost.page.html).toContain('value="*.k.example"'); // kept for retyping
    const delNeeded = await b.submit(`${VAULT}/hosts/${ruleHost?.id}/delete`, {});
    expect(delNeeded.error).toContain("needs this host allowed");
    const switchNeeded = await b.submit(`${VAULT}/hosts/${ruleHost?.id}`, { action: "block" });
    expect(switchNeeded.error).toContain("injects a credential for this host");
    await b.submit(`${VAULT}/hosts`, { pattern: "bad.example", action: "block" });
    const ruleBlocked = await b.submit(`${VAULT}/rules`, {
      host: "bad.example",
      secret: "K",
      scheme: "raw",
      header: "x-api-key",
    });
    expect(ruleBlocked.error).toContain("is blocked by the host entry bad.example");
    // The form comes back as it was sent.
    expect(ruleBlocked.page.html).toContain('value="bad.example"');
    expect(ruleBlocked.page.html).toContain('<option value="raw" selected="">');
    expect(ruleBlocked.page.html).toContain('value="x-api-key"');

    const publicSuffix = await b.submit(`${VAULT}/hosts`, { pattern: "*.com", action: "block" });
    expect(publicSuffix.error).toContain('"*.com"');
    const noName = await b.submit(`${VAULT}/rules`, { host: "q.example", secret: "K", scheme: "query" });
    expect(noName.error).toBe("Scheme query needs inject.name, the query parameter to set.");
    const unknown = await b.submit(`${VAULT}/rules`, { host: "q.example", secret: "NOPE", scheme: "bearer" });
    expect(unknown.error).toBe("No secret named NOPE; create it first.");
    const framing = await b.submit(`${VAULT}/rules`, {
      host: "q.example",
      secret: "K",
      scheme: "raw",
      header: "content-length",
    });
    expect(framing.error).toMatch(/^inject\.name: /);
    for (const [path, fields, error] of [
      [`${VAULT}/rules`, { secret: "K" }, "Give the rule a host."],
      [`${VAULT}/rules`, { host: "q.example" }, "Pick the secret the rule injects."],
      [
        `${VAULT}/rules`,
        { host: "q.example", secret: "K", scheme: "ntlm" },
        "Pick how the secret is injected.",
      ],
      [`${VAULT}/hosts`, { action: "block" }, "Give a host or *.domain."],
      [`${VAULT}/hosts`, { pattern: "x.example", action: "maybe" }, "Pick allow or block."],
      [`${VAULT}/default`, {}, "Pick allow or block as the default."],
      [
        `${VAULT}/rules/${(await apiOf(t).rules())[0]?.id}/move`,
        { direction: "sideways" },
        "Move a rule up or down.",
      ],
    ] as const) {
      const res = await b.submit(path, fields);
      expect(res.error, path).toBe(error);
      expect(res.page.html).toContain(`<p class="error">${error}</p>`);
    }
    expect((await apiOf(t).rules()).map((r) => r.host)).toEqual(["api.k.example"]);
    expect((await apiOf(t).hosts()).map((h) => h.pattern)).toEqual(["api.k.example", "bad.example"]);
    expect((await apiOf(t).settings()).default).toBe("allow");
  });

  it("rules move up and down through the service's reorder; edit and delete", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    await b.submit(`${VAULT}/secrets`, { name: "K", value: "k-value-1" });
    for (const n of [1, 2, 3]) {
      await b.submit(`${VAULT}/rules`, { host: `api${n}.example`, secret: "K", scheme: "bearer" });
    }
    const hostsInOrder = async () => (await apiOf(t).rules()).map((r) => r.host);
    const ids = new Map((await apiOf(t).rules()).map((r) => [r.host, r.id]));
    const page = await b.get(VAULT);
    // The first rule has no Up, the last no Down.
    expect(page.html).not.toContain(
      `rules/${ids.get("api1.example")}/move" method="post"><input type="hidden" name="_csrf"`,
    );
    expect((page.html.match(/name="direction" value="up"/g) ?? []).length).toBe(2);
    expect((page.html.match(/name="direction" value="down"/g) ?? []).length).toBe(2);

    const up = await b.submit(`${VAULT}/rules/${ids.get("api3.example")}/move`, { direction: "up" });
    expect(up.ok).toBe("Moved rule #3 to #2.");
    expect(await hostsInOrder()).toEqual(["api1.example", "api3.example", "api2.example"]);
    await b.submit(`${VAULT}/rules/${ids.get("api1.example")}/move`, { direction: "down" });
    expect(await hostsInOrder()).toEqual(["api3.example", "api1.example", "api2.example"]);
    const stay = await b.submit(`${VAULT}/rules/${ids.get("api3.example")}/move`, { direction: "up" });
    expect(stay.ok).toBe("Rule #1 stays where it is.");
    expect(await hostsInOrder()).toEqual(["api3.example", "api1.example", "api2.example"]);
    // The page lists them in that order.
    const order = [...(await b.get(VAULT)).html.matchAll(/<code>(api\d\.example)<\/code>/g)].map((m) => m[1]);
    expect(order.slice(0, 3)).toEqual(["api3.example", "api1.example", "api2.example"]);

    // Edit: the form is filled in; a refused edit comes back to it with the input kept.
    const id = ids.get("api2.example") ?? "";
    const edit = await b.get(`${VAULT}/rules/${id}/edit`);
    expect(edit.status).toBe(200);
    expect(edit.html).toContain('value="api2.example"');
    expect(edit.html).toContain('value="authorization"');
    const bad = await b.post(`${VAULT}/rules/${id}`, {
      host: "*.github.io",
      secret: "K",
      scheme: "raw",
      header: "x-key",
    });
    expect(bad.status).toBe(303);
    expect(bad.location).toMatch(new RegExp(`^/manage/vault/rules/${id}/edit\\?`));
    const back = await b.get(bad.location ?? "");
    expect(back.html).toContain('<p class="error">&quot;*.github.io&quot;');
    expect(back.html).toContain('value="*.github.io"');
    expect(back.html).toContain('value="x-key"');
    const saved = await b.submit(`${VAULT}/rules/${id}`, {
      host: "api2b.example",
      secret: "K",
      scheme: "query",
      header: "key",
    });
    expect(saved.ok).toBe("Saved rule #3.");
    expect((await apiOf(t).rules())[2]).toMatchObject({
      host: "api2b.example",
      inject: { scheme: "query", name: "key" },
    });
    expect(saved.page.html).toContain("query ?key=");
    // The old host's implicit entry went with it.
    expect((await apiOf(t).hosts()).map((h) => h.pattern)).not.toContain("api2.example");

    const del = await b.submit(`${VAULT}/rules/${ids.get("api1.example")}/delete`, {});
    expect(del.ok).toBe("Deleted the rule.");
    expect(await hostsInOrder()).toEqual(["api3.example", "api2b.example"]);
  });

  it("a 253-character host renders whole inside a wrapping cell; markup in input is escaped", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const long = `${"a".repeat(63)}.${"b".repeat(63)}.${"c".repeat(63)}.${"d".repeat(53)}.example`;
    expect(long.length).toBe(253);
    const saved = await b.submit(`${VAULT}/hosts`, { pattern: long, action: "block" });
    expect(saved.ok).toBe(`Blocked ${long}.`);
    expect(saved.page.html).toContain(`<td><code>${long}</code></td>`);
    // The table is fixed-layout and its cells wrap anywhere (the layout's style sheet).
    expect(saved.page.html).toMatch(/table\{[^}]*table-layout:fixed/);
    expect(saved.page.html).toMatch(/td\{[^}]*overflow-wrap:anywhere/);
    expect(saved.page.html).toMatch(/code,\.mono\{[^}]*overflow-wrap:anywhere/);

    const evil = "<img src=x onerror=alert(1)>\"'.example";
    const refused = await b.submit(`${VAULT}/hosts`, { pattern: evil, action: "block" });
    expect(refused.error).toContain("<img src=x onerror=alert(1)>");
    expect(refused.page.html).not.toContain("<img src=x");
    expect(refused.page.html).toContain("&lt;img src=x onerror=alert(1)&gt;");
  });
});
