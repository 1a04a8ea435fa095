import { describe, expect, it } from "vitest";
import { loggedIn } from "./browser";
import { newTenant } from "./harness";
import { apiOf, recording, routing, VAULT } from "./pages-fixtures";
import { auditBatch, newRun, postBatch, runWithAudit } from "./run-fixtures";

// The vault page's host entries beyond adding them (src/pages/vault/hosts.tsx, blocked.tsx): the
// list paged 100 at a time, per-host routes, and the recent blocked hosts list whose "Allow this
// host" writes an entry. Rules and the default are in pages-vault-rules.

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
