import { mkdtempSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { cli, loggedIn } from "./harness";

// `benchwright keys create|list|revoke` against `wrangler dev` (case K3's client side): the key
// is shown once, to a new 0600 file or, when asked, alone on standard output.

const work = () => mkdtempSync(join(tmpdir(), "bw-cli-keys-"));

describe("keys", () => {
  it("create writes the key to a new 0600 file (never printed); list shows it; revoke ends it", async () => {
    const user = await loggedIn();
    const out = join(work(), "ci.key");
    const made = await cli(
      ["keys", "create", "ci", "--scope", "read", "--expires-in", "30d", "--out", out, "--json"],
      {
        home: user.home,
      },
    );
    expect(made.code, made.stderr).toBe(0);
    const key = readFileSync(out, "utf8").trim();
    expect(key).toMatch(/^bw_/);
    expect(statSync(out).mode & 0o777).toBe(0o600);
    expect(made.stdout + made.stderr).not.toContain(key);
    const info = JSON.parse(made.stdout);
    expect(info).toMatchObject({ name: "ci", scope: "read", keyFile: out });
    expect(info.key).toBeUndefined();

    // The new key works, read-only, as BENCHWRIGHT_API_KEY.
    const env = { BENCHWRIGHT_API_KEY: key };
    expect((await cli(["whoami"], { home: user.home, env })).code).toBe(0);
    const wider = await cli(["keys", "create", "wider", "--print"], { home: user.home, env });
    expect(wider.code).toBe(1);
    expect(wider.stderr).toContain("read_only_key");

    const list = await cli(["keys", "list"], { home: user.home });
    expect(list.code, list.stderr).toBe(0);
    expect(list.stdout).toContain(info.id);
    expect(list.stdout).toContain(info.prefix);
    expect(list.stdout).not.toContain(key);

    const revoke = await cli(["keys", "revoke", info.id], { home: user.home });
    expect(revoke.code, revoke.stderr).toBe(0);
    const after = await cli(["whoami"], { home: user.home, env });
    expect(after.code).toBe(1);
    expect(after.stderr).toContain("unauthorized");
  });

  it("--print puts the key alone on standard output; neither --out nor --print is a usage error", async () => {
    const user = await loggedIn();
    const printed = await cli(["keys", "create", "piped", "--print"], { home: user.home });
    expect(printed.code, printed.stderr).toBe(0);
    expect(printed.stdout).toMatch(/^bw_[A-Za-z0-9_-]{43}\n$/);
    expect(printed.stderr).not.toContain(printed.stdout.trim());

    const none = await cli(["keys", "create", "nowhere"], { home: user.home });
    expect(none.code).toBe(2);
    expect(none.stderr).toContain("--out PATH or --print");
    const existing = join(work(), "taken");
    writeFileSync(existing, "mine");
    const taken = await cli(["keys", "create", "x", "--out", existing], { home: user.home });
    expect(taken.code).toBe(2);
    expect(readFileSync(existing, "utf8")).toBe("mine");
    expect(
      (await cli(["keys", "create", "x", "--print", "--scope", "admin"], { home: user.home })).code,
    ).toBe(2);
  });
});
