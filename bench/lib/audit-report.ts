import { f, int, ratio, type SectionHead, type SummaryRow, times } from "./results";

// The audit ingest bench's section of the results page (bench/audit-bench.ts).

/** route: the Worker's ingest route; direct-*: storeAuditBatch from Node, kept pool or fresh connection. */
export type AuditTarget = "route" | "direct-pooled" | "direct-fresh";

export interface AuditRow {
  batchRows: number;
  target: AuditTarget;
  batchesPerS: number;
  rowsPerS: number;
  p50Ms: number;
  p99Ms: number;
  /** Batches not stored (route: not 204), by status. */
  errors: number;
  statuses: Record<string, number>;
  measuredS: number;
  /** Rows of the acknowledged batches (warm-up included) and the rows the database holds: equal. */
  rowsAcked: number;
  rowsStored: number;
}

export interface AuditResults extends SectionHead {
  config: { durationS: number; rounds: number; warmupS: number; concurrency: number; batchRows: string };
  postgres: string;
  /** One fresh connection from Node (connect, `select 1`, end), serially: wall and CPU ms, medians. */
  connection: { ms: number; cpuMs: number };
  rows: AuditRow[];
}

const LABEL: Record<AuditTarget, string> = {
  route: "ingest route (wrangler dev)",
  "direct-pooled": "direct, Neon driver, kept pool",
  "direct-fresh": "direct, Neon driver, connection per batch",
};

const find = (r: AuditResults, size: number, t: AuditTarget) =>
  r.rows.find((x) => x.batchRows === size && x.target === t);

export function auditSection(r: AuditResults): AuditResults {
  const summary: SummaryRow[] = [];
  for (const size of new Set(r.rows.map((x) => x.batchRows))) {
    const route = find(r, size, "route");
    const base = find(r, size, "direct-pooled");
    summary.push({
      measure: `audit rows/s stored through the ingest route, ${int(size)}-row batches, ${r.config.concurrency} senders`,
      result: `${int(route?.rowsPerS ?? Number.NaN)} rows/s`,
      baseline: `${int(base?.rowsPerS ?? Number.NaN)} rows/s (same batches, storeAuditBatch through the Neon driver)`,
      ratio: times(ratio(route?.rowsPerS, base?.rowsPerS)),
    });
  }
  return { ...r, summary };
}

export function renderAudit(r: AuditResults): string {
  const c = r.config;
  const lines = [
    "## Audit ingest bench (`npm run bench:audit`, bench/audit-bench.ts)",
    "",
    ...(r.short ? ["**Short run**: settings below the defaults, so these numbers say less.", ""] : []),
    `- date: ${r.date}, commit ${r.commit}, whole run ${f(r.wallS, 0)} s`,
    `- machine: ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.machine.node}, PostgreSQL ${r.postgres} (throwaway cluster, fsync off, as in the tests)`,
    `- ${c.concurrency} senders flat out, each with one batch in flight (as many proxies delivering at once); ` +
      `${c.durationS} s measured per row in ${c.rounds} window${c.rounds === 1 ? "" : "s"}, each after ${c.warmupS} s unmeasured; ` +
      "every row of every batch is a new host (half blocked hosts, half egress routes), so each row is an insert",
    "",
    "Signed audit batches, as a run's proxy sends them, posted to `POST /internal/runs/{id}/audit` on",
    "`wrangler dev` (proxy-token lookup, audit-key decryption, signature and schema check, then",
    "`storeAuditBatch`: the batch id and the rows in one transaction), against the same batches stored",
    "by the same `storeAuditBatch` straight from Node through the Neon driver and the same WebSocket",
    "bridge: on a kept pool (what Postgres and the driver can take) and with a connection opened per",
    "batch (what the Worker does per request, src/db/client.ts). Rows/s counts rows of batches",
    "acknowledged inside the windows.",
    "",
    "| rows per batch | through | batches/s | rows/s | p50 ms | p99 ms | × direct (kept pool) | × direct (connection per batch) | not stored | rows acknowledged / in the database |",
    "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const x of r.rows) {
    const pooled = find(r, x.batchRows, "direct-pooled");
    const fresh = find(r, x.batchRows, "direct-fresh");
    const statuses = Object.entries(x.statuses)
      .map(([k, v]) => `${k === "0" ? "error" : k}: ${v}`)
      .join(", ");
    lines.push(
      `| ${int(x.batchRows)} | ${LABEL[x.target]} | ${f(x.batchesPerS, 1)} | ${int(x.rowsPerS)} | ${f(x.p50Ms, 1)} | ${f(x.p99Ms, 1)} | ${f(ratio(x.rowsPerS, pooled?.rowsPerS), 2)} | ${f(ratio(x.rowsPerS, fresh?.rowsPerS), 2)} | ${x.errors}${statuses ? ` (${statuses})` : ""} | ${int(x.rowsAcked)} / ${int(x.rowsStored)} |`,
    );
  }
  const lost = r.rows.filter((x) => x.rowsAcked !== x.rowsStored);
  lines.push(
    "",
    `One fresh connection through the driver and the bridge (connect, \`select 1\`, end), one at a time: ${f(r.connection.ms, 0)} ms, ` +
      `${f(r.connection.cpuMs, 0)} ms of it CPU in the client (the driver's SCRAM-SHA-256 login: 4,096 HMAC rounds, each an awaited WebCrypto call). ` +
      "The Worker opens a connection per request too (src/db/client.ts), with the same login: compare " +
      "the route's batches/s across batch sizes to see how much of a request is that fixed cost.",
    "",
    lost.length === 0
      ? "Every acknowledged row is in the database, and nothing else."
      : `**Acknowledged and stored rows differ** for: ${lost.map((x) => `${x.batchRows}-row ${x.target}`).join(", ")}.`,
  );
  return lines.join("\n");
}
