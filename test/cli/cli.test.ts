import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readFileSync, statSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { api, apiUrl, cli, configHome, loggedIn, newUser } from "./harness";

const canary = () => `cli-canary-${randomBytes(12).toString("hex")}`;
const configFile = (home: string) => join(home, "benchwright", "config.json");

describe("login", () => {
  it("checks the key and stores it with the URL in a 0600 file in a 0700 directory", async () => {
    const user = await newUser();
    const home = configHome();
    const res = await cli(["login", "--url", apiUrl()], { home, input: `${user.key}\n` });
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toContain(user.userId);
    expect(res.stdout).not.toContain(user.key);
    const file = configFile(home);
    expect(statSync(file).mode & 0o777).toBe(0o600);
    expect(statSync(join(home, "benchwright")).mode & 0o777).toBe(0o700);
    expect(JSON.parse(readFileSync(file, "utf8"))).toEqual({ url: apiUrl(), key: user.key });
  });

  it("refuses a key given as an argument (exit 2) and writes nothing", async () => {
    const user = await newUser();
    const home = configHome();
    const res = await cli(["login", "--url", apiUrl(), user.key], { home });
    expect(res.code).toBe(2);
    expect(res.stderr).toContain("never an argument");
    expect(res.stderr).not.toContain(user.key);
    expect(existsSync(configFile(home))).toBe(false);
  });

  it("stores nothing when the API refuses the key (exit 1, the problem's code)", async () => {
    const home = configHome();
    const res = await cli(["login", "--url", apiUrl()], { home, input: "bw_notakey\n" });
    expect(res.code).toBe(1);
    expect(res.stderr).toContain("unauthorized");
    expect(existsSync(configFile(home))).toBe(false);
  });
});

describe("whoami", () => {
  it("prints the API's JSON with --json", async () => {
    const user = await loggedIn();
    const res = await cli(["whoami", "--json"], { home: user.home });
    expect(res.code, res.stderr).toBe(0);
    const me = JSON.parse(res.stdout);
    expect(me).toMatchObject({ userId: user.userId, environmentId: user.environmentId });
  });

  it("exits 3 when not logged in", async () => {
    const res = await cli(["whoami"], { home: configHome() });
    expect(res.code).toBe(3);
    expect(res.stderr).toContain("benchwright login");
  });

  it("exits 1 when the API cannot be reached", async () => {
    const home = configHome();
    const user = await newUser();
    await cli(["login", "--url", apiUrl()], { home, input: user.key });
    // Port 9 (discard) on loopback: nothing listens there in the test environment.
    const file = configFile(home);
    writeFileSync(file, JSON.stringify({ url: "http://127.0.0.1:9", key: user.key }));
    const res = await cli(["whoami"], { home });
    expect(res.code).toBe(1);
    expect(res.stderr).toContain("could not reach http://127.0.0.1:9");
  });
});

