import { describe, expect, it } from "vitest";
import { api, cli, loggedIn } from "./harness";

// The vault from the command line: rules, host entries, the default, the starter pack, the
// preview and the dry run, each checked against what the API then holds.

const json = async (key: string, path: string) => JSON.parse((await api(key, path)).text);

describe("vault rules", () => {
  it("adds a rule for a secret, lists it in order, and removes it by host", async () => {
    const user = await loggedIn();
    await cli(["vault", "secrets", "set", "SVC_TOKEN"], { home: user.home, input: "cli-rule-value" });
    const added = await cli(["vault", "rules", "add", "api.svc.test", "--secret", "SVC_TOKEN", "--json"], {
      home: user.home,
    });
    expect(added.code, added.stderr).toBe(0);
    const rule = JSON.parse(added.stdout);
    expect(rule).toMatchObject({ host: "api.svc.test", secret: "SVC_TOKEN", inject: { scheme: "bearer" } });
    expect((await json(user.key, "/v1/vault/rules")).rules.map((r: { id: string }) => r.id)).toEqual([
      rule.id,
    ]);

    const listed = await cli(["vault", "rules", "list"], { home: user.home });
    expect(listed.stdout).toMatch(/^#\s+HOST\s+SECRET\s+INJECT/);
    expect(listed.stdout).toContain("bearer (authorization)");

    // raw and query need the header's or parameter's name: refused before anything is sent.
    const noName = await cli(
      ["vault", "rules", "add", "x.svc.test", "--secret", "SVC_TOKEN", "--inject", "raw"],
      {
        home: user.home,
      },
    );
    expect(noName.code).toBe(2);
    expect(noName.stderr).toContain("--name");

    const removed = await cli(["vault", "rules", "remove", "api.svc.test"], { home: user.home });
    expect(removed.code, removed.stderr).toBe(0);
    expect((await json(user.key, "/v1/vault/rules")).rules).toEqual([]);
  });

  it("passes the API's refusal of a rule for a secret that does not exist through (exit 1)", async () => {
    const user = await loggedIn();
    const res = await cli(["vault", "rules", "add", "api.svc.test", "--secret", "NOPE"], { home: user.home });
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(/^benchwright: [a-z_]+: /);
  });
});

describe("vault hosts", () => {
  it("allows, blocks, lists, promotes and removes host entries", async () => {
    const user = await loggedIn();
    const allowed = await cli(["vault", "hosts", "allow", "a.svc.test", "*.cdn.test", "--via", "direct"], {
      home: user.home,
    });
    expect(allowed.code, allowed.stderr).toBe(0);
    const blocked = await cli(["vault", "hosts", "block", "evil.test"], { home: user.home });
    expect(blocked.code, blocked.stderr).toBe(0);
    const hosts = (await json(user.key, "/v1/vault/hosts")).hosts as {
      pattern: string;
      action: string;
      via: string | null;
    }[];
    expect(hosts.map((h) => [h.pattern, h.action, h.via]).sort()).toEqual([
      ["*.cdn.test", "allow", "direct"],
      ["a.svc.test", "allow", "direct"],
      ["evil.test", "block", null],
    ]);
    const listed = await cli(["vault", "hosts", "list", "--json"], { home: user.home });
    expect(JSON.parse(listed.stdout).hosts).toHaveLength(3);

    // --via on a block is a usage error; nothing is sent.
    expect(
      (await cli(["vault", "hosts", "block", "x.test", "--via", "tunnel"], { home: user.home })).code,
    ).toBe(2);

    // Promotion: the block entry becomes allow.
    const promoted = await cli(["vault", "hosts", "promote", "evil.test", "--json"], { home: user.home });
    expect(promoted.code, promoted.stderr).toBe(0);
    expect(JSON.parse(promoted.stdout)).toMatchObject({ created: 0, updated: 1, unchanged: 0 });
    const after = (await json(user.key, "/v1/vault/hosts")).hosts as { pattern: string; action: string }[];
    expect(after.find((h) => h.pattern === "evil.test")?.action).toBe("allow");

    const removed = await cli(["vault", "hosts", "remove", "evil.test"], { home: user.home });
    expect(removed.code, removed.stderr).toBe(0);
    const left = (await json(user.key, "/v1/vault/hosts")).hosts as { pattern: string }[];
    expect(left.map((h) => h.pattern).sort()).toEqual(["*.cdn.test", "a.svc.test"]);
    expect((await cli(["vault", "hosts", "remove", "evil.test"], { home: user.home })).code).toBe(1);
  });

  it("sets the default; the preview shows catch-all routing and why", async () => {
    const user = await loggedIn();
    const shown = await cli(["vault", "default"], { home: user.home });
    expect(shown.code, shown.stderr).toBe(0);
    expect(shown.stdout).toContain("default allow");
    expect((await cli(["vault", "default", "deny"], { home: user.home })).code).toBe(2);
    const set = await cli(["vault", "default", "block", "--json"], { home: user.home });
    expect(set.code, set.stderr).toBe(0);
    expect(JSON.parse(set.stdout)).toMatchObject({ default: "block" });
    expect(await json(user.key, "/v1/vault/settings")).toMatchObject({ default: "block" });

    const preview = await cli(["vault", "preview", "--json"], { home: user.home });
    expect(preview.code, preview.stderr).toBe(0);
    expect(JSON.parse(preview.stdout).routing).toEqual({ mode: "catch-all", reasons: ["block_default"] });
    const human = await cli(["vault", "preview"], { home: user.home });
    expect(human.stdout).toContain("routing catch-all (block_default)");
  });

  it("adds the starter pack once; a second call adds nothing", async () => {
    const user = await loggedIn();
    const first = await cli(["vault", "starter-pack", "--json"], { home: user.home });
    expect(first.code, first.stderr).toBe(0);
    const added = JSON.parse(first.stdout).added as string[];
    expect(added).toContain("registry.npmjs.org");
    const second = await cli(["vault", "starter-pack", "--json"], { home: user.home });
    expect(JSON.parse(second.stdout).added).toEqual([]);
    const hosts = (await json(user.key, "/v1/vault/hosts")).hosts as { pattern: string }[];
    expect(hosts.map((h) => h.pattern)).toEqual(expect.arrayContaining(added));
  });

  it("dry-runs edits against a run that does not exist: exit 1 with the API's code", async () => {
    const user = await loggedIn();
    const res = await cli(["vault", "dry-run", "run_0123456789abcdef", "--allow", "x.test"], {
      home: user.home,
    });
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(/^benchwright: [a-z_]+: /);
    expect((await cli(["vault", "dry-run", "run_x", "--default", "maybe"], { home: user.home })).code).toBe(
      2,
    );
  });
});

describe("vault limits and placeholders", () => {
  it("rules add/update take --methods, --paths and the placeholder flags; hosts allow/update take limits", async () => {
    const user = await loggedIn();
    const home = { home: user.home };
    await cli(["vault", "secrets", "set", "GH_TOKEN"], { home: user.home, input: "cli-limit-value" });
    // case N3: the limits reach the vault as the API saves them (methods uppercased).
    const added = await cli(
      [
        "vault",
        "rules",
        "add",
        "api.gh.test",
        "--secret",
        "GH_TOKEN",
        "--methods",
        "get, head",
        "--paths",
        "/repos/acme/,/orgs/acme",
        "--placeholder-env",
        "GITHUB_TOKEN",
        "--placeholder-in",
        "body",
        "--json",
      ],
      home,
    );
    expect(added.code, added.stderr).toBe(0);
    const rule = JSON.parse(added.stdout);
    expect(rule).toMatchObject({
      methods: ["GET", "HEAD"],
      paths: ["/repos/acme/", "/orgs/acme"],
      placeholderEnv: "GITHUB_TOKEN",
      placeholderIn: ["body"],
    });
    const listed = await cli(["vault", "rules", "list"], home);
    expect(listed.stdout).toMatch(/PLACEHOLDER\s+LIMITS/);
    expect(listed.stdout).toContain("GITHUB_TOKEN (+body)");
    expect(listed.stdout).toContain("GET,HEAD /repos/acme/,/orgs/acme");

    const updated = await cli(
      ["vault", "rules", "update", "api.gh.test", "--methods", "any", "--no-placeholder", "--json"],
      home,
    );
    expect(updated.code, updated.stderr).toBe(0);
    expect(JSON.parse(updated.stdout)).toMatchObject({
      methods: null,
      paths: ["/repos/acme/", "/orgs/acme"],
    });
    expect((await json(user.key, `/v1/vault/rules/${rule.id}`)).placeholderEnv).toBeNull();

    // A reserved variable and a path with ..: the API's codes, exit 1, nothing changed.
    const reserved = await cli(["vault", "rules", "update", rule.id, "--placeholder-env", "PATH"], home);
    expect(reserved.code).toBe(1);
    expect(reserved.stderr).toContain("invalid_placeholder_env");
    const dotdot = await cli(["vault", "rules", "update", rule.id, "--paths", "/a/../b"], home);
    expect(dotdot.code).toBe(1);
    expect(dotdot.stderr).toContain("invalid_limit");
    // Both placeholder flags at once: a usage error, nothing sent.
    expect(
      (await cli(["vault", "rules", "update", rule.id, "--no-placeholder", "--placeholder-env", "X"], home))
        .code,
    ).toBe(2);

    const allowed = await cli(
      ["vault", "hosts", "allow", "pypi.test", "--methods", "GET,HEAD", "--json"],
      home,
    );
    expect(allowed.code, allowed.stderr).toBe(0);
    expect(JSON.parse(allowed.stdout).hosts[0]).toMatchObject({ methods: ["GET", "HEAD"], paths: null });
    const narrowed = await cli(
      ["vault", "hosts", "update", "pypi.test", "--paths", "/simple/", "--json"],
      home,
    );
    expect(narrowed.code, narrowed.stderr).toBe(0);
    expect(JSON.parse(narrowed.stdout)).toMatchObject({ methods: ["GET", "HEAD"], paths: ["/simple/"] });
    const hostsList = await cli(["vault", "hosts", "list"], home);
    expect(hostsList.stdout).toContain("GET,HEAD /simple/");
    // Limits on a block entry: the API refuses (limits_on_block).
    await cli(["vault", "hosts", "block", "evil.test"], home);
    const onBlock = await cli(["vault", "hosts", "update", "evil.test", "--methods", "GET"], home);
    expect(onBlock.code).toBe(1);
    expect(onBlock.stderr).toContain("limits_on_block");
  });
});
