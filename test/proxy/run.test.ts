import { execFile } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { runProxy } from "../../proxy-image/src/run";
import {
  type AuditBatch,
  auditPath,
  newAuditKey,
  PolicyEnvelope,
  ProxyReady,
  policyEtag,
  policyPath,
  readyPath,
  verifyAuditBatch,
} from "../../src/contract/proxy-wire";
import { compilePolicy, type VaultSnapshot } from "../../src/policy/compile";
import { createTestCa, curl, startTlsUpstream, type Upstream, vault } from "./harness";

// The proxy as it runs in its sandbox (run.ts: config → CA → policy client → audit → listeners →
// ready), against a control plane played by an in-test server speaking the wire contract.

const RUN = "run_e2e";
const TOKEN = "proxy-token-e2e-0123456789";
const CANARY = "sk-canary-run-7d1e";

class ControlPlane {
  readonly auditKey = newAuditKey();
  vault: VaultSnapshot = vault({});
  secrets: Record<string, string> = {};
  ready: ProxyReady | null = null;
  readonly batches = new Map<string, AuditBatch>();
  policyGets = 0;
  private server: Server | null = null;
  port = 0;

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        const raw = Buffer.concat(chunks).toString("utf8");
        if (req.headers.authorization !== `Bearer ${TOKEN}`) return void res.writeHead(401).end();
        if (req.method === "GET" && req.url === policyPath(RUN)) {
          this.policyGets++;
          const envelope = PolicyEnvelope.parse({ policy: compilePolicy(this.vault), secrets: this.secrets });
          const etag = policyEtag(envelope.policy.version);
          if (req.headers["if-none-match"] === etag) return void res.writeHead(304, { etag }).end();
          return void res
            .writeHead(200, { "content-type": "application/json", etag })
            .end(JSON.stringify(envelope));
        }
        if (req.method === "POST" && req.url === readyPath(RUN)) {
          this.ready = ProxyReady.parse(JSON.parse(raw));
          return void res.writeHead(204).end();
        }
        if (req.method === "POST" && req.url === auditPath(RUN)) {
          try {
            const batch = verifyAuditBatch(this.auditKey, req.headers as Record<string, string>, raw, {
              runId: RUN,
            });
            const dup = this.batches.has(batch.batchId);
            this.batches.set(batch.batchId, batch);
            return void res.writeHead(dup ? 409 : 204).end();
          } catch {
            return void res.writeHead(401).end();
          }
        }
        res.writeHead(404).end();
      });
    });
    await new Promise<void>((r) => this.server?.listen(0, "127.0.0.1", r));
    this.port = (this.server.address() as AddressInfo).port;
  }

  blockedCount(host: string): number {
    let n = 0;
    for (const b of this.batches.values())
      for (const row of b.blockedHosts) if (row.host === host) n += row.count;
    return n;
  }

  close(): Promise<void> {
    return new Promise((r) => {
      this.server?.closeAllConnections();
      this.server?.close(() => r());
    });
  }
}

async function until<T>(what: string, probe: () => T | Promise<T>, deadlineMs = 5_000): Promise<T> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const value = await probe();
    if (value) return value;
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

describe("the proxy process wiring (run.ts) against the control-plane contract", () => {
  const cp = new ControlPlane();
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
        BW_RUN_ID: RUN,
        BW_CONTROL_PLANE_URL: `http://127.0.0.1:${cp.port}`,
        BW_PROXY_TOKEN: TOKEN,
        BW_AUDIT_KEY: cp.auditKey,
        BW_SPOOL_DIR: join(dir, "spool"),
        BW_LISTEN_HOST: "127.0.0.1",
        BW_TLS_PORT: "0",
        BW_HTTP_PORT: "0",
        BW_EXPLICIT_PORT: "0",
        BW_POLICY_INTERVAL_MS: "200",
        BW_TEST_EXTRA_CA_FILE: join(dir, "upstream-ca.pem"),
        BW_TEST_ROUTES: `api.test=${api.address}:${api.port}`,
        BW_TEST_ALLOW_CIDRS: "127.0.0.2/32",
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
    "--cacert",
    caFile,
    "--connect-to",
    `${host}:443:127.0.0.1:${proxy.listeners.tls}`,
    `https://${host}${path}`,
  ];

  it("reports ready with the run CA and the policy version it loaded", () => {
    expect(cp.ready?.caCertPem).toBe(proxy.ca.certPem);
    expect(cp.ready?.caFingerprint256).toBe(proxy.ca.fingerprint256);
    expect(cp.ready?.policyVersion).toBe(7);
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
});

describe("proxy start-up configuration", () => {
  it("refuses to start on a bad configuration with a clear message and exit code 2", async () => {
    const result = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
      execFile(
        "npx",
        ["tsx", "proxy-image/src/main.ts", "--run-id", "bad id!"],
        { env: { PATH: process.env.PATH ?? "" } },
        (err, _out, stderr) => resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stderr }),
      );
    });
    expect(result.code).toBe(2);
    expect(result.stderr).toContain("BW_RUN_ID (--run-id): must be 1-64");
    expect(result.stderr).toContain("BW_PROXY_TOKEN (--proxy-token): is not set");
  });
});
