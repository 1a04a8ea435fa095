import { eq } from "drizzle-orm";
import { expect, inject, it } from "vitest";
import { nodeDb } from "../../scripts/lib/neon-node";
import { startWsBridge, type WsBridge } from "../../scripts/lib/ws-bridge";
import { VAULT_ATTEMPTS } from "../../src/coordinator/machine";
import { runs, vaultSecrets } from "../../src/db/schema";
import { until } from "../until";
import {
  CLIENT_HELPERS,
  demoVault,
  describeE2e,
  type E2eOptions,
  lastJson,
  newUser,
  nodeScript,
  SKIP_REASON,
  stdoutOf,
  type TraceEvent,
  waitForEnd,
} from "./harness";

// Whole runs on the local backend: the public API launches a run, the coordinator asks the
// broker for namespaces from the real host agent, the real proxy runs in the proxy sandbox and
// fetches its policy from the real Worker, the wiring program proves the redirect, and the
// benchmark's commands run as an unprivileged user. Upstreams live in a namespace this suite made.

if (SKIP_REASON) console.warn(`end-to-end runs skipped: ${SKIP_REASON} (CI runs them as root)`);

// The Worker's own bridge to the database, which a test takes down (E1).
let workerBridge: WsBridge;

async function start(): Promise<E2eOptions> {
  const url = new URL(inject("databaseUrl"));
  workerBridge = await startWsBridge({ host: url.hostname, port: Number(url.port) });
  // A short vault read timeout, so the test of a slow database waits one second, not ten.
  return {
    name: "bwt-e2e",
    index: 91,
    wsProxy: workerBridge.address,
    workerVars: { VAULT_READ_TIMEOUT_SECONDS: "1" },
  };
}

