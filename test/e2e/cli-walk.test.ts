import { mkdtempSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { buildCli, cli as runCli } from "../cli/harness";
import { until } from "../until";
import { describeE2e, type E2eOptions, newUser } from "./harness";

// Issue 9's "done when", on real parts: from a fresh login to a blocked host promoted to allow,
// using only the CLI (a child process of its bundle, over real HTTP) and a real run on the local
// backend. The vault's secret is a canary that no CLI output may ever contain.

const SCRIPT = `
const get = async (url) => {
  try { return (await fetch(url)).status; } catch (e) { return String(e.cause?.code ?? e.message); }
};
(async () => {
  const api = await get("https://api.demo.test/v1/whoami");
  const other = await get("https://other.demo.test/data");
  console.log(JSON.stringify({ walk: true, api, other }));
  process.exit(other === 200 ? 0 : 1);
})();
`;

let bin: string;

async function start(): Promise<E2eOptions> {
  // The CLI's own bundle, built from the current sources for this file alone (the cli project
  // builds cli/dist at the same time; neither reads the other's half-written file).
  bin = await buildCli("bw-cli-walk-");
  return { name: "bwt-e2w", index: 99 };
}

describeE2e("the CLI walk: clone to a blocked host promoted to allow", { start }, (e) => {
  const outputs: string[] = [];
  it("logs in, sets the vault, sees the refusal, dry-runs, promotes, and the next run reaches the host", async () => {
    const user = await newUser(e.stack.apiUrl);
    const home = mkdtempSync(join(tmpdir(), "bw-cli-walk-home-"));
    const cli = async (args: string[], input?: string) => {
      const res = await runCli(args, { home, input, bin });
      outputs.push(res.stdout, res.stderr);
      return res;
    };
    const ok = async (args: string[], input?: string) => {
      const res = await cli(args, input);
      expect(res.code, `${args.join(" ")}\n${res.stderr}`).toBe(0);
      return res;
    };

    await ok(["login", "--url", e.stack.apiUrl], `${user.key}\n`);
    await ok(["vault", "secrets", "set", "DEMO_API_KEY"], `${e.canary}\n`);
    await ok(["vault", "rules", "add", "api.demo.test", "--secret", "DEMO_API_KEY"]);
    await ok(["vault", "default", "block"]);
    expect((await ok(["vault", "preview"])).stdout).toContain("routing catch-all (block_default)");

    // The first run is refused other.demo.test: its command exits 1, so following it exits 4.
    const launchArgs = ["runs", "launch", "--follow", "--", "node", "-e", SCRIPT];
    const first = await cli(launchArgs);
    expect(first.code, first.stderr).toBe(4);
    expect(first.stdout).toContain('{"walk":true,"api":200,"other":403}');
    const firstId = /launched (run_\S+)/.exec(first.stderr)?.[1] as string;
    expect(firstId).toBeTruthy();
    expect(first.stdout).toContain(`${firstId} finished: command_failed`);

    // The refusal is recorded (the proxy reports in batches: wait for it).
    const blocked = await until(
      "other.demo.test in the run's blocked hosts",
      async () => {
        const res = await ok(["logs", "blocked-hosts", firstId, "--json"]);
        const hosts = JSON.parse(res.stdout).blockedHosts as { host: string }[];
        return hosts.some((h) => h.host === "other.demo.test") ? hosts : null;
      },
      30_000,
      500,
    );
    expect(blocked.map((h) => h.host)).toEqual(["other.demo.test"]);

    // The dry run says what allowing it would change, and saves nothing.
    const dry = JSON.parse(
      (await ok(["vault", "dry-run", firstId, "--allow", "other.demo.test", "--json"])).stdout,
    );
    expect(dry.hosts.find((h: { host: string }) => h.host === "other.demo.test")).toMatchObject({
      current: { action: "block" },
      draft: { action: "allow" },
      changed: true,
    });
    expect((await ok(["vault", "hosts", "list"])).stdout).not.toContain("other.demo.test");

    // Promote every host the run was refused; the next run reaches it.
    const promoted = JSON.parse((await ok(["vault", "hosts", "promote", "--run", firstId, "--json"])).stdout);
    expect(promoted).toMatchObject({
      created: 1,
      entries: [{ pattern: "other.demo.test", action: "allow" }],
    });
    const second = await cli(launchArgs);
    expect(second.code, `${second.stdout}\n${second.stderr}`).toBe(0);
    expect(second.stdout).toContain('{"walk":true,"api":200,"other":200}');
    expect(e.upstream.seen.some((s) => s.host === "other.demo.test")).toBe(true);
    const secondId = /launched (run_\S+)/.exec(second.stderr)?.[1] as string;
    const routes = await until(
      "other.demo.test in the second run's egress routes",
      async () => {
        const res = JSON.parse((await ok(["logs", "egress-routes", secondId, "--json"])).stdout);
        const other = (res.egressRoutes as { host: string; route: string }[]).find(
          (r) => r.host === "other.demo.test",
        );
        return other ?? null;
      },
      30_000,
      500,
    );
    expect(routes.route).toBe("direct");

    // The key reached the upstream through the proxy, and never any output of the CLI.
    expect(e.upstream.seen.some((s) => s.host === "api.demo.test" && s.keyMatches === true)).toBe(true);
    for (const text of outputs) expect(text).not.toContain(e.canary);
  });
});
