import { STARTER_PACK_HOSTS, STARTER_PACK_READ_ONLY } from "@benchwright/shared/policy/starter-pack";
import { describe, expect, it } from "vitest";
import { expectProblem, newTenant } from "./harness";
import { preview, put, rule, secret, version } from "./vault-fixtures";

// Host entries, the default action and its version counter, the starter pack, and the policy
// preview's routing decisions.

const NO_LIMITS = { methods: null, paths: null };

describe("starter pack", () => {
  it("adds every starter host as an explicit allow entry; a second call adds nothing", async () => {
    const t = await newTenant();
    const first = await t.api("POST", "/v1/vault/hosts/starter-pack");
    expect(first.status).toBe(200);
    expect(first.json).toEqual({ added: [...STARTER_PACK_HOSTS], kept: [] });
    const list = (await t.api("GET", "/v1/vault/hosts")).json.hosts;
    expect(list.map((h: { pattern: string }) => h.pattern)).toEqual([...STARTER_PACK_HOSTS].sort());
    for (const h of list) expect(h).toMatchObject({ action: "allow", implicit: false });

    const second = await t.api("POST", "/v1/vault/hosts/starter-pack");
    expect(second.status).toBe(200);
    expect(second.json).toEqual({ added: [], kept: [...STARTER_PACK_HOSTS] });
    expect((await t.api("GET", "/v1/vault/hosts")).json.hosts).toEqual(list);
  });

  it("keeps an existing block entry for one of its hosts as block", async () => {
    const t = await newTenant();
    const blocked = await put(t, "pypi.org", "block");
    const res = await t.api("POST", "/v1/vault/hosts/starter-pack");
    expect(res.json.kept).toEqual(["pypi.org"]);
    expect(res.json.added).toHaveLength(STARTER_PACK_HOSTS.length - 1);
    expect(res.json.added).not.toContain("pypi.org");
    expect((await t.api("GET", `/v1/vault/hosts/${blocked.id}`)).json).toEqual(blocked);
  });

  it("a rule's implicit entry for a starter host becomes explicit, so the host stays allowed after the rule goes", async () => {
    const t = await newTenant();
    await secret(t);
    const r = await rule(t, "api.github.com");
    const res = await t.api("POST", "/v1/vault/hosts/starter-pack");
    expect(res.json.kept).toEqual(["api.github.com"]);
    expect((await t.api("DELETE", `/v1/vault/rules/${r.id}`)).status).toBe(204);
    const entry = (await t.api("GET", "/v1/vault/hosts")).json.hosts.find(
      (h: { pattern: string }) => h.pattern === "api.github.com",
    );
    expect(entry).toMatchObject({ action: "allow", implicit: false });
  });

  it("GET on the starter-pack path is a host-entry read (404 not_found), not the action", async () => {
    const t = await newTenant();
    expectProblem(await t.api("GET", "/v1/vault/hosts/starter-pack"), 404, "not_found");
    expect((await t.api("GET", "/v1/vault/hosts")).json.hosts).toEqual([]);
  });
});

