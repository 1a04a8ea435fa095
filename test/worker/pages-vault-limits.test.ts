import { describe, expect, it } from "vitest";
import { loggedIn } from "./browser";
import { newTenant } from "./harness";
import { recording, VAULT } from "./pages-fixtures";

// The vault page's placeholder variables and method and path limits (src/pages/vault/rules.tsx,
// hosts.tsx) through the real Worker and Postgres: saved as the API saves them, shown in the
// tables, and the service's refusals as the form's flash with the fields kept.

describe("vault page: limits and placeholder variables", { timeout: 60_000 }, () => {
  it("a rule's variable and limits, a host's limits; refusals are the flash", async () => {
    const t = await newTenant();
    const b = recording(await loggedIn(t));
    await b.submit(`${VAULT}/secrets`, { name: "gh-token", value: "gh-value-1" });
    // case N3: the page saves a rule's limits as the API does (methods uppercased).
    const rule = await b.submit(`${VAULT}/rules`, {
      host: "api.github.example",
      secret: "gh-token",
      scheme: "bearer",
      placeholderEnv: "GITHUB_TOKEN",
      placeholderBody: "1",
      methods: "get, HEAD",
      paths: "/repos/acme/\n/orgs/acme",
    });
    expect(rule.error).toBeNull();
    const [saved] = (await t.api("GET", "/v1/vault/rules")).json.rules;
    expect(saved).toMatchObject({
      placeholderEnv: "GITHUB_TOKEN",
      placeholderIn: ["body"],
      methods: ["GET", "HEAD"],
      paths: ["/repos/acme/", "/orgs/acme"],
    });
    expect(rule.page.html).toContain("<code>GITHUB_TOKEN</code>");
    expect(rule.page.html).toContain("<code>GET HEAD</code>");

    // The edit page: a blank variable goes back to the default (the secret's name made portable).
    const edited = await b.submit(`${VAULT}/rules/${saved.id}`, {
      host: "api.github.example",
      secret: "gh-token",
      scheme: "bearer",
      placeholderEnv: "",
      methods: "",
      paths: "/repos/acme/",
    });
    expect(edited.error).toBeNull();
    expect((await t.api("GET", `/v1/vault/rules/${saved.id}`)).json).toMatchObject({
      placeholderEnv: "gh_token",
      placeholderIn: [],
      methods: null,
      paths: ["/repos/acme/"],
    });

    // case N1: a platform variable is refused, the fields kept for the retry.
    const reserved = await b.post(`${VAULT}/rules`, {
      host: "b.github.example",
      secret: "gh-token",
      scheme: "bearer",
      placeholderEnv: "HTTPS_PROXY",
    });
    expect(reserved.status).toBe(303);
    const back = new URL(reserved.location ?? "", "http://x");
    expect(back.searchParams.get("error")).toContain("platform's");
    expect(back.searchParams.get("ruleEnv")).toBe("HTTPS_PROXY");

    const host = await b.submit(`${VAULT}/hosts`, {
      pattern: "pypi.example",
      action: "allow",
      via: "",
      methods: "GET,HEAD",
      paths: "",
    });
    expect(host.ok).toBe("Allowed pypi.example (GET, HEAD).");
    const entry = (await t.api("GET", "/v1/vault/hosts")).json.hosts.find(
      (h: { pattern: string }) => h.pattern === "pypi.example",
    );
    const limited = await b.submit(`${VAULT}/hosts/${entry.id}/limits`, {
      methods: "GET",
      paths: "/simple/",
    });
    expect(limited.ok).toBe("pypi.example (GET; paths /simple/).");
    expect(limited.page.html).toContain('value="/simple/"');

    // case N4: a path with .. is refused by the service, nothing changes.
    const dotdot = await b.submit(`${VAULT}/hosts/${entry.id}/limits`, { methods: "GET", paths: "/a/../b" });
    expect(dotdot.error).toContain(". or .. segment");
    const blocked = await b.submit(`${VAULT}/hosts`, {
      pattern: "evil.example",
      action: "block",
      methods: "GET",
    });
    expect(blocked.error).toContain("only an allowed host may carry them");
    expect((await t.api("GET", `/v1/vault/hosts/${entry.id}`)).json).toMatchObject({
      methods: ["GET"],
      paths: ["/simple/"],
    });
  });
});
