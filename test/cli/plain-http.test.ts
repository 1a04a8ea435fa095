import { existsSync, mkdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { apiUrl, cli, configHome, loggedIn, newUser } from "./harness";

// Case K5 for the CLI: no key over plain http except to this machine, and no token on a command
// line, whether the URL comes from `login --url`, BENCHWRIGHT_URL or a saved config file.

const configFile = (home: string) => join(home, "benchwright", "config.json");

describe("case K5: the CLI sends no key over plain http but to loopback", () => {
  it("case K5: login refuses an http:// URL that is not loopback (exit 2), before reading or sending the key", async () => {
    const user = await newUser();
    for (const url of [
      "http://api.example.com",
      "http://10.0.0.5:8787",
      "http://[fe80::1]:8787",
      "http://127.0.0.1.example.com",
      "http://localhost.example.com",
    ]) {
      const home = configHome();
      const res = await cli(["login", "--url", url], { home, input: `${user.key}\n` });
      expect(res.code, url).toBe(2);
      expect(res.stderr, url).toContain("plain http://");
      expect(res.stderr, url).toContain("https://");
      expect(res.stderr + res.stdout).not.toContain(user.key);
      expect(existsSync(configFile(home)), url).toBe(false);
    }
  });

  it("case K5: login accepts http:// to 127.0.0.0/8, ::1 and localhost (the local stack)", async () => {
    const user = await newUser();
    const port = new URL(apiUrl()).port;
    for (const host of ["127.0.0.1", "localhost"]) {
      const home = configHome();
      const res = await cli(["login", "--url", `http://${host}:${port}`], { home, input: `${user.key}\n` });
      expect(res.code, `${host}: ${res.stderr}`).toBe(0);
    }
    // ::1 and the rest of 127/8 pass the check (nothing listens there: the error is the network's).
    for (const url of [`http://[::1]:1`, "http://127.8.9.10:1"]) {
      const res = await cli(["login", "--url", url], { home: configHome(), input: `${user.key}\n` });
      expect(res.code, url).toBe(1);
      expect(res.stderr, url).toContain("could not reach");
    }
  });

  it("case K5: BENCHWRIGHT_URL or a saved URL on plain http to another host is refused at use", async () => {
    const user = await newUser();
    const res = await cli(["whoami"], {
      home: configHome(),
      env: { BENCHWRIGHT_API_KEY: user.key, BENCHWRIGHT_URL: "http://api.example.com" },
    });
    expect(res.code).toBe(2);
    expect(res.stderr).toContain("BENCHWRIGHT_URL http://api.example.com is plain http://");
    expect(res.stderr + res.stdout).not.toContain(user.key);

    const home = configHome();
    mkdirSync(join(home, "benchwright"), { recursive: true, mode: 0o700 });
    writeFileSync(configFile(home), JSON.stringify({ url: "http://api.example.com", key: user.key }), {
      mode: 0o600,
    });
    const saved = await cli(["vault", "secrets", "list"], { home });
    expect(saved.code).toBe(2);
    expect(saved.stderr).toContain("plain http://");
    expect(saved.stderr + saved.stdout).not.toContain(user.key);
  });

  it("case K5: the egress agent's command a launch prints takes its token from the environment", async () => {
    const user = await loggedIn();
    const launched = await cli(["runs", "launch", "--egress", "local", "--", "true"], { home: user.home });
    expect(launched.code, launched.stderr).toBe(0);
    const line = launched.stdout.split("\n").find((l) => l.includes("egress-agent")) ?? "";
    expect(line).toMatch(
      /BENCHWRIGHT_EGRESS_TOKEN=bwe_[A-Za-z0-9_-]{43} npx --no benchwright egress-agent --url /,
    );
    expect(line).not.toContain("--token");
    const id = /run_[0-9a-z]+/.exec(launched.stdout)?.[0] ?? "";
    await cli(["runs", "cancel", id], { home: user.home });
  });
});
