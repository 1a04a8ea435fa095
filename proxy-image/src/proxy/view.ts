import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import {
  type ProxyView,
  VIEW_PATH,
  VIEW_RECENT_LIMIT,
  type ViewDecision,
} from "@benchwright/shared/contract/proxy-view";
import type { AuditStats } from "./audit";
import type { DecisionRecord, PolicySource } from "./handler";

// The proxy's view of itself (shared/contract/proxy-view.ts): every decision record passes through
// here on its way to the log. Served on 127.0.0.1 only, the loopback of the proxy sandbox's own
// network namespace, so no work sandbox can reach it; the control plane reads it by running
// `proxy.cjs view` in the proxy sandbox. A row keeps the record's fields that name no value of
// the request: no header, path, body or secret is ever in it.

export interface ViewSources {
  runId: string;
  policy: PolicySource;
  audit: { readonly stats: AuditStats; readonly pendingBatches: number; readonly accepting: boolean };
  now?: () => number;
}

export const isDecision = (r: DecisionRecord | Record<string, unknown>): r is DecisionRecord =>
  r.event === "decision";

export class View {
  private readonly now: () => number;
  private readonly startedAt: string;
  private readonly counts = { requests: 0, allow: 0, block: 0, refuse: 0, error: 0, injected: 0 };
  // Stamped with the clock's number; made ISO text only when the view is read, not per request.
  private readonly recent: Array<Omit<ViewDecision, "at"> & { at: number }> = [];
  private server: Server | null = null;

  constructor(private readonly sources: ViewSources) {
    this.now = sources.now ?? Date.now;
    this.startedAt = new Date(this.now()).toISOString();
  }

  record(r: DecisionRecord): void {
    this.counts.requests++;
    this.counts[r.decision]++;
    if (r.decision === "allow" && r.rule !== null) this.counts.injected++;
    this.recent.push({
      at: this.now(),
      listener: r.listener,
      host: r.host,
      port: r.port,
      method: r.method,
      decision: r.decision,
      reason: r.reason,
      status: r.status,
      rule: r.rule,
      policyVersion: r.policyVersion,
      ms: r.ms,
    });
    if (this.recent.length > VIEW_RECENT_LIMIT) this.recent.shift();
  }

  snapshot(): ProxyView {
    const state = this.sources.policy.current();
    const audit = this.sources.audit;
    return {
      runId: this.sources.runId,
      startedAt: this.startedAt,
      generatedAt: new Date(this.now()).toISOString(),
      policyVersion: state.kind === "ready" ? state.policy.version : null,
      policyState: state.kind,
      counts: { ...this.counts },
      recent: this.recent.map((r) => ({ ...r, at: new Date(r.at).toISOString() })),
      audit: { ...audit.stats, pendingBatches: audit.pendingBatches, accepting: audit.accepting },
    };
  }

  /** Serves GET /view on 127.0.0.1:port (0: any free port); anything else is 404. */
  listen(port: number): Promise<AddressInfo> {
    const server = createServer((req, res) => {
      const path = new URL(req.url ?? "/", "http://view").pathname;
      if (req.method !== "GET" || path !== VIEW_PATH) return void res.writeHead(404).end();
      const body = JSON.stringify(this.snapshot());
      res.writeHead(200, {
        "content-type": "application/json",
        "content-length": Buffer.byteLength(body),
        "cache-control": "no-store",
      });
      res.end(body);
    });
    this.server = server;
    return new Promise((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, "127.0.0.1", () => {
        server.off("error", reject);
        resolve(server.address() as AddressInfo);
      });
    });
  }

  close(): Promise<void> {
    const server = this.server;
    this.server = null;
    if (!server?.listening) return Promise.resolve();
    return new Promise((resolve) => {
      server.close(() => resolve());
      server.closeAllConnections();
    });
  }
}
