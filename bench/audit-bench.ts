// The audit ingest bench: `npm run bench:audit`. Signed audit batches, as a run's proxy sends
// them (proxy-image/src/proxy/audit.ts), posted to the control plane's real ingest route
// (POST /internal/runs/{id}/audit, src/routes/internal.ts) on a local `wrangler dev` over a real
// PostgreSQL (a throwaway cluster of the machine's own, through the Neon driver and the
// WebSocket bridge, as the tests run it). Baselines in the same run: the same batches stored by
// the same code (storeAuditBatch) straight from Node through the Neon driver, on a kept pool and
// with a fresh connection per batch (what the Worker does: src/db/client.ts). Rows/s stored,
// and the ratios. Loopback only; skipped with a message when PostgreSQL is not installed.
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { parseKeyRing } from "@benchwright/shared/contract/key-ring";
import { type AuditBatch, auditPath, signAuditBatch } from "@benchwright/shared/contract/proxy-wire";
import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { Pool } from "@neondatabase/serverless";
import { drizzle } from "drizzle-orm/neon-serverless";
import { configureNeonForNode, nodeDb } from "../scripts/lib/neon-node";
import { freePort } from "../scripts/lib/postgres";
import { startWorkerDev } from "../scripts/lib/worker-dev";
import { randomId } from "../src/crypto/api-keys";
import * as schema from "../src/db/schema";
import { issueProxyCredentials, type RunOwner } from "../src/runs/proxy-credentials";
import { storeAuditBatch } from "../src/runs/proxy-reports";
import { type AuditResults, type AuditRow, type AuditTarget, auditSection } from "./lib/audit-report";
import { publish, summaryLines } from "./lib/page";
import { flatOutWindow, num, quantiles, runBench, sectionHead, type WindowGate } from "./lib/results";
import { newTenant, newVaultKek, onStop, startDatabase, stopAll, whyNoPostgres } from "./lib/stack";

const CONFIG = {
  /** Seconds measured per row (target and batch size), over all rounds. */
  durationS: num("BENCH_AUDIT_DURATION_S", 8),
  /** Windows per row, the targets of a batch size taking turns. */
  rounds: num("BENCH_AUDIT_ROUNDS", 2),
  warmupS: num("BENCH_AUDIT_WARMUP_S", 1),
  /** Senders at once: proxies delivering (each has one batch in flight at most). */
  concurrency: num("BENCH_AUDIT_CONCURRENCY", 8),
  /** Rows per batch (half blocked hosts, half egress routes), one row of the table each. */
  batchRows: (process.env.BENCH_AUDIT_BATCH_ROWS || "10,500").split(",").map((x) => {
    const n = Number(x);
    if (!Number.isInteger(n) || n < 1 || n > 20_000) throw new Error("BENCH_AUDIT_BATCH_ROWS: 1..20000 each");
    return n;
  }),
};
const SHORT = CONFIG.durationS < 8 || CONFIG.rounds < 2;
const TARGETS: AuditTarget[] = ["route", "direct-pooled", "direct-fresh"];

const log = (s: string) => process.stderr.write(`${s}\n`);

interface Run extends RunOwner {
  proxyToken: string;
  auditKey: string;
}

let seq = 0;
/** A batch of `rows` new hosts for `run`: each row inserts, none only bumps a count. */
function batchOf(run: Run, rows: number): AuditBatch {
  const n = ++seq;
  const now = new Date().toISOString();
  const blocked = Math.ceil(rows / 2);
  return {
    schema: 1,
    runId: run.id,
    batchId: `bat_bench_${n}_${randomBytes(4).toString("hex")}`,
    source: "proxy",
    createdAt: now,
    blockedHosts: Array.from({ length: blocked }, (_, i) => ({
      host: `b${n}x${i}.audit.test`,
      count: 1 + (i % 7),
      firstSeen: now,
      lastSeen: now,
    })),
    egressRoutes: Array.from({ length: rows - blocked }, (_, i) => ({
      host: `r${n}x${i}.audit.test`,
      route: "direct" as const,
      count: 1 + (i % 5),
      firstSeen: now,
      lastSeen: now,
    })),
    modelCalls: [],
    limitRefusals: [],
    strayPlaceholders: [],
  };
}

