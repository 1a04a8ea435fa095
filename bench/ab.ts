// A quick A/B of the proxy's own cost: `npx tsx bench/ab.ts [other checkout]`. Keep-alive flat out
// (32 connections, as the proxy bench) through the minimal Node MITM, the proxy built from this
// tree and, when given, the proxy built from another checkout (a `git worktree` of the commit
// before a change), the targets taking turns in each round, so a neighbour's load falls on all of
// them alike. Prints per target the median req/s and CPU ms per request of the middle process, and
// each proxy's as × the minimal MITM's (the median of per-round ratios). Writes nothing to
// bench/results: it is the loop for working on one change; `npm run bench:proxy` is the record.
// BENCH_ROUNDS (default 5), BENCH_DURATION_S (seconds per window, default 3).
import type { ChildProcess } from "node:child_process";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { build } from "esbuild";
import { FakeControlPlane } from "../test/proxy/control-plane";
import { vault as vaultOf } from "../test/proxy/harness";
import { PROXY_BUILD } from "./lib/bundle";
import { keepAliveLoad, type Target } from "./lib/load";
import { stopChild } from "./lib/mitm";
import { cpuSecondsOf } from "./lib/proc";
import { HEADER, HOST, startMinimalMitm, startProxyProcess, startUpstream } from "./lib/proxy-process";
import { num, ROOT } from "./lib/results";

const ROUNDS = num("BENCH_ROUNDS", 5);
const SECONDS = num("BENCH_DURATION_S", 3);
const SECRET = `sk-bench-${Math.random().toString(36).slice(2, 14)}`;
const children: ChildProcess[] = [];
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

const dir = mkdtempSync(join(tmpdir(), "bw-ab-"));
try {
  const checkouts: Array<[string, string]> = [["proxy", ROOT]];
  if (process.argv[2]) checkouts.unshift(["base", process.argv[2]]);
  const up = await startUpstream({ dir, bodyBytes: 1024, secret: SECRET, children });
  const targets: Array<{ target: Target; pid: number }> = [];
  const minimalBundle = join(dir, "minimal.cjs");
  await build({
    ...PROXY_BUILD,
    entryPoints: [fileURLToPath(new URL("./lib/minimal-mitm.ts", import.meta.url))],
    outfile: minimalBundle,
  });
  const minimal = await startMinimalMitm({ bundle: minimalBundle, upstream: up, secret: SECRET, children });
  targets.push({
    target: {
      name: "minimal",
      address: "127.0.0.1",
      port: minimal.port,
      servername: HOST,
      caPem: minimal.caPem,
    },
    pid: minimal.pid,
  });
  const cps: FakeControlPlane[] = [];
  for (const [name, root] of checkouts) {
    const bundle = join(dir, `${name}.cjs`);
    await build({
      ...PROXY_BUILD,
      entryPoints: [join(root, "proxy-image/src/proxy/main.ts")],
      outfile: bundle,
    });
    const cp = new FakeControlPlane(
      `run_ab_${name}`,
      vaultOf({
        version: 1,
        hosts: [{ pattern: "blocked.test", action: "block" }],
        rules: [{ host: HOST, secret: "API_KEY", inject: { scheme: "raw", name: HEADER } }],
      }),
      { API_KEY: SECRET },
    );
    await cp.start();
    cps.push(cp);
    const p = await startProxyProcess({
      bundle,
      dir,
      cp,
      upstream: up,
      logFile: join(dir, `${name}.log`),
      children,
    });
    targets.push({
      target: {
        name,
        address: "127.0.0.1",
        port: p.ready.listeners.tls,
        servername: HOST,
        caPem: p.ready.caCertPem,
      },
      pid: p.pid,
    });
  }
  const seen = new Map<string, { rps: number[]; cpuMs: number[] }>();
  for (let r = 0; r < ROUNDS; r++) {
    for (const { target, pid } of targets) {
      let cpu0 = 0;
      let cpu1 = 0;
      const raw = await keepAliveLoad(target, {
        warmupS: 1,
        durationS: SECONDS,
        connections: 32,
        hooks: { start: () => (cpu0 = cpuSecondsOf(pid)), end: () => (cpu1 = cpuSecondsOf(pid)) },
      });
      const s = seen.get(target.name) ?? { rps: [], cpuMs: [] };
      s.rps.push(raw.ok / raw.windowS);
      s.cpuMs.push(((cpu1 - cpu0) * 1000) / raw.ok);
      seen.set(target.name, s);
    }
  }
  // Ratios per round (each proxy against the minimal MITM of the same round), then their median:
  // a neighbour's load moves a round's numbers together, so the ratio is steadier than either.
  const floor = seen.get("minimal") ?? { rps: [], cpuMs: [] };
  for (const [name, s] of seen) {
    const cpuX = median(s.cpuMs.map((c, i) => c / (floor.cpuMs[i] ?? Number.NaN)));
    const rpsX = median(s.rps.map((r, i) => r / (floor.rps[i] ?? Number.NaN)));
    console.log(
      `${name.padEnd(8)} ${median(s.rps).toFixed(0).padStart(6)} req/s (${rpsX.toFixed(2)}× minimal)  ` +
        `${median(s.cpuMs).toFixed(3)} CPU ms/req (${cpuX.toFixed(2)}× minimal)  ` +
        `windows: ${s.cpuMs.map((x) => x.toFixed(3)).join(" ")}`,
    );
  }
  for (const cp of cps) await cp.close();
} finally {
  for (const c of children) await stopChild(c).catch(() => {});
  rmSync(dir, { recursive: true, force: true });
}
process.exit(0);
