// The proxy bench: `npm run bench:proxy`. One run, loopback only (127.0.0.0/8), two to three
// minutes with the defaults. It measures, against baselines taken in the same run:
//   keep-alive      direct HTTPS to the upstream / through the minimal Node MITM (lib/minimal-mitm.ts:
//                   TLS terminated, an undici Pool, one header added, nothing else: Node's own
//                   limit) / through the proxy (TLS terminated, credential header injected) /
//                   through mitmdump doing the same (when it is installed), 32 connections flat out
//   fixed rate      direct / minimal / proxy, keep-alive, open loop at half the proxy's flat-out
//                   rate: the latency the proxy adds below saturation
//   new connection  direct / minimal / proxy, one verified TLS handshake per request
//   memory          the proxy's and the minimal MITM's RSS fresh, holding 1,000 idle keep-alive
//                   connections before any load (what one costs) and again after the load rows,
//                   and their peaks
//   decisions       index.decide (host policy, then the rule) per lookup at 10 and 100,000 rules
// and writes its section of bench/results/latest.md and latest.json. It never fails on a number:
// targets are reported as met or not met. Durations and sizes come from the environment (see CONFIG).
import type { ChildProcess } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { FakeControlPlane } from "../test/proxy/control-plane";
import { vault as vaultOf } from "../test/proxy/harness";
import { buildScriptDrift, PROXY_BUILD } from "./lib/bundle";
import { benchDecisions } from "./lib/decision";
import {
  fixedRateLoad,
  keepAliveLoad,
  type LoadOptions,
  newConnectionLoad,
  openIdleConnections,
  type RawLoad,
  summarise,
  type Target,
} from "./lib/load";
import { type Mitmdump, mitmdumpVersion, startMitmdump, stopChild } from "./lib/mitm";
import { publish, summaryLines } from "./lib/page";
import { CpuMeter, memoryOf } from "./lib/proc";
import {
  HEADER,
  HOST,
  startMinimalMitm,
  startProxyProcess,
  startUpstream,
  UPSTREAM_ADDRESS,
  type UpstreamCounts,
} from "./lib/proxy-process";
import {
  consoleTable,
  countDecisions,
  type IdleHold,
  type Phase,
  proxySection,
  type Results,
  type SpliceResults,
} from "./lib/report";
import { gitDescribe, machine, num, ROOT, resultsDir } from "./lib/results";

const CONFIG = {
  /** Seconds measured per row (target and kind of load), over all rounds. */
  durationS: num("BENCH_DURATION_S", 9),
  /** Windows each row is measured in, taking turns with the other rows of its kind. */
  rounds: num("BENCH_ROUNDS", 3),
  /** Seconds of unmeasured load before each window (connections up, JIT warm). */
  warmupS: num("BENCH_WARMUP_S", 1),
  /** Keep-alive connections, and concurrent loops of the new-connection load. */
  connections: num("BENCH_CONNECTIONS", 32),
  idleConnections: num("BENCH_IDLE_CONNECTIONS", 1000),
  /** Seconds allowed for opening them (a busy machine may not make it; the count is reported). */
  idleMaxS: num("BENCH_IDLE_MAX_S", 20),
  /** Response body size of the upstream. */
  bodyBytes: num("BENCH_BODY_BYTES", 1024),
  decisionRounds: num("BENCH_DECISION_ROUNDS", 7),
  decisionPasses: num("BENCH_DECISION_PASSES", 10),
  /** Offered load of the fixed-rate rows, req/s (default: half the proxy's flat-out rate). */
  fixedRate: process.env.BENCH_FIXED_RATE ? num("BENCH_FIXED_RATE", 1) : null,
  /** BENCH_MITM=0 skips mitmdump even when it is installed. */
  mitm: process.env.BENCH_MITM !== "0",
};

/** Settings below these defaults make a short (trial) run, and the results say so. */
const SHORT =
  CONFIG.durationS < 9 ||
  CONFIG.rounds < 3 ||
  CONFIG.idleConnections < 1000 ||
  CONFIG.decisionRounds < 7 ||
  CONFIG.decisionPasses < 10;
const SECRET = `sk-bench-${Math.random().toString(36).slice(2, 14)}`;
const RUN_ID = "run_bench";
const ZERO_COUNTS: UpstreamCounts = { requests: 0, injected: 0, connections: 0 };

const log = (s: string) => process.stderr.write(`${s}\n`);

