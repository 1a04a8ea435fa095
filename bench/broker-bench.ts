// The broker bench: `npm run bench:broker`. Many runs' worth of sandbox broker calls at once
// (create a proxy sandbox, exec `bw-proxy` in it, poll it, destroy the run's sandboxes) through
// the real SandboxBroker Durable Object in `wrangler dev` (bench/worker/broker-entry.ts: the
// Worker's own objects and one loopback route that makes a broker call), over a real PostgreSQL
// (the broker opens a Neon connection per call) and the sandbox0 backend against the Kubernetes
// contract server (test/contract/kubernetes-server.ts). Two rows taking turns in the same run:
// each run's calls on its own broker instance (issue 24), and every call on the one shared
// instance of before. Calls/s and latency (p50, p99, per call kind). Loopback only; skipped
// with a message when PostgreSQL is not installed.
import { randomBytes } from "node:crypto";
import { mkdtempSync, rmSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { RunSpec } from "@benchwright/shared/contract/run-spec";
import { nodeDb } from "../scripts/lib/neon-node";
import { freePort } from "../scripts/lib/postgres";
import { startWorkerDev } from "../scripts/lib/worker-dev";
import { randomId } from "../src/crypto/api-keys";
import * as schema from "../src/db/schema";
import { startKubernetesServer } from "../test/contract/kubernetes-server";
import {
  type BrokerInstances,
  type BrokerOp,
  type BrokerOpStats,
  type BrokerResults,
  type BrokerRow,
  brokerSection,
} from "./lib/broker-report";
import { publish, summaryLines } from "./lib/page";
import { flatOutWindow, num, quantiles, runBench, sectionHead, type WindowGate } from "./lib/results";
import { newTenant, newVaultKek, onStop, startDatabase, stopAll, whyNoPostgres } from "./lib/stack";

const CONFIG = {
  /** Runs at once, each with one broker call in flight. */
  runs: num("BENCH_BROKER_RUNS", 16),
  /** Seconds measured per row, over all rounds. */
  durationS: num("BENCH_BROKER_DURATION_S", 36),
  /** Windows per row, the rows taking turns. */
  rounds: num("BENCH_BROKER_ROUNDS", 6),
  warmupS: num("BENCH_BROKER_WARMUP_S", 2),
  /** Polls of the proxy's exec per cycle. */
  polls: num("BENCH_BROKER_POLLS", 4),
};
const SHORT = CONFIG.durationS < 36 || CONFIG.rounds < 6;
const ROWS: BrokerInstances[] = ["shared", "run"];
const OPS: BrokerOp[] = ["create", "exec", "poll", "destroyRun"];
const IMAGE = (name: string, digit: string) => `registry.bench.test/${name}@sha256:${digit.repeat(64)}`;

const log = (s: string) => process.stderr.write(`${s}\n`);

interface Sample {
  op: BrokerOp;
  ms: number;
  stubMs: number;
}

interface Window {
  samples: Sample[];
  errors: string[];
  windowS: number;
}

/** `runs` runs flat out through cycles of broker calls; counts what completes inside the window. */
async function load(workerUrl: string, instances: BrokerInstances, runIds: string[], windowS: number) {
  const w: Window = { samples: [], errors: [], windowS: 0 };
  const call = async (gate: WindowGate, op: BrokerOp, runId: string, args: unknown[]) => {
    const t0 = performance.now();
    const res = await fetch(`${workerUrl}/bench/call`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ instances, op, runId, args }),
    });
    const body = (await res.json()) as { ok: boolean; ms: number; error?: string; result?: unknown };
    const ms = performance.now() - t0;
    if (!gate.counting) return body;
    if (body.ok) w.samples.push({ op, ms, stubMs: body.ms });
    else w.errors.push(`${op}: ${body.error}`);
    return body;
  };
  const oneRun = async (gate: WindowGate, runId: string) => {
    while (gate.running) {
      const sandboxId = randomId("sbx_");
      const execId = `proxy-${randomBytes(4).toString("hex")}`;
      const made = await call(gate, "create", runId, [{ id: sandboxId, kind: "proxy" }]);
      if (made.ok && (made.result as { ok: boolean }).ok) {
        await call(gate, "exec", runId, [
          sandboxId,
          {
            id: execId,
            argv: ["bw-proxy"],
            // Stand-ins: the contract server runs no proxy, and nothing here is a secret.
            env: { BW_RUN_ID: runId, BW_PROXY_TOKEN: "bench-stand-in", BW_AUDIT_KEY: "bench-stand-in" },
            stage: "setup",
            timeoutMs: null,
          },
        ]);
        for (let i = 0; i < CONFIG.polls; i++) {
          await call(gate, "poll", runId, [sandboxId, execId, { waitMs: 0, stdoutFrom: 0, stderrFrom: 0 }]);
        }
      } else if (gate.counting) {
        w.errors.push(`create: ${JSON.stringify(made.result ?? made.error)}`);
      }
      await call(gate, "destroyRun", runId, [{}]);
    }
  };
  const work = (gate: WindowGate, i: number) => oneRun(gate, runIds[i] as string);
  w.windowS = await flatOutWindow(runIds.length, work, CONFIG.warmupS, windowS);
  return w;
}