type Send = (run: Run, batch: AuditBatch) => Promise<{ ok: boolean; status: number }>;

interface Window {
  latencies: number[];
  batches: number;
  rows: number;
  errors: number;
  statuses: Record<string, number>;
  windowS: number;
  /** Rows of every batch acknowledged, warm-up and tail included (all of them are stored). */
  acked: number;
}

/** `concurrency` senders flat out; counts what completes inside the window after warm-up. */
async function load(send: Send, run: Run, rows: number, windowS: number): Promise<Window> {
  const w: Window = { latencies: [], batches: 0, rows: 0, errors: 0, statuses: {}, windowS: 0, acked: 0 };
  const sender = async (gate: WindowGate) => {
    while (gate.running) {
      const batch = batchOf(run, rows);
      const t0 = performance.now();
      let r: { ok: boolean; status: number };
      try {
        r = await send(run, batch);
      } catch {
        r = { ok: false, status: 0 };
      }
      if (r.ok) w.acked += rows;
      if (!gate.counting) continue;
      if (r.ok) {
        w.batches++;
        w.rows += rows;
        w.latencies.push(performance.now() - t0);
      } else {
        w.errors++;
        w.statuses[r.status] = (w.statuses[r.status] ?? 0) + 1;
      }
    }
  };
  w.windowS = await flatOutWindow(CONFIG.concurrency, sender, CONFIG.warmupS, windowS);
  return w;
}

