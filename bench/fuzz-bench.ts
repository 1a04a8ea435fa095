// The fuzz bench: `npm run bench:fuzz`. Case F3 at scale: BENCH_FUZZ_CASES (default 100,000)
// mutated HTTP/1 requests, split at random boundaries, to the real proxy's plain listener (two in
// three) and TLS listener (one in three), with the fuzzer and the differential oracle of
// test/proxy/fuzz.test.ts (test/proxy/fuzz-lib.ts): every request an upstream receives through
// the proxy must be one a strict reference parser saw from the same bytes (same method, target,
// body), well-formed as forwarded, and on the TLS path carry the injected credential; the proxy's
// answers never carry it. After every batch the proxy (its own process) must still be alive and
// answer a well-formed request. Loopback only.
//
// It prints cases/s, crashes and ambiguous forwards, and writes its section of
// bench/results/latest.{md,json}. Timing never fails it; a crash or an ambiguous forward does
// (exit 1): that is a correctness failure. Seeded: FUZZ_SEED=<n> replays a run's cases.
import { type ChildProcess, fork } from "node:child_process";
import { fileURLToPath } from "node:url";
import {
  CANARY,
  DEFAULT_SEED,
  EXCHANGE,
  type Finding,
  ForwardOracle,
  type FuzzTargets,
  fuzzCase,
  LIVENESS_URL,
  liveness,
  PLAIN_HOST,
  prng,
  startReference,
  TLS_HOST,
} from "../test/proxy/fuzz-lib";
import type { Seen } from "../test/proxy/harness";
import { type FuzzResults, fuzzSection } from "./lib/fuzz-report";
import { publish, summaryLines } from "./lib/page";
import { cpuSecondsOf, memoryOf } from "./lib/proc";
import { f, int, num, runBench, sectionHead } from "./lib/results";

const CONFIG = {
  cases: num("BENCH_FUZZ_CASES", 100_000),
  /** Cases in flight at once (each holds two connections: proxy and reference). */
  concurrency: num("BENCH_FUZZ_CONCURRENCY", 64),
  /** Cases between liveness checks and oracle checkpoints. */
  batch: num("BENCH_FUZZ_BATCH", 1000),
  seed: Number(process.env.FUZZ_SEED ?? DEFAULT_SEED),
};
if (!Number.isInteger(CONFIG.seed)) throw new Error("FUZZ_SEED must be an integer");
const SHORT = CONFIG.cases < 100_000;
/** Findings printed in full (with the case's bytes when it can be told); all are counted. */
const MAX_SHOWN = 20;

const log = (s: string) => process.stderr.write(`${s}\n`);

interface Drained {
  kind: "drained";
  id: number;
  plain: Seen[];
  tls: Seen[];
  decisions: Record<string, number>;
  rssMiB: number;
}

