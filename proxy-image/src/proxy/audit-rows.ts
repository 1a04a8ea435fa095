import {
  type AuditBatch,
  type AuditSource,
  type EgressRoute,
  type LimitKind,
  MAX_AUDIT_ENTRIES,
  type ModelCallRow,
} from "@benchwright/shared/contract/proxy-wire";

// The audit rows held in memory until they are spooled (audit.ts): blocked hosts, egress routes
// stray placeholders and limit refusals counted per key with their first and last time, model calls
// one row each.

interface Seen {
  count: number;
  first: number;
  last: number;
}

export type Entry =
  | { kind: "blocked"; host: string; seen: Seen }
  | { kind: "route"; host: string; route: EgressRoute; seen: Seen }
  | { kind: "model"; row: ModelCallRow }
  | { kind: "stray"; host: string; secret: string; seen: Seen }
  | { kind: "limit"; key: LimitKey; seen: Seen };

/** A limit-refusal row's key (case N3): never the path. */
interface LimitKey {
  host: string;
  method: string;
  limit: LimitKind;
}
const limitKey = (k: LimitKey) => `${k.host} ${k.method} ${k.limit}`;

// Distinct (host, route) keys and model call rows held in memory while the spool is full: rows
// for hosts already held are still counted, a new host or call beyond this is refused (and the
// proxy refuses its egress).
const MAX_MEMORY_KEYS = 100_000;

/** The in-memory aggregate of the audit rows not yet spooled. */
export class HeldRows {
  private readonly blocked = new Map<string, Seen>();
  private readonly routes = new Map<string, { host: string; route: EgressRoute; seen: Seen }>();
  // One entry per call, oldest first: each call is its own row (its callId de-duplicates it).
  private modelCalls: ModelCallRow[] = [];
  // Stray placeholders (N2), by secret name and host.
  private readonly strays = new Map<string, { host: string; secret: string; seen: Seen }>();
  private readonly limits = new Map<string, { key: LimitKey; seen: Seen }>();

  constructor(
    private readonly runId: string,
    private readonly source: AuditSource,
  ) {}

  /** Rows held. */
  get count(): number {
    let rows = 0;
    for (const seen of this.blocked.values()) rows += seen.count;
    for (const { seen } of this.routes.values()) rows += seen.count;
    for (const { seen } of this.strays.values()) rows += seen.count;
    for (const { seen } of this.limits.values()) rows += seen.count;
    return rows + this.modelCalls.length;
  }

  /** Distinct keys held (what MAX_MEMORY_KEYS bounds). */
  get keys(): number {
    return (
      this.blocked.size + this.routes.size + this.modelCalls.length + this.strays.size + this.limits.size
    );
  }

  /** False when a new host would pass the memory bound. */
  addBlocked(host: string, at: number): boolean {
    const seen = this.blocked.get(host);
    if (seen === undefined && this.keys >= MAX_MEMORY_KEYS) return false;
    bump(seen, at, (fresh) => this.blocked.set(host, fresh));
    return true;
  }

  /** False when a new (route, host) would pass the memory bound. */
  addRoute(host: string, route: EgressRoute, at: number): boolean {
    const key = `${route} ${host}`;
    const held = this.routes.get(key);
    if (held === undefined && this.keys >= MAX_MEMORY_KEYS) return false;
    bump(held?.seen, at, (seen) => this.routes.set(key, { host, route, seen }));
    return true;
  }

  /** False when a new (secret, host) would pass the memory bound. */
  addStray(host: string, secret: string, at: number): boolean {
    const key = `${secret} ${host}`;
    const held = this.strays.get(key);
    if (held === undefined && this.keys >= MAX_MEMORY_KEYS) return false;
    bump(held?.seen, at, (seen) => this.strays.set(key, { host, secret, seen }));
    return true;
  }

  /** False when a new (host, method, limit) would pass the memory bound. */
  addLimitRefusal(key: LimitKey, at: number): boolean {
    const held = this.limits.get(limitKey(key));
    if (held === undefined && this.keys >= MAX_MEMORY_KEYS) return false;
    bump(held?.seen, at, (seen) => this.limits.set(limitKey(key), { key, seen }));
    return true;
  }

  /** False when the call would pass the memory bound. */
  addModelCall(row: ModelCallRow): boolean {
    if (this.keys >= MAX_MEMORY_KEYS) return false;
    this.modelCalls.push(row);
    return true;
  }