async function main(): Promise<number> {
  const why = whyNoPostgres();
  if (why) {
    log(`audit bench skipped: ${why}. Its section of bench/results is left as it was.`);
    return 0;
  }
  const started = Date.now();
  const dir = mkdtempSync(join(tmpdir(), "bw-bench-audit-"));
  onStop(async () => rmSync(dir, { recursive: true, force: true }));
  try {
    const db = await startDatabase();
    onStop(() => db.stop());
    log(`PostgreSQL ${db.version} up; starting wrangler dev`);
    const kek = newVaultKek();
    const worker = await startWorkerDev({
      port: await freePort(),
      envFile: join(dir, "worker.vars"),
      persistTo: join(dir, "wrangler-state"),
      secrets: {
        DATABASE_URL: db.url,
        VAULT_KEK: kek,
        COMPUTE_BACKEND_SECRET: randomBytes(32).toString("base64url"),
      },
      vars: { DATABASE_WS_PROXY: db.wsProxy, COMPUTE_BACKEND_URL: "" },
      log: process.env.BENCH_VERBOSE ? (line) => log(`[wrangler] ${line}`) : undefined,
    });
    onStop(() => worker.stop());
    const apiUrl = worker.url;
    log(`wrangler dev on ${apiUrl}`);

    // One run per row, with real proxy credentials issued by the control plane's own code.
    configureNeonForNode(db.wsProxy);
    const tenant = await newTenant(db.url, "audit");
    const ring = parseKeyRing(kek);
    const admin = nodeDb(db.url);
    const newRun = async (): Promise<Run> => {
      const owner = { id: randomId("run_"), userId: tenant.userId, environmentId: tenant.environmentId };
      await admin.db.insert(schema.runs).values({
        ...owner,
        status: "running",
        spec: RunSpec.parse({ commands: ["true"] }),
        backend: "local",
      });
      return { ...owner, ...(await issueProxyCredentials(admin.db, ring, owner)) };
    };

    const pooled = new Pool({ connectionString: db.url, max: CONFIG.concurrency, idleTimeoutMillis: 0 });
    pooled.on("error", () => {});
    const pooledDb = drizzle({ client: pooled, schema });
    const dbUrl = db.url;
    const send: Record<AuditTarget, Send> = {
      // As the proxy's AuditReporter sends it: signed raw body, its proxy token.
      route: async (run, batch) => {
        const body = JSON.stringify(batch);
        const res = await fetch(`${apiUrl}${auditPath(run.id)}`, {
          method: "POST",
          headers: {
            authorization: `Bearer ${run.proxyToken}`,
            "content-type": "application/json",
            ...signAuditBatch(run.auditKey, batch.batchId, new Date(), body),
          },
          body,
        });
        await res.arrayBuffer();
        return { ok: res.status === 204, status: res.status };
      },
      "direct-pooled": async (run, batch) => ({ ok: await storeAuditBatch(pooledDb, run, batch), status: 0 }),
      "direct-fresh": async (run, batch) => {
        const pool = new Pool({ connectionString: dbUrl, max: 1 });
        pool.on("error", () => {});
        try {
          return { ok: await storeAuditBatch(drizzle({ client: pool, schema }), run, batch), status: 0 };
        } finally {
          await pool.end();
        }
      },
    };

    // What one connection costs the driver here (it is the Worker's cost per request too).
    const connect: number[] = [];
    const connectCpu: number[] = [];
    for (let i = 0; i < 5; i++) {
      const u0 = process.cpuUsage();
      const t0 = performance.now();
      const pool = new Pool({ connectionString: dbUrl, max: 1 });
      await pool.query("select 1");
      await pool.end();
      connect.push(performance.now() - t0);
      const u = process.cpuUsage(u0);
      connectCpu.push((u.user + u.system) / 1000);
    }
    log(`a fresh connection (connect, select 1, end): ${quantiles(connect).median.toFixed(0)} ms`);

    const rows: AuditRow[] = [];
    for (const size of CONFIG.batchRows) {
      const cells = await Promise.all(
        TARGETS.map(async (target) => ({ target, run: await newRun(), windows: [] as Window[] })),
      );
      for (let round = 1; round <= CONFIG.rounds; round++) {
        for (const cell of cells) {
          const w = await load(send[cell.target], cell.run, size, CONFIG.durationS / CONFIG.rounds);
          cell.windows.push(w);
          log(
            `${size}-row batches, ${cell.target} (round ${round}/${CONFIG.rounds}): ${(w.rows / w.windowS).toFixed(0)} rows/s, ` +
              `${(w.batches / w.windowS).toFixed(1)} batches/s, errors ${w.errors}`,
          );
        }
      }
      for (const cell of cells) {
        const sum = (k: "batches" | "rows" | "errors" | "windowS" | "acked") =>
          cell.windows.reduce((n, w) => n + w[k], 0);
        const lat = cell.windows.flatMap((w) => w.latencies).sort((a, b) => a - b);
        const stored = await admin.pool.query(
          "select (select count(*) from blocked_host_log where run_id = $1) + (select count(*) from egress_route_log where run_id = $1) as n",
          [cell.run.id],
        );
        const statuses: Record<string, number> = {};
        for (const w of cell.windows)
          for (const [k, v] of Object.entries(w.statuses)) statuses[k] = (statuses[k] ?? 0) + v;
        rows.push({
          batchRows: size,
          target: cell.target,
          batchesPerS: sum("batches") / sum("windowS"),
          rowsPerS: sum("rows") / sum("windowS"),
          p50Ms: quantiles(lat).median,
          p99Ms: lat.length
            ? (lat[Math.min(lat.length - 1, Math.floor(0.99 * lat.length))] as number)
            : Number.NaN,
          errors: sum("errors"),
          statuses,
          measuredS: sum("windowS"),
          rowsAcked: sum("acked"),
          rowsStored: Number(stored.rows[0]?.n ?? Number.NaN),
        });
      }
    }
    await pooled.end();
    await admin.pool.end();

    const results: AuditResults = {
      ...sectionHead("audit", started, SHORT),
      config: { ...CONFIG, batchRows: CONFIG.batchRows.join(",") },
      postgres: db.version,
      connection: { ms: quantiles(connect).median, cpuMs: quantiles(connectCpu).median },
      rows,
    };
    const section = auditSection(results);
    const written = publish(section);
    process.stdout.write(`\naudit ingest bench:\n${summaryLines(section)}\nwritten to ${written}\n`);
    return 0;
  } finally {
    await stopAll();
  }
}

runBench("audit bench", main);
