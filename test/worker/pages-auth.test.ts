import { eq } from "drizzle-orm";
import { describe, expect, it } from "vitest";
import { provisionApiKey } from "../../src/auth/provision";
import { randomId } from "../../src/crypto/api-keys";
import { apiKeys, sessions } from "../../src/db/schema";
import { type Browser, loggedIn, newBrowser } from "./browser";
import { newTenant, type Tenant, withDb } from "./harness";

// Logging in to the pages with an API key, the session cookie, CSRF on every form, logout and
// key revocation ending sessions, and the pages' headers (src/pages/routes.tsx,
// src/auth/session.ts), through the real Worker and Postgres.

const VAULT = "/manage/vault";

async function secretNames(t: Tenant): Promise<string[]> {
  const res = await t.api("GET", "/v1/vault/secrets");
  expect(res.status).toBe(200);
  return res.json.secrets.map((s: { name: string }) => s.name);
}

function sessionCookie(set: string | null): string {
  expect(set, "a Set-Cookie header").toBeTruthy();
  return set ?? "";
}

describe("pages: logging in", { timeout: 60_000 }, () => {
  it("GET /manage/vault without a session → 303 to the login page, which comes back here", async () => {
    const b = newBrowser();
    const res = await b.get(VAULT);
    expect(res.status).toBe(303);
    expect(res.location).toBe("/login?next=%2Fmanage%2Fvault");
    const login = await b.get(res.location ?? "");
    expect(login.status).toBe(200);
    expect(login.html).toContain('name="next" value="/manage/vault"');
    expect(login.html).toContain('type="password" name="key"');
  });

  it("a bad key → 401 and no cookie; a revoked-looking or empty key too", async () => {
    const t = await newTenant();
    for (const key of ["bw_not-a-key", `${t.key}x`, "", "   "]) {
      const b = newBrowser();
      const res = await b.post("/login", { key, next: VAULT });
      expect(res.status, key).toBe(401);
      expect(res.headers.get("set-cookie"), key).toBeNull();
      expect(b.cookie).toBeNull();
      expect(res.html).toContain("not valid");
      // The key typed is not written back into the page.
      if (key.length > 3) expect(res.html).not.toContain(key);
    }
  });

  it("a good key → 303 to next with an HttpOnly, SameSite=Strict session cookie; the page then opens", async () => {
    const t = await newTenant();
    const b = newBrowser();
    const res = await b.post("/login", { key: t.key, next: "/manage/vault?ok=hello" });
    expect(res.status).toBe(303);
    expect(res.location).toBe("/manage/vault?ok=hello");
    const set = sessionCookie(res.headers.get("set-cookie"));
    expect(set).toMatch(/^bw_session=[A-Za-z0-9_-]{43};/);
    expect(set).toMatch(/;\s*HttpOnly/i);
    expect(set).toMatch(/;\s*SameSite=Strict/i);
    expect(set).toMatch(/;\s*Path=\//i);
    // The cookie carries a random token, not the API key.
    expect(set).not.toContain(t.key);
    const page = await b.get(VAULT);
    expect(page.status).toBe(200);
    expect(page.html).toContain("<h1>Vault</h1>");
    expect(page.html).not.toContain(t.key);
  });

  it("next that leaves the site (//host, a URL, a backslash trick) → /manage/vault", async () => {
    const t = await newTenant();
    for (const next of [
      "//evil.example/x",
      "https://evil.example",
      "/\\evil.example",
      "\\\\evil.example",
      "javascript:alert(1)",
      "",
    ]) {
      const res = await newBrowser().post("/login", { key: t.key, next });
      expect(res.status, next).toBe(303);
      expect(res.location, next).toBe("/manage/vault");
      expect(res.headers.get("location"), next).toBe("/manage/vault");
    }
    // And the login page does not carry such a next into its form.
    const login = await newBrowser().get("/login?next=%2F%2Fevil.example%2Fx");
    expect(login.html).toContain('name="next" value="/manage/vault"');
  });
});

describe("pages: CSRF", { timeout: 60_000 }, () => {
  it("a POST without _csrf or with a wrong one → 403 and nothing written", async () => {
    const t = await newTenant();
    const b = await loggedIn(t);
    const good = b.csrf ?? "";
    expect(good).toMatch(/^[0-9a-f]{64}$/);
    const other = await loggedIn(await newTenant());
    for (const csrf of [null, "", "0".repeat(64), other.csrf ?? "", good.slice(0, 63), `${good}0`]) {
      const fields: Record<string, string> = { name: "FORGED", value: "forged-value-1" };
      if (csrf !== null) fields._csrf = csrf;
      const res = await b.post(`${VAULT}/secrets`, csrf === null ? { ...fields, _csrf: [] } : fields);
      expect(res.status, String(csrf)).toBe(403);
      expect(res.html).not.toContain("forged-value-1");
    }
    expect(await secretNames(t)).toEqual([]);
    // The same form with the session's token goes through.
    const ok = await b.post(`${VAULT}/secrets`, { name: "REAL", value: "real-value-1" });
    expect(ok.status).toBe(303);
    expect(await secretNames(t)).toEqual(["REAL"]);
  });

  it("a POST with no session at all → 401, nothing written", async () => {
    const t = await newTenant();
    const stranger = newBrowser();
    const res = await stranger.post(`${VAULT}/secrets`, { name: "X", value: "y", _csrf: "0".repeat(64) });
    expect(res.status).toBe(401);
    expect(await secretNames(t)).toEqual([]);
  });
});

describe("pages: ending a session", { timeout: 60_000 }, () => {
  async function stillIn(b: Browser, cookie: string): Promise<boolean> {
    b.cookie = cookie;
    const res = await b.get(VAULT);
    return res.status === 200;
  }

  it("logout ends the session: the old cookie no longer opens a page or posts a form", async () => {
    const t = await newTenant();
    const b = await loggedIn(t);
    const cookie = b.cookie ?? "";
    const csrf = b.csrf ?? "";
    const out = await b.post("/logout", {});
    expect(out.status).toBe(303);
    expect(out.location).toBe("/login");
    expect(out.headers.get("set-cookie")).toMatch(/^bw_session=;/);
    // A copy of the old cookie (a stolen one, say) is dead too: the session ended on the server.
    expect(await stillIn(b, cookie)).toBe(false);
    b.cookie = cookie;
    const res = await b.post(`${VAULT}/secrets`, { name: "AFTER", value: "after-value", _csrf: csrf });
    expect(res.status).toBe(401);
    expect(await secretNames(t)).toEqual([]);
  });

  it("revoking the API key ends every session it opened", async () => {
    const t = await newTenant();
    const one = await loggedIn(t);
    const two = await loggedIn(t);
    expect(await stillIn(one, one.cookie ?? "")).toBe(true);
    await withDb((db) =>
      db.update(apiKeys).set({ revokedAt: new Date() }).where(eq(apiKeys.userId, t.userId)),
    );
    for (const b of [one, two]) {
      const res = await b.get(VAULT);
      expect(res.status).toBe(303);
      expect(res.location).toBe("/login?next=%2Fmanage%2Fvault");
    }
    // And the key cannot open a new one.
    expect((await newBrowser().post("/login", { key: t.key, next: VAULT })).status).toBe(401);
  });
});

describe("pages: headers", { timeout: 60_000 }, () => {
  it("every page is sent with a strict CSP (no script), nosniff, no-store", async () => {
    const t = await newTenant();
    const b = await loggedIn(t);
    const pages = [await newBrowser().get("/login"), await b.get(VAULT), await newBrowser().get(VAULT)];
    for (const res of pages) {
      const csp = res.headers.get("content-security-policy") ?? "";
      expect(csp).toContain("default-src 'none'");
      expect(csp).not.toContain("script-src");
      expect(csp).toContain("frame-ancestors 'none'");
      expect(csp).toContain("form-action 'self'");
      expect(res.headers.get("x-content-type-options")).toBe("nosniff");
      expect(res.headers.get("cache-control")).toBe("no-store");
      expect(res.html).not.toMatch(/<script/i);
    }
  });
});

describe("case K1: the login form and every form refuse a cross-site POST", { timeout: 60_000 }, () => {
  const CROSS_SITE: Array<[string, { origin?: string | null; secFetchSite?: string | null }]> = [
    ["no Origin, Sec-Fetch-Site: cross-site", { origin: null, secFetchSite: "cross-site" }],
    ["a foreign Origin", { origin: "https://evil.example", secFetchSite: null }],
    [
      "a foreign Origin, Sec-Fetch-Site: cross-site",
      { origin: "https://evil.example", secFetchSite: "cross-site" },
    ],
    [
      "a foreign Origin claiming same-origin",
      { origin: "https://evil.example", secFetchSite: "same-origin" },
    ],
    ["Origin: null (a sandboxed frame)", { origin: "null", secFetchSite: null }],
    ["our Origin but Sec-Fetch-Site: same-site", { secFetchSite: "same-site" }],
    ["neither header", { origin: null, secFetchSite: null }],
  ];

  it("case K1: a cross-site login POST with a good key → 403, no cookie, no session opened", async () => {
    const t = await newTenant();
    for (const [what, site] of CROSS_SITE) {
      const b = newBrowser();
      const res = await b.post("/login", { key: t.key, next: VAULT }, site);
      expect(res.status, what).toBe(403);
      expect(res.headers.get("set-cookie"), what).toBeNull();
      expect(b.cookie, what).toBeNull();
      expect(res.html, what).not.toContain(t.key);
    }
    const opened = await withDb((db) =>
      db
        .select()
        .from(sessions)
        .innerJoin(apiKeys, eq(apiKeys.id, sessions.apiKeyId))
        .where(eq(apiKeys.userId, t.userId)),
    );
    expect(opened).toEqual([]);
    // The same POST from our own page (Origin ours; or only Sec-Fetch-Site: same-origin) logs in.
    expect((await newBrowser().post("/login", { key: t.key, next: VAULT })).status).toBe(303);
    const bare = await newBrowser().post("/login", { key: t.key, next: VAULT }, { origin: null });
    expect(bare.status).toBe(303);
  });

  it("case K1: a cross-site POST of a signed-in form (with the right CSRF token) → 403, nothing written", async () => {
    const t = await newTenant();
    const b = await loggedIn(t);
    for (const [what, site] of CROSS_SITE) {
      const res = await b.post(`${VAULT}/secrets`, { name: "CROSS", value: "cross-value-1" }, site);
      expect(res.status, what).toBe(403);
    }
    expect(await secretNames(t)).toEqual([]);
    const out = await b.post("/logout", {}, { origin: "https://evil.example" });
    expect(out.status).toBe(403);
    expect((await b.get(VAULT)).status).toBe(200);
  });

  it("case K1: every page's header shows the signed-in account and environment", async () => {
    const email = `${randomId("k1_")}@tenants.test`;
    const made = await withDb((db) => provisionApiKey(db, { email, environment: "staging-k1" }));
    const t = await newTenant();
    const b = newBrowser();
    expect((await b.post("/login", { key: made.key, next: VAULT })).status).toBe(303);
    for (const path of [VAULT, "/runs", "/runs/run_doesnotexist"]) {
      const page = await b.get(path);
      const header = /<header>([\s\S]*?)<\/header>/.exec(page.html)?.[1] ?? "";
      expect(header, path).toContain(email);
      expect(header, path).toContain("staging-k1");
      expect(header, path).not.toContain(made.key);
    }
    // Another user's browser shows theirs, never this one's; the login page shows nobody.
    const other = await loggedIn(t);
    const theirs = await other.get(VAULT);
    expect(theirs.html).not.toContain(email);
    expect((await newBrowser().get("/login")).html).not.toContain("Signed in as");
  });
});
