import { describe, expect, it } from "vitest";
import { type Browser, loggedIn, type PageResponse } from "./browser";
import { newTenant, type Tenant } from "./harness";
import { findNeedles, leakNeedles, newCanary } from "./leaks";
import { auditBatch, newRun, postBatch, runWithAudit } from "./run-fixtures";

// The vault page (/manage/vault, src/pages/vault/) through the real Worker and Postgres:
// every form, the flash it answers with, case B5 (a secret's value never appears in any page,
// redirect or flash) and C1 (one tenant's session never reads or changes another's vault).

const VAULT = "/manage/vault";

/** Everything a browser was sent: status, headers, body. */
const seen = (res: PageResponse) =>
  `${res.status}\n${[...res.headers].map(([k, v]) => `${k}: ${v}`).join("\n")}\n\n${res.html}`;

/** A browser that keeps every response it got, for the leak scan at the end. */
function recording(b: Browser) {
  const log: string[] = [];
  return {
    log,
    async get(path: string) {
      const res = await b.get(path);
      log.push(`GET ${path}\n${seen(res)}`);
      return res;
    },
    async post(path: string, fields: Record<string, string | string[]>) {
      const res = await b.post(path, fields);
      log.push(`POST ${path}\n${seen(res)}`);
      return res;
    },
    /** Posts, expects a 303 back to the vault page, follows it; returns the page and the flash. */
    async submit(path: string, fields: Record<string, string | string[]>) {
      const res = await this.post(path, fields);
      expect(res.status, res.html).toBe(303);
      expect(res.location ?? "").toMatch(/^\/manage\/vault(\?|$)/);
      const url = new URL(res.location ?? "", "http://x");
      const page = await this.get(`${url.pathname}${url.search}`);
      expect(page.status).toBe(200);
      return { page, ok: url.searchParams.get("ok"), error: url.searchParams.get("error") };
    },
  };
}

const api = {
  secrets: async (t: Tenant) =>
    (await t.api("GET", "/v1/vault/secrets")).json.secrets as {
      id: string;
      name: string;
      fingerprint: string;
    }[],
};

/** The id in a form action on the page, e.g. the secret whose row shows `name`. */
function actionIds(html: string, kind: string): string[] {
  return [...html.matchAll(new RegExp(`action="/manage/vault/${kind}/([a-z]+_[A-Za-z0-9]+)/`, "g"))].map(
    (m) => m[1] ?? "",
  );
}

