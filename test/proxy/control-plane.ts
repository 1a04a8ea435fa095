import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import type { PolicyDocument } from "@benchwright/shared/contract/policy";
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
} from "@benchwright/shared/contract/proxy-wire";
import { compilePolicy, type VaultSnapshot } from "@benchwright/shared/policy/compile";

// Contract test double of the control plane's internal API, as far as one proxy needs it, on
// 127.0.0.1, built only from the wire contract's own code: the policy envelope (ETag / 304), the
// ready call (run CA and bound ports), and signed audit batches (verified, de-duplicated by
// batch id). Used by the proxy's end-to-end test and by the bench; the Worker serves the same
// contract for real.

export class FakeControlPlane {
  readonly auditKey = newAuditKey();
  readonly token = `proxy-token-${Math.random().toString(36).slice(2, 12)}-0123456789`;
  port = 0;
  /** The policy the proxy gets on its next poll. */
  vault: VaultSnapshot;
  secrets: Record<string, string>;
  ready: ProxyReady | null = null;
  /** Stored batches by id: a replay is answered 409 and stored once. */
  readonly batches = new Map<string, AuditBatch>();
  auditRows = 0;
  /** How the vault becomes the document served (a test may set fields the vault cannot yet). */
  compile: (vault: VaultSnapshot) => PolicyDocument = (v) => compilePolicy(v);
  private server: Server | null = null;
  private readyWaiters: Array<(r: ProxyReady) => void> = [];

  constructor(
    readonly runId: string,
    vault: VaultSnapshot,
    secrets: Record<string, string> = {},
  ) {
    this.vault = vault;
    this.secrets = secrets;
  }

  async start(): Promise<void> {
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        if (req.headers.authorization !== `Bearer ${this.token}`) return void res.writeHead(401).end();
        const raw = Buffer.concat(chunks).toString("utf8");
        if (req.method === "GET" && req.url === policyPath(this.runId)) {
          const envelope = PolicyEnvelope.parse({ policy: this.compile(this.vault), secrets: this.secrets });
          const etag = policyEtag(envelope.policy.version);
          if (req.headers["if-none-match"] === etag) return void res.writeHead(304, { etag }).end();
          return void res
            .writeHead(200, { "content-type": "application/json", etag })
            .end(JSON.stringify(envelope));
        }
        if (req.method === "POST" && req.url === readyPath(this.runId)) {
          this.ready = ProxyReady.parse(JSON.parse(raw));
          for (const w of this.readyWaiters.splice(0)) w(this.ready);
          return void res.writeHead(204).end();
        }
        if (req.method === "POST" && req.url === auditPath(this.runId)) {
          try {
            const batch = verifyAuditBatch(this.auditKey, req.headers as Record<string, string>, raw, {
              runId: this.runId,
            });
            if (this.batches.has(batch.batchId)) return void res.writeHead(409).end();
            this.batches.set(batch.batchId, batch);
            this.auditRows += batch.blockedHosts.length + batch.egressRoutes.length;
            return void res.writeHead(204).end();
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

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  /** The BW_* settings of a proxy serving this run on loopback, on ports the OS picks. */
  proxyEnv(spoolDir: string): Record<string, string> {
    return {
      BW_RUN_ID: this.runId,
      BW_CONTROL_PLANE_URL: this.url,
      BW_PROXY_TOKEN: this.token,
      BW_AUDIT_KEY: this.auditKey,
      BW_SPOOL_DIR: spoolDir,
      BW_LISTEN_HOST: "127.0.0.1",
      BW_TLS_PORT: "0",
      BW_HTTP_PORT: "0",
      BW_EXPLICIT_PORT: "0",
      BW_VIEW_PORT: "0",
    };
  }

  /** The next ready call's body. */
  nextReady(): Promise<ProxyReady> {
    return new Promise((resolve) => this.readyWaiters.push(resolve));
  }

  /** Refusals of `host` over every stored batch. */
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