describe("vault secrets", () => {
  it("refuses a value on the command line with advice (exit 2) and stores nothing", async () => {
    const user = await loggedIn();
    const value = canary();
    const res = await cli(["vault", "secrets", "set", "CLI_TOKEN", value], { home: user.home });
    expect(res.code).toBe(2);
    expect(res.stderr).toContain("never an argument");
    expect(res.stderr).toContain("--from-file");
    expect(res.stderr).not.toContain(value);
    const list = await api(user.key, "/v1/vault/secrets");
    expect(JSON.parse(list.text)).toEqual({ secrets: [] });
  });

  it("stores a value from standard input; the API shows its name, never the value", async () => {
    const user = await loggedIn();
    const value = canary();
    const res = await cli(["vault", "secrets", "set", "CLI_TOKEN"], { home: user.home, input: `${value}\n` });
    expect(res.code, res.stderr).toBe(0);
    expect(res.stdout).toContain("created CLI_TOKEN");
    expect(res.stdout + res.stderr).not.toContain(value);
    const list = await api(user.key, "/v1/vault/secrets");
    expect(list.status).toBe(200);
    expect(JSON.parse(list.text).secrets.map((s: { name: string }) => s.name)).toEqual(["CLI_TOKEN"]);
    expect(list.text).not.toContain(value);

    const listed = await cli(["vault", "secrets", "list", "--json"], { home: user.home });
    expect(listed.code, listed.stderr).toBe(0);
    expect(JSON.parse(listed.stdout)).toEqual(JSON.parse(list.text));
    const human = await cli(["vault", "secrets", "list"], { home: user.home });
    expect(human.stdout).toMatch(/^NAME\s+ID\s+FINGERPRINT/);
    expect(human.stdout).toContain("CLI_TOKEN");
  });

  it("replaces an existing secret's value (a new fingerprint) from --from-file", async () => {
    const user = await loggedIn();
    await cli(["vault", "secrets", "set", "CLI_TOKEN"], { home: user.home, input: canary() });
    const before = JSON.parse((await api(user.key, "/v1/vault/secrets")).text).secrets[0];
    const file = join(user.home, "value.txt");
    const value = canary();
    writeFileSync(file, value, { mode: 0o600 });
    const res = await cli(["vault", "secrets", "set", "CLI_TOKEN", "--from-file", file, "--json"], {
      home: user.home,
    });
    expect(res.code, res.stderr).toBe(0);
    const after = JSON.parse(res.stdout);
    expect(after).toMatchObject({ id: before.id, name: "CLI_TOKEN" });
    expect(after.fingerprint).not.toBe(before.fingerprint);
    expect(res.stdout).not.toContain(value);
  });

  it("passes the API's refusal of a bad name through (exit 1, the problem's code)", async () => {
    const user = await loggedIn();
    const res = await cli(["vault", "secrets", "set", "not a name"], { home: user.home, input: "x" });
    expect(res.code).toBe(1);
    expect(res.stderr).toMatch(/benchwright: invalid_request: /);
  });
});

