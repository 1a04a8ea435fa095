import { randomUUID } from "node:crypto";
import { mkdir, open, readdir, readFile, rename, stat, unlink } from "node:fs/promises";
import { join } from "node:path";
import { canonicalHost } from "@benchwright/shared/contract/host-name";
import { logLine } from "@benchwright/shared/contract/log";
import {
  AuditBatch,
  type AuditSource,
  auditPath,
  bearer,
  type EgressRoute,
  JSON_CONTENT_TYPE,
  type LimitKind,
  LimitRefusalRow,
  ModelCallRow,
  signAuditBatch,
} from "@benchwright/shared/contract/proxy-wire";
import { HeldRows } from "./audit-rows";
import type { FetchFn, LogFn } from "./policy-client";

// Audit rows (blocked hosts, egress routes, limit refusals: host and counts only; stray
// placeholders: host, secret name and counts; model calls: one row per call, counts only, never
// aggregated) leave the proxy in batches.
// Each batch is written to a spool directory before it is sent and deleted only once the control
// plane has it, so a control-plane outage or a crash loses nothing (case F1); the control plane
// de-duplicates on the batch id, so a retry is never counted twice. The spool is bounded: when it
// is full, `accepting` turns false and the proxy refuses new egress rather than drop rows (E3).

export interface AuditReporterOptions {
  controlPlaneUrl: string;
  runId: string;
  proxyToken: string;
  /** The run's audit key (`whsec_...`). */
  auditKey: string;
  /** Owned by this reporter: batches `NNNNNNNNNNNN-<batchId>.json`, and `rejected/`. */
  spoolDir: string;
  /** Default 8 MiB. */
  maxSpoolBytes?: number;
  /** How often the aggregate is spooled and sent; at most 1000. Default 1000. */
  flushIntervalMs?: number;
  source?: AuditSource;
  fetch?: FetchFn;
  /** Clock for the rows' timestamps and the signatures (ms since the epoch). */
  now?: () => number;
  log?: LogFn;
  /** Per request. Default 10 s. */
  requestTimeoutMs?: number;
  /** Bound on stop(). Default 5 s. */
  stopTimeoutMs?: number;
  /** Retry backoff after a 5xx or network error: base and cap. Defaults 500 ms and 30 s. */
  retryBaseMs?: number;
  retryMaxMs?: number;
  /** A batch is split to stay under this many bytes. Default 1 MiB. */
  maxBatchBytes?: number;
}

export interface AuditStats {
  /** Rows taken by recordBlocked / recordRoute / recordStrayPlaceholder / recordModelCall / recordLimitRefusal. */
  rowsRecorded: number;
  /** Rows the control plane has acknowledged (2xx, or 409: it had them already). */
  rowsSent: number;
  /** Rows in batches the control plane refused for good (moved to rejected/, logged). */
  rowsRejected: number;
  /** Record calls that were refused (invalid host, stopped, memory bound); each one logged. */
  rowsRefused: number;
  batchesSent: number;
  batchesRejected: number;
}

interface Spooled {
  name: string;
  batchId: string;
  bytes: number;
}

const SPOOL_FILE = /^(\d{12})-([A-Za-z0-9_-]{1,64})\.json$/;
const REJECTED = "rejected";
const defaultLog: LogFn = (level, event, fields) => {
  console.error(logLine(level, { event, component: "audit", ...fields }));
};

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms).unref());

export class AuditReporter {
  private readonly rows: HeldRows;
  private readonly queue: Spooled[] = [];
  private spoolBytes = 0;
  private nextSeq = 1;
  // True while rows sit in memory because the spool had no room (or could not be written).
  private held = false;
  private writeFailed = false;
  private running = false;
  private stopped = false;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private readonly abort = new AbortController();
  private init: Promise<void> | null = null;
  private writeChain: Promise<unknown> = Promise.resolve();
  private delivering: Promise<void> | null = null;
  private failures = 0;
  private nextAttemptAt = 0;
  private stopping: Promise<void> | null = null;