describe("vault page: secrets", { timeout: 60_000 }, () => {
  it("an added secret shows its name and fingerprint; its value appears in no page, redirect or flash", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const canary = newCanary("page");
    const empty = await b.get(VAULT);
    expect(empty.html).toContain("No secrets yet");

    const added = await b.submit(`${VAULT}/secrets`, { name: "CANARY_KEY", value: canary });
    expect(added.error).toBeNull();
    const [secret] = await api.secrets(t);
    expect(secret?.name).toBe("CANARY_KEY");
    expect(added.ok).toContain("Added CANARY_KEY");
    expect(added.page.html).toContain("CANARY_KEY");
    expect(added.page.html).toContain(secret?.fingerprint);
    expect(added.page.html).toContain('<p class="ok">');

    // Failing adds: the same name again (secret_exists), a value with a line break, a bad name,
    // no name, no value. Each says why; none sends the value back, not even into the form.
    const again = await b.submit(`${VAULT}/secrets`, { name: "CANARY_KEY", value: `${canary}2` });
    expect(again.error).toContain("A secret named CANARY_KEY exists");
    expect(again.page.html).toContain('value="CANARY_KEY"'); // the name is kept for retyping
    const crlf = await b.submit(`${VAULT}/secrets`, { name: "OTHER", value: `${canary}\r\nx: y` });
    expect(crlf.error).toContain("printable ASCII");
    const badName = await b.submit(`${VAULT}/secrets`, { name: "1 bad name", value: canary });
    expect(badName.error).toContain("That is not a secret name");
    const noName = await b.submit(`${VAULT}/secrets`, { name: " ", value: canary });
    expect(noName.error).toBe("Give the secret a name.");
    const noValue = await b.submit(`${VAULT}/secrets`, { name: "NO_VALUE", value: "" });
    expect(noValue.error).toBe("Enter the secret's value.");
    const tooLong = await b.submit(`${VAULT}/secrets`, { name: "LONG", value: canary.repeat(600) });
    expect(tooLong.error).toBe("A secret value is at most 16 KiB.");
    expect((await api.secrets(t)).map((s) => s.name)).toEqual(["CANARY_KEY"]);

    // Replacing the value: a new fingerprint, the old and new values nowhere.
    const second = newCanary("second");
    const id = secret?.id ?? "";
    const replaced = await b.submit(`${VAULT}/secrets/${id}/replace`, { value: second });
    const [after] = await api.secrets(t);
    expect(after?.fingerprint).not.toBe(secret?.fingerprint);
    expect(replaced.ok).toContain(after?.fingerprint);
    expect(replaced.page.html).toContain(after?.fingerprint);
    const badReplace = await b.submit(`${VAULT}/secrets/${id}/replace`, { value: `${second}\n` });
    expect(badReplace.error).toContain("printable ASCII");
    expect((await api.secrets(t))[0]?.fingerprint).toBe(after?.fingerprint);

    const needles = [...(await leakNeedles(canary)), ...(await leakNeedles(second))];
    expect(b.log.length).toBeGreaterThan(10);
    expect(b.log.flatMap((text, i) => findNeedles(`response ${i}`, text, needles))).toEqual([]);
    // Value fields are password fields with nothing filled in.
    expect(replaced.page.html).not.toMatch(/type="password"[^>]*value=/);
  });

  it("delete: a secret no rule uses goes; one a rule uses is refused with the reason", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    await b.submit(`${VAULT}/secrets`, { name: "SPARE", value: "spare-value-1" });
    await b.submit(`${VAULT}/secrets`, { name: "USED", value: "used-value-1" });
    const rule = await t.api("POST", "/v1/vault/rules", {
      host: "api.used.example",
      secret: "USED",
      inject: { scheme: "bearer" },
    });
    expect(rule.status).toBe(201);
    const byName = new Map((await api.secrets(t)).map((s) => [s.name, s.id]));
    const page = await b.get(VAULT);
    expect(page.html).toContain("used by rule #1");
    expect(actionIds(page.html, "secrets")).toContain(byName.get("USED"));

    const refused = await b.submit(`${VAULT}/secrets/${byName.get("USED")}/delete`, {});
    expect(refused.error).toContain(`Rules ${rule.json.id} use this secret`);
    expect(refused.page.html).toContain(`Rules ${rule.json.id} use this secret`);
    const gone = await b.submit(`${VAULT}/secrets/${byName.get("SPARE")}/delete`, {});
    expect(gone.ok).toBe("Deleted SPARE.");
    expect((await api.secrets(t)).map((s) => s.name)).toEqual(["USED"]);
  });
});

const apiOf = (t: Tenant) => ({
  rules: async () =>
    (await t.api("GET", "/v1/vault/rules")).json.rules as {
      id: string;
      host: string;
      secret: string;
      inject: { scheme: string; name: string };
    }[],
  hosts: async () =>
    (await t.api("GET", "/v1/vault/hosts")).json.hosts as {
      id: string;
      pattern: string;
      action: string;
      implicit: boolean;
    }[],
  settings: async () =>
    (await t.api("GET", "/v1/vault/settings")).json as { default: string; version: number },
});

/** The routing section's text, tags dropped. */
function routing(html: string): string {
  const m = /<section id="routing">([\s\S]*?)<\/section>/.exec(html);
  return (m?.[1] ?? "").replace(/<[^>]+>/g, "").replace(/\s+/g, " ");
}

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