  /**
   * Detaches the first entries of the aggregate that fit in `room` bytes as one batch. Null when
   * not even one fits (and `oneAlways` is false). Synchronous, so no record lands in between.
   */
  take(room: number, oneAlways: boolean, batchId: string, createdAt: string) {
    const entries: Entry[] = [];
    for (const [host, seen] of this.blocked) {
      if (entries.length >= MAX_AUDIT_ENTRIES) break;
      entries.push({ kind: "blocked", host, seen });
    }
    const routesFrom = entries.length;
    for (const { host, route, seen } of this.routes.values()) {
      if (entries.length - routesFrom >= MAX_AUDIT_ENTRIES) break;
      entries.push({ kind: "route", host, route, seen });
    }
    const modelsFrom = entries.length;
    for (const row of this.modelCalls) {
      if (entries.length - modelsFrom >= MAX_AUDIT_ENTRIES) break;
      entries.push({ kind: "model", row });
    }
    const straysFrom = entries.length;
    for (const { host, secret, seen } of this.strays.values()) {
      if (entries.length - straysFrom >= MAX_AUDIT_ENTRIES) break;
      entries.push({ kind: "stray", host, secret, seen });
    }
    const limitsFrom = entries.length;
    for (const { key, seen } of this.limits.values()) {
      if (entries.length - limitsFrom >= MAX_AUDIT_ENTRIES) break;
      entries.push({ kind: "limit", key, seen });
    }
    let n = entries.length;
    let body = this.serialize(batchId, createdAt, entries.slice(0, n));
    // Hosts are canonical (ASCII), a model's name need not be: count bytes.
    let bytes = Buffer.byteLength(body);
    while (bytes > room && n > 1) {
      n = Math.max(1, Math.min(n - 1, Math.floor((n * room) / bytes)));
      body = this.serialize(batchId, createdAt, entries.slice(0, n));
      bytes = Buffer.byteLength(body);
    }
    if (bytes > room && !oneAlways) return null;
    const chosen = entries.slice(0, n);
    let calls = 0;
    for (const entry of chosen) {
      if (entry.kind === "blocked") this.blocked.delete(entry.host);
      else if (entry.kind === "route") this.routes.delete(`${entry.route} ${entry.host}`);
      else if (entry.kind === "stray") this.strays.delete(`${entry.secret} ${entry.host}`);
      else if (entry.kind === "limit") this.limits.delete(limitKey(entry.key));
      else calls++;
    }
    // Model rows are taken from the front, in order.
    if (calls > 0) this.modelCalls = this.modelCalls.slice(calls);
    return { body, bytes, entries: chosen };
  }

  private serialize(batchId: string, createdAt: string, entries: readonly Entry[]): string {
    const iso = (ms: number) => new Date(ms).toISOString();
    const batch: AuditBatch = {
      schema: 1,
      runId: this.runId,
      batchId,
      source: this.source,
      createdAt,
      blockedHosts: [],
      egressRoutes: [],
      modelCalls: [],
      limitRefusals: [],
      strayPlaceholders: [],
    };
    for (const e of entries) {
      if (e.kind === "model") {
        batch.modelCalls.push(e.row);
        continue;
      }
      const times = { count: e.seen.count, firstSeen: iso(e.seen.first), lastSeen: iso(e.seen.last) };
      if (e.kind === "limit") batch.limitRefusals.push({ ...e.key, ...times });
      else if (e.kind === "blocked") batch.blockedHosts.push({ host: e.host, ...times });
      else if (e.kind === "stray") batch.strayPlaceholders.push({ host: e.host, secret: e.secret, ...times });
      else batch.egressRoutes.push({ host: e.host, route: e.route, ...times });
    }
    return JSON.stringify(batch);
  }

  /** Puts detached entries back (a failed write); merging is commutative, so order does not matter. */
  restore(entries: readonly Entry[]): void {
    const calls: ModelCallRow[] = [];
    for (const entry of entries) {
      if (entry.kind === "model") {
        calls.push(entry.row);
        continue;
      }
      if (entry.kind === "stray") {
        const key = `${entry.secret} ${entry.host}`;
        const held = this.strays.get(key);
        if (held) merge(held.seen, entry.seen);
        else this.strays.set(key, { host: entry.host, secret: entry.secret, seen: entry.seen });
        continue;
      }
      if (entry.kind === "limit") {
        const held = this.limits.get(limitKey(entry.key));
        if (held === undefined) this.limits.set(limitKey(entry.key), { key: entry.key, seen: entry.seen });
        else merge(held.seen, entry.seen);
        continue;
      }
      const current =
        entry.kind === "blocked"
          ? this.blocked.get(entry.host)
          : this.routes.get(`${entry.route} ${entry.host}`)?.seen;
      if (current === undefined) {
        if (entry.kind === "blocked") this.blocked.set(entry.host, entry.seen);
        else
          this.routes.set(`${entry.route} ${entry.host}`, {
            host: entry.host,
            route: entry.route,
            seen: entry.seen,
          });
        continue;
      }
      merge(current, entry.seen);
    }
    // Back in front of the calls recorded since, so they still go out oldest first.
    if (calls.length > 0) this.modelCalls = [...calls, ...this.modelCalls];
  }
}

function merge(into: Seen, from: Seen): void {
  into.count += from.count;
  into.first = Math.min(into.first, from.first);
  into.last = Math.max(into.last, from.last);
}

function bump(seen: Seen | undefined, at: number, create: (seen: Seen) => void): void {
  if (seen === undefined) {
    create({ count: 1, first: at, last: at });
    return;
  }
  seen.count++;
  if (at < seen.first) seen.first = at;
  if (at > seen.last) seen.last = at;
}
