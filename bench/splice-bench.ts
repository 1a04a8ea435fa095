// The splice bench: `npx tsx bench/splice-bench.ts`. Loopback only, about a minute. What a
// spliced connection (I3 under catch-all, I4 on the direct listeners: the same relay) costs
// against the same client talking to the upstream itself: keep-alive HTTPS, 32 connections flat
// out, and one TLS handshake per request, the two targets taking turns in each round. The proxy is
// the shipped bundle in its own process; the client verifies the upstream's own certificate
// through it, so nothing is terminated. Prints one JSON line per kind, with the proxy's CPU ms per
// spliced request (comparable across runs when the ratios are not); never fails on a number.
// It writes bench/results/splice.json (BENCH_RESULTS_DIR elsewhere), whose keep-alive row the
// proxy bench's next run reports as its splice target.
import { fork, spawn } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { loadavg, tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { FakeControlPlane } from "../test/proxy/control-plane";
import { createTestCa, vault } from "../test/proxy/harness";
import { keepAliveLoad, newConnectionLoad, type RawLoad, summarise, type Target } from "./lib/load";
import { cpuSecondsOf } from "./lib/proc";
import type { SpliceResults } from "./lib/report";
import { gitDescribe, ROOT, resultsDir } from "./lib/results";

const HOST = "splice.bench.test";
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const SECONDS = Number(process.env.BENCH_DURATION_S ?? 5);
// The proxy's CPU seconds over the splice windows, and the requests they carried.
let proxyPid = 0;
let cpuStart = 0;
const proxyCpu = { seconds: 0, requests: 0 };

const dir = mkdtempSync(join(tmpdir(), "bw-splice-bench-"));
const bundle = join(dir, "proxy.cjs");
await build({
  entryPoints: [join(ROOT, "proxy-image/src/proxy/main.ts")],
  bundle: true,
  platform: "node",
  target: "node24",
  format: "cjs",
  outfile: bundle,
  external: ["koffi"],
  logLevel: "warning",
});
const ca = await createTestCa("Benchwright splice bench CA");
const leaf = await ca.issue([HOST]);
const upstream = fork(fileURLToPath(new URL("./lib/upstream-server.ts", import.meta.url)), [], {
  execArgv: ["--import", "tsx"],
  stdio: ["ignore", "inherit", "inherit", "ipc"],
});
upstream.send({
  kind: "start",
  certPem: leaf.certPem,
  keyPem: leaf.keyPem,
  address: "127.0.0.2",
  bodyBytes: 1024,
  secret: "unused-in-this-bench-0000",
  header: "x-unused",
});
const upstreamPort = await new Promise<number>((resolve) =>
  upstream.on("message", (m: { kind: string; port?: number }) => {
    if (m.kind === "listening") resolve(m.port as number);
  }),
);
// A block default makes the run catch-all; the bench host is allowed without a rule: spliced.
const cp = new FakeControlPlane(
  "run_splice_bench",
  vault({ version: 1, default: "block", hosts: [{ pattern: HOST, action: "allow" }] }),
);
await cp.start();
const ready = cp.nextReady();
const proxy = spawn(process.execPath, [bundle], {
  cwd: dir,
  stdio: ["ignore", "ignore", "inherit"],
  env: {
    PATH: process.env.PATH ?? "/usr/bin:/bin",
    ...cp.proxyEnv(join(dir, "spool")),
    BW_TEST_ROUTES: `${HOST}=127.0.0.2:${upstreamPort}`,
    BW_TEST_ALLOW_CIDRS: "127.0.0.2/32",
  },
});
proxyPid = proxy.pid as number;
try {
  const { listeners } = await ready;
  const direct: Target = {
    name: "direct",
    address: "127.0.0.2",
    port: upstreamPort,
    servername: HOST,
    caPem: ca.certPem,
  };
  const spliced: Target = {
    name: "splice",
    address: "127.0.0.1",
    port: listeners.tls,
    servername: HOST,
    caPem: ca.certPem,
  };
  const out: SpliceResults = {
    date: new Date().toISOString(),
    commit: gitDescribe(),
    loadAverage: 0,
    rows: [],
  };
  const load0 = loadavg()[0] ?? 0;
  for (const kind of ["keep-alive", "new-connection"] as const) {
    const rounds: Record<string, RawLoad[]> = { direct: [], splice: [] };
    proxyCpu.seconds = 0;
    proxyCpu.requests = 0;
    for (let i = 0; i < ROUNDS; i++) {
      for (const target of [direct, spliced]) {
        const metered = target === spliced;
        const hooks = {
          start: () => {
            if (metered) cpuStart = cpuSecondsOf(proxyPid);
          },
          end: () => {
            if (metered) proxyCpu.seconds += cpuSecondsOf(proxyPid) - cpuStart;
          },
        };
        const o = { warmupS: 1, durationS: SECONDS, hooks };
        const raw =
          kind === "keep-alive"
            ? await keepAliveLoad(target, { ...o, connections: 32 })
            : await newConnectionLoad(target, { ...o, concurrency: 32 });
        if (metered) proxyCpu.requests += raw.ok;
        (rounds[target.name] as RawLoad[]).push(raw);
      }
    }
    const d = summarise(rounds.direct as RawLoad[]);
    const s = summarise(rounds.splice as RawLoad[]);
    const row = (r: typeof d) => ({
      rps: Math.round(r.rps),
      p50Ms: r.p50Ms,
      p99Ms: r.p99Ms,
      errors: r.errors,
    });
    const measured = {
      kind,
      direct: row(d),
      splice: row(s),
      ratio: Number((s.rps / d.rps).toFixed(2)),
      proxyCpuMsPerRequest: Number(((proxyCpu.seconds * 1000) / proxyCpu.requests).toFixed(4)),
    };
    out.rows.push(measured);
    console.log(JSON.stringify(measured));
  }
  // For the proxy bench's splice row (its next run reads this file): the machine's load too.
  out.loadAverage = Number(((load0 + (loadavg()[0] ?? 0)) / 2).toFixed(2));
  mkdirSync(resultsDir(), { recursive: true });
  writeFileSync(join(resultsDir(), "splice.json"), `${JSON.stringify(out, null, 2)}\n`);
} finally {
  proxy.kill();
  upstream.kill();
  await cp.close();
  rmSync(dir, { recursive: true, force: true });
}