describe("vault page: recent blocked hosts", { timeout: 60_000 }, () => {
  it("account-wide rows with counts, source and run links; paged; empty state; another tenant sees none", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const empty = await b.get(VAULT);
    expect(empty.html).toContain("No run has been refused a host yet.");

    const tag = crypto.randomUUID().slice(0, 8);
    const evil = `evil-${tag}.example`;
    const r1 = await runWithAudit(t, [evil]);
    const r2 = await newRun(t);
    const now = new Date().toISOString();
    const agent = auditBatch(r2.id, {
      source: "local_agent",
      blockedHosts: [{ host: evil, count: 4, firstSeen: now, lastSeen: now }],
    });
    expect((await postBatch(r2, agent)).status).toBe(204);

    // Its row offers Allow while the vault blocks it; a host the vault allows now says so.
    expect((await t.api("POST", "/v1/vault/hosts", { pattern: evil, action: "block" })).status).toBe(200);
    const page = await b.get(VAULT);
    const section = /<section id="blocked">([\s\S]*?)<\/section>/.exec(page.html)?.[1] ?? "";
    expect(section).toContain(`<code>${evil}</code>`);
    expect(section).toContain("<td>5</td>");
    expect(section).toContain("proxy and local agent");
    expect(section).toContain(`href="/runs/${r1.id}"`);
    expect(section).toContain(`href="/runs/${r2.id}"`);
    expect(section).toContain(
      `<input type="hidden" name="host" value="${evil}"/><button type="submit">Allow this host</button>`,
    );
    expect(section).not.toContain("allowed now");

    // Allow this host: the block entry becomes allow (allowHosts), the row says so.
    const allowed = await b.submit(`${VAULT}/blocked-hosts/allow`, { host: evil });
    expect(allowed.ok).toBe(
      `Allowed ${evil}: runs reach it from now on (a running run's proxy picks the change up within seconds).`,
    );
    expect((await apiOf(t).hosts()).map((h) => [h.pattern, h.action])).toEqual([[evil, "allow"]]);
    expect(allowed.page.html).toContain("allowed now");
    expect(allowed.page.html).not.toContain("Allow this host");
    const twice = await b.submit(`${VAULT}/blocked-hosts/allow`, { host: evil });
    expect(twice.ok).toBe(`${evil} was allowed already.`);
    // A hand-made form: wildcards and junk are refused by the service, nothing written.
    const wild = await b.submit(`${VAULT}/blocked-hosts/allow`, { host: `*.${evil}` });
    expect(wild.error).toContain("exact host names only");
    const none = await b.submit(`${VAULT}/blocked-hosts/allow`, { host: "" });
    expect(none.error).toBe("Which host? The form named none.");
    expect((await apiOf(t).hosts()).map((h) => h.pattern)).toEqual([evil]);

    // Paged: 30 more hosts, 25 a page, newest first; the cursor link leads to the rest.
    await runWithAudit(
      t,
      Array.from({ length: 30 }, (_, i) => `h${String(i).padStart(2, "0")}-${tag}.example`),
    );
    const first = await b.get(VAULT);
    const hostsOn = (html: string) =>
      [
        ...(/<section id="blocked">([\s\S]*?)<\/section>/.exec(html)?.[1] ?? "").matchAll(
          /<td><code>([^<]+)<\/code>/g,
        ),
      ].map((m) => m[1]);
    expect(hostsOn(first.html)).toHaveLength(25);
    expect(first.html).toContain("allowed now"); // the default allows the new ones
    const next = /href="(\/manage\/vault\?blockedCursor=[^"#]+)#blocked"/.exec(first.html)?.[1];
    expect(next).toBeTruthy();
    const second = await b.get((next ?? "").replaceAll("&amp;", "&"));
    expect(hostsOn(second.html)).toHaveLength(6);
    expect(new Set([...hostsOn(first.html), ...hostsOn(second.html)]).size).toBe(31);
    expect(second.html).toContain("First page");
    expect(second.html).not.toContain("Next page");
    // Under a block default every refused host offers Allow; allowing one from page 2 stays there.
    await b.submit(`${VAULT}/default`, { default: "block" });
    const blockedPage2 = await b.get((next ?? "").replaceAll("&amp;", "&"));
    const target = hostsOn(blockedPage2.html)[0] ?? "";
    expect(blockedPage2.html).toContain(`name="host" value="${target}"`);
    const cursor = decodeURIComponent(/blockedCursor=([^"#&]+)/.exec(next ?? "")?.[1] ?? "");
    const res = await b.post(`${VAULT}/blocked-hosts/allow`, { host: target, blockedCursor: cursor });
    expect(res.status).toBe(303);
    expect(new URL(res.location ?? "", "http://x").searchParams.get("blockedCursor")).toBe(cursor);
    expect((await apiOf(t).hosts()).find((h) => h.pattern === target)?.action).toBe("allow");
    const bad = await b.get(`${VAULT}?blockedCursor=not-a-cursor`);
    expect(bad.status).toBe(200);
    expect(bad.html).toContain("cursor: not a cursor this API gave");

    const other = await (await loggedIn(await newTenant())).get(VAULT);
    expect(other.html).not.toContain(tag);
    expect(other.html).toContain("No run has been refused a host yet.");
  });
});

describe("vault page: dry run", { timeout: 60_000 }, () => {
  it("shows the run's hosts decided under the change and now, the routing it forces, and saves it", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    expect((await b.get(VAULT)).html).toContain("No runs yet: a dry run replays the hosts a run recorded.");
    const canary = newCanary("dryrun");
    await b.submit(`${VAULT}/secrets`, { name: "API_KEY", value: canary });
    await b.submit(`${VAULT}/rules`, { host: "api.dry.example", secret: "API_KEY", scheme: "bearer" });
    const run = await runWithAudit(t, ["api.dry.example", "pkg.dry.example", "zzz.dry.example"]);
    const page = await b.get(VAULT);
    expect(page.html).toContain(`<option value="${run.id}">`);

    // The default becomes block: pkg and zzz would be refused, api keeps its rule; catch-all.
    const q = new URLSearchParams({ runId: run.id, pattern: "", action: "block", default: "block" });
    const dry = await b.get(`${VAULT}/dry-run?${q}`);
    expect(dry.status).toBe(200);
    const rows = [
      ...dry.html.matchAll(
        /<tr><td><code>([^<]+)<\/code><\/td><td>(.*?)<\/td><td>(.*?)<\/td><td>(.*?)<\/td><\/tr>/g,
      ),
    ].map((m) => [m[1], ...[m[2], m[3], m[4]].map((x) => (x ?? "").replace(/<[^>]+>/g, ""))]);
    expect(rows).toEqual([
      ["pkg.dry.example", "allow, direct", "block", "changed"],
      ["zzz.dry.example", "allow, direct", "block", "changed"],
      [
        "api.dry.example",
        "allow, inject rule #1 (API_KEY), direct",
        "allow, inject rule #1 (API_KEY), direct",
        "—",
      ],
    ]);
    expect(dry.html).toContain("3 hosts recorded, 2 decided differently.");
    const routingText = dry.html.replace(/<[^>]+>/g, "");
    expect(routingText).toContain("Now: default");
    expect(routingText).toContain("With the change: catch-all (The default is block)");
    expect(routingText).toContain("This change switches runs to catch-all routing, which costs:");
    expect(routingText).toContain("must be allowed, or installs fail");
    expect(routingText).toContain("A run already running keeps the routing it started with");
    expect(await apiOf(t).settings()).toMatchObject({ default: "allow" }); // nothing saved yet

    // A host entry alone: only that host changes, routing stays.
    const one = await b.get(
      `${VAULT}/dry-run?${new URLSearchParams({ runId: run.id, pattern: "pkg.dry.example", action: "block", default: "" })}`,
    );
    expect(one.html).toContain("3 hosts recorded, 1 decided differently.");
    expect(one.html).not.toContain("switches runs to catch-all");
    expect(one.html).toContain('<input type="hidden" name="pattern" value="pkg.dry.example"/>');

    // Save this change (from the first dry run): the default is saved through the service.
    const saved = await b.submit(`${VAULT}/dry-run/save`, { default: "block" });
    expect(saved.ok).toBe("Saved: hosts no entry names blocked.");
    expect((await apiOf(t).settings()).default).toBe("block");
    expect(routing(saved.page.html)).toContain("gets catch-all routing");
    const both = await b.submit(`${VAULT}/dry-run/save`, {
      pattern: "pkg.dry.example",
      action: "allow",
      default: "block",
    });
    expect(both.ok).toBe("Saved: allowed pkg.dry.example; hosts no entry names blocked.");
    // Now the same dry run shows pkg allowed under both.
    const after = await b.get(`${VAULT}/dry-run?${q}`);
    expect(after.html).toContain("3 hosts recorded, 0 decided differently.");

    // Refusals come back to the vault page's form, with what was typed.
    const cases: [Record<string, string>, string][] = [
      [{ runId: "", default: "block" }, "Pick a run: the dry run replays the hosts it recorded."],
      [{ runId: run.id, pattern: "", default: "" }, "Nothing to try: give a host entry or a new default."],
      [{ runId: "run_nope", default: "block" }, "No run run_nope."],
      [{ runId: run.id, pattern: "*.com", action: "block" }, '"*.com"'],
      [{ runId: run.id, pattern: "api.dry.example", action: "block" }, "injects a credential"],
    ];
    for (const [fields, error] of cases) {
      const res = await b.get(`${VAULT}/dry-run?${new URLSearchParams(fields)}`);
      expect(res.status, JSON.stringify(fields)).toBe(303);
      const url = new URL(res.location ?? "", "http://x");
      expect(url.pathname).toBe(VAULT);
      expect(url.searchParams.get("error") ?? "").toContain(error);
      const back = await b.get(`${url.pathname}${url.search}`);
      if (fields.runId) expect(back.html).toContain(`value="${fields.runId}"`);
    }
    const refusedSave = await b.submit(`${VAULT}/dry-run/save`, {
      pattern: "api.dry.example",
      action: "block",
    });
    expect(refusedSave.error).toContain("injects a credential for this host");

    // Another tenant cannot dry-run this run: the same answer as no run at all.
    const other = recording(await loggedIn(await newTenant()));
    const foreign = await other.get(
      `${VAULT}/dry-run?${new URLSearchParams({ runId: run.id, default: "block" })}`,
    );
    expect(foreign.status).toBe(303);
    expect(new URL(foreign.location ?? "", "http://x").searchParams.get("error")).toBe(`No run ${run.id}.`);

    const needles = await leakNeedles(canary);
    expect(b.log.flatMap((text, i) => findNeedles(`response ${i}`, text, needles))).toEqual([]);
  });
});

describe("vault page: long lists", { timeout: 60_000 }, () => {
  it("more than 100 host entries are paged 100 at a time", async () => {
    const t = await newTenant();
    const tag = crypto.randomUUID().slice(0, 8);
    const hosts = Array.from({ length: 100 }, (_, i) => `h${String(i).padStart(3, "0")}-${tag}.example`);
    expect((await t.api("POST", "/v1/vault/hosts/from-blocked", { hosts })).status).toBe(200);
    expect((await t.api("POST", "/v1/vault/hosts/starter-pack")).status).toBe(200);
    const total = (await apiOf(t).hosts()).length;
    expect(total).toBeGreaterThan(100);
    const b = await loggedIn(t);
    const rowsOf = (html: string) =>
      (/<section id="hosts">([\s\S]*?)<\/section>/.exec(html)?.[1] ?? "").match(/<tr><td><code>/g)?.length ??
      0;
    const first = await b.get(VAULT);
    expect(rowsOf(first.html)).toBe(100);
    expect(first.html).toContain(`1–100 of ${total}.`);
    expect(first.html).toContain('href="/manage/vault?hostsFrom=100#hosts">Next</a>');
    const second = await b.get(`${VAULT}?hostsFrom=100`);
    expect(rowsOf(second.html)).toBe(total - 100);
    expect(second.html).toContain(`101–${total} of ${total}.`);
    expect(second.html).toContain('href="/manage/vault?hostsFrom=0#hosts">Previous</a>');
    // Nonsense offsets fall back to the first page.
    for (const from of ["-5", "abc", "100000"]) {
      expect(rowsOf((await b.get(`${VAULT}?hostsFrom=${from}`)).html)).toBe(100);
    }
  });
});

describe("vault page: per-host routes", { timeout: 60_000 }, () => {
  it("the form sets an allowed host's route; each row shows it and changes or clears it; a block takes none", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const entries = async () =>
      (await t.api("GET", "/v1/vault/hosts")).json.hosts as {
        id: string;
        pattern: string;
        via: string | null;
      }[];

    const tunnel = await b.submit(`${VAULT}/hosts`, {
      pattern: "home.example",
      action: "allow",
      via: "tunnel",
    });
    expect(tunnel.ok).toBe("Allowed home.example (route: tunnel).");
    const [home] = await entries();
    expect(home).toMatchObject({ pattern: "home.example", via: "tunnel" });
    // The row shows the route (its own form, tunnel selected); routing became catch-all for it.
    expect(tunnel.page.html).toContain(`action="/manage/vault/hosts/${home?.id}"`);
    expect(tunnel.page.html).toMatch(/<option value="tunnel" selected="">tunnel \(your machine\)<\/option>/);
    expect(routing(tunnel.page.html)).toContain("gets catch-all routing");
    expect(routing(tunnel.page.html)).toContain("A host is routed through your own machine (via tunnel)");

    const refused = await b.submit(`${VAULT}/hosts`, {
      pattern: "evil.example",
      action: "block",
      via: "tunnel",
    });
    expect(refused.error).toContain("evil.example is blocked, so it has no route");
    const bad = await b.submit(`${VAULT}/hosts`, { pattern: "x.example", action: "allow", via: "vpn" });
    expect(bad.error).toBe("Pick tunnel, direct or no route.");
    expect((await entries()).map((e) => e.pattern)).toEqual(["home.example"]);

    const direct = await b.submit(`${VAULT}/hosts/${home?.id}`, { via: "direct" });
    expect(direct.ok).toBe("home.example now goes direct.");
    expect((await entries())[0]?.via).toBe("direct");
    const cleared = await b.submit(`${VAULT}/hosts/${home?.id}`, { via: "" });
    expect(cleared.ok).toBe("home.example now goes as the run's egress says.");
    expect((await entries())[0]?.via).toBeNull();
    expect(routing(cleared.page.html)).not.toContain("A host is routed through your own machine");

    await b.submit(`${VAULT}/hosts/${home?.id}`, { via: "tunnel" });
    const blocked = await b.submit(`${VAULT}/hosts/${home?.id}`, { action: "block" });
    expect(blocked.ok).toBe("Blocked home.example.");
    expect((await entries())[0]).toMatchObject({ via: null });
    // A blocked row offers no route.
    expect(blocked.page.html).not.toContain('aria-label="Route of home.example"');
  });
});