describe("policy preview", () => {
  it("an empty vault: nothing to enforce, with a note saying so", async () => {
    const t = await newTenant();
    const doc = await preview(t);
    expect(doc).toEqual({
      schema: 1,
      version: 0,
      default: "allow",
      routing: { mode: "default", reasons: [] },
      enforce: false,
      note: expect.stringMatching(/without a proxy/),
      egress: "direct",
      hosts: [],
      rules: [],
      model: null,
      hostsFile: [],
    });
  });

  it("allow entries alone leave nothing to enforce", async () => {
    const t = await newTenant();
    await put(t, "allowed.example", "allow");
    await put(t, "*.cdn.example", "allow");
    const doc = await preview(t);
    expect(doc.enforce).toBe(false);
    expect(doc.note).toEqual(expect.any(String));
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
    expect(doc.hostsFile).toEqual([]);
  });

  it("the starter pack's read-only hosts are enforced: redirected by the hosts file, default routing", async () => {
    // case N3: a limited host is never spliced; under default routing it is redirected.
    const t = await newTenant();
    await t.api("POST", "/v1/vault/hosts/starter-pack");
    const doc = await preview(t);
    expect(doc).toMatchObject({ enforce: true, note: null, routing: { mode: "default", reasons: [] } });
    expect(doc.hostsFile).toEqual([...STARTER_PACK_READ_ONLY].sort());
    expect(doc.hosts).toHaveLength(STARTER_PACK_HOSTS.length);
  });

  it("a rule alone: default routing, enforced, its host in the hosts file, no secret value", async () => {
    const t = await newTenant();
    await secret(t);
    await rule(t, "api.example.com");
    const res = await t.api("GET", "/v1/vault/policy-preview");
    expect(res.json).toMatchObject({
      routing: { mode: "default", reasons: [] },
      enforce: true,
      note: null,
      hosts: [{ pattern: "api.example.com", action: "allow" }],
      rules: [
        {
          index: 0,
          host: "api.example.com",
          secret: "KEY",
          inject: { scheme: "bearer", name: "authorization" },
        },
      ],
      hostsFile: ["api.example.com"],
    });
    expect(res.text).not.toContain("value-of-KEY");
  });

  it("hostsFile lists exactly the exact rule hosts and exact block entries, sorted, once each", async () => {
    const t = await newTenant();
    await secret(t);
    await rule(t, "z.example.com");
    await rule(t, "b.example.com");
    await rule(t, "b.example.com");
    await put(t, "tracker.example", "block");
    await put(t, "allowed.example", "allow");
    await put(t, "z.example.com", "allow"); // explicit allow for a rule host: still listed (via the rule)
    await t.api("PATCH", `/v1/vault/hosts/${(await put(t, "limited.example", "allow")).id}`, {
      methods: ["GET"],
    });
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
    // An exact allow entry with limits is listed too (N3); a plain allow entry is not.
    expect(doc.hostsFile).toEqual(["b.example.com", "limited.example", "tracker.example", "z.example.com"]);
  });

  it("block default → catch-all (block_default), no hosts file", async () => {
    const t = await newTenant();
    await put(t, "tracker.example", "block");
    await t.api("PUT", "/v1/vault/settings", { default: "block" });
    const doc = await preview(t);
    expect(doc).toMatchObject({
      default: "block",
      routing: { mode: "catch-all", reasons: ["block_default"] },
      enforce: true,
      note: null,
      hostsFile: [],
    });
  });

  it("a block default alone is something to enforce", async () => {
    const t = await newTenant();
    await t.api("PUT", "/v1/vault/settings", { default: "block" });
    expect(await preview(t)).toMatchObject({ enforce: true, note: null, routing: { mode: "catch-all" } });
  });

  it("a wildcard block entry → catch-all (wildcard_block)", async () => {
    const t = await newTenant();
    await put(t, "*.evil.example", "block");
    await put(t, "tracker.example", "block");
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "catch-all", reasons: ["wildcard_block"] });
    expect(doc.hostsFile).toEqual([]);
    expect(doc.enforce).toBe(true);
  });

  it("a wildcard allow entry alone changes nothing", async () => {
    const t = await newTenant();
    await put(t, "*.cdn.example", "allow");
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
    expect(doc.enforce).toBe(false);
  });

  it("a wildcard rule → catch-all (wildcard_rule)", async () => {
    const t = await newTenant();
    await secret(t);
    await rule(t, "*.internal.example");
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "catch-all", reasons: ["wildcard_rule"] });
    expect(doc.hostsFile).toEqual([]);
  });

  it("an IP-literal block entry → catch-all (ip_literal)", async () => {
    const t = await newTenant();
    await put(t, "203.0.113.7", "block");
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "catch-all", reasons: ["ip_literal"] });
    expect(doc.hostsFile).toEqual([]);
  });

  it("an IP-literal rule → catch-all (ip_literal)", async () => {
    const t = await newTenant();
    await secret(t);
    await rule(t, "[2001:db8::1]");
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "catch-all", reasons: ["ip_literal"] });
  });

  it("an IP-literal allow entry alone changes nothing", async () => {
    const t = await newTenant();
    await put(t, "203.0.113.7", "allow");
    expect((await preview(t)).routing).toEqual({ mode: "default", reasons: [] });
  });

  it("egress=local → catch-all (local_egress), enforced even for an empty vault", async () => {
    const t = await newTenant();
    const doc = await preview(t, "?egress=local");
    expect(doc).toMatchObject({
      routing: { mode: "catch-all", reasons: ["local_egress"] },
      enforce: true,
      note: null,
      hostsFile: [],
    });
    expect(await preview(t, "?egress=direct")).toEqual(await preview(t));
  });

  it("every reason at once, in the contract's order", async () => {
    const t = await newTenant();
    await secret(t);
    await rule(t, "*.internal.example");
    await put(t, "*.evil.example", "block");
    await put(t, "198.51.100.1", "block");
    await t.api("PUT", "/v1/vault/settings", { default: "block" });
    const doc = await preview(t, "?egress=local");
    expect(doc.routing).toEqual({
      mode: "catch-all",
      reasons: ["block_default", "wildcard_block", "wildcard_rule", "ip_literal", "local_egress"],
    });
  });

  it("an unknown query parameter → 400 unknown_field; a bad egress → 400 invalid_request", async () => {
    const t = await newTenant();
    expectProblem(await t.api("GET", "/v1/vault/policy-preview?foo=1"), 400, "unknown_field");
    expectProblem(
      await t.api("GET", "/v1/vault/policy-preview?egress=local&user=usr_x"),
      400,
      "unknown_field",
    );
    expectProblem(await t.api("GET", "/v1/vault/policy-preview?egress=remote"), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/vault/policy-preview?egress="), 400, "invalid_request");
    expectProblem(await t.api("GET", "/v1/vault/policy-preview?egress=LOCAL"), 400, "invalid_request");
    expectProblem(
      await t.api("GET", "/v1/vault/policy-preview?egress=local&egress=direct"),
      400,
      "invalid_request",
    );
  });
});

