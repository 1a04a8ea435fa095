import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { api, apiUrl, cli, configHome, loggedIn, newUser } from "./harness";

// Issue 36, item 3: one saved login per deployment (--profile, BENCHWRIGHT_PROFILE), and logout.
// Two users of two environments stand for two deployments: each profile must reach its own.

const defaultFile = (home: string) => join(home, "benchwright", "config.json");
const profileFile = (home: string, name: string) => join(home, "benchwright", "profiles", `${name}.json`);

async function loginAs(home: string, key: string, extra: string[] = [], env?: Record<string, string>) {
  const res = await cli(["login", "--url", apiUrl(), ...extra], { home, input: `${key}\n`, env });
  expect(res.code, res.stderr).toBe(0);
  return res;
}

async function whoami(home: string, args: string[] = [], env?: Record<string, string>) {
  const res = await cli(["whoami", "--json", ...args], { home, env });
  return { ...res, me: res.code === 0 ? JSON.parse(res.stdout) : null };
}

describe("profiles", () => {
  it("keeps one login per profile, each its own 0600 file; --profile and BENCHWRIGHT_PROFILE choose", async () => {
    const main = await newUser();
    const staging = await newUser();
    const home = configHome();
    await loginAs(home, main.key);
    const saved = await loginAs(home, staging.key, ["--profile", "staging"]);
    expect(saved.stdout).toContain(profileFile(home, "staging"));
    expect(saved.stdout + saved.stderr).not.toContain(staging.key);

    expect(JSON.parse(readFileSync(defaultFile(home), "utf8")).key).toBe(main.key);
    expect(JSON.parse(readFileSync(profileFile(home, "staging"), "utf8"))).toEqual({
      url: apiUrl(),
      key: staging.key,
    });
    expect(statSync(profileFile(home, "staging")).mode & 0o777).toBe(0o600);
    expect(statSync(join(home, "benchwright", "profiles")).mode & 0o777).toBe(0o700);

    expect((await whoami(home)).me.userId).toBe(main.userId);
    expect((await whoami(home, ["--profile", "staging"])).me.userId).toBe(staging.userId);
    // Before the command's words too, and as --profile=NAME.
    const leading = await cli(["--profile", "staging", "whoami", "--json"], { home });
    expect(leading.code, leading.stderr).toBe(0);
    expect(JSON.parse(leading.stdout).userId).toBe(staging.userId);
    expect((await whoami(home, ["--profile=staging"])).me.userId).toBe(staging.userId);
    expect((await whoami(home, [], { BENCHWRIGHT_PROFILE: "staging" })).me.userId).toBe(staging.userId);
    // The flag wins over the variable; "default" names the default profile.
    const both = await whoami(home, ["--profile", "default"], { BENCHWRIGHT_PROFILE: "staging" });
    expect(both.me.userId).toBe(main.userId);

    const human = await cli(["whoami", "--profile", "staging"], { home });
    expect(human.stdout).toMatch(/^profile\s+staging$/m);
  });

  it("a profile no one logged in to is not logged in (exit 3), naming the login to run", async () => {
    const user = await loggedIn();
    const res = await cli(["whoami", "--profile", "production"], { home: user.home });
    expect(res.code).toBe(3);
    expect(res.stderr).toContain("benchwright login --profile production");
    expect(res.stderr).toContain(profileFile(user.home, "production"));
  });

  it("refuses a name that is not a profile name (exit 2) and writes nothing", async () => {
    const user = await newUser();
    const home = configHome();
    for (const name of ["../evil", "a/b", "Prod", "-x", ""]) {
      const res = await cli(["login", "--url", apiUrl(), `--profile=${name}`], {
        home,
        input: `${user.key}\n`,
      });
      expect(res.code, name).toBe(2);
      expect(res.stderr).toContain("--profile must be a profile name");
    }
    const fromEnv = await cli(["login", "--url", apiUrl()], {
      home,
      input: `${user.key}\n`,
      env: { BENCHWRIGHT_PROFILE: "../../etc" },
    });
    expect(fromEnv.code).toBe(2);
    expect(fromEnv.stderr).toContain("BENCHWRIGHT_PROFILE must be a profile name");
    expect(readdirSync(home)).toEqual([]);
  });
});

describe("logout", () => {
  it("forgets only its profile's key; the key itself still works; a second logout says so (exit 0)", async () => {
    const main = await newUser();
    const staging = await newUser();
    const home = configHome();
    await loginAs(home, main.key);
    await loginAs(home, staging.key, [], { BENCHWRIGHT_PROFILE: "staging" });

    const out = await cli(["logout", "--profile", "staging"], { home });
    expect(out.code, out.stderr).toBe(0);
    expect(out.stdout).toContain(`removed ${profileFile(home, "staging")}`);
    expect(existsSync(profileFile(home, "staging"))).toBe(false);
    expect((await whoami(home, ["--profile", "staging"])).code).toBe(3);
    // The other profile is untouched, and without --revoke the API still takes the key.
    expect((await whoami(home)).me.userId).toBe(main.userId);
    expect((await api(staging.key, "/v1/me")).status).toBe(200);

    const again = await cli(["logout", "--profile", "staging", "--json"], { home });
    expect(again.code, again.stderr).toBe(0);
    expect(JSON.parse(again.stdout)).toMatchObject({
      profile: "staging",
      removed: false,
      revokedKeyId: null,
    });
  });

  it("--revoke has the API refuse the key, then forgets it", async () => {
    const user = await loggedIn();
    const res = await cli(["logout", "--revoke", "--json"], { home: user.home });
    expect(res.code, res.stderr).toBe(0);
    const body = JSON.parse(res.stdout);
    expect(body).toMatchObject({ profile: "default", removed: true });
    expect(body.revokedKeyId).toMatch(/^key_/);
    expect(res.stdout + res.stderr).not.toContain(user.key);
    expect(existsSync(defaultFile(user.home))).toBe(false);
    expect((await api(user.key, "/v1/me")).status).toBe(401);
  });

  it("--revoke keeps the file when the API will not revoke (a read key: exit 1), and forgets a dead key", async () => {
    const owner = await newUser();
    const made = await fetch(`${apiUrl()}/v1/api-keys`, {
      method: "POST",
      headers: { authorization: `Bearer ${owner.key}`, "content-type": "application/json" },
      body: JSON.stringify({ name: "read-only", scope: "read" }),
    });
    expect(made.status).toBe(201);
    const readKey = ((await made.json()) as { key: string }).key;
    const home = configHome();
    await loginAs(home, readKey);

    const refused = await cli(["logout", "--revoke"], { home });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain("was not revoked");
    expect(refused.stderr).not.toContain(readKey);
    expect(existsSync(defaultFile(home))).toBe(true);
    expect((await api(readKey, "/v1/me")).status).toBe(200);

    // Revoked meanwhile by its owner: the API refuses it, so there is nothing left to revoke.
    const keyId = (JSON.parse((await api(readKey, "/v1/me")).text) as { keyId: string }).keyId;
    const revoked = await fetch(`${apiUrl()}/v1/api-keys/${keyId}`, {
      method: "DELETE",
      headers: { authorization: `Bearer ${owner.key}` },
    });
    expect(revoked.status).toBe(204);
    const dead = await cli(["logout", "--revoke"], { home });
    expect(dead.code, dead.stderr).toBe(0);
    expect(existsSync(defaultFile(home))).toBe(false);
  });
});