describe("vault page: models", { timeout: 60_000 }, () => {
  it("adds models of each provider (defaults shown, openai-compatible needs its URL), deletes; never the key", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    const empty = await b.get(VAULT);
    expect(empty.html).toContain("No models yet.");
    expect(empty.html).toContain("key as a secret first.");
    const canary = newCanary("pagemodel");
    await b.submit(`${VAULT}/secrets`, { name: "MODEL_KEY", value: canary });

    const claude = await b.submit(`${VAULT}/models`, {
      name: "claude-eval",
      provider: "anthropic",
      baseUrl: "",
      upstreamModel: "",
      secret: "MODEL_KEY",
    });
    expect(claude.error).toBeNull();
    expect(claude.ok).toBe("Added the model claude-eval (anthropic, https://api.anthropic.com/v1).");
    expect(claude.page.html).toContain("key as x-api-key, with anthropic-version");

    // openai-compatible without a base URL: the service's code, its words; the form kept (no URL).
    const noUrl = await b.submit(`${VAULT}/models`, {
      name: "router",
      provider: "openai-compatible",
      baseUrl: "",
      secret: "MODEL_KEY",
    });
    expect(noUrl.ok).toBeNull();
    expect(noUrl.error).toContain("needs its API");
    expect(noUrl.page.html).toContain('value="router"');
    expect(noUrl.page.html).toMatch(/<option value="openai-compatible" selected/);
    const router = await b.submit(`${VAULT}/models`, {
      name: "router",
      provider: "openai-compatible",
      baseUrl: "https://OpenRouter.ai/api/v1/",
      upstreamModel: "meta-llama/llama-3-8b-instruct",
      secret: "MODEL_KEY",
    });
    expect(router.ok).toBe("Added the model router (openai-compatible, https://openrouter.ai/api/v1).");
    for (const [fields, error] of [
      [{ name: "has space", provider: "openai", secret: "MODEL_KEY" }, "Give the model a name"],
      [{ name: "x", provider: "openrouter", secret: "MODEL_KEY" }, "Pick a provider"],
      [{ name: "x", provider: "openai", secret: "NOPE" }, "No secret named NOPE"],
      [{ name: "router", provider: "openai", secret: "MODEL_KEY" }, "A model named router exists"],
    ] as const) {
      expect((await b.submit(`${VAULT}/models`, fields)).error).toContain(error);
    }
    const models = (await t.api("GET", "/v1/vault/models")).json.models;
    expect(models.map((m: { name: string; provider: string }) => [m.name, m.provider])).toEqual([
      ["claude-eval", "anthropic"],
      ["router", "openai-compatible"],
    ]);

    const [first] = actionIds(router.page.html, "models");
    const gone = await b.submit(`${VAULT}/models/${first}/delete`, {});
    expect(gone.ok).toBe("Deleted the model claude-eval.");
    expect((await t.api("GET", "/v1/vault/models")).json.models).toHaveLength(1);
    expect((await b.submit(`${VAULT}/models/mdl_doesnotexist/delete`, {})).error).toContain(
      "mdl_doesnotexist",
    );

    // C1: another tenant's model id is no model of this session's.
    const other = await newTenant();
    expect(
      (await other.api("POST", "/v1/vault/secrets", { name: "K", value: newCanary("other") })).status,
    ).toBe(201);
    const theirs = await other.api("POST", "/v1/vault/models", {
      name: "m",
      provider: "openai",
      secret: "K",
    });
    expect((await b.submit(`${VAULT}/models/${theirs.json.id}/delete`, {})).error).toBeTruthy();
    expect((await other.api("GET", `/v1/vault/models/${theirs.json.id}`)).status).toBe(200);

    expect(findNeedles("pages", b.log.join("\n"), await leakNeedles(canary))).toEqual([]);
  });
});
