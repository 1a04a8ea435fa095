// The proxy memory bench: `npm run bench:memory`. What the proxy bundle's build costs in RSS, one
// build against another in the same run: the proxy process fresh (started, policy loaded) and
// holding 1,000 idle keep-alive TLS connections, for
//   before         the bundle as it was built before issue 21's memory work: unminified (kept
//                  comments with characters above U+00FF, so V8 holds the source as a two-byte
//                  string) and undici's whole index loaded
//   minified       the shipped build flags (lib/bundle.ts), undici's whole index still loaded
//   undici lib     unminified, undici's Pool and connector from its lib files (proxy-image/src/proxy/undici.ts)
//   shipped        both: what `npm run build:proxy` builds now
// and the minimal Node MITM (lib/minimal-mitm.ts, the shipped flags) as Node's own floor. Each
// build runs in several rounds, builds taking turns, a fresh process each time; medians. Loopback
// only. Settings: BENCH_MEMORY_ROUNDS (default 3), BENCH_IDLE_CONNECTIONS (default 1000),
// BENCH_IDLE_MAX_S (default 20).
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { type BuildOptions, build } from "esbuild";
import { FakeControlPlane } from "../test/proxy/control-plane";
import { vault as vaultOf } from "../test/proxy/harness";
import { PROXY_BUILD, UNMINIFIED_BUILD } from "./lib/bundle";
import { openIdleConnections, type Target } from "./lib/load";
import { type MemoryResults, type MemorySample, memorySection } from "./lib/memory-report";
import { stopChild } from "./lib/mitm";
import { publish, summaryLines } from "./lib/page";
import { memoryOf } from "./lib/proc";
import { HEADER, HOST, startMinimalMitm, startProxyProcess, startUpstream } from "./lib/proxy-process";
import { num, ROOT, runBench, sectionHead } from "./lib/results";

const CONFIG = {
  rounds: num("BENCH_MEMORY_ROUNDS", 3),
  idleConnections: num("BENCH_IDLE_CONNECTIONS", 1000),
  idleMaxS: num("BENCH_IDLE_MAX_S", 20),
};
const SHORT = CONFIG.rounds < 3 || CONFIG.idleConnections < 1000;
const SECRET = `sk-bench-${Math.random().toString(36).slice(2, 14)}`;
const log = (s: string) => process.stderr.write(`${s}\n`);
const children: ChildProcess[] = [];

interface Variant {
  name: string;
  what: string;
  options: BuildOptions;
  /** Load undici's whole index first, as the proxy did when it imported from "undici". */
  undiciIndex: boolean;
}

const VARIANTS: Variant[] = [
  {
    name: "before",
    what: "unminified, undici's index loaded (the build before this change)",
    options: UNMINIFIED_BUILD,
    undiciIndex: true,
  },
  {
    name: "minified",
    what: "shipped build flags, undici's index loaded",
    options: PROXY_BUILD,
    undiciIndex: true,
  },
  {
    name: "undici lib",
    what: "unminified, undici from its lib files",
    options: UNMINIFIED_BUILD,
    undiciIndex: false,
  },
  {
    name: "shipped",
    what: "shipped build flags, undici from its lib files",
    options: PROXY_BUILD,
    undiciIndex: false,
  },
];

/** Characters in the bundle's text, and how many are above U+00FF (any one makes V8 use two bytes). */
function textOf(file: string): { chars: number; wide: number } {
  const s = readFileSync(file, "utf8");
  let wide = 0;
  for (let i = 0; i < s.length; i++) if (s.charCodeAt(i) > 0xff) wide++;
  return { chars: s.length, wide };
}