describe("runs", () => {
  it("exits 1 on a run that does not exist, printing the problem's code and detail", async () => {
    const user = await loggedIn();
    for (const args of [
      ["runs", "show", "run_0123456789abcdef"],
      ["runs", "cancel", "run_0123456789abcdef"],
      ["logs", "blocked-hosts", "run_0123456789abcdef"],
      ["logs", "egress-routes", "run_0123456789abcdef"],
      ["logs", "limit-refusals", "run_0123456789abcdef"],
      ["logs", "stray-placeholders", "run_0123456789abcdef"],
    ]) {
      const res = await cli(args, { home: user.home });
      expect(res.code, args.join(" ")).toBe(1);
      expect(res.stderr).toMatch(/^benchwright: not_found: \S/);
    }
  });

  it("launches the words after -- as one command, shows and cancels the run", async () => {
    const user = await loggedIn();
    // No compute backend answers in this suite: the run is accepted, then fails or is cancelled.
    const launched = await cli(["runs", "launch", "--json", "--", "echo", "hi", "--json"], {
      home: user.home,
    });
    expect(launched.code, launched.stderr).toBe(0);
    const run = JSON.parse(launched.stdout);
    expect(run.id).toMatch(/^run_/);
    const shown = await cli(["runs", "show", run.id, "--json"], { home: user.home });
    expect(shown.code, shown.stderr).toBe(0);
    expect(JSON.parse(shown.stdout).spec.commands).toEqual(["echo hi --json"]);
    // Several words keep their boundaries (quoted for sh); one word is a shell command as written.
    const specOf = async (args: string[]) => {
      const launched = await cli(["runs", "launch", "--json", "--", ...args], { home: user.home });
      const id = JSON.parse(launched.stdout).id;
      await cli(["runs", "cancel", id], { home: user.home });
      return JSON.parse((await cli(["runs", "show", id, "--json"], { home: user.home })).stdout).spec;
    };
    expect((await specOf(["sh", "-c", `echo "a b" 'c'`])).commands).toEqual([
      String.raw`sh -c 'echo "a b" '\''c'\'''`,
    ]);
    expect((await specOf(["echo a && echo b"])).commands).toEqual(["echo a && echo b"]);

    const human = await cli(["runs", "show", run.id], { home: user.home });
    expect(human.stdout).toContain(`run       ${run.id}`);
    const cancelled = await cli(["runs", "cancel", run.id], { home: user.home });
    expect(cancelled.code, cancelled.stderr).toBe(0);
    expect(cancelled.stdout).toContain(run.id);
    const routes = await cli(["logs", "egress-routes", run.id, "--json"], { home: user.home });
    expect(routes.code, routes.stderr).toBe(0);
    expect(JSON.parse(routes.stdout)).toEqual({ egressRoutes: [], nextCursor: null });
    const blocked = await cli(["logs", "blocked-hosts", run.id], { home: user.home });
    expect(blocked.code, blocked.stderr).toBe(0);
    expect(blocked.stdout).toContain("no hosts were refused");
    const limits = await cli(["logs", "limit-refusals", run.id], { home: user.home });
    expect(limits.code, limits.stderr).toBe(0);
    expect(limits.stdout).toContain("no request was refused by a method or path limit");
    const strays = await cli(["logs", "stray-placeholders", run.id, "--json"], { home: user.home });
    expect(strays.code, strays.stderr).toBe(0);
    expect(JSON.parse(strays.stdout)).toEqual({ strayPlaceholders: [], nextCursor: null });
  });

  it("launches with --model and --budget (the spec's modelBudget); logs model-calls shows the spend", async () => {
    const user = await loggedIn();
    const { home } = user;
    expect((await cli(["vault", "secrets", "set", "MODEL_KEY"], { home, input: `${canary()}\n` })).code).toBe(
      0,
    );
    // No CLI command adds a model: the API itself, as a user's script would.
    const made = await fetch(`${apiUrl()}/v1/vault/models`, {
      method: "POST",
      headers: { authorization: `Bearer ${user.key}`, "content-type": "application/json" },
      body: JSON.stringify({ name: "eval-model", provider: "anthropic", secret: "MODEL_KEY" }),
    });
    expect(made.status, await made.text()).toBe(201);
    const launched = await cli(
      [
        "runs",
        "launch",
        "--json",
        "--model",
        "eval-model",
        "--budget",
        "calls=1000,input=2m,output=200k",
        "--",
        "true",
      ],
      { home },
    );
    expect(launched.code, launched.stderr).toBe(0);
    const run = JSON.parse(launched.stdout);
    await cli(["runs", "cancel", run.id], { home });
    const shown = JSON.parse((await cli(["runs", "show", run.id, "--json"], { home })).stdout);
    expect(shown.spec.modelBudget).toEqual({ calls: 1000, inputTokens: 2_000_000, outputTokens: 200_000 });
    const calls = await cli(["logs", "model-calls", run.id], { home });
    expect(calls.code, calls.stderr).toBe(0);
    expect(calls.stdout).toContain("model eval-model (anthropic, api.anthropic.com)");
    expect(calls.stdout).toContain(
      "budget: 0 / 1000 calls, 0 / 2000000 input tokens, 0 / 200000 output tokens",
    );

    // A malformed --budget is the CLI's own refusal (exit 2, nothing sent); a budget without a
    // model is the API's (exit 1, its code).
    const bad = await cli(
      ["runs", "launch", "--model", "eval-model", "--budget", "calls=many", "--", "true"],
      {
        home,
      },
    );
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--budget takes calls=N,input=N,output=N");
    const alone = await cli(["runs", "launch", "--budget", "calls=5", "--", "true"], { home });
    expect(alone.code).toBe(1);
    expect(alone.stderr).toContain("model_budget_without_model");
    const runs = JSON.parse((await api(user.key, "/v1/runs")).text).runs;
    expect(runs).toHaveLength(1);
  });

  it("refuses a benchmark the API does not know (exit 1, unknown_benchmark)", async () => {
    const user = await loggedIn();
    const res = await cli(["runs", "launch", "--benchmark", "no-such-benchmark"], { home: user.home });
    expect(res.code).toBe(1);
    expect(res.stderr).toContain("unknown_benchmark");
  });

  it("exits 3 when not logged in, 2 on a launch with nothing to run", async () => {
    const home = configHome();
    expect((await cli(["runs", "show", "run_0123456789abcdef"], { home })).code).toBe(3);
    expect((await cli(["runs", "launch"], { home })).code).toBe(2);
    expect((await cli(["runs", "launch", "echo", "hi"], { home })).code).toBe(2);
  });
});

