import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import {
  type AuditBatch,
  AuditVerificationError,
  auditPath,
  bearer,
  type EgressRoute,
  MAX_AUDIT_BODY_BYTES,
  MAX_AUDIT_ENTRIES,
  type ModelCallRow,
  newAuditKey,
  readBearer,
  signAuditBatch,
  verifyAuditBatch,
} from "@benchwright/shared/contract/proxy-wire";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { AuditReporter, type AuditReporterOptions } from "../../proxy-image/src/proxy/audit";
import type { AuditSink } from "../../proxy-image/src/proxy/handler";
import type { LogFn } from "../../proxy-image/src/proxy/policy-client";

// The audit channel against a real HTTP server on 127.0.0.1 that plays the control plane's side
// of the contract with the contract's own code: bearer token, verifyAuditBatch, de-duplication by
// batch id. Cases D1/D2/D5 for this channel, E3 (bounded spool) and F1 (0 lost, 0 doubled).

const RUN = "run_audit_test";
const OTHER_RUN = "run_other";
const TOKEN = "proxy-token-0123456789abcdef";

const REFUSAL_STATUS = { unauthenticated: 401, invalid_batch: 400, wrong_run: 403 } as const;

type Override = (batch: AuditBatch) => number | undefined;

class FakeControlPlane {
  readonly runs = new Map<string, { token: string; key: string }>();
  /** `${runId}/${batchId}` → the batch, stored once. */
  readonly stored = new Map<string, AuditBatch>();
  /** Batch ids in arrival order, one per POST that got as far as a verified batch. */
  readonly arrivals: string[] = [];
  readonly statuses: number[] = [];
  /** Answer every request with this status before looking at it (an outage that answers). */
  failWith: number | null = null;
  /** Store, then drop the connection without answering, this many times (a lost response). */
  dropAfterStore = 0;
  /** Never answer. */
  hang = false;
  override: Override | null = null;
  port = 0;
  private server: Server | null = null;

  constructor() {
    this.runs.set(RUN, { token: TOKEN, key: newAuditKey() });
    this.runs.set(OTHER_RUN, { token: "other-token-0123456789", key: newAuditKey() });
  }

  get url(): string {
    return `http://127.0.0.1:${this.port}`;
  }

  get key(): string {
    return (this.runs.get(RUN) as { key: string }).key;
  }

  async start(): Promise<void> {
    const server = createServer((req, res) => void this.handle(req, res));
    this.server = server;
    // Same port on restart: the reporter keeps its URL across an outage.
    await new Promise<void>((resolve) => server.listen(this.port, "127.0.0.1", resolve));
    this.port = (server.address() as AddressInfo).port;
  }

  async stop(): Promise<void> {
    const server = this.server;
    this.server = null;
    if (!server) return;
    server.closeAllConnections();
    await new Promise<void>((resolve) => server.close(() => resolve()));
  }

  /** Stored counts per "blocked host" / "route host". */
  totals(runId = RUN): Map<string, number> {
    const out = new Map<string, number>();
    const add = (key: string, n: number) => out.set(key, (out.get(key) ?? 0) + n);
    for (const batch of this.stored.values()) {
      if (batch.runId !== runId) continue;
      for (const row of batch.blockedHosts) add(`blocked ${row.host}`, row.count);
      for (const row of batch.egressRoutes) add(`${row.route} ${row.host}`, row.count);
    }
    return out;
  }