async function main(): Promise<number> {
  const started = Date.now();
  const dir = mkdtempSync(join(tmpdir(), "bw-memory-"));
  try {
    const bundles = new Map<string, string>();
    for (const v of VARIANTS) {
      const entry = join(dir, `entry-${bundles.size}.ts`);
      const main = join(ROOT, "proxy-image/src/proxy/main.ts");
      const undici = join(ROOT, "proxy-image/node_modules/undici/index.js");
      writeFileSync(
        entry,
        `${v.undiciIndex ? `import ${JSON.stringify(undici)};\n` : ""}import ${JSON.stringify(main)};\n`,
      );
      const outfile = join(dir, `proxy-${bundles.size}.cjs`);
      await build({ ...v.options, entryPoints: [entry], outfile });
      bundles.set(v.name, outfile);
    }
    const minimalBundle = join(dir, "minimal-mitm.cjs");
    await build({
      ...PROXY_BUILD,
      entryPoints: [fileURLToPath(new URL("./lib/minimal-mitm.ts", import.meta.url))],
      outfile: minimalBundle,
    });

    const up = await startUpstream({ dir, bodyBytes: 1024, secret: SECRET, children });
    const cp = new FakeControlPlane(
      "run_bench_memory",
      vaultOf({
        version: 1,
        hosts: [],
        rules: [{ host: HOST, secret: "API_KEY", inject: { scheme: "raw", name: HEADER } }],
      }),
      { API_KEY: SECRET },
    );
    await cp.start();

    // A probe preloaded into each process: on SIGUSR2, a full GC, then process.memoryUsage() to a
    // file. RSS counts what the allocator has not given back; the heap after a GC is what is live.
    const probe = join(dir, "mem-probe.cjs");
    writeFileSync(
      probe,
      'process.on("SIGUSR2", () => { globalThis.gc?.(); require("node:fs").writeFileSync(__dirname + "/mem-" + process.pid + ".json", JSON.stringify(process.memoryUsage())); });\n',
    );
    const probeArgs = ["--expose-gc", "--require", probe];
    const heapOf = async (pid: number): Promise<number> => {
      const file = join(dir, `mem-${pid}.json`);
      rmSync(file, { force: true });
      process.kill(pid, "SIGUSR2");
      for (let i = 0; i < 50; i++) {
        await new Promise((r) => setTimeout(r, 50));
        try {
          return (JSON.parse(readFileSync(file, "utf8")) as { heapUsed: number }).heapUsed / (1024 * 1024);
        } catch {
          // not written yet
        }
      }
      return Number.NaN;
    };

    const samples: MemorySample[] = [];
    const hold = async (name: string, pid: number, target: Target, child: ChildProcess) => {
      // Let the start-up settle (first policy poll, JIT of the start path) before reading memory.
      await new Promise((r) => setTimeout(r, 1000));
      const fresh = memoryOf(pid)?.rssMiB ?? Number.NaN;
      const freshHeap = await heapOf(pid);
      const idle = await openIdleConnections(target, {
        count: CONFIG.idleConnections,
        concurrency: 64,
        maxS: CONFIG.idleMaxS,
      });
      await new Promise((r) => setTimeout(r, 250));
      const holding = memoryOf(pid)?.rssMiB ?? Number.NaN;
      const open = idle.open();
      const idleHeap = await heapOf(pid);
      idle.close();
      await stopChild(child);
      samples.push({
        name,
        freshRssMiB: fresh,
        idleRssMiB: holding,
        idleOpen: open,
        idleFailed: idle.failed,
        freshHeapMiB: freshHeap,
        idleHeapMiB: idleHeap,
      });
      log(
        `  ${name}: fresh ${fresh.toFixed(1)} MiB (heap ${freshHeap.toFixed(1)}), ` +
          `holding ${open} idle ${holding.toFixed(1)} MiB (heap ${idleHeap.toFixed(1)})`,
      );
    };
    for (let round = 1; round <= CONFIG.rounds; round++) {
      log(`round ${round}/${CONFIG.rounds}`);
      for (const v of VARIANTS) {
        const p = await startProxyProcess({
          bundle: bundles.get(v.name) as string,
          dir,
          cp,
          upstream: up,
          logFile: join(dir, "proxy.log"),
          nodeArgs: probeArgs,
          children,
        });
        await hold(
          v.name,
          p.pid,
          {
            name: v.name,
            address: "127.0.0.1",
            port: p.ready.listeners.tls,
            servername: HOST,
            caPem: p.ready.caCertPem,
          },
          p.child,
        );
      }
      const m = await startMinimalMitm({
        bundle: minimalBundle,
        upstream: up,
        secret: SECRET,
        nodeArgs: probeArgs,
        children,
      });
      await hold(
        "minimal MITM",
        m.pid,
        {
          name: "minimal",
          address: "127.0.0.1",
          port: m.port,
          servername: HOST,
          caPem: m.caPem,
        },
        m.child,
      );
    }
    await stopChild(up.child);
    await cp.close();

    const results: MemoryResults = {
      ...sectionHead("memory", started, SHORT),
      config: CONFIG,
      variants: [
        ...VARIANTS.map((v) => ({ name: v.name, what: v.what, ...textOf(bundles.get(v.name) as string) })),
        {
          name: "minimal MITM",
          what: "bench/lib/minimal-mitm.ts, shipped build flags",
          ...textOf(minimalBundle),
        },
      ],
      samples,
    };
    const section = memorySection(results);
    const written = publish(section);
    process.stdout.write(`\nsummary:\n${summaryLines(section)}\nwritten to ${written}\n`);
    return 0;
  } finally {
    for (const c of children) await stopChild(c).catch(() => {});
    if (process.env.BENCH_KEEP_TMP === "1") log(`kept ${dir}`);
    else rmSync(dir, { recursive: true, force: true });
  }
}

process.on("exit", () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill("SIGKILL");
});
for (const sig of ["SIGINT", "SIGTERM", "SIGHUP"] as const) process.once(sig, () => process.exit(130));
runBench("memory bench", main);
