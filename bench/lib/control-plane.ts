import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import {
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

// The control plane as far as one proxy process needs it, on 127.0.0.1: the policy envelope
// (with ETag / 304, as the Worker serves it), the ready call (which carries the run CA and the
// bound ports), and signed audit batches (verified, then dropped).

export class BenchControlPlane {
  readonly auditKey = newAuditKey();
  readonly token = `bench-proxy-token-${Math.random().toString(36).slice(2, 12)}`;
  port = 0;
  auditBatches = 0;
  /** Rows (host, or host and route) over all batches. */
  auditRows = 0;
  private server: Server | null = null;
  private readyWaiters: Array<(r: ProxyReady) => void> = [];
  private readonly envelope: PolicyEnvelope;

  constructor(
    readonly runId: string,
    vault: VaultSnapshot,
    secrets: Record<string, string>,
  ) {
    this.envelope = PolicyEnvelope.parse({ policy: compilePolicy(vault), secrets });
  }

  async start(): Promise<void> {
    const body = JSON.stringify(this.envelope);
    const etag = policyEtag(this.envelope.policy.version);
    this.server = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on("data", (c: Buffer) => chunks.push(c));
      req.on("end", () => {
        if (req.headers.authorization !== `Bearer ${this.token}`) return void res.writeHead(401).end();
        if (req.method === "GET" && req.url === policyPath(this.runId)) {
          if (req.headers["if-none-match"] === etag) return void res.writeHead(304, { etag }).end();
          return void res.writeHead(200, { "content-type": "application/json", etag }).end(body);
        }
        const raw = Buffer.concat(chunks).toString("utf8");
        if (req.method === "POST" && req.url === readyPath(this.runId)) {
          const ready = ProxyReady.parse(JSON.parse(raw));
          for (const w of this.readyWaiters.splice(0)) w(ready);
          return void res.writeHead(204).end();
        }
        if (req.method === "POST" && req.url === auditPath(this.runId)) {
          try {
            const batch = verifyAuditBatch(this.auditKey, req.headers as Record<string, string>, raw, {
              runId: this.runId,
            });
            this.auditBatches++;
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

  /** The next ready call's body. */
  nextReady(): Promise<ProxyReady> {
    return new Promise((resolve) => this.readyWaiters.push(resolve));
  }

  close(): Promise<void> {
    return new Promise((r) => {
      this.server?.closeAllConnections();
      this.server?.close(() => r());
    });
  }
}