  /** Every model call row stored, in batch order (a row stored twice would appear twice). */
  modelCalls(runId = RUN): ModelCallRow[] {
    return [...this.stored.values()].filter((b) => b.runId === runId).flatMap((b) => b.modelCalls);
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const reply = (status: number, body: unknown = {}) => {
      this.statuses.push(status);
      const text = JSON.stringify(body);
      res.writeHead(status, { "content-type": "application/json" });
      res.end(text);
    };
    if (this.hang) return;
    const match = /^\/internal\/runs\/([^/]+)\/audit$/.exec(req.url ?? "");
    const runId = match ? decodeURIComponent(match[1] as string) : "";
    const run = this.runs.get(runId);
    if (req.method !== "POST" || !run) return reply(404, { code: "not_found" });
    if (readBearer(req.headers.authorization) !== run.token) return reply(401, { code: "unauthorized" });
    if (!req.headers["content-type"]?.startsWith("application/json")) return reply(415, {});
    const chunks: Buffer[] = [];
    let size = 0;
    for await (const chunk of req as AsyncIterable<Buffer>) {
      size += chunk.length;
      if (size > MAX_AUDIT_BODY_BYTES) return reply(413, { code: "payload_too_large" });
      chunks.push(chunk);
    }
    if (this.failWith !== null) return reply(this.failWith, { code: "unavailable" });
    let batch: AuditBatch;
    try {
      batch = verifyAuditBatch(run.key, req.headers, Buffer.concat(chunks).toString("utf8"), { runId });
    } catch (error) {
      if (!(error instanceof AuditVerificationError)) throw error;
      return reply(REFUSAL_STATUS[error.code], { code: error.code });
    }
    this.arrivals.push(batch.batchId);
    const forced = this.override?.(batch);
    if (forced !== undefined) return reply(forced, { code: "forced" });
    const key = `${runId}/${batch.batchId}`;
    if (this.stored.has(key)) return reply(409, { code: "duplicate" });
    this.stored.set(key, batch);
    if (this.dropAfterStore > 0) {
      this.dropAfterStore--;
      req.socket.destroy();
      return;
    }
    reply(200, { stored: true });
  }
}

async function until(cond: () => boolean, what: string, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setTimeout(resolve, 5));
  }
}

const spoolFiles = (dir: string) => readdirSync(dir).filter((n) => n.endsWith(".json"));

describe("the audit endpoint contract (D1, D2, D5)", () => {
  let cp: FakeControlPlane;
  beforeEach(async () => {
    cp = new FakeControlPlane();
    await cp.start();
  });
  afterEach(() => cp.stop());

  const body = (overrides: Partial<AuditBatch> = {}) => {
    const at = new Date().toISOString();
    const batch: AuditBatch = {
      schema: 1,
      runId: RUN,
      modelCalls: [],
      limitRefusals: [],
      strayPlaceholders: [],
      batchId: "batch-1",
      source: "proxy",
      createdAt: at,
      blockedHosts: [{ host: "evil.example", count: 3, firstSeen: at, lastSeen: at }],
      egressRoutes: [],
      ...overrides,
    };
    return JSON.stringify(batch);
  };

  const post = (raw: string, headers: Record<string, string>, runId = RUN, token = TOKEN) =>
    fetch(`${cp.url}${auditPath(runId)}`, {
      method: "POST",
      body: raw,
      headers: { authorization: bearer(token), "content-type": "application/json", ...headers },
    }).then((r) => r.status);

  it("stores a good batch once; a replay of the same delivery is 409", async () => {
    const raw = body();
    const headers = { ...signAuditBatch(cp.key, "batch-1", new Date(), raw) };
    expect(await post(raw, headers)).toBe(200);
    expect(await post(raw, headers)).toBe(409);
    // Re-signed later (a retry): still the same batch id, still stored once.
    expect(await post(raw, { ...signAuditBatch(cp.key, "batch-1", new Date(), raw) })).toBe(409);
    expect(cp.stored.size).toBe(1);
    expect(cp.totals().get("blocked evil.example")).toBe(3);
  });

  // case D5 (a batch naming another run), by the contract's verifyAuditBatch
  it("refuses a batch naming another run, even signed with this run's key", async () => {
    const raw = body({ runId: OTHER_RUN });
    expect(await post(raw, { ...signAuditBatch(cp.key, "batch-1", new Date(), raw) })).toBe(403);
    expect(cp.stored.size).toBe(0);
  });

  // case D1 and case D2 (the old side) for the audit channel, by the contract's verifyAuditBatch
  it("refuses another run's key, a wrong key, a tampered body, missing headers, an old timestamp", async () => {
    const raw = body();
    const other = (cp.runs.get(OTHER_RUN) as { key: string }).key;
    const good = () => ({ ...signAuditBatch(cp.key, "batch-1", new Date(), raw) });
    expect(await post(raw, { ...signAuditBatch(other, "batch-1", new Date(), raw) })).toBe(401);
    expect(await post(raw, { ...signAuditBatch(newAuditKey(), "batch-1", new Date(), raw) })).toBe(401);
    expect(await post(raw.replace('"count":3', '"count":30'), good())).toBe(401);
    for (const name of ["webhook-id", "webhook-timestamp", "webhook-signature"] as const) {
      const headers: Record<string, string> = good();
      delete headers[name];
      expect(await post(raw, headers)).toBe(401);
    }
    const old = new Date(Date.now() - 6 * 60_000);
    expect(await post(raw, { ...signAuditBatch(cp.key, "batch-1", old, raw) })).toBe(401);
    expect(await post(raw, good(), RUN, "wrong-token-0123456789")).toBe(401);
    expect(cp.stored.size).toBe(0);
    expect(await post(raw, good())).toBe(200);
  });

  it("refuses a signed batch with a field that could carry a path (400)", async () => {
    const raw = body().replace('"egressRoutes":[]', '"egressRoutes":[],"path":"/v1/x"');
    expect(await post(raw, { ...signAuditBatch(cp.key, "batch-1", new Date(), raw) })).toBe(400);
  });
});

