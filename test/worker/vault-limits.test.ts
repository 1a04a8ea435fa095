import { STARTER_PACK_READ_ONLY } from "@benchwright/shared/policy/starter-pack";
import { describe, expect, it } from "vitest";
import { expectProblem, newTenant, type Tenant } from "./harness";
import { addRule, entryFor, hosts, preview, put, tenantWithSecret, version } from "./vault-fixtures";

// Method and path limits of rules and host entries, and rules' placeholder variables, over the
// API: what is saved and shown, what is refused (with its code, nothing written), and what the
// compiled policy carries to the run's proxy (the preview) and the coordinator.

async function noChange(t: Tenant, before: number) {
  expect(await version(t)).toBe(before);
}

describe("rules: placeholder variables", () => {
  it("absent: the secret's name made portable; a chosen name; null is none; body opt-in", async () => {
    // case N1: the variable a rule's secret's placeholder goes in is the vault's to say.
    const t = await tenantWithSecret("openrouter.key", "GH");
    const byDefault = await addRule(t, "openrouter.ai", "openrouter.key");
    expect(byDefault).toMatchObject({ placeholderEnv: "openrouter_key", placeholderIn: [] });
    const chosen = await addRule(t, "api.github.com", "GH", {
      placeholderEnv: "GITHUB_TOKEN",
      placeholderIn: ["body"],
    });
    expect(chosen).toMatchObject({ placeholderEnv: "GITHUB_TOKEN", placeholderIn: ["body"] });
    const none = await addRule(t, "uploads.github.com", "GH", { placeholderEnv: null });
    expect(none.placeholderEnv).toBeNull();

    const doc = await preview(t);
    expect(
      doc.rules.map((r: { placeholderEnv: string | null; placeholderIn: string[] }) => [
        r.placeholderEnv,
        r.placeholderIn,
      ]),
    ).toEqual([
      ["openrouter_key", []],
      ["GITHUB_TOKEN", ["body"]],
      [null, []],
    ]);
  });

  it("update: a name set, then none, then a name again; an omitted field keeps what is stored", async () => {
    const t = await tenantWithSecret();
    const r = await addRule(t, "api.example.com");
    expect(r.placeholderEnv).toBe("KEY");
    const named = await t.api("PATCH", `/v1/vault/rules/${r.id}`, { placeholderEnv: "MY_KEY" });
    expect(named.status, named.text).toBe(200);
    expect(named.json.placeholderEnv).toBe("MY_KEY");
    const moved = await t.api("PATCH", `/v1/vault/rules/${r.id}`, { host: "api2.example.com" });
    expect(moved.json).toMatchObject({ host: "api2.example.com", placeholderEnv: "MY_KEY" });
    const none = await t.api("PATCH", `/v1/vault/rules/${r.id}`, { placeholderEnv: null });
    expect(none.json.placeholderEnv).toBeNull();
    const again = await t.api("PATCH", `/v1/vault/rules/${r.id}`, { placeholderEnv: "KEY" });
    expect(again.json.placeholderEnv).toBe("KEY");
  });

  it("a secret whose portable name is the platform's gets no default variable", async () => {
    const t = await tenantWithSecret("bw-token");
    const r = await addRule(t, "api.example.com", "bw-token");
    expect(r.placeholderEnv).toBeNull();
    expect((await preview(t)).rules[0].placeholderEnv).toBeNull();
  });

  it.each([
    ["PATH", "the platform's"],
    ["HTTPS_PROXY", "the platform's"],
    ["BW_X", "the platform's"],
    ["ld_preload", "the platform's"],
    ["1KEY", "not starting with a digit"],
    ["MY-KEY", "letters, digits and _"],
  ])("placeholderEnv %j → 400 invalid_placeholder_env, nothing written", async (env, why) => {
    // case N1: a placeholder under a platform variable would break the wiring or the CA trust.
    const t = await tenantWithSecret();
    const before = await version(t);
    const res = await t.api("POST", "/v1/vault/rules", {
      host: "api.example.com",
      secret: "KEY",
      inject: { scheme: "bearer" },
      placeholderEnv: env,
    });
    expectProblem(res, 400, "invalid_placeholder_env");
    expect(res.json.detail).toContain(why);
    expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
    await noChange(t, before);
  });

  it("placeholderIn other than body → 400 invalid_request", async () => {
    const t = await tenantWithSecret();
    const r = await addRule(t, "api.example.com");
    expectProblem(
      await t.api("PATCH", `/v1/vault/rules/${r.id}`, { placeholderIn: ["query"] }),
      400,
      "invalid_request",
    );
    const reserved = await t.api("PATCH", `/v1/vault/rules/${r.id}`, { placeholderEnv: "PATH" });
    expectProblem(reserved, 400, "invalid_placeholder_env");
    expect((await t.api("GET", `/v1/vault/rules/${r.id}`)).json).toEqual(r);
  });
});