/** Nearest-rank p99 of sorted samples. */
const p99 = (sorted: number[]) =>
  sorted.length
    ? (sorted[Math.min(sorted.length - 1, Math.ceil(0.99 * sorted.length) - 1)] as number)
    : Number.NaN;

function row(instances: BrokerInstances, windows: Window[]): BrokerRow {
  const rates = windows.map((w) => w.samples.length / w.windowS);
  const median = quantiles(rates).median;
  const samples = windows.flatMap((w) => w.samples);
  const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
  const ms = sorted(samples.map((s) => s.ms));
  const ops = Object.fromEntries(
    OPS.map((op): [BrokerOp, BrokerOpStats] => {
      const of = sorted(samples.filter((s) => s.op === op).map((s) => s.ms));
      return [op, { calls: of.length, p50Ms: quantiles(of).median, p99Ms: p99(of) }];
    }),
  ) as Record<BrokerOp, BrokerOpStats>;
  const errors = windows.flatMap((w) => w.errors);
  return {
    instances,
    windows: rates,
    callsPerS: median,
    spreadPct: ((Math.max(...rates) - Math.min(...rates)) / 2 / median) * 100,
    p50Ms: quantiles(ms).median,
    p99Ms: p99(ms),
    stubP99Ms: p99(sorted(samples.map((s) => s.stubMs))),
    ops,
    errors: errors.length,
    firstErrors: [...new Set(errors)].slice(0, 3),
  };
}

async function main(): Promise<number> {
  const why = whyNoPostgres();
  if (why) {
    log(`broker bench skipped: ${why}. Its section of bench/results is left as it was.`);
    return 0;
  }
  const started = Date.now();
  const loadAtStart = loadavg()[0] as number;
  const dir = mkdtempSync(join(tmpdir(), "bw-bench-broker-"));
  onStop(async () => rmSync(dir, { recursive: true, force: true }));
  try {
    const db = await startDatabase();
    onStop(() => db.stop());
    const k8s = await startKubernetesServer();
    onStop(() => k8s.close());
    log(`PostgreSQL ${db.version} and the Kubernetes contract server (${k8s.url}) up; starting wrangler dev`);
    const worker = await startWorkerDev({
      port: await freePort(),
      script: "bench/worker/broker-entry.ts",
      readyPath: "/bench/ready",
      envFile: join(dir, "worker.vars"),
      persistTo: join(dir, "wrangler-state"),
      secrets: {
        DATABASE_URL: db.url,
        VAULT_KEK: newVaultKek(),
        COMPUTE_BACKEND_SECRET: randomBytes(32).toString("base64url"),
      },
      vars: {
        DATABASE_WS_PROXY: db.wsProxy,
        COMPUTE_BACKEND: "sandbox0",
        COMPUTE_BACKEND_URL: "",
        SANDBOX0_API_URL: k8s.url,
        // wrangler dev loads only the secrets wrangler.toml lists from the env file, so the contract
        // server's token (made for this run, good for nothing else) goes as a var.
        SANDBOX0_TOKEN: k8s.token,
        SANDBOX0_NAMESPACE: "bench-broker",
        SANDBOX0_PROXY_IMAGE: IMAGE("benchwright-proxy", "1"),
        SANDBOX0_WORK_IMAGE: IMAGE("benchwright-work", "2"),
        PUBLIC_URL: "https://boundary.bench.test",
      },
      log: process.env.BENCH_VERBOSE ? (line) => log(`[wrangler] ${line}`) : undefined,
    });
    onStop(() => worker.stop());
    log(`wrangler dev on ${worker.url}`);

    // The runs: rows as a launch records them (sandbox0 backend), a set of its own per row.
    const tenant = await newTenant(db.url, "broker");
    const admin = nodeDb(db.url);
    const newRuns = async () => {
      const ids = Array.from({ length: CONFIG.runs }, () => randomId("run_"));
      await admin.db.insert(schema.runs).values(
        ids.map((id) => ({
          id,
          userId: tenant.userId,
          environmentId: tenant.environmentId,
          status: "starting_proxy" as const,
          spec: RunSpec.parse({ commands: ["true"] }),
          backend: "sandbox0",
        })),
      );
      return ids;
    };
    const cells = await Promise.all(
      ROWS.map(async (instances) => ({ instances, runIds: await newRuns(), windows: [] as Window[] })),
    );
    await admin.pool.end();

    for (let round = 1; round <= CONFIG.rounds; round++) {
      for (const cell of cells) {
        const w = await load(worker.url, cell.instances, cell.runIds, CONFIG.durationS / CONFIG.rounds);
        cell.windows.push(w);
        log(
          `${cell.instances} (round ${round}/${CONFIG.rounds}): ${(w.samples.length / w.windowS).toFixed(0)} calls/s, ` +
            `errors ${w.errors.length}${w.errors[0] ? ` (${w.errors[0]})` : ""}`,
        );
      }
    }

    const results: BrokerResults = {
      ...sectionHead("broker", started, SHORT),
      config: { ...CONFIG },
      postgres: db.version,
      loadAverage: { start: loadAtStart, end: loadavg()[0] as number },
      rows: cells.map((c) => row(c.instances, c.windows)),
    };
    const section = brokerSection(results);
    const written = publish(section);
    process.stdout.write(`\nbroker bench:\n${summaryLines(section)}\nwritten to ${written}\n`);
    return 0;
  } finally {
    await stopAll();
  }
}

runBench("broker bench", main);