  private readonly url: string;
  private readonly rejectedDir: string;
  private readonly maxSpoolBytes: number;
  private readonly flushIntervalMs: number;
  private readonly maxBatchBytes: number;
  private readonly fetchFn: FetchFn;
  private readonly now: () => number;
  private readonly log: LogFn;

  readonly stats: AuditStats = {
    rowsRecorded: 0,
    rowsSent: 0,
    rowsRejected: 0,
    rowsRefused: 0,
    batchesSent: 0,
    batchesRejected: 0,
  };

  constructor(private readonly options: AuditReporterOptions) {
    this.rows = new HeldRows(options.runId, options.source ?? "proxy");
    this.url = new URL(auditPath(options.runId), options.controlPlaneUrl).toString();
    this.rejectedDir = join(options.spoolDir, REJECTED);
    this.maxSpoolBytes = options.maxSpoolBytes ?? 8 * 1024 * 1024;
    this.flushIntervalMs = options.flushIntervalMs ?? 1000;
    if (!Number.isInteger(this.flushIntervalMs) || this.flushIntervalMs < 1 || this.flushIntervalMs > 1000) {
      throw new RangeError("flushIntervalMs must be an integer in 1..1000");
    }
    this.maxBatchBytes = options.maxBatchBytes ?? 1024 * 1024;
    this.fetchFn = options.fetch ?? ((url, init) => fetch(url, init));
    this.now = options.now ?? Date.now;
    this.log = options.log ?? defaultLog;
  }

  /** False while rows wait in memory for spool space: the proxy must refuse new egress (E3). */
  get accepting(): boolean {
    return !this.stopped && !this.held && !this.writeFailed;
  }

  /** Batches spooled and not yet acknowledged. */
  get pendingBatches(): number {
    return this.queue.length;
  }

  /** Bytes of the batches in the spool. */
  get spooledBytes(): number {
    return this.spoolBytes;
  }

  /** Rows counted in memory, not yet spooled. */
  get heldRows(): number {
    return this.rows.count;
  }

  /** A request to `host` was refused by host policy. False when the row could not be kept. */
  recordBlocked(host: string): boolean {
    const canonical = this.admit(host);
    if (canonical === null) return false;
    if (!this.rows.addBlocked(canonical, this.now()))
      return this.refuse("too many distinct hosts held in memory");
    this.stats.rowsRecorded++;
    return true;
  }

  /** A connection to `host` went out by `route` (or was refused). False when the row could not be kept. */
  recordRoute(host: string, route: EgressRoute): boolean {
    const canonical = this.admit(host);
    if (canonical === null) return false;
    if (!this.rows.addRoute(canonical, route, this.now()))
      return this.refuse("too many distinct hosts held in memory");
    this.stats.rowsRecorded++;
    return true;
  }

  /** A run placeholder sent unswapped to `host` (N2). False when the row could not be kept. */
  recordStrayPlaceholder(host: string, secret: string): boolean {
    const canonical = this.admit(host);
    if (canonical === null) return false;
    if (!this.rows.addStray(canonical, secret, this.now()))
      return this.refuse("too many distinct hosts held in memory");
    this.stats.rowsRecorded++;
    return true;
  }

  /**
   * A request to `host` refused for a method or path limit (case N3). The method is counted by
   * its uppercase name (the row's token); one that is not a method token is not kept.
   */
  recordLimitRefusal(host: string, method: string, limit: LimitKind): boolean {
    const canonical = this.admit(host);
    if (canonical === null) return false;
    const name = method.toUpperCase();
    if (!LimitRefusalRow.shape.method.safeParse(name).success) return this.refuse("not a method token");
    if (!this.rows.addLimitRefusal({ host: canonical, method: name, limit }, this.now()))
      return this.refuse("too many distinct rows held in memory");
    this.stats.rowsRecorded++;
    return true;
  }

