import { execFile } from "node:child_process";
import { Resolver } from "node:dns/promises";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runProxy } from "../../proxy-image/src/proxy/run";
import { until } from "../until";
import { FakeControlPlane } from "./control-plane";
import { createTestCa, curl, startTlsUpstream, tlsArgs, type Upstream, vault } from "./harness";

// The proxy as it runs in its sandbox (run.ts: config → CA → policy client → audit → listeners →
// ready), against a control plane played by an in-test server speaking the wire contract.

const RUN = "run_e2e";
const CANARY = "sk-canary-run-7d1e";

describe("the proxy process wiring (run.ts) against the control-plane contract", () => {
  const cp = new FakeControlPlane(RUN, vault({}));
  let api: Upstream;
  let proxy: Awaited<ReturnType<typeof runProxy>>;
  let dir: string;
  let caFile: string;
  const logs: string[] = [];
  const realWrite = process.stdout.write.bind(process.stdout);

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "bw-run-test-"));
    const testCa = await createTestCa();
    writeFileSync(join(dir, "upstream-ca.pem"), testCa.certPem);
    api = await startTlsUpstream({ ca: testCa, hosts: ["api.test"] });
    cp.vault = vault({
      version: 7,
      hosts: [{ pattern: "evil.test", action: "block" }],
      rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "raw", name: "x-api-key" } }],
    });
    cp.secrets = { API_KEY: CANARY };
    await cp.start();
    // Capture the decision log (stdout) to prove the canary never reaches it (B5).
    process.stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
      logs.push(String(chunk));
      return (realWrite as (c: string | Uint8Array, ...r: unknown[]) => boolean)(chunk, ...rest);
    }) as typeof process.stdout.write;
    proxy = await runProxy(
      {
        ...cp.proxyEnv(join(dir, "spool")),
        BW_POLICY_INTERVAL_MS: "200",
        BW_TEST_EXTRA_CA_FILE: join(dir, "upstream-ca.pem"),
        BW_TEST_ROUTES: `api.test=${api.address}:${api.port}`,
        BW_TEST_ALLOW_CIDRS: "127.0.0.2/32",
        BW_DNS_PORT: "0",
        BW_DNS_ANSWER: "198.18.7.7",
      },
      [],
    );
    caFile = join(dir, "run-ca.pem");
    writeFileSync(caFile, proxy.ca.certPem);
  });

  afterAll(async () => {
    process.stdout.write = realWrite;
    await proxy?.shutdown();
    await api?.close();
    await cp.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const via = (host: string, path = "/") => [
    ...tlsArgs({ caFile, tlsPort: proxy.listeners.tls }, host),
    `https://${host}${path}`,
  ];
  it("reports ready with the run CA and the policy version it loaded", () => {
    expect(cp.ready?.caCertPem).toBe(proxy.ca.certPem);
    expect(cp.ready?.caFingerprint256).toBe(proxy.ca.fingerprint256);
    expect(cp.ready?.policyVersion).toBe(7);
  });

  it("starts the catch-all resolver with the listeners when BW_DNS_PORT is set", async () => {
    expect(proxy.dns).not.toBeNull();
    const resolver = new Resolver({ timeout: 2_000, tries: 1 });
    resolver.setServers([`127.0.0.1:${proxy.dns?.port}`]);
    expect(await resolver.resolve4("anything.example")).toEqual(["198.18.7.7"]);
  });

  it("injects the vault credential fetched from the control plane", async () => {
    const res = await curl(via("api.test", "/v1/chat"));
    expect(res.status).toBe(200);
    expect(api.seen.at(-1)?.headers["x-api-key"]).toBe(CANARY);
    expect(res.body).not.toContain(CANARY);
  });

  it("refuses a blocked host, and the signed audit batch reaches the control plane", async () => {
    const res = await curl(via("evil.test"));
    expect(res.status).toBe(403);
    await until("the blocked-host row", () => cp.blockedCount("evil.test") >= 1);
    expect(cp.blockedCount("evil.test")).toBe(1);
  });

  it("picks up a policy edit within seconds, without a restart", async () => {
    cp.vault = {
      ...cp.vault,
      version: 8,
      hosts: [...cp.vault.hosts, { pattern: "api.test", action: "block" }],
      rules: [],
    };
    cp.secrets = {};
    await until("the new policy to be enforced", async () => (await curl(via("api.test"))).status === 403);
    const state = proxy.policy.current();
    expect(state.kind === "ready" && state.policy.version).toBe(8);
  });

  it("never writes the secret to its logs (case B5)", () => {
    expect(logs.length).toBeGreaterThan(0);
    expect(logs.join("")).not.toContain(CANARY);
  });

  it("writes every line as JSON with level, ts and event, its policy and audit lines included", async () => {
    // A batch that reached the control plane, a policy edit: each part has spoken by now.
    await proxy.audit.flush();
    const lines = logs
      .join("")
      .split("\n")
      .filter((line) => line !== "");
    const records = lines.map((line) => JSON.parse(line) as Record<string, unknown>);
    for (const record of records) {
      expect(Object.keys(record).slice(0, 3), JSON.stringify(record)).toEqual(["level", "ts", "event"]);
      expect(record.event, JSON.stringify(record)).toMatch(/^[a-z][a-z0-9_]*$/);
    }
    const events = new Set(records.map((record) => record.event));
    for (const event of ["ready", "decision", "policy_in_force"]) expect(events).toContain(event);
    // The policy client's line names the version it put in force, under its component.
    expect(records).toContainEqual(
      expect.objectContaining({ event: "policy_in_force", component: "policy-client", version: 8 }),
    );
  });
});

describe("proxy start-up configuration", () => {
  it("refuses to start on a bad configuration with a clear message and exit code 2", async () => {
    const result = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
      execFile(
        "npx",
        ["tsx", "proxy-image/src/proxy/main.ts", "--run-id", "bad id!"],
        { env: { PATH: process.env.PATH ?? "" } },
        (err, _out, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stderr }),
      );
    });
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("BW_RUN_ID (--run-id): must be 1-64");
    expect(result.stderr).toContain("BW_PROXY_TOKEN (--proxy-token): is not set");
  });
});