describe("AuditReporter", () => {
  let cp: FakeControlPlane;
  let dir: string;
  let logs: Array<{ level: string; event: string; fields: unknown }>;
  const reporters: AuditReporter[] = [];
  const log: LogFn = (level, event, fields) => void logs.push({ level, event, fields });

  const reporter = (options: Partial<AuditReporterOptions> = {}) => {
    const r = new AuditReporter({
      controlPlaneUrl: cp.url,
      runId: RUN,
      proxyToken: TOKEN,
      auditKey: cp.key,
      spoolDir: dir,
      flushIntervalMs: 20,
      retryBaseMs: 10,
      retryMaxMs: 100,
      log,
      ...options,
    });
    reporters.push(r);
    return r;
  };

  beforeEach(async () => {
    cp = new FakeControlPlane();
    await cp.start();
    dir = await mkdtemp(join(tmpdir(), "bw-audit-test-"));
    logs = [];
  });

  afterEach(async () => {
    await Promise.all(reporters.splice(0).map((r) => r.stop()));
    await cp.stop();
    await rm(dir, { recursive: true, force: true });
  });

  it("fits the proxy's AuditSink", () => {
    const sink: AuditSink = reporter();
    expect(sink.accepting).toBe(true);
  });

  it("aggregates rows per host and delivers one signed batch", async () => {
    const r = reporter();
    await r.start();
    r.recordBlocked("EVIL.example.");
    r.recordBlocked("evil.example");
    r.recordRoute("api.example.com", "direct");
    r.recordRoute("api.example.com:443", "direct");
    r.recordRoute("api.example.com", "refused");
    await r.flush();
    expect(cp.stored.size).toBe(1);
    const [batch] = [...cp.stored.values()] as [AuditBatch];
    expect(batch.source).toBe("proxy");
    expect(batch.blockedHosts).toEqual([expect.objectContaining({ host: "evil.example", count: 2 })]);
    expect(batch.egressRoutes.map((e) => [e.host, e.route, e.count])).toEqual([
      ["api.example.com", "direct", 2],
      ["api.example.com", "refused", 1],
    ]);
    expect(r.pendingBatches).toBe(0);
    expect(spoolFiles(dir)).toEqual([]);
    expect(r.stats).toMatchObject({ rowsRecorded: 5, rowsSent: 5, batchesSent: 1, rowsRejected: 0 });
  });

  it("rows recorded while a batch is being written wait for the next flush (no one-row batch stream)", async () => {
    const r = reporter({ flushIntervalMs: 1000 });
    await r.start();
    r.recordBlocked("first.example");
    // Steady traffic: a row lands on every turn of the event loop while the flush writes and fsyncs,
    // up to 200 rows: unbounded, a slow fsync let it feed past one batch's bytes (maxBatchBytes),
    // and the next flush then rightly wrote two batches.
    let feeding = true;
    let fed = 0;
    const feed = () => {
      if (!feeding || fed >= 200) return;
      r.recordRoute(`h${fed++}.example`, "direct");
      setImmediate(feed);
    };
    setImmediate(feed);
    await r.flush();
    feeding = false;
    expect(fed).toBeGreaterThan(0);
    // One flush, one batch: the rows fed meanwhile are still held for the next one.
    expect(cp.stored.size).toBe(1);
    expect(r.heldRows).toBeGreaterThan(0);
    await r.flush();
    expect(cp.stored.size).toBe(2);
    expect(r.heldRows).toBe(0);
  });

  it("flushes on its own at least every flush interval", async () => {
    const r = reporter();
    await r.start();
    r.recordBlocked("evil.example");
    await until(() => cp.stored.size === 1, "the timed flush");
  });

  it("refuses a host that is not a host, and does not log what it was given", () => {
    const r = reporter();
    expect(r.recordBlocked("evil.example/secret-path?q=1")).toBe(false);
    expect(r.recordRoute("", "direct")).toBe(false);
    expect(r.stats.rowsRefused).toBe(2);
    expect(r.stats.rowsRecorded).toBe(0);
    expect(JSON.stringify(logs)).not.toContain("secret-path");
  });

  // case F1
  it("F1: 5,000 rows across a control-plane outage arrive exactly once", async () => {
    const r = reporter();
    await r.start();
    await cp.stop();
    const expected = new Map<string, number>();
    const routes: EgressRoute[] = ["direct", "tunnel", "refused"];
    const N = 5000;
    for (let i = 0; i < N; i++) {
      const host = `h${(i * 7919) % 311}.example.com`;
      if (i % 4 === 0) {
        expect(r.recordBlocked(host)).toBe(true);
        expected.set(`blocked ${host}`, (expected.get(`blocked ${host}`) ?? 0) + 1);
      } else {
        const route = routes[i % 3] as EgressRoute;
        expect(r.recordRoute(host, route)).toBe(true);
        expected.set(`${route} ${host}`, (expected.get(`${route} ${host}`) ?? 0) + 1);
      }
      // Several flushes during the outage: several batches wait in the spool.
      if (i % 1000 === 999) await r.flush();
    }
    expect(r.pendingBatches).toBeGreaterThanOrEqual(5);
    expect(r.accepting).toBe(true);
    // Back, but the first two responses are lost after the batch was stored: retries must not double.
    cp.dropAfterStore = 2;
    await cp.start();
    await until(() => r.pendingBatches === 0 && r.heldRows === 0, "the spool to drain");
    const totals = cp.totals();
    expect(totals).toEqual(expected);
    expect([...totals.values()].reduce((a, b) => a + b, 0)).toBe(N);
    expect(cp.statuses.filter((s) => s === 409).length).toBeGreaterThanOrEqual(2);
    expect(r.stats).toMatchObject({ rowsRecorded: N, rowsSent: N, rowsRejected: 0 });
    expect(spoolFiles(dir)).toEqual([]);
    expect(logs.some((l) => l.event === "audit_delivery_retrying")).toBe(true);
  });

  // case F1
  it("F1 for model calls: each call is its own row, delivered exactly once across an outage", async () => {
    const r = reporter({ maxBatchBytes: 6 * 1024 * 1024 });
    await r.start();
    await cp.stop();
    const at = new Date().toISOString();
    const row = (i: number): ModelCallRow => ({
      callId: `call-${String(i).padStart(8, "0")}`,
      at,
      model: "bench-model",
      provider: "fakeai",
      endpoint: i % 2 === 0 ? "chat.completions" : "responses",
      stream: i % 3 === 0,
      status: 200,
      inputTokens: 12,
      outputTokens: 5,
      cachedInputTokens: 0,
      refused: null,
      ms: 40,
    });
    // More than one batch may carry: the per-array bound splits them.
    const N = MAX_AUDIT_ENTRIES + 1500;
    for (let i = 0; i < N; i++) expect(r.recordModelCall(row(i))).toBe(true);
    // Identical calls are still two calls: nothing is aggregated.
    expect(r.recordModelCall({ ...row(N), callId: "call-twin-a" })).toBe(true);
    expect(r.recordModelCall({ ...row(N), callId: "call-twin-b" })).toBe(true);
    r.recordBlocked("evil.example");
    expect(r.recordModelCall({ ...row(0), callId: "no" })).toBe(false);
    expect(r.heldRows).toBe(N + 3);
    await r.flush();
    expect(r.pendingBatches).toBeGreaterThanOrEqual(2);
    cp.dropAfterStore = 1;
    await cp.start();
    await until(() => r.pendingBatches === 0 && r.heldRows === 0, "the spool to drain");
    const ids = cp.modelCalls().map((c) => c.callId);
    expect(ids).toHaveLength(N + 2);
    expect(new Set(ids).size).toBe(N + 2);
    expect(ids.slice(0, 3)).toEqual(["call-00000000", "call-00000001", "call-00000002"]);
    for (const batch of cp.stored.values())
      expect(batch.modelCalls.length).toBeLessThanOrEqual(MAX_AUDIT_ENTRIES);
    expect(cp.totals().get("blocked evil.example")).toBe(1);
    expect(cp.statuses).toContain(409);
    expect(r.stats).toMatchObject({ rowsRecorded: N + 3, rowsSent: N + 3, rowsRefused: 1 });
  });

  it("retries a 5xx with backoff, oldest batch first, and delivers in order", async () => {
    cp.failWith = 503;
    const r = reporter();
    await r.start();
    for (let i = 0; i < 3; i++) {
      r.recordBlocked(`b${i}.example`);
      await r.flush();
    }
    const order = spoolFiles(dir).map((n) => n.slice(13, -5));
    expect(order).toHaveLength(3);
    await until(() => cp.statuses.filter((s) => s === 503).length >= 3, "a few retries");
    cp.failWith = null;
    await until(() => r.pendingBatches === 0, "delivery");
    expect(cp.arrivals).toEqual(order);
  });

  it("crash recovery: a new reporter on the same spool delivers what the old one left", async () => {
    await cp.stop();
    const first = reporter();
    await first.start();
    for (let i = 0; i < 50; i++) first.recordRoute(`r${i % 10}.example`, "tunnel");
    await first.flush();
    for (let i = 0; i < 20; i++) first.recordBlocked("evil.example");
    await first.stop(); // the control plane is down: the final attempt fails, the files stay
    const left = spoolFiles(dir);
    expect(left.length).toBe(2);
    // A temp file from a write the crash interrupted: never renamed, so never sent.
    writeFileSync(join(dir, ".tmp-000000000099-dead.json"), "{ half a batch");

    await cp.start();
    const second = reporter();
    await second.start();
    await until(() => second.pendingBatches === 0, "the old spool to drain");
    expect(cp.arrivals).toEqual(left.map((n) => n.slice(13, -5)));
    expect(cp.totals().get("tunnel r3.example")).toBe(5);
    expect(cp.totals().get("blocked evil.example")).toBe(20);
    expect(second.stats.rowsSent).toBe(70);
    expect(readdirSync(dir).filter((n) => n !== "rejected")).toEqual([]);
  });

  // case E3, the reporter's half: a full spool stops accepting (the proxy's 503: host-policy.test.ts)
  it("E3: a full spool stops accepting egress, and accepts again once it drains", async () => {
    await cp.stop();
    const r = reporter({ maxSpoolBytes: 1500 });
    await r.start();
    let recorded = 0;
    for (let i = 0; i < 40; i++) {
      r.recordRoute(`host-${i}.example.org`, "direct");
      recorded++;
      if (i % 5 === 4) await r.flush();
    }
    expect(r.accepting).toBe(false);
    expect(r.spooledBytes).toBeLessThanOrEqual(1500);
    expect(r.heldRows).toBeGreaterThan(0);
    // Rows for egress the proxy now refuses are still counted, never dropped.
    expect(r.recordRoute("host-1.example.org", "refused")).toBe(true);
    recorded++;
    expect(logs.some((l) => l.event === "audit_spool_full")).toBe(true);

    await cp.start();
    await until(() => r.accepting, "accepting again");
    await until(() => r.pendingBatches === 0 && r.heldRows === 0, "everything delivered");
    const totals = cp.totals();
    expect([...totals.values()].reduce((a, b) => a + b, 0)).toBe(recorded);
    expect(totals.get("refused host-1.example.org")).toBe(1);
    expect(r.stats.rowsSent).toBe(recorded);
  });

  it("a 400 moves the batch to rejected/ and is never retried", async () => {
    cp.override = () => 400;
    const r = reporter();
    await r.start();
    r.recordBlocked("evil.example");
    r.recordBlocked("evil.example");
    await r.flush();
    expect(r.pendingBatches).toBe(0);
    expect(spoolFiles(dir)).toEqual([]);
    expect(spoolFiles(join(dir, "rejected"))).toHaveLength(1);
    expect(r.stats).toMatchObject({ rowsRejected: 2, batchesRejected: 1, rowsSent: 0 });
    const refused = logs.find((l) => l.event === "audit_batch_rejected");
    expect(JSON.stringify(refused?.fields)).toContain('"rows":2');
    // Many flush intervals later, still one attempt.
    await new Promise((resolve) => setTimeout(resolve, 150));
    expect(cp.arrivals).toHaveLength(1);
  });

  it("a batch signed with the wrong key (401) is set aside, not looped on", async () => {
    const r = reporter({ auditKey: newAuditKey() });
    await r.start();
    r.recordBlocked("evil.example");
    await r.flush();
    expect(cp.statuses).toEqual([401]);
    expect(spoolFiles(join(dir, "rejected"))).toHaveLength(1);
    await new Promise((resolve) => setTimeout(resolve, 100));
    expect(cp.statuses).toEqual([401]);
  });

  it("signs at send time: a batch spooled long ago still verifies", async () => {
    let clock = Date.now() - 60 * 60_000;
    await cp.stop();
    const r = reporter({ now: () => clock });
    await r.start();
    r.recordBlocked("evil.example");
    await r.flush();
    clock = Date.now();
    await cp.start();
    await until(() => r.pendingBatches === 0, "delivery");
    const [batch] = [...cp.stored.values()] as [AuditBatch];
    expect(Date.parse(batch.blockedHosts[0]?.firstSeen ?? "")).toBeLessThan(Date.now() - 59 * 60_000);
  });

  it("stop() flushes, tries once, and returns within its bound against a control plane that hangs", async () => {
    cp.hang = true;
    const r = reporter({ stopTimeoutMs: 200, requestTimeoutMs: 60_000 });
    await r.start();
    r.recordBlocked("evil.example");
    const started = Date.now();
    await r.stop();
    expect(Date.now() - started).toBeLessThan(1500);
    expect(spoolFiles(dir)).toHaveLength(1);
    expect(r.accepting).toBe(false);
    expect(r.recordBlocked("evil.example")).toBe(false);
    const file = JSON.parse(readFileSync(join(dir, spoolFiles(dir)[0] as string), "utf8")) as AuditBatch;
    expect(file.blockedHosts).toEqual([expect.objectContaining({ host: "evil.example", count: 1 })]);
  });

  it("sets aside a spooled file that is not a batch of this run", async () => {
    await cp.stop();
    writeFileSync(join(dir, "000000000001-foreign.json"), JSON.stringify({ runId: OTHER_RUN }));
    await cp.start();
    const r = reporter();
    await r.start();
    await until(() => r.pendingBatches === 0, "the file to be set aside");
    expect(existsSync(join(dir, "rejected", "000000000001-foreign.json"))).toBe(true);
    expect(cp.arrivals).toEqual([]);
  });
});