  /** A call through the model lane. False when the row could not be kept. */
  recordModelCall(row: ModelCallRow): boolean {
    if (this.stopped) return this.refuse("the reporter is stopped");
    // The row is not logged: only that it did not fit the contract.
    const parsed = ModelCallRow.safeParse(row);
    if (!parsed.success) return this.refuse("not a valid model call row");
    if (!this.rows.addModelCall(parsed.data)) return this.refuse("too many rows held in memory");
    this.stats.rowsRecorded++;
    return true;
  }

  /** Reads the spool left by a previous process, sends it, and starts the flush timer. */
  async start(): Promise<void> {
    if (this.running || this.stopped) return;
    this.running = true;
    await this.ready();
    this.deliver().catch((error) => this.log("error", "audit_delivery_failed", { error: errorName(error) }));
    this.schedule();
  }

  /** Spools what is in memory and tries to send now (ignoring a pending backoff). */
  async flush(): Promise<void> {
    await this.spool(false);
    this.nextAttemptAt = 0;
    await this.deliver();
  }

  /**
   * Final flush and one send attempt, bounded by stopTimeoutMs. Rows still in memory are spooled
   * even past maxSpoolBytes (the bound protects a long run's disk; losing them would be worse).
   * What is not delivered stays in the spool for the next process.
   */
  stop(): Promise<void> {
    if (this.stopping) return this.stopping;
    this.stopped = true;
    this.running = false;
    if (this.timer) clearTimeout(this.timer);
    this.timer = null;
    const limit = this.options.stopTimeoutMs ?? 5000;
    const work = (async () => {
      await this.spool(true);
      await this.delivering;
      this.nextAttemptAt = 0;
      await this.deliver();
    })().catch((error) => this.log("error", "audit_final_flush_failed", { error: errorName(error) }));
    const deadline = sleep(limit).then(() => {
      this.abort.abort();
      return sleep(100);
    });
    this.stopping = Promise.race([work, deadline]).then(() => {
      if (this.queue.length > 0 || this.heldRows > 0) {
        this.log("warn", "audit_undelivered_at_stop", {
          pendingBatches: this.queue.length,
          heldRows: this.heldRows,
        });
      }
    });
    return this.stopping;
  }

  // ---- recording ----

  private admit(host: string): string | null {
    if (this.stopped) {
      this.refuse("the reporter is stopped");
      return null;
    }
    const canonical = canonicalHost(host);
    // The raw input is not logged: it is not a valid host and could carry anything.
    if (canonical === null) this.refuse("not a valid host");
    return canonical;
  }

  private refuse(reason: string): false {
    this.stats.rowsRefused++;
    this.log("error", "audit_row_refused", { reason });
    return false;
  }

  // ---- spooling ----

  private ready(): Promise<void> {
    this.init ??= this.scan();
    return this.init;
  }

  /** Creates the spool, drops half-written temp files, and queues what a previous process left. */
  private async scan(): Promise<void> {
    await mkdir(this.rejectedDir, { recursive: true, mode: 0o700 });
    const names = (await readdir(this.options.spoolDir)).sort();
    for (const name of names) {
      const path = join(this.options.spoolDir, name);
      if (name.startsWith(".tmp-")) {
        // Never renamed, so never counted as spooled; its rows are still in that process's memory
        // or were lost with it before any acknowledgement could have been given.
        await unlink(path).catch(() => undefined);
        continue;
      }
      const match = SPOOL_FILE.exec(name);
      if (!match) continue;
      const size = (await stat(path)).size;
      this.queue.push({ name, batchId: match[2] ?? "", bytes: size });
      this.spoolBytes += size;
      this.nextSeq = Math.max(this.nextSeq, Number(match[1]) + 1);
    }
    if (this.queue.length > 0) {
      this.log("info", "audit_spool_found", {
        batches: this.queue.length,
        bytes: this.spoolBytes,
      });
    }
  }

  /** Moves the in-memory aggregate into spool files, in batches that fit. Serialised. */
  private spool(force: boolean): Promise<void> {
    const next = this.writeChain.then(() => this.spoolOnce(force));
    this.writeChain = next.catch(() => undefined);
    return next;
  }

