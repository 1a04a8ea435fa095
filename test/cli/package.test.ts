import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, writeFileSync } from "node:fs";
import { isBuiltin } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, describe, expect, it } from "vitest";
import { apiUrl, CLI_PATH, cli, configHome, newUser, type Result } from "./harness";

// Item 6 of issue 23: the CLI as a package. `npm pack` in cli/ gives a tarball of one bundle (and
// its launcher), with no dependency on this repository; it is installed with npm into a prefix of
// its own, offline (it has no dependencies to fetch), and the installed command is run against
// `wrangler dev` (test/setup/cli-stack.ts), as a user who never cloned the repository would.

const ROOT = join(import.meta.dirname, "..", "..");
const work = mkdtempSync(join(tmpdir(), "bw-cli-pkg-"));
const prefix = join(work, "prefix");
// npm's own state in the test's directory: no cache, config or update check of the machine's.
const npmEnv = {
  ...process.env,
  npm_config_cache: join(work, "npm-cache"),
  npm_config_userconfig: join(work, "npmrc"),
  npm_config_audit: "false",
  npm_config_fund: "false",
  npm_config_update_notifier: "false",
};
let tarball = "";
let installedBin = "";

function npm(args: string[], cwd: string): string {
  const res = spawnSync("npm", args, { cwd, env: npmEnv, encoding: "utf8" });
  if (res.status !== 0) throw new Error(`npm ${args.join(" ")}: ${res.status}\n${res.stdout}\n${res.stderr}`);
  return res.stdout;
}

/** The installed command, run with node (the shebang is run once, below). */
const installed = (args: string[], options: Parameters<typeof cli>[1]): Promise<Result> =>
  cli(args, { ...options, bin: installedBin, cwd: work });

beforeAll(() => {
  // cli/dist is built from the current sources by the suite's setup; --ignore-scripts so this file
  // does not rebuild it (prepack) while another file's CLI is reading it.
  const packed = JSON.parse(
    npm(["pack", "--json", "--ignore-scripts", "--pack-destination", work], join(ROOT, "cli")),
  );
  tarball = join(work, packed[0].filename);
  npm(["install", "--global", "--offline", "--prefix", prefix, tarball], work);
  installedBin = join(prefix, "bin", "benchwright");
}, 120_000);