describe("rules: method and path limits", () => {
  it("saved in the contract's grammar (methods uppercased, once each), shown, updated, cleared", async () => {
    // case N3: a rule's limits reach the run's proxy through the compiled policy.
    const t = await tenantWithSecret();
    const r = await addRule(t, "api.example.com", "KEY", {
      methods: ["get", "HEAD", "GET"],
      paths: ["/repos/acme/", "/v1/*/items"],
    });
    expect(r).toMatchObject({ methods: ["GET", "HEAD"], paths: ["/repos/acme/", "/v1/*/items"] });
    expect((await t.api("GET", "/v1/vault/rules")).json.rules[0]).toEqual(r);
    const doc = await preview(t);
    expect(doc.rules[0]).toMatchObject({ methods: ["GET", "HEAD"], paths: ["/repos/acme/", "/v1/*/items"] });
    // The rule's implicit allow entry carries no limits of its own.
    expect(await entryFor(t, "api.example.com")).toMatchObject({
      implicit: true,
      methods: null,
      paths: null,
    });
    expect(doc.hosts[0]).toMatchObject({ pattern: "api.example.com", methods: null, paths: null });

    const patched = await t.api("PATCH", `/v1/vault/rules/${r.id}`, { methods: ["POST"] });
    expect(patched.json).toMatchObject({ methods: ["POST"], paths: ["/repos/acme/", "/v1/*/items"] });
    const cleared = await t.api("PATCH", `/v1/vault/rules/${r.id}`, { methods: null, paths: null });
    expect(cleared.json).toMatchObject({ methods: null, paths: null });
    expect((await preview(t)).rules[0]).toMatchObject({ methods: null, paths: null });
  });

  it.each([
    ["a method that is not a token", { methods: ["GE T"] }, "methods"],
    ["an empty method list (null is no limit)", { methods: [] }, "null is no limit"],
    ["a path with ..", { paths: ["/repos/../admin"] }, ". or .. segment"],
    ["a path with an encoded byte", { paths: ["/a%2fb"] }, "no ? # %"],
    ["a path with //", { paths: ["/a//b"] }, "empty segment"],
    ["a relative path", { paths: ["repos"] }, "starts with /"],
  ])("%s → 400 invalid_limit, nothing written", async (_title, limits, why) => {
    // case N4: a limit names normalised paths only, so none can be written to step outside it.
    const t = await tenantWithSecret();
    const before = await version(t);
    const res = await t.api("POST", "/v1/vault/rules", {
      host: "api.example.com",
      secret: "KEY",
      inject: { scheme: "bearer" },
      ...limits,
    });
    expectProblem(res, 400, "invalid_limit");
    expect(res.json.detail).toContain(why);
    expect((await t.api("GET", "/v1/vault/rules")).json.rules).toEqual([]);
    expect(await hosts(t)).toEqual([]);
    await noChange(t, before);
  });
});