  private async spoolOnce(force: boolean): Promise<void> {
    await this.ready();
    while (this.rows.keys > 0) {
      // Room left under the bound; a lone batch is always allowed, or a tiny bound could never drain.
      const room = force
        ? this.maxBatchBytes
        : Math.min(this.maxBatchBytes, this.maxSpoolBytes - this.spoolBytes);
      const taken = this.take(room, force || this.queue.length === 0);
      // Rows that arrive while this batch is written wait for the next flush: looping on them
      // sent a stream of one-row batches under steady traffic (seen in the bench).
      const more = force || this.rows.keys > 0;
      if (taken === null) {
        if (!this.held) {
          this.log("warn", "audit_spool_full", {
            spooledBytes: this.spoolBytes,
            maxSpoolBytes: this.maxSpoolBytes,
          });
        }
        this.held = true;
        return;
      }
      try {
        await this.writeBatch(taken.name, taken.body);
      } catch (error) {
        this.rows.restore(taken.entries);
        if (!this.writeFailed) this.log("error", "audit_spool_write_failed", { error: errorName(error) });
        this.writeFailed = true;
        this.held = true;
        return;
      }
      this.queue.push({ name: taken.name, batchId: taken.batchId, bytes: taken.bytes });
      this.spoolBytes += taken.bytes;
      if (!more) break;
    }
    if (this.held || this.writeFailed) this.log("info", "audit_spool_room_again");
    this.held = false;
    this.writeFailed = false;
  }

  /** The next batch of what is held, named for the spool; null when none fits in `room`. */
  private take(room: number, oneAlways: boolean) {
    const batchId = randomUUID();
    const taken = this.rows.take(room, oneAlways, batchId, new Date(this.now()).toISOString());
    if (taken === null) return null;
    const name = `${String(this.nextSeq++).padStart(12, "0")}-${batchId}.json`;
    return { name, batchId, ...taken };
  }

  /** Atomic: temp file, fsync, rename, fsync of the directory. */
  private async writeBatch(name: string, body: string): Promise<void> {
    const dir = this.options.spoolDir;
    const tmp = join(dir, `.tmp-${name}`);
    const file = await open(tmp, "wx", 0o600);
    try {
      await file.writeFile(body, "utf8");
      await file.sync();
    } finally {
      await file.close();
    }
    await rename(tmp, join(dir, name));
    const handle = await open(dir, "r").catch(() => null);
    if (handle)
      await handle
        .sync()
        .catch(() => undefined)
        .finally(() => handle.close());
  }

  // ---- delivery ----

  private schedule(): void {
    if (!this.running) return;
    this.timer = setTimeout(async () => {
      try {
        await this.spool(false);
        if (Date.now() >= this.nextAttemptAt) await this.deliver();
      } catch (error) {
        this.log("error", "audit_flush_failed", { error: errorName(error) });
      }
      this.schedule();
    }, this.flushIntervalMs);
    this.timer.unref();
  }

  /** Sends spooled batches oldest first until one fails. Single-flight. */
  private deliver(): Promise<void> {
    this.delivering ??= this.deliverLoop().finally(() => {
      this.delivering = null;
    });
    return this.delivering;
  }

  private async deliverLoop(): Promise<void> {
    await this.ready();
    while (this.queue.length > 0) {
      if (this.abort.signal.aborted) return;
      const head = this.queue[0] as Spooled;
      const outcome = await this.sendOne(head);
      if (outcome === "retry") {
        this.failures++;
        const backoff = Math.min(
          this.options.retryMaxMs ?? 30_000,
          (this.options.retryBaseMs ?? 500) * 2 ** Math.min(this.failures - 1, 20),
        );
        // Equal jitter: many proxies coming back after one outage do not retry in lockstep.
        this.nextAttemptAt = Date.now() + backoff / 2 + Math.random() * (backoff / 2);
        return;
      }
      if (this.failures > 0) this.log("info", "audit_delivery_resumed", { failedAttempts: this.failures });
      this.failures = 0;
      this.nextAttemptAt = 0;
      this.queue.shift();
      this.spoolBytes -= head.bytes;
      // Delivery made room: rows waiting in memory can go to the spool now.
      if (this.held && !this.stopped) await this.spool(false);
    }
  }