describe("the CLI as a package", () => {
  it("packs to one bundle, its launcher and a README, with no dependencies", () => {
    const files = spawnSync("tar", ["tzf", tarball], { encoding: "utf8" }).stdout.trim().split("\n").sort();
    expect(files).toEqual([
      "package/README.md",
      "package/bin/benchwright.cjs",
      "package/dist/benchwright.cjs",
      "package/package.json",
    ]);
    const manifest = JSON.parse(
      spawnSync("tar", ["xzOf", tarball, "package/package.json"], { encoding: "utf8" }).stdout,
    );
    expect(manifest.dependencies ?? {}).toEqual({});
    expect(manifest.bin).toEqual({ benchwright: "bin/benchwright.cjs" });
    // Nothing of the repository is named: the bundle requires only node's own modules.
    const bundle = spawnSync("tar", ["xzOf", tarball, "package/dist/benchwright.cjs"], {
      encoding: "utf8",
      maxBuffer: 64 * 1024 * 1024,
    }).stdout;
    const required = new Set([...bundle.matchAll(/require\("([^"]+)"\)/g)].map((m) => m[1] as string));
    // ws's optional native helpers are tried in a try/catch and not needed.
    const foreign = [...required].filter(
      (m) => !m.startsWith("node:") && !["bufferutil", "utf-8-validate"].includes(m) && !isBuiltin(m),
    );
    expect(foreign).toEqual([]);
  });

  it("runs from the prefix: --version, and the shebang works without node on the command line", () => {
    const version = JSON.parse(readFileSync(join(ROOT, "cli", "package.json"), "utf8")).version;
    const res = spawnSync(installedBin, ["--version"], { encoding: "utf8", env: { PATH: CLI_PATH } });
    expect(res.status, res.stderr).toBe(0);
    expect(res.stdout.trim()).toBe(version);
  });

  it("logs in and works against wrangler dev: webhooks, notifications, setup images, vault models, bug reports", async () => {
    const user = await newUser();
    const home = configHome();
    const login = await installed(["login", "--url", apiUrl()], { home, input: `${user.key}\n` });
    expect(login.code, login.stderr).toBe(0);
    expect(login.stdout + login.stderr).not.toContain(user.key);

    // A webhook: its secret goes to a new 0600 file, never to the terminal.
    const spec = join(work, `spec-${user.userId}.json`);
    writeFileSync(spec, JSON.stringify({ commands: ["echo hook"] }));
    const secretFile = join(work, `whsec-${user.userId}`);
    const made = await installed(
      ["webhooks", "create", "nightly", "--from", spec, "--secret-out", secretFile, "--json"],
      {
        home,
      },
    );
    expect(made.code, made.stderr).toBe(0);
    const hook = JSON.parse(made.stdout);
    const secret = readFileSync(secretFile, "utf8").trim();
    expect(secret).toMatch(/^whsec_/);
    expect(made.stdout + made.stderr).not.toContain(secret);
    expect(hook).toMatchObject({ name: "nightly", secretFile });
    expect(hook.secret).toBeUndefined();
    const again = await installed(["webhooks", "rotate-secret", hook.id, "--secret-out", secretFile], {
      home,
    });
    expect(again.code).toBe(2);
    expect(again.stderr).toContain("exists");
    const rotatedFile = `${secretFile}-2`;
    const rotated = await installed(["webhooks", "rotate-secret", hook.id, "--secret-out", rotatedFile], {
      home,
    });
    expect(rotated.code, rotated.stderr).toBe(0);
    expect(readFileSync(rotatedFile, "utf8").trim()).not.toBe(secret);
    const listed = await installed(["webhooks", "list"], { home });
    expect(listed.stdout).toContain(hook.id);
    expect((await installed(["webhooks", "show", hook.id, "--json"], { home })).stdout).toContain(
      "echo hook",
    );
    expect((await installed(["webhooks", "delete", hook.id], { home })).code).toBe(0);
    expect((await installed(["webhooks", "show", hook.id], { home })).code).toBe(1);

    // A notification URL (this user starts no run, so nothing is ever sent to it): its secret goes
    // to a file too; a URL the API refuses is its problem, said on stderr.
    const ntfFile = join(work, `ntf-${user.userId}`);
    const url = "https://ci.example.com/benchwright";
    const ntf = await installed(["notifications", "create", url, "--secret-out", ntfFile, "--json"], {
      home,
    });
    expect(ntf.code, ntf.stderr).toBe(0);
    const note = JSON.parse(ntf.stdout);
    expect(note).toMatchObject({ url, events: ["run.ended"], secretFile: ntfFile });
    expect(ntf.stdout).not.toContain(readFileSync(ntfFile, "utf8").trim());
    const local = await installed(
      ["notifications", "create", "https://localhost/x", "--secret-out", `${ntfFile}-2`],
      {
        home,
      },
    );
    expect(local.code).toBe(1);
    expect(local.stderr).toContain("invalid_notification_url");
    expect((await installed(["notifications", "list"], { home })).stdout).toContain(note.id);
    expect((await installed(["notifications", "deliveries", note.id], { home })).stdout).toContain(
      "nothing sent yet",
    );
    expect((await installed(["notifications", "delete", note.id], { home })).code).toBe(0);
    expect((await installed(["notifications", "list"], { home })).stdout).toContain("no notification URLs");

    // Setup images: none kept yet; a key the environment does not have is the API's 404, named.
    expect((await installed(["setup-images", "list"], { home })).stdout).toContain("no setup images");
    const unknown = await installed(["setup-images", "delete", "a".repeat(64)], { home });
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toContain("not_found");
    const badKey = await installed(["setup-images", "delete", "short"], { home });
    expect(badKey.code).toBe(1);
    expect(badKey.stderr).toContain("invalid_request");

    // A model: fields pass through to the API as given.
    const set = await installed(["vault", "secrets", "set", "OPENAI_KEY"], {
      home,
      input: "sk-test-value\n",
    });
    expect(set.code, set.stderr).toBe(0);
    const add = await installed(
      [
        "vault",
        "models",
        "add",
        "gpt-test",
        "--provider",
        "openai",
        "--base-url",
        "https://api.openai.com/v1",
        "--secret",
        "OPENAI_KEY",
        "--json",
      ],
      { home },
    );
    expect(add.code, add.stderr).toBe(0);
    const model = JSON.parse(add.stdout);
    expect(model).toMatchObject({ name: "gpt-test", provider: "openai", secret: "OPENAI_KEY" });
    const updated = await installed(
      ["vault", "models", "update", "gpt-test", "--upstream-model", "gpt-4o-mini"],
      {
        home,
      },
    );
    expect(updated.code, updated.stderr).toBe(0);
    const shown = await installed(["vault", "models", "show", model.id, "--json"], { home });
    expect(JSON.parse(shown.stdout).upstreamModel).toBe("gpt-4o-mini");
    expect((await installed(["vault", "models", "list"], { home })).stdout).toContain("gpt-test");
    // The API's refusal of a field is passed through with its code (exit 1).
    const bad = await installed(
      [
        "vault",
        "models",
        "add",
        "bad",
        "--provider",
        "openai",
        "--base-url",
        "ftp://x",
        "--secret",
        "OPENAI_KEY",
      ],
      { home },
    );
    expect(bad.code).toBe(1);
    expect((await installed(["vault", "models", "remove", "gpt-test"], { home })).code).toBe(0);

    // A bug report on a run of theirs (accepted; no compute backend answers in this suite).
    const launched = await installed(["runs", "launch", "--json", "--", "true"], { home });
    expect(launched.code, launched.stderr).toBe(0);
    const run = JSON.parse(launched.stdout);
    const filed = await installed(["bug-reports", "create", run.id, "--title", "it broke", "--json"], {
      home,
      input: "the body, from standard input\n",
    });
    expect(filed.code, filed.stderr).toBe(0);
    expect(JSON.parse(filed.stdout)).toMatchObject({ runId: run.id, title: "it broke" });
    const reports = await installed(["bug-reports", "list", run.id, "--json"], { home });
    expect(JSON.parse(reports.stdout).bugReports[0]).toMatchObject({ body: "the body, from standard input" });
    await installed(["runs", "cancel", run.id], { home });
  }, 60_000);

  it("suggests the command meant for a slip (exit 2), and completes in bash", async () => {
    const home = configHome();
    for (const [typed, meant] of [
      [["runz", "list"], "runs list"],
      [["vault", "secrts", "list"], "vault secrets list"],
      [["webhook", "list"], "webhooks list"],
      [["whoamii"], "whoami"],
    ] as const) {
      const res = await installed([...typed], { home });
      expect(res.code, typed.join(" ")).toBe(2);
      expect(res.stderr).toContain(`did you mean: benchwright ${meant}?`);
    }
    // Nothing near enough: the overview, no guess.
    const far = await installed(["frobnicate"], { home });
    expect(far.code).toBe(2);
    expect(far.stderr).not.toContain("did you mean");

    const bash = await installed(["completion", "bash"], { home });
    expect(bash.code, bash.stderr).toBe(0);
    const complete = (words: string[]) => {
      const script = join(work, "completion.bash");
      writeFileSync(script, bash.stdout);
      const cword = words.length - 1;
      const res = spawnSync(
        "bash",
        [
          "-c",
          `source ${script}; COMP_WORDS=(${words.map((w) => `'${w}'`).join(" ")}); COMP_CWORD=${cword}; _benchwright; printf '%s\\n' "\${COMPREPLY[@]}"`,
        ],
        { encoding: "utf8" },
      );
      return res.stdout.trim().split("\n").sort();
    };
    expect(complete(["benchwright", "vault", "se"])).toEqual(["secrets"]);
    expect(complete(["benchwright", "vault", "models", ""])).toEqual([
      "add",
      "list",
      "remove",
      "show",
      "update",
    ]);
    expect(complete(["benchwright", "webhooks", "create", "x", "--s"])).toEqual(["--secret-out"]);
    expect(complete(["benchwright", "--v"])).toEqual(["--version"]);
    const zsh = await installed(["completion", "zsh"], { home });
    expect(zsh.code).toBe(0);
    expect(zsh.stdout).toMatch(/^#compdef benchwright/);
    expect(zsh.stdout).toContain("compdef _benchwright benchwright");
    expect((await installed(["completion", "fish"], { home })).code).toBe(2);
  });

  it("carries the egress agent: it refuses --token and reads the environment", async () => {
    const home = configHome();
    const token = `bwe_${"A".repeat(43)}`;
    const flag = await installed(["egress-agent", "--url", "https://cp.example", "--token", token], { home });
    expect(flag.code).toBe(2);
    expect(flag.stderr).toContain("BENCHWRIGHT_EGRESS_TOKEN");
    expect(flag.stderr + flag.stdout).not.toContain(token);
    const help = await installed(["egress-agent", "--help"], { home });
    expect(help.code).toBe(0);
    expect(help.stdout).toContain("--token-stdin");
  });
});