describe("runs: launch from a folder, follow, list, controls", () => {
  it("launches a benchmark folder's benchwright.json and follows it to its end (exit 4: it did not complete)", async () => {
    const user = await loggedIn();
    const folder = join(user.home, "bench");
    mkdirSync(folder);
    writeFileSync(join(folder, "benchwright.json"), JSON.stringify({ commands: ["echo from-folder"] }));
    // No compute backend answers in this suite, so the run cannot be put inside a boundary: it
    // ends without running anything, and following it says so with exit 4.
    const res = await cli(["runs", "launch", "--from", folder, "--follow", "--json"], { home: user.home });
    expect(res.code, res.stderr).toBe(4);
    // NDJSON: an {"event"} line per trace event, then the run.
    const lines = res.stdout
      .trim()
      .split("\n")
      .map((l) => JSON.parse(l));
    expect(lines.slice(0, -1).every((l) => l.event?.kind)).toBe(true);
    const run = lines.at(-1).run;
    expect(run.spec.commands).toEqual(["echo from-folder"]);
    expect(["stopped", "failed"]).toContain(run.status);
    expect(res.stderr).toContain(`launched ${run.id}`);
    expect(res.stderr).toContain(`run ${run.id} ${run.status}: ${run.reason}`);

    const followed = await cli(["runs", "follow", run.id], { home: user.home });
    expect(followed.code).toBe(4);
    expect(followed.stdout).toContain(`· ${run.status} (${run.reason})`);

    const listed = await cli(["runs", "list", "--json", "--limit", "5"], { home: user.home });
    expect(listed.code, listed.stderr).toBe(0);
    expect(JSON.parse(listed.stdout).runs.map((r: { id: string }) => r.id)).toEqual([run.id]);
    expect((await cli(["runs", "list"], { home: user.home })).stdout).toMatch(/^ID\s+STATUS\s+REASON/);
  });

  it("refuses a folder without benchwright.json and a spec the API refuses, sending nothing", async () => {
    const user = await loggedIn();
    const empty = join(user.home, "empty");
    mkdirSync(empty);
    const missing = await cli(["runs", "launch", "--from", empty], { home: user.home });
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("benchwright.json");
    writeFileSync(join(empty, "benchwright.json"), JSON.stringify({ commands: [], bogus: 1 }));
    const refused = await cli(["runs", "launch", "--from", empty], { home: user.home });
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^benchwright: unknown_field: .*bogus/);
    expect(JSON.parse((await api(user.key, "/v1/runs")).text).runs).toEqual([]);
  });

  it("checks a linger window before sending it; halt and resume of an ended run are the API's no", async () => {
    const user = await loggedIn();
    expect((await cli(["runs", "linger", "run_0123456789abcdef", "forever"], { home: user.home })).code).toBe(
      2,
    );
    expect((await cli(["runs", "linger", "run_0123456789abcdef", "25h"], { home: user.home })).code).toBe(2);
    for (const verb of ["halt", "resume"]) {
      const res = await cli(["runs", verb, "run_0123456789abcdef"], { home: user.home });
      expect(res.code, verb).toBe(1);
      expect(res.stderr).toMatch(/^benchwright: not_found: /);
    }
  });

  it("takes the key from BENCHWRIGHT_API_KEY without a login (and never prints it)", async () => {
    const user = await newUser();
    const home = configHome();
    const res = await cli(["whoami", "--json"], {
      home,
      env: { BENCHWRIGHT_API_KEY: user.key, BENCHWRIGHT_URL: apiUrl() },
    });
    expect(res.code, res.stderr).toBe(0);
    expect(JSON.parse(res.stdout)).toMatchObject({ userId: user.userId });
    expect(res.stdout + res.stderr).not.toContain(user.key);
    expect(existsSync(configFile(home))).toBe(false);
  });
});

describe("usage", () => {
  it("prints help everywhere (exit 0) and refuses unknown commands and options (exit 2)", async () => {
    const home = configHome();
    for (const args of [["--help"], ["vault", "--help"], ["runs", "launch", "--help"], ["whoami", "-h"]]) {
      const res = await cli(args, { home });
      expect(res.code, args.join(" ")).toBe(0);
      expect(res.stdout).toContain("usage: benchwright");
    }
    expect((await cli([], { home })).code).toBe(2);
    expect((await cli(["frobnicate"], { home })).code).toBe(2);
    expect((await cli(["whoami", "--bogus"], { home })).code).toBe(2);
    expect((await cli(["runs", "show"], { home })).code).toBe(2);
  });
});