  private async sendOne(entry: Spooled): Promise<"done" | "retry"> {
    const path = join(this.options.spoolDir, entry.name);
    let body: string;
    try {
      body = await readFile(path, "utf8");
    } catch (error) {
      this.log("error", "audit_batch_unreadable", {
        batchId: entry.batchId,
        error: errorName(error),
      });
      return "done";
    }
    let batch: AuditBatch;
    try {
      batch = AuditBatch.parse(JSON.parse(body));
      if (batch.runId !== this.options.runId || batch.batchId !== entry.batchId)
        throw new Error("another run");
    } catch {
      // Corrupt or foreign: it can never be accepted, so it is set aside, not retried.
      await this.reject(entry, path, 0, "the spooled file is not a batch of this run");
      return "done";
    }
    const rows = countRows(batch);

    let status: number;
    let detail = "";
    try {
      // Signed at send time, not spool time: a batch that waited out a long outage must not
      // arrive with a timestamp outside the 5-minute window.
      const headers = {
        ...signAuditBatch(this.options.auditKey, entry.batchId, new Date(this.now()), body),
        authorization: bearer(this.options.proxyToken),
        "content-type": JSON_CONTENT_TYPE,
      };
      const signal = AbortSignal.any([
        this.abort.signal,
        AbortSignal.timeout(this.options.requestTimeoutMs ?? 10_000),
      ]);
      const response = await this.fetchFn(this.url, {
        method: "POST",
        headers,
        body,
        signal,
        redirect: "error",
      });
      status = response.status;
      detail = status >= 400 && status < 500 && status !== 409 ? (await response.text()).slice(0, 300) : "";
      if (!detail) await response.body?.cancel();
    } catch (error) {
      if (this.failures === 0) {
        this.log("warn", "audit_delivery_retrying", {
          batchId: entry.batchId,
          error: errorName(error),
        });
      }
      return "retry";
    }

    if ((status >= 200 && status < 300) || status === 409) {
      await unlink(path).catch((error) =>
        this.log("error", "audit_batch_delete_failed", {
          batchId: entry.batchId,
          error: errorName(error),
        }),
      );
      this.stats.rowsSent += rows;
      this.stats.batchesSent++;
      return "done";
    }
    if (status >= 400 && status < 500 && status !== 408 && status !== 429) {
      await this.reject(entry, path, rows, `the control plane answered HTTP ${status}`, detail);
      return "done";
    }
    if (this.failures === 0) {
      this.log("warn", "audit_delivery_retrying", { batchId: entry.batchId, status });
    }
    return "retry";
  }

  private async reject(
    entry: Spooled,
    path: string,
    rows: number,
    reason: string,
    detail = "",
  ): Promise<void> {
    await rename(path, join(this.rejectedDir, entry.name)).catch(() => unlink(path).catch(() => undefined));
    this.stats.rowsRejected += rows;
    this.stats.batchesRejected++;
    this.log("error", "audit_batch_rejected", {
      batchId: entry.batchId,
      rows,
      reason,
      detail,
    });
  }
}

function countRows(batch: AuditBatch): number {
  let rows = 0;
  for (const row of batch.blockedHosts) rows += row.count;
  for (const row of batch.egressRoutes) rows += row.count;
  for (const row of batch.strayPlaceholders) rows += row.count;
  return rows + batch.modelCalls.length;
}

function errorName(error: unknown): string {
  if (error instanceof Error) {
    const code =
      (error as { code?: unknown; cause?: { code?: unknown } }).code ??
      (error as { cause?: { code?: unknown } }).cause?.code;
    return typeof code === "string" ? `${error.name} (${code})` : error.name;
  }
  return "unknown error";
}