describe("host entries: method and path limits", () => {
  it("an allow entry takes them; PATCH changes one and keeps the other; null clears", async () => {
    // case N3: a limited allowed host is redirected under default routing (its exact name in the
    // hosts file), so the proxy can hold it to the limits.
    const t = await newTenant();
    const res = await t.api("POST", "/v1/vault/hosts", {
      pattern: "api.github.com",
      action: "allow",
      methods: ["GET", "head"],
      paths: ["/repos/"],
    });
    expect(res.status, res.text).toBe(200);
    expect(res.json).toMatchObject({ methods: ["GET", "HEAD"], paths: ["/repos/"], via: null });
    const doc = await preview(t);
    expect(doc.hosts).toEqual([
      { pattern: "api.github.com", action: "allow", methods: ["GET", "HEAD"], paths: ["/repos/"] },
    ]);
    expect(doc).toMatchObject({ enforce: true, routing: { mode: "default" }, hostsFile: ["api.github.com"] });

    const patched = await t.api("PATCH", `/v1/vault/hosts/${res.json.id}`, { paths: ["/orgs/", "/repos/"] });
    expect(patched.json).toMatchObject({ methods: ["GET", "HEAD"], paths: ["/orgs/", "/repos/"] });
    const viaOnly = await t.api("PATCH", `/v1/vault/hosts/${res.json.id}`, { via: "direct" });
    expect(viaOnly.json).toMatchObject({ via: "direct", methods: ["GET", "HEAD"] });
    const cleared = await t.api("PATCH", `/v1/vault/hosts/${res.json.id}`, { methods: null });
    expect(cleared.json).toMatchObject({ methods: null, paths: ["/orgs/", "/repos/"] });
    // POST replaces the entry: limits it does not give are none.
    const replaced = await put(t, "api.github.com", "allow");
    expect(replaced).toMatchObject({ methods: null, paths: null });
  });

  it("a wildcard allow entry with a limit brings catch-all routing (wildcard_limit)", async () => {
    const t = await newTenant();
    const res = await t.api("POST", "/v1/vault/hosts", {
      pattern: "*.githubusercontent.com",
      action: "allow",
      methods: ["GET"],
    });
    expect(res.status, res.text).toBe(200);
    expect((await preview(t)).routing).toEqual({ mode: "catch-all", reasons: ["wildcard_limit"] });
  });

  it("limits on a block entry → 400 limits_on_block (POST and PATCH), nothing written; blocking drops them", async () => {
    const t = await newTenant();
    const before = await version(t);
    const post = await t.api("POST", "/v1/vault/hosts", {
      pattern: "evil.example",
      action: "block",
      paths: ["/x"],
    });
    expectProblem(post, 400, "limits_on_block");
    expect(await hosts(t)).toEqual([]);
    await noChange(t, before);

    const allowed = await t.api("POST", "/v1/vault/hosts", {
      pattern: "evil.example",
      action: "allow",
      methods: ["GET"],
    });
    expect(allowed.status).toBe(200);
    const id = allowed.json.id;
    expectProblem(
      await t.api("PATCH", `/v1/vault/hosts/${id}`, { action: "block", methods: ["GET"] }),
      400,
      "limits_on_block",
    );
    expect((await t.api("GET", `/v1/vault/hosts/${id}`)).json).toEqual(allowed.json);
    const blocked = await t.api("PATCH", `/v1/vault/hosts/${id}`, { action: "block" });
    expect(blocked.json).toMatchObject({ action: "block", methods: null, paths: null });
    expectProblem(await t.api("PATCH", `/v1/vault/hosts/${id}`, { paths: ["/a"] }), 400, "limits_on_block");
  });

  it.each([
    [{ methods: ["GET\r\nX"] }, "methods"],
    [{ paths: ["/a/./b"] }, ". or .. segment"],
    [{ paths: ["/a?b"] }, "no ? # %"],
  ])("%j on an allow entry → 400 invalid_limit, nothing written", async (limits, why) => {
    const t = await newTenant();
    const before = await version(t);
    const res = await t.api("POST", "/v1/vault/hosts", {
      pattern: "api.example.com",
      action: "allow",
      ...limits,
    });
    expectProblem(res, 400, "invalid_limit");
    expect(res.json.detail).toContain(why);
    expect(await hosts(t)).toEqual([]);
    await noChange(t, before);
  });

  it("the starter pack allows its source hosts read-only (GET, HEAD) and the rest unlimited", async () => {
    const t = await newTenant();
    expect((await t.api("POST", "/v1/vault/hosts/starter-pack")).status).toBe(200);
    const list = await hosts(t);
    for (const h of list as unknown as { pattern: string; methods: string[] | null; paths: null }[]) {
      expect(h.methods, h.pattern).toEqual(STARTER_PACK_READ_ONLY.has(h.pattern) ? ["GET", "HEAD"] : null);
      expect(h.paths).toBeNull();
    }
    // github.com stays unlimited: git over https fetches with POST.
    expect(await entryFor(t, "github.com")).toMatchObject({ methods: null });
    expect(await entryFor(t, "api.github.com")).toMatchObject({ methods: ["GET", "HEAD"] });
    // The limited hosts come to the proxy by the hosts file.
    const doc = await preview(t);
    expect(doc.routing.mode).toBe("default");
    expect([...doc.hostsFile].sort()).toEqual([...STARTER_PACK_READ_ONLY].sort());
  });
});