async function main(): Promise<void> {
  const started = Date.now();
  const dir = mkdtempSync(join(tmpdir(), "bw-bench-"));
  let mitm: Mitmdump | null = null;
  try {
    // The proxy as shipped: the image's bundle (PROXY_BUILD, the options of `npm run build:proxy`),
    // written to a scratch directory so a parallel build of proxy-image/dist is not disturbed.
    // The minimal MITM is bundled the same way, with the proxy's own undici (proxy-image/src/proxy/undici.ts).
    const drift = buildScriptDrift(readFileSync(join(ROOT, "package.json"), "utf8"));
    if (drift.length > 0)
      log(`warning: build:proxy lacks ${drift.join(" ")}: this bench's bundle is not the image's`);
    const bundle = join(dir, "proxy.cjs");
    // Its source map (external: no comment in the bundle, nothing loaded by the proxy) names the
    // frames of a CPU profile by source file (bench/profile-summary.ts).
    // BENCH_PROXY_NODE_ARGS: extra node flags for the proxy process (e.g. --cpu-prof, with
    // BENCH_KEEP_TMP=1 to keep the profile, written to the scratch directory).
    const nodeArgs = (process.env.BENCH_PROXY_NODE_ARGS ?? "").split(" ").filter(Boolean);
    await build({
      ...PROXY_BUILD,
      entryPoints: [join(ROOT, "proxy-image/src/proxy/main.ts")],
      outfile: bundle,
      sourcemap: "external",
    });
    const minimalBundle = join(dir, "minimal-mitm.cjs");
    await build({
      ...PROXY_BUILD,
      entryPoints: [fileURLToPath(new URL("./lib/minimal-mitm.ts", import.meta.url))],
      outfile: minimalBundle,
    });

    // Upstream: api.test, certificate from a test CA, own process, on 127.0.0.2.
    const up = await startUpstream({ dir, bodyBytes: CONFIG.bodyBytes, secret: SECRET, children });
    const { ca: testCa, port: upstreamPort, child: upstream } = up;
    const upstreamCounts = up.counts;

    // Control plane and the proxy process, configured as in its sandbox but on loopback.
    const cp = new FakeControlPlane(
      RUN_ID,
      vaultOf({
        version: 1,
        hosts: [{ pattern: "blocked.test", action: "block" }],
        rules: [{ host: HOST, secret: "API_KEY", inject: { scheme: "raw", name: HEADER } }],
      }),
      { API_KEY: SECRET },
    );
    await cp.start();
    const proxyLog = join(dir, "proxy.log");
    const {
      child: proxy,
      ready,
      pid: proxyPid,
    } = await startProxyProcess({
      bundle,
      dir,
      cp,
      upstream: up,
      logFile: proxyLog,
      nodeArgs,
      children,
    });
    // Let the start-up settle (first policy poll, JIT of the start path) before reading memory.
    await new Promise((r) => setTimeout(r, 500));
    const freshRss = memoryOf(proxyPid)?.rssMiB ?? Number.NaN;

    const minimalMitm = await startMinimalMitm({
      bundle: minimalBundle,
      upstream: up,
      secret: SECRET,
      children,
    });
    const minimal = minimalMitm.child;
    await new Promise((r) => setTimeout(r, 500));
    const minimalFreshRss = memoryOf(minimal.pid as number)?.rssMiB ?? Number.NaN;

    const direct: Target = {
      name: "direct",
      address: UPSTREAM_ADDRESS,
      port: upstreamPort,
      servername: HOST,
      caPem: testCa.certPem,
    };
    const viaProxy: Target = {
      name: "proxy",
      address: "127.0.0.1",
      port: ready.listeners.tls,
      servername: HOST,
      caPem: ready.caCertPem,
    };

    const viaMinimal: Target = {
      name: "minimal",
      address: "127.0.0.1",
      port: minimalMitm.port,
      servername: HOST,
      caPem: minimalMitm.caPem,
    };

    // What an idle connection costs each process, before any load has grown its heap: both fresh,
    // the same connections, so (holding − fresh) / open compares like with like.
    log(`idle, fresh: ${CONFIG.idleConnections} keep-alive connections to the proxy, then the minimal MITM`);
    const freshIdle = {
      proxy: await holdIdle(viaProxy, proxyPid),
      minimal: await holdIdle(viaMinimal, minimal.pid as number),
    };
    log(
      `  proxy ${freshIdle.proxy.open} open: RSS ${freshIdle.proxy.rssMiB.toFixed(1)} MiB; ` +
        `minimal MITM ${freshIdle.minimal.open} open: RSS ${freshIdle.minimal.rssMiB.toFixed(1)} MiB`,
    );

    const mitmVersion = CONFIG.mitm ? mitmdumpVersion() : null;
    let mitmNote = CONFIG.mitm ? "not installed, skipped" : "skipped (BENCH_MITM=0)";
    if (mitmVersion) {
      try {
        mitm = await startMitmdump({
          dir,
          servername: HOST,
          upstream: { address: UPSTREAM_ADDRESS, port: upstreamPort },
          upstreamCaFile: up.caFile,
          header: HEADER,
          secret: SECRET,
        });
        children.push(mitm.child);
        mitmNote = `mitmdump ${mitmVersion}`;
      } catch (e) {
        mitmNote = `failed to start, skipped: ${(e as Error).message}`;
      }
    }
    log(`proxy pid ${proxyPid} tls :${viaProxy.port}; upstream :${upstreamPort}; mitmdump: ${mitmNote}`);

    const pids: Record<string, number> = {
      loadgen: process.pid,
      upstream: upstream.pid as number,
      proxy: proxyPid,
      minimal: minimal.pid as number,
      ...(mitm ? { mitmdump: mitm.pid } : {}),
    };

    // Each row is measured in CONFIG.rounds windows, the rows of one kind taking turns (direct,
    // proxy, mitmdump, direct, ...), so a neighbour's load or a clock change hits every row
    // alike rather than one of them; the windows are pooled.
    interface Row {
      kind: Phase["kind"];
      target: Target;
      rounds: RawLoad[];
      meter: CpuMeter;
      upstream: { requests: number; injected: number; connections: number };
    }
    let fixedRate = 0;
    const run = (row: Row, o: LoadOptions) =>
      row.kind === "keep-alive"
        ? keepAliveLoad(row.target, { ...o, connections: CONFIG.connections })
        : row.kind === "fixed-rate"
          ? fixedRateLoad(row.target, { ...o, rate: fixedRate, connections: CONFIG.connections })
          : newConnectionLoad(row.target, { ...o, concurrency: CONFIG.connections });
    async function measure(rows: Row[]): Promise<void> {
      const windowS = CONFIG.durationS / CONFIG.rounds;
      for (let round = 1; round <= CONFIG.rounds; round++) {
        for (const row of rows) {
          let before: Promise<UpstreamCounts> = Promise.resolve(ZERO_COUNTS);
          let after: Promise<UpstreamCounts> = Promise.resolve(ZERO_COUNTS);
          const raw = await run(row, {
            warmupS: CONFIG.warmupS,
            durationS: windowS,
            hooks: {
              start: () => {
                row.meter.begin();
                before = upstreamCounts();
              },
              end: () => {
                row.meter.end();
                after = upstreamCounts();
              },
            },
          });
          const [b, a] = await Promise.all([before, after]);
          row.upstream.requests += a.requests - b.requests;
          row.upstream.injected += a.injected - b.injected;
          row.upstream.connections += a.connections - b.connections;
          row.rounds.push(raw);
          log(
            `${row.kind} ${row.target.name} (round ${round}/${CONFIG.rounds}): ${(raw.ok / raw.windowS).toFixed(0)} req/s, ` +
              `errors ${raw.errors}, non-2xx ${raw.non2xx}`,
          );
        }
      }
    }
    const row = (kind: Phase["kind"], target: Target): Row => ({
      kind,
      target,
      rounds: [],
      meter: new CpuMeter(() => pids),
      upstream: { requests: 0, injected: 0, connections: 0 },
    });

    const keepAlive = [row("keep-alive", direct), row("keep-alive", viaMinimal), row("keep-alive", viaProxy)];
    if (mitm) {
      keepAlive.push(
        row("keep-alive", {
          name: "mitmdump",
          address: "127.0.0.1",
          port: mitm.port,
          servername: HOST,
          caPem: mitm.caPem,
        }),
      );
    }
    await measure(keepAlive);
    let mitmPeakRssMiB: number | null = null;
    if (mitm) {
      mitmPeakRssMiB = memoryOf(mitm.pid)?.hwmMiB ?? null;
      // Out of the way of the rows that follow.
      await mitm.stop().catch(() => {});
      mitm = null;
      delete pids.mitmdump;
    }
    // The fixed rate: BENCH_FIXED_RATE, else half of what the proxy sustained flat out above
    // (so it runs well below saturation on whatever machine this is), in steps of 50.
    const proxyFlatOut = summarise(keepAlive[2]?.rounds ?? []).rps;
    fixedRate = CONFIG.fixedRate ?? Math.max(50, Math.floor(proxyFlatOut / 2 / 50) * 50);
    const fixed = [row("fixed-rate", direct), row("fixed-rate", viaMinimal), row("fixed-rate", viaProxy)];
    await measure(fixed);
    const newConnection = [
      row("new-connection", direct),
      row("new-connection", viaMinimal),
      row("new-connection", viaProxy),
    ];
    await measure(newConnection);

    const phases: Phase[] = [...keepAlive, ...fixed, ...newConnection].map((r) => ({
      kind: r.kind,
      target: r.target.name,
      ...summarise(r.rounds),
      windowsRps: r.rounds.map((w) => w.ok / w.windowS),
      cpuCores: r.meter.cores(),
      upstreamRequests: r.upstream.requests,
      upstreamInjected: r.upstream.injected,
      upstreamConnections: r.upstream.connections,
      ...(r.target.name === "mitmdump" ? { peakRssMiB: mitmPeakRssMiB } : {}),
    }));
    const afterLoadRss = memoryOf(proxyPid)?.rssMiB ?? Number.NaN;

    log(`idle, after the load rows: ${CONFIG.idleConnections} keep-alive connections to the proxy`);
    const idle = await holdIdle(viaProxy, proxyPid);
    const peak = memoryOf(proxyPid);
    log(`  ${idle.open} open after ${idle.openMs.toFixed(0)} ms: proxy RSS ${idle.rssMiB.toFixed(1)} MiB`);

    // The same for the minimal MITM: what Node itself holds per idle TLS connection.
    const minimalAfterLoadRss = memoryOf(minimal.pid as number)?.rssMiB ?? Number.NaN;
    const minimalIdle = await holdIdle(viaMinimal, minimal.pid as number);
    const minimalPeak = memoryOf(minimal.pid as number);
    log(`  minimal MITM: ${minimalIdle.open} open: RSS ${minimalIdle.rssMiB.toFixed(1)} MiB`);

    await stopChild(minimal);
    await stopChild(proxy);
    await stopChild(upstream);
    await cp.close();
    const decisions = await countDecisions(proxyLog, SECRET);

    log("policy decisions: 10 and 100,000 rules");
    const decisionResults = benchDecisions([10, 100_000], {
      rounds: CONFIG.decisionRounds,
      passes: CONFIG.decisionPasses,
    });

    const results: Results = {
      schema: 1,
      date: new Date().toISOString(),
      commit: gitDescribe(),
      machine: { ...machine(), mitmdump: mitmNote },
      config: { ...CONFIG, fixedRate },
      phases,
      memory: {
        proxyFreshRssMiB: freshRss,
        proxyAfterLoadRssMiB: afterLoadRss,
        proxyPeakRssMiB: peak?.hwmMiB ?? Number.NaN,
        idle,
        minimal: {
          freshRssMiB: minimalFreshRss,
          afterLoadRssMiB: minimalAfterLoadRss,
          idleOpen: minimalIdle.open,
          idleRssMiB: minimalIdle.rssMiB,
          peakRssMiB: minimalPeak?.hwmMiB ?? Number.NaN,
        },
        freshIdle,
      },
      decisions: decisionResults,
      proxyDecisionLog: decisions,
      audit: { batches: cp.batches.size, rows: cp.auditRows },
      wallS: (Date.now() - started) / 1000,
      short: SHORT,
      splice: lastSplice(),
    };
    const section = proxySection(results, SHORT);
    const written = publish(section);
    process.stdout.write(
      `${consoleTable(results)}\n\nsummary:\n${summaryLines(section)}\nwritten to ${written}\n`,
    );
  } finally {
    await mitm?.stop().catch(() => {});
    for (const c of children) await stopChild(c).catch(() => {});
    // BENCH_KEEP_TMP=1 keeps the scratch directory (proxy log, bundle, certificates) for a look.
    if (process.env.BENCH_KEEP_TMP === "1") log(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * Opens CONFIG.idleConnections keep-alive connections to `target` (each has served one request),
 * reads the RSS of the process behind it while they are all held, and closes them.
 */
async function holdIdle(target: Target, pid: number): Promise<IdleHold> {
  const idle = await openIdleConnections(target, {
    count: CONFIG.idleConnections,
    concurrency: 64,
    maxS: CONFIG.idleMaxS,
  });
  await new Promise((r) => setTimeout(r, 250));
  const rssMiB = memoryOf(pid)?.rssMiB ?? Number.NaN;
  const open = idle.open();
  idle.close();
  return { connections: CONFIG.idleConnections, open, failed: idle.failed, openMs: idle.openMs, rssMiB };
}

/** The last splice-bench run (bench/splice-bench.ts writes it), or null. */
function lastSplice(): SpliceResults | null {
  const file = join(resultsDir(), "splice.json");
  return existsSync(file) ? (JSON.parse(readFileSync(file, "utf8")) as SpliceResults) : null;
}

// Whatever ends the bench (an error, ^C, a closed pipe) ends the processes it started.
const children: ChildProcess[] = [];
process.on("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
});
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.once(sig, () => process.exit(130));
process.stderr.on("error", () => {}); // `| head` closing the pipe must not stop the run midway

main().then(
  () => process.exit(0),
  (e: unknown) => {
    console.error(`bench failed: ${(e as Error).stack ?? e}`);
    process.exit(1);
  },
);