describeE2e("runs on the local backend", { start, after: () => workerBridge?.close() }, (e) => {
  it("default routing: injects the key for the API host, refuses and records the blocked host", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const launched = await api.call("POST", "/v1/runs", { benchmark: "demo" });
    expect(launched.status).toBe(202);
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      reason: "completed",
      routing: "default",
    });
    const out = lastJson(run);
    // The API host got the key (the sandbox sent none); the blocked host was refused by the proxy.
    expect(out.api).toMatchObject({ status: 200, body: { keyPresent: true, keyMatches: true } });
    expect(out.blocked.status).toBe(403);
    expect(e.upstream.seen.filter((s) => s.host === "blocked.demo.test")).toEqual([]);
    // The proof of the boundary is on the run.
    expect(run.proof).toMatchObject({ enforced: true, routing: "default" });
    expect(JSON.stringify(run)).not.toContain(e.canary);
    const blocked = await api.call("GET", `/v1/runs/${run.id}/blocked-hosts`);
    expect(blocked.json.blockedHosts).toEqual([
      expect.objectContaining({ host: "blocked.demo.test", seenCount: 1, source: "proxy" }),
    ]);
    const routes = await api.call("GET", `/v1/runs/${run.id}/egress-routes`);
    expect(routes.json.egressRoutes).toContainEqual(
      expect.objectContaining({ host: "api.demo.test", route: "direct", count: 1 }),
    );
    expect(run.sandboxes.every((s: { status: string }) => s.status === "destroyed")).toBe(true);
  });
  it("catch-all (block default): the allowed host gets its key; an unlisted host, a raw port and an IP literal get nowhere", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary, { default: "block" });
    const ip = e.upstream.address;
    const script = `${CLIENT_HELPERS}
(async () => {
  console.log(JSON.stringify({
    api: await get("https://api.demo.test/v1/whoami"),
    api2: await get("https://api.demo.test/v1/again"),
    unlisted: await get("https://other.demo.test/"),
    blocked: await get("https://blocked.demo.test/"),
    rawPort: await tcp("${ip}", ${e.upstream.directPort}),
    ipLiteral: await get("https://${ip}/"),
    plainHttp: await get("http://other.demo.test/"),
  }));
})();`;
    const launched = await api.call("POST", "/v1/runs", { commands: [nodeScript(script)] });
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      routing: "catch-all",
    });
    expect(run.notes).toContainEqual(expect.objectContaining({ code: "catch_all_routing" }));
    expect(run.proof).toMatchObject({ enforced: true, routing: "catch-all" });
    // The wiring proved it before any command ran: TLS to the probe host refused by the proxy,
    // and a direct connection out (to a listener that default routing would reach) failed.
    const wiring = run.trace.find((t: { detail: { proof?: unknown } | null }) => t.detail?.proof);
    expect(wiring.detail.proof.probes).toEqual([
      expect.objectContaining({ name: "tls_probe", ok: true }),
      expect.objectContaining({ name: "direct_egress", ok: true }),
    ]);
    const out = lastJson(run);
    expect(out.api).toMatchObject({ status: 200, body: { keyMatches: true } });
    expect(out.api2).toMatchObject({ status: 200, body: { keyMatches: true } });
    expect(out.unlisted.status).toBe(403);
    expect(out.blocked.status).toBe(403);
    expect(out.plainHttp.status).toBe(403);
    expect(out.rawPort).not.toBe("connected");
    // An IP literal on 443 reaches the proxy, which refuses it (no SNI host it may name).
    expect(out.ipLiteral.status ?? out.ipLiteral.error).not.toBe(200);
    expect(e.upstream.seen.filter((s) => s.event === "direct")).toEqual([]);
    expect(e.upstream.seen.filter((s) => s.host === "other.demo.test")).toEqual([]);
    // Audit rows arrive, counted: two blocked hosts once each, the API host twice.
    const blocked = await api.call("GET", `/v1/runs/${run.id}/blocked-hosts`);
    const counts = Object.fromEntries(
      blocked.json.blockedHosts.map((b: { host: string; seenCount: number }) => [b.host, b.seenCount]),
    );
    expect(counts).toMatchObject({ "other.demo.test": 2, "blocked.demo.test": 1 });
    const routes = await api.call("GET", `/v1/runs/${run.id}/egress-routes`);
    expect(routes.json.egressRoutes).toContainEqual(
      expect.objectContaining({ host: "api.demo.test", route: "direct", count: 2 }),
    );
  });

  it("the work sandbox, as its own user, cannot read the secret anywhere nor undo the redirect", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    // Searches for the canary's fixed prefix: the sandbox never learns the value itself.
    const hunt = [
      "echo uid=$(id -u)",
      "grep CapEff /proc/self/status",
      "echo procs=$(ls /proc | grep -cE '^[0-9]+$')",
      "env",
      "cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'",
      "cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
      // The needle is assembled at run time so that no command line ever holds it.
      'n=canary; n="$n-e2e"; grep -rsl "$n" /etc /run /tmp /home /var/tmp /dev/shm /root 2>/dev/null | sed \'s/^/found:/\'',
      "echo hunt-done",
    ].join("; ");
    const undo = [
      "ip route del default 2>/dev/null && echo undo:route || echo kept:route",
      "nft flush ruleset 2>/dev/null && echo undo:nft || echo kept:nft",
      "(echo '10.240.91.2 api.demo.test' >> /etc/hosts) 2>/dev/null && echo undo:hosts || echo kept:hosts",
      "ip link set eth0 down 2>/dev/null && echo undo:link || echo kept:link",
      "unshare -Urm true 2>/dev/null && echo undo:userns || echo kept:userns",
    ].join("; ");
    const launched = await api.call("POST", "/v1/runs", {
      commands: [
        hunt,
        undo,
        "node -e 'fetch(\"https://api.demo.test/after\").then(async (r) => console.log(JSON.stringify(await r.json())))'",
      ],
    });
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      reason: "completed",
    });
    const out = stdoutOf(run);
    expect(out).toContain("hunt-done");
    expect(out).not.toContain(e.canary);
    expect(out).not.toContain("canary-e2e");
    expect(out).not.toMatch(/^found:/m);
    expect(out).not.toContain(e.stack.agentSecret);
    expect(out).not.toContain("BW_PROXY_TOKEN");
    expect(out).not.toContain("BW_AUDIT_KEY");
    expect(out).not.toMatch(/bwp_[A-Za-z0-9_-]{20,}/);
    expect(out).not.toContain("whsec_");
    expect(out).not.toContain("VAULT_KEK");
    expect(/uid=(\d+)/.exec(out)?.[1]).not.toBe("0");
    expect(out).toMatch(/CapEff:\s+0000000000000000/);
    // Only the sandbox's own processes are visible (its init, the shell, the commands).
    expect(Number(/procs=(\d+)/.exec(out)?.[1])).toBeLessThan(10);
    for (const what of ["route", "nft", "hosts", "link", "userns"]) expect(out).toContain(`kept:${what}`);
    expect(out).not.toMatch(/^undo:/m);
    // After every attempt the redirect still holds: the key is injected, not leaked.
    expect(out).toContain('"keyMatches":true');
  });

  it("runs a fanned-out task in its own sandbox with no vault and no backend credential", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const dump = "env; cat /proc/[0-9]*/environ 2>/dev/null | tr '\\0' '\\n'; echo task-done";
    const launched = await api.call("POST", "/v1/runs", {
      commands: ["echo work-done"],
      tasks: [
        { name: "t1", commands: [dump] },
        {
          name: "t2",
          commands: [
            nodeScript(
              `${CLIENT_HELPERS}\nget("https://api.demo.test/t2").then((r) => console.log(JSON.stringify(r)));`,
            ),
          ],
        },
      ],
    });
    const run = await waitForEnd(api, launched.json.id);
    expect(run, JSON.stringify(run.trace, null, 1)).toMatchObject({
      status: "finished",
      reason: "completed",
    });
    expect(run.sandboxes.map((s: { kind: string }) => s.kind).sort()).toEqual([
      "proxy",
      "task",
      "task",
      "work",
    ]);
    const t1 = stdoutOf(run, "t1");
    expect(t1).toContain("task-done");
    for (const secret of [
      e.canary,
      e.stack.agentSecret,
      "BW_PROXY_TOKEN",
      "BW_AUDIT_KEY",
      "COMPUTE_BACKEND",
      "whsec_",
    ]) {
      expect(t1).not.toContain(secret);
    }
    // The task is behind the same boundary: its call got the key injected on the way out.
    expect(lastJson(run, "t2")).toMatchObject({ status: 200, body: { keyMatches: true } });
  });

  it("a vault with nothing to enforce: the run goes without a proxy, with a plain note", async () => {
    const api = await newUser(e.stack.apiUrl);
    const launched = await api.call("POST", "/v1/runs", { commands: ["echo plain-run"] });
    const run = await waitForEnd(api, launched.json.id);
    expect(run).toMatchObject({ status: "finished", reason: "completed", routing: "default" });
    expect(run.notes).toEqual([expect.objectContaining({ level: "note", code: "no_proxy" })]);
    expect(run.proof).toMatchObject({ enforced: false, reason: "nothing_to_enforce" });
    expect(run.proxy.readyAt).toBeNull();
    expect(stdoutOf(run)).toContain("plain-run");
  });

  // case E1, on real parts: the vault cannot be decrypted → retries, stop, no sandbox, no command.
  it("stops before any sandbox when the vault cannot be read (E1)", async () => {
    const api = await newUser(e.stack.apiUrl);
    await demoVault(api, e.canary);
    const me = await api.call("GET", "/v1/me");
    const { db, pool } = nodeDb(inject("databaseUrl"));
    await db
      .update(vaultSecrets)
      .set({ ciphertext: "v1.gone.AAAA.AAAA.AAAA.AAAA" })
      .where(eq(vaultSecrets.environmentId, me.json.environmentId));
    await pool.end();
    const launched = await api.call("POST", "/v1/runs", { commands: ["echo must-not-run"] });
    const run = await waitForEnd(api, launched.json.id);
    expect(run).toMatchObject({ status: "stopped", reason: "vault_unreadable" });
    expect(run.sandboxes).toEqual([]);
    expect(JSON.stringify(run.trace)).not.toContain("must-not-run\n");
    expect(stdoutOf(run)).toBe("");
  });

  // case E1, the database slow and then away during the vault fetch: each read is bounded by the
  // database's own statement timeout, the attempts go on while it cannot be reached at all, and
  // the run stops before any sandbox, its stop recorded once the database is back.
  it.skipIf(inject("databaseKind") === "pglite")(
    "stops before any sandbox when the database is slow, then away, during the vault fetch (E1)",
    async () => {
      const api = await newUser(e.stack.apiUrl);
      await demoVault(api, e.canary);
      const me = await api.call("GET", "/v1/me");
      const { db, pool } = nodeDb(inject("databaseUrl"));
      const lock = await pool.connect();
      const attempt = (runId: string, n: number) =>
        e.logs.find(
          (l) => l.includes('"vault_read_failed"') && l.includes(runId) && l.includes(`"attempt":${n},`),
        );
      let runId = "";
      let launching: Promise<unknown> | null = null;
      try {
        // Slow: every read of the vault's secrets waits behind this lock (the test's own
        // connection, through the suite's bridge, not the Worker's).
        await lock.query("begin");
        await lock.query("lock table vault_secrets in access exclusive mode");
        launching = api.call("POST", "/v1/runs", { commands: ["echo must-not-run"] });
        runId = await until(
          "the run's row",
          async () =>
            (
              await db.select({ id: runs.id }).from(runs).where(eq(runs.environmentId, me.json.environmentId))
            )[0]?.id,
          30_000,
        );
        const first = await until(
          "the first attempt, cancelled by the timeout",
          () => attempt(runId, 1),
          30_000,
        );
        expect(first).toContain("the database did not answer within 1 s");
        // Away: the Worker's bridge cuts every connection and drops new ones; the lock goes after.
        workerBridge.setDown(true);
        await lock.query("rollback");
        const last = await until("the last attempt", () => attempt(runId, VAULT_ATTEMPTS), 30_000);
        expect(last).toContain("the database could not be reached");
        expect(workerBridge.refused).toBeGreaterThan(0);
      } finally {
        lock.release();
        workerBridge.setDown(false);
      }
      // The launch's answer waited behind the lock and was cut with its connection: a 503 to
      // retry, not a 500; the run it had recorded is stopped all the same.
      const answer = (await launching) as { status: number; json: { code: string } };
      expect(`${answer.status} ${answer.json.code}`).toBe("503 database_unavailable");
      const run = await waitForEnd(api, runId);
      expect(run).toMatchObject({ status: "stopped", reason: "vault_unreadable" });
      expect(run.reasonDetail).toContain("the database could not be reached");
      expect(run.reasonDetail).toContain("no benchmark code ran");
      const texts = run.trace.map((t: TraceEvent) => t.detail?.text ?? "");
      expect(texts).toContain(
        `Vault read attempt 1 of ${VAULT_ATTEMPTS} failed: the database did not answer within 1 s`,
      );
      expect(run.sandboxes).toEqual([]);
      expect(stdoutOf(run)).toBe("");
      expect(JSON.stringify(run.trace)).not.toContain("must-not-run\n");
      expect(e.logs.join("\n")).not.toContain(e.canary);
      await pool.end();
    },
  );
});