describe("per-host routes (via)", () => {
  it("an allow entry takes via tunnel or direct; the entry shows it; a POST without via replaces it with none", async () => {
    const t = await newTenant();
    const plain = await put(t, "plain.example.com", "allow");
    expect(plain.via).toBeNull();
    const tunnel = await t.api("POST", "/v1/vault/hosts", {
      pattern: "home.example.com",
      action: "allow",
      via: "tunnel",
    });
    expect(tunnel.status, tunnel.text).toBe(200);
    expect(tunnel.json).toMatchObject({ pattern: "home.example.com", action: "allow", via: "tunnel" });
    expect((await t.api("GET", `/v1/vault/hosts/${tunnel.json.id}`)).json.via).toBe("tunnel");
    const direct = await t.api("POST", "/v1/vault/hosts", {
      pattern: "home.example.com",
      action: "allow",
      via: "direct",
    });
    expect(direct.json).toMatchObject({ id: tunnel.json.id, via: "direct" });
    // POST creates or replaces the entry: no via is no route of its own.
    expect((await put(t, "home.example.com", "allow")).via).toBeNull();
  });

  it("via on a block entry → 400 via_on_block, nothing written; a bad via → 400 invalid_request", async () => {
    const t = await newTenant();
    const before = await version(t);
    const res = expectProblem(
      await t.api("POST", "/v1/vault/hosts", { pattern: "evil.example.com", action: "block", via: "tunnel" }),
      400,
      "via_on_block",
    );
    expect(res.json.detail).toContain("evil.example.com");
    expectProblem(
      await t.api("POST", "/v1/vault/hosts", { pattern: "evil.example.com", action: "allow", via: "vpn" }),
      400,
      "invalid_request",
    );
    expect(await version(t)).toBe(before);
    expect((await t.api("GET", "/v1/vault/hosts")).json.hosts).toEqual([]);

    const blocked = await put(t, "evil.example.com", "block");
    const v = await version(t);
    expectProblem(
      await t.api("PATCH", `/v1/vault/hosts/${blocked.id}`, { via: "direct" }),
      400,
      "via_on_block",
    );
    expectProblem(
      await t.api("PATCH", `/v1/vault/hosts/${blocked.id}`, { action: "block", via: "tunnel" }),
      400,
      "via_on_block",
    );
    expect(await version(t)).toBe(v);
    expect((await t.api("GET", `/v1/vault/hosts/${blocked.id}`)).json).toEqual(blocked);
  });

  it("PATCH sets and clears via (null), keeps it when only the action is sent, and blocking drops it", async () => {
    const t = await newTenant();
    const e = await put(t, "x.example.com", "allow");
    const patch = async (body: unknown) => {
      const res = await t.api("PATCH", `/v1/vault/hosts/${e.id}`, body);
      expect(res.status, res.text).toBe(200);
      return res.json;
    };
    expect(await patch({ via: "tunnel" })).toMatchObject({ action: "allow", via: "tunnel" });
    expect(await patch({ action: "allow" })).toMatchObject({ action: "allow", via: "tunnel" });
    expect(await patch({ via: null })).toMatchObject({ action: "allow", via: null });
    expect(await patch({ via: "direct" })).toMatchObject({ via: "direct" });
    expect(await patch({ action: "block" })).toMatchObject({ action: "block", via: null });
    // Allowing again does not bring the old route back; allowing with one sets it.
    expect(await patch({ action: "allow" })).toMatchObject({ action: "allow", via: null });
    expect(await patch({ action: "allow", via: "tunnel" })).toMatchObject({ via: "tunnel" });
    expectProblem(await t.api("PATCH", `/v1/vault/hosts/${e.id}`, {}), 400, "invalid_request");
    expectProblem(await t.api("PATCH", `/v1/vault/hosts/${e.id}`, { via: "vpn" }), 400, "invalid_request");
  });

  it("allowing a refused host keeps an allow entry's route (from-blocked)", async () => {
    const t = await newTenant();
    const e = await t.api("POST", "/v1/vault/hosts", {
      pattern: "a.example.com",
      action: "allow",
      via: "tunnel",
    });
    const res = await t.api("POST", "/v1/vault/hosts/from-blocked", { hosts: ["a.example.com"] });
    expect(res.status, res.text).toBe(200);
    expect((await t.api("GET", `/v1/vault/hosts/${e.json.id}`)).json.via).toBe("tunnel");
  });

  it("a tunnel host → catch-all (tunnel_host), enforced even alone; the preview carries each entry's via", async () => {
    const t = await newTenant();
    await t.api("POST", "/v1/vault/hosts", { pattern: "home.example.com", action: "allow", via: "tunnel" });
    await t.api("POST", "/v1/vault/hosts", { pattern: "cdn.example.com", action: "allow", via: "direct" });
    await put(t, "plain.example.com", "allow");
    const doc = await preview(t);
    expect(doc).toMatchObject({
      routing: { mode: "catch-all", reasons: ["tunnel_host"] },
      enforce: true,
      note: null,
      egress: "direct",
      hostsFile: [],
    });
    expect(doc.hosts).toEqual([
      { pattern: "cdn.example.com", action: "allow", via: "direct", ...NO_LIMITS },
      { pattern: "home.example.com", action: "allow", via: "tunnel", ...NO_LIMITS },
      { pattern: "plain.example.com", action: "allow", ...NO_LIMITS },
    ]);
    // Under local egress the run's own reason says it all.
    expect((await preview(t, "?egress=local")).routing).toEqual({
      mode: "catch-all",
      reasons: ["local_egress"],
    });
  });

  it("a direct route alone changes nothing: default routing, nothing to enforce", async () => {
    const t = await newTenant();
    await t.api("POST", "/v1/vault/hosts", { pattern: "cdn.example.com", action: "allow", via: "direct" });
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
    expect(doc.enforce).toBe(false);
  });

  it("switching the tunnel host to block leaves default routing again (its via went with it)", async () => {
    const t = await newTenant();
    const e = await t.api("POST", "/v1/vault/hosts", {
      pattern: "home.example.com",
      action: "allow",
      via: "tunnel",
    });
    expect((await preview(t)).routing.reasons).toEqual(["tunnel_host"]);
    await t.api("PATCH", `/v1/vault/hosts/${e.json.id}`, { action: "block" });
    const doc = await preview(t);
    expect(doc.routing).toEqual({ mode: "default", reasons: [] });
    expect(doc.hosts).toEqual([{ pattern: "home.example.com", action: "block", ...NO_LIMITS }]);
    expect(doc.hostsFile).toEqual(["home.example.com"]);
  });
});