async function main(): Promise<number> {
  const started = Date.now();
  const proxyProc = fork(fileURLToPath(new URL("./lib/fuzz-proxy.ts", import.meta.url)), [], {
    execArgv: ["--import", "tsx"],
    stdio: ["ignore", "inherit", "inherit", "ipc"],
  });
  children.push(proxyProc);
  const proc = { exit: null as string | null };
  proxyProc.once("exit", (code, signal) => {
    proc.exit = signal ? `killed by ${signal}` : `exited with ${code}`;
  });
  const ready = await new Promise<{ httpPort: number; tlsPort: number; caPem: string }>((resolve, reject) => {
    proxyProc.once("exit", () => reject(new Error(`the proxy process ${proc.exit} at start`)));
    proxyProc.on("message", (m: { kind: string; httpPort: number; tlsPort: number; caPem: string }) => {
      if (m.kind === "ready") resolve(m);
    });
  });
  const pid = proxyProc.pid as number;
  let drains = 0;
  const drain = () =>
    new Promise<Drained | null>((resolve) => {
      if (proc.exit) return resolve(null);
      const id = ++drains;
      const onMessage = (m: Drained) => {
        if (m.kind !== "drained" || m.id !== id) return;
        done(m);
      };
      const onExit = () => done(null);
      const done = (v: Drained | null) => {
        proxyProc.off("message", onMessage);
        proxyProc.off("exit", onExit);
        resolve(v);
      };
      proxyProc.on("message", onMessage);
      proxyProc.once("exit", onExit);
      proxyProc.send({ kind: "drain", id });
    });

  const reference = await startReference();
  const targets: FuzzTargets = { ...ready, referencePort: reference.port };
  const rssStart = memoryOf(pid)?.rssMiB ?? Number.NaN;
  log(
    `fuzz: ${int(CONFIG.cases)} cases, seed ${CONFIG.seed}, ${CONFIG.concurrency} at a time, ` +
      `checked every ${int(CONFIG.batch)}; proxy pid ${pid} (plain :${ready.httpPort}, TLS :${ready.tlsPort})`,
  );

  const rng = prng(CONFIG.seed);
  const oracle = new ForwardOracle();
  const findings: Finding[] = [];
  const crashes: string[] = [];
  const tally = {
    refused: 0,
    forwarded: 0,
    noAnswer: 0,
    plainUpstream: 0,
    tlsUpstream: 0,
    referenceParsed: 0,
  };
  let decisions: Record<string, number> = {};
  let rssPeak = rssStart;
  // The bytes of the cases of the last two batches, to show with a finding (ids are in the URLs).
  let recent = new Map<number, string[]>();
  let previous = new Map<number, string[]>();
  const absorb = (d: Drained) => {
    tally.plainUpstream += d.plain.filter((s) => s.url !== LIVENESS_URL).length;
    tally.tlsUpstream += d.tls.length;
    findings.push(...oracle.forwarded(d.plain, PLAIN_HOST, "plain upstream"));
    findings.push(...oracle.forwarded(d.tls, TLS_HOST, "TLS upstream"));
    for (const s of d.tls)
      if (s.headers.authorization !== `Bearer ${CANARY}`)
        findings.push({
          where: "TLS upstream",
          key: JSON.stringify([s.method, s.url, s.body]),
          problem: "a request without the injected credential",
        });
    decisions = d.decisions;
    rssPeak = Math.max(rssPeak, d.rssMiB);
  };
  const takeReference = () => {
    const parsed = reference.seen.splice(0);
    tally.referenceParsed += parsed.length;
    oracle.reference(parsed);
  };

  const cpu0 = { bench: cpuSecondsOf(process.pid), proxy: cpuSecondsOf(pid) };
  const t0 = performance.now();
  let done = 0;
  let lastReport = t0;
  for (let start = 0; start < CONFIG.cases && crashes.length === 0; start += CONFIG.batch) {
    const end = Math.min(CONFIG.cases, start + CONFIG.batch);
    [previous, recent] = [recent, new Map()];
    let next = start;
    const worker = async () => {
      while (next < end && !proc.exit) {
        const id = next++;
        const outcome = await fuzzCase(targets, rng, id, id % 3 === 2);
        recent.set(id, outcome.chunks);
        tally.refused += outcome.refused;
        tally.forwarded += outcome.forwarded;
        if (outcome.refused + outcome.forwarded === 0) tally.noAnswer++;
        if (outcome.leaked)
          findings.push({ where: `case ${id}`, problem: "the proxy's answer carried the injected secret" });
        done++;
      }
    };
    await Promise.all(Array.from({ length: Math.min(CONFIG.concurrency, end - start) }, worker));
    // Never crash: the process is alive and answers a well-formed request.
    const status = proc.exit ? undefined : await liveness(ready.httpPort).catch(() => undefined);
    if (proc.exit || status !== 200)
      crashes.push(
        `after case ${done - 1}: ${proc.exit ? `the proxy process ${proc.exit}` : `a good request got ${status ?? "no answer"}`}`,
      );
    takeReference();
    const d = await drain();
    if (d) absorb(d);
    oracle.retry();
    const now = performance.now();
    if (now - lastReport > 10_000 || end === CONFIG.cases) {
      lastReport = now;
      log(
        `  ${int(done)} cases, ${f(done / ((now - t0) / 1000), 0)} cases/s; refused ${int(tally.refused)}, ` +
          `answered ${int(tally.forwarded)}; findings ${findings.length}, held ${oracle.pending}, crashes ${crashes.length}`,
      );
    }
  }
  const fuzzS = (performance.now() - t0) / 1000;
  const cpu = {
    bench: (cpuSecondsOf(process.pid) - cpu0.bench) / fuzzS,
    proxy: (cpuSecondsOf(pid) - cpu0.proxy) / fuzzS,
  };
  // Let requests that were cut off settle upstream before the last comparison (as the test does).
  await new Promise((r) => setTimeout(r, 100));
  takeReference();
  const last = await drain();
  if (last) absorb(last);
  findings.push(...oracle.settle());
  const rssEnd = memoryOf(pid)?.rssMiB ?? Number.NaN;
  if (proc.exit && crashes.length === 0) crashes.push(`the proxy process ${proc.exit}`);
  await reference.close();
  // Disconnected, the proxy process closes its listeners and scratch directory and exits.
  if (!proc.exit) {
    const exited = new Promise((r) => proxyProc.once("exit", r));
    proxyProc.disconnect();
    await Promise.race([exited, new Promise((r) => setTimeout(r, 5_000))]);
  }

  const shown = findings.slice(0, MAX_SHOWN).map((x) => {
    const id = Number(/[?&]c=(\d+)/.exec(x.key ?? x.where)?.[1] ?? /^case (\d+)/.exec(x.where)?.[1]);
    const chunks = recent.get(id) ?? previous.get(id);
    return { ...x, ...(chunks ? { caseId: id, chunks } : {}) };
  });
  const results: FuzzResults = {
    ...sectionHead("fuzz", started, SHORT),
    config: { ...CONFIG, idleMs: EXCHANGE.idleMs ?? 0, gapMs: EXCHANGE.gapMs ?? 0 },
    cases: done,
    fuzzS,
    casesPerS: done / fuzzS,
    crashes,
    ambiguousForwards: findings.length,
    findings: shown,
    responses: { refused: tally.refused, answered: tally.forwarded, casesWithoutAnswer: tally.noAnswer },
    upstream: { plain: tally.plainUpstream, tls: tally.tlsUpstream },
    referenceParsed: tally.referenceParsed,
    proxyDecisions: decisions,
    cpuCores: cpu,
    proxyRssMiB: { start: rssStart, end: rssEnd, peak: rssPeak },
  };
  const section = fuzzSection(results);
  const dir = publish(section);
  for (const x of shown)
    log(
      `FINDING ${x.where}: ${x.problem}${"chunks" in x ? `\n  case ${x.caseId}: ${JSON.stringify(x.chunks)}` : ""}`,
    );
  for (const c of crashes) log(`CRASH ${c}`);
  process.stdout.write(`\nfuzz bench (seed ${CONFIG.seed}):\n${summaryLines(section)}\nwritten to ${dir}\n`);
  if (crashes.length > 0 || findings.length > 0) {
    log(
      `FAILED: ${crashes.length} crashes, ${findings.length} ambiguous forwards (replay: FUZZ_SEED=${CONFIG.seed})`,
    );
    return 1;
  }
  return 0;
}

// Whatever ends the bench (an error, ^C, a closed pipe) ends the processes it started.
const children: ChildProcess[] = [];
process.on("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
});
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.once(sig, () => process.exit(130));
runBench("fuzz bench", main);
