import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";
import type { DecisionResult } from "./decision";
import type { LoadResult } from "./load";
import { f, int, mark, ratio, type SectionHead, type SummaryRow, times } from "./results";

// Results of the proxy bench: the JSON as measured, and its section of the results page (table,
// ratios, targets met or not). Targets never fail the run; they are reported.

export interface Phase extends LoadResult {
  kind: "keep-alive" | "fixed-rate" | "new-connection";
  target: string;
  /** CPU used during the measured window, per process, as a share of one core. */
  cpuCores: Record<string, number>;
  /** Requests the upstream received in the window, and how many carried the injected credential. */
  upstreamRequests: number;
  upstreamInjected: number;
  /** TLS connections the upstream accepted in the window. */
  upstreamConnections: number;
  /** mitmdump's peak RSS (its phase only). */
  peakRssMiB?: number | null;
  /** req/s of each measured window (absent in results from before it was recorded). */
  windowsRps?: number[];
}

/** A process's RSS while it holds `open` of `connections` idle keep-alive TLS connections. */
export interface IdleHold {
  connections: number;
  open: number;
  failed: number;
  openMs: number;
  rssMiB: number;
}

export interface Results {
  schema: 1;
  date: string;
  commit: string;
  machine: { cores: number; cpu: string; node: string; mitmdump: string };
  config: Record<string, number | boolean | null>;
  phases: Phase[];
  memory: {
    proxyFreshRssMiB: number;
    proxyAfterLoadRssMiB: number;
    /** VmHWM of the proxy process over the whole run. */
    proxyPeakRssMiB: number;
    /** Holding the idle connections after the load rows. */
    idle: IdleHold;
    /** The minimal MITM's RSS, for comparison (absent in older results). */
    minimal?: {
      freshRssMiB: number;
      afterLoadRssMiB: number;
      idleOpen: number;
      idleRssMiB: number;
      peakRssMiB?: number;
    };
    /**
     * Holding the idle connections on fresh processes, before any load: the per-connection cost
     * the targets compare (absent in older results).
     */
    freshIdle?: { proxy: IdleHold; minimal: IdleHold };
  };
  decisions: DecisionResult[];
  proxyDecisionLog: Awaited<ReturnType<typeof countDecisions>>;
  /** Signed audit batches the bench's control plane accepted, and the rows they carried. */
  audit: { batches: number; rows: number };
  wallS: number;
  /** Settings below the defaults (absent in results from before there was more than one bench). */
  short?: boolean;
  /** The last `bench/splice-bench.ts` run (its splice.json), when there is one. */
  splice?: SpliceResults | null;
}

/** What bench/splice-bench.ts writes to splice.json beside the results. */
export interface SpliceResults {
  date: string;
  commit: string;
  loadAverage: number;
  rows: Array<{
    kind: "keep-alive" | "new-connection";
    direct: { rps: number; p50Ms: number; p99Ms: number };
    splice: { rps: number; p50Ms: number; p99Ms: number };
    ratio: number;
    proxyCpuMsPerRequest: number;
  }>;
}

const spliceKeepAlive = (r: Results) => r.splice?.rows.find((row) => row.kind === "keep-alive") ?? null;
const spliceMeasured = (r: Results): string => {
  const row = spliceKeepAlive(r);
  return row && r.splice
    ? `${f(row.ratio, 2)}× (${int(row.splice.rps)} vs ${int(row.direct.rps)} req/s; bench/splice-bench.ts, ${r.splice.date.slice(0, 10)}, ${r.splice.commit}, load average ${f(r.splice.loadAverage, 1)})`
    : "not measured (bench/splice-bench.ts writes splice.json)";
};

interface Target {
  name: string;
  goal: string;
  measured: string;
  met: boolean | null;
  /** How far from the goal, printed when it is missed. */
  missedBy?: string | undefined;
}

/** Tallies the proxy's decision log, and checks the credential never appears in it. */
export async function countDecisions(file: string, secret: string) {
  const byDecision: Record<string, number> = {};
  let tlsErrors = 0;
  let malformed = 0;
  let linesWithSecret = 0;
  for await (const line of createInterface({ input: createReadStream(file, "utf8"), crlfDelay: Infinity })) {
    if (line.includes(secret)) linesWithSecret++;
    if (!line.startsWith("{")) continue;
    let r: { event?: string; decision?: string };
    try {
      r = JSON.parse(line);
    } catch {
      continue;
    }
    if (r.event === "decision" && r.decision) byDecision[r.decision] = (byDecision[r.decision] ?? 0) + 1;
    else if (r.event === "tls_error") tlsErrors++;
    else if (r.event === "malformed") malformed++;
  }
  return { byDecision, tlsErrors, malformed, linesWithSecret };
}

/** What one idle connection costs: (RSS holding them − RSS fresh) / connections open, in KiB. */
export const kibPerConnection = (hold: IdleHold | undefined, freshMiB: number | undefined): number | null =>
  hold === undefined || freshMiB === undefined || !(hold.open > 0)
    ? null
    : ((hold.rssMiB - freshMiB) * 1024) / hold.open;

/** The memory the targets compare, proxy against the minimal MITM, from one run. */
function memoryVsMinimal(r: Results) {
  const m = r.memory;
  const perConnection = {
    proxy: kibPerConnection(m.freshIdle?.proxy, m.proxyFreshRssMiB),
    minimal: kibPerConnection(m.freshIdle?.minimal, m.minimal?.freshRssMiB),
  };
  return {
    perConnection: { ...perConnection, ratio: ratio(perConnection.proxy, perConnection.minimal) },
    fresh: {
      proxy: m.proxyFreshRssMiB,
      minimal: m.minimal?.freshRssMiB ?? null,
      ratio: ratio(m.proxyFreshRssMiB, m.minimal?.freshRssMiB),
    },
  };
}

/** Per idle connection ≤ 1.1× the minimal MITM's, fresh RSS ≤ 1.2× its own, decisions at scale < 5 µs. */
const GOAL = { perConnection: 1.1, fresh: 1.2, largeDecisionUs: 5 };

const signed = (n: number | null) => `${n !== null && n >= 0 ? "+" : ""}${f(n, 2)}`;

/** Requests per second of a row as quoted: the median of its windows (pooled, for old results). */
export const rpsOf = (p: Phase | undefined): number | undefined =>
  p === undefined ? undefined : p.windowsRps?.length ? median(p.windowsRps) : p.rps;

function median(xs: readonly number[]): number {
  const s = [...xs].sort((a, b) => a - b);
  const m = Math.floor(s.length / 2);
  return s.length % 2 ? (s[m] as number) : ((s[m - 1] as number) + (s[m] as number)) / 2;
}

/** The spread of a row's windows around their median, ± %: how noisy the row was. */
export function spreadOf(p: Phase | undefined): number | null {
  if (!p?.windowsRps || p.windowsRps.length < 2) return null;
  const mid = median(p.windowsRps);
  return mid > 0 ? ((Math.max(...p.windowsRps) - Math.min(...p.windowsRps)) / 2 / mid) * 100 : null;
}

/** The process a row's requests pass through, whose CPU is charged per request. */
const MIDDLE: Record<string, string> = { minimal: "minimal", proxy: "proxy", mitmdump: "mitmdump" };

/** CPU milliseconds the row's middle process spent per request (null for direct). */
export function cpuMsPerRequest(p: Phase): number | null {
  const proc = MIDDLE[p.target];
  const cores = proc ? p.cpuCores[proc] : undefined;
  return cores === undefined || !(p.rps > 0) ? null : (cores / p.rps) * 1000;
}

function targetsOf(r: Results): Target[] {
  const get = (kind: Phase["kind"], target: string) =>
    r.phases.find((p) => p.kind === kind && p.target === target);
  const kaDirect = get("keep-alive", "direct");
  const kaMinimal = get("keep-alive", "minimal");
  const kaProxy = get("keep-alive", "proxy");
  const kaMitm = get("keep-alive", "mitmdump");
  const ncDirect = get("new-connection", "direct");
  const ncProxy = get("new-connection", "proxy");
  const vsMinimal = ratio(rpsOf(kaProxy), rpsOf(kaMinimal));
  const vsMitm = ratio(rpsOf(kaProxy), rpsOf(kaMitm));
  const ncVsDirect = ratio(rpsOf(ncProxy), rpsOf(ncDirect));
  const frDirect = get("fixed-rate", "direct");
  const frProxy = get("fixed-rate", "proxy");
  const kaP99 = kaProxy && kaDirect ? kaProxy.p99Ms - kaDirect.p99Ms : null;
  const frP99 = frProxy && frDirect ? frProxy.p99Ms - frDirect.p99Ms : null;
  const ncP99 = ncProxy && ncDirect ? ncProxy.p99Ms - ncDirect.p99Ms : null;
  const small = r.decisions[0];
  const large = r.decisions.at(-1);
  const decisionRatio = ratio(large?.nsPerOp, small?.nsPerOp);
  const mem = memoryVsMinimal(r);
  const met = (v: number | null, ok: (v: number) => boolean) => (v === null ? null : ok(v));
  const p99Target = (name: string, added: number | null): Target => ({
    name,
    goal: "≤ +5 ms",
    measured: `${signed(added)} ms`,
    met: met(added, (v) => v <= 5),
    missedBy: added === null ? undefined : `${f(added - 5, 2)} ms`,
  });
  const minimalRps = rpsOf(kaMinimal);
  return [
    {
      name: "keep-alive req/s vs the minimal Node MITM",
      goal: "≥ 0.8×",
      measured: vsMinimal === null ? "n/a (no minimal MITM row)" : `${f(vsMinimal, 2)}×`,
      met: met(vsMinimal, (v) => v >= 0.8),
      missedBy:
        vsMinimal === null || minimalRps === undefined
          ? undefined
          : `${f(0.8 - vsMinimal, 2)}× (needs ${int(0.8 * minimalRps)} req/s)`,
    },
    {
      name: "keep-alive req/s vs mitmdump",
      goal: "≥ 10×",
      measured: vsMitm === null ? `n/a (mitmdump: ${r.machine.mitmdump})` : `${f(vsMitm, 1)}×`,
      met: met(vsMitm, (v) => v >= 10),
      missedBy: vsMitm === null ? undefined : `${f(10 - vsMitm, 1)}×`,
    },
    {
      name: "new-connection req/s vs direct (new-connection)",
      goal: "≥ 0.5×",
      measured: `${f(ncVsDirect, 2)}×`,
      met: met(ncVsDirect, (v) => v >= 0.5),
      missedBy: ncVsDirect === null ? undefined : `${f(0.5 - ncVsDirect, 2)}×`,
    },
    p99Target(
      `keep-alive p99 vs direct p99, open loop at ${int(Number(r.config.fixedRate ?? 0))} req/s`,
      frP99,
    ),
    p99Target(`keep-alive p99 vs direct p99, flat out (${r.config.connections} connections)`, kaP99),
    p99Target("new-connection p99 vs direct p99", ncP99),
    {
      name: `decision time at ${int(small?.rules ?? 0)} rules`,
      goal: "< 2 µs",
      measured: `${f((small?.nsPerOp ?? Number.NaN) / 1000, 2)} µs`,
      met: small ? small.nsPerOp < 2000 : null,
      missedBy: small ? `${f((small.nsPerOp - 2000) / 1000, 2)} µs` : undefined,
    },
    {
      name: `decision time at ${int(large?.rules ?? 0)} rules`,
      goal: `< ${GOAL.largeDecisionUs} µs`,
      measured: `${f((large?.nsPerOp ?? Number.NaN) / 1000, 2)} µs (${f(decisionRatio, 2)}× the ${int(small?.rules ?? 0)}-rule ${f((small?.nsPerOp ?? Number.NaN) / 1000, 2)} µs)`,
      met: large ? large.nsPerOp < GOAL.largeDecisionUs * 1000 : null,
      missedBy: large ? `${f(large.nsPerOp / 1000 - GOAL.largeDecisionUs, 2)} µs` : undefined,
    },
    {
      name: "proxy RSS per idle keep-alive connection vs the minimal Node MITM's (fresh processes)",
      goal: `≤ ${GOAL.perConnection}×`,
      measured:
        mem.perConnection.ratio === null
          ? "n/a (not measured on fresh processes in this run)"
          : `${f(mem.perConnection.ratio, 2)}× (${f(mem.perConnection.proxy, 0)} vs ${f(mem.perConnection.minimal, 0)} KiB)`,
      met: met(mem.perConnection.ratio, (v) => v <= GOAL.perConnection),
      missedBy:
        mem.perConnection.ratio === null || mem.perConnection.minimal === null
          ? undefined
          : `${f(mem.perConnection.ratio - GOAL.perConnection, 2)}×, needs ≤ ${f(GOAL.perConnection * mem.perConnection.minimal, 0)} KiB`,
    },
    {
      name: "proxy RSS fresh vs the minimal Node MITM's",
      goal: `≤ ${GOAL.fresh}×`,
      measured:
        mem.fresh.ratio === null
          ? "n/a (no minimal MITM reading)"
          : `${f(mem.fresh.ratio, 2)}× (${f(mem.fresh.proxy)} vs ${f(mem.fresh.minimal)} MiB)`,
      met: met(mem.fresh.ratio, (v) => v <= GOAL.fresh),
      missedBy:
        mem.fresh.ratio === null || mem.fresh.minimal === null
          ? undefined
          : `${f(mem.fresh.ratio - GOAL.fresh, 2)}×, needs ≤ ${f(GOAL.fresh * mem.fresh.minimal)} MiB`,
    },
    {
      name: "splice (no TLS termination, bytes relayed) keep-alive req/s vs direct",
      goal: "≥ 0.9×",
      measured: spliceMeasured(r),
      met: met(spliceKeepAlive(r)?.ratio ?? null, (v) => v >= 0.9),
      missedBy: `${f(0.9 - (spliceKeepAlive(r)?.ratio ?? 0), 2)}×`,
    },
  ];
}

function throughputTable(r: Results): string[] {
  const rate = Number(r.config.fixedRate ?? 0);
  const procs = ["loadgen", "minimal", "proxy", "upstream", "mitmdump", "irq", "others"];
  const rows = [
    "| load | through | req/s (median of windows) | windows ± % | p50 ms | p99 ms | × direct | × minimal MITM | × mitmdump | CPU ms per request | errors / non-2xx | upstream got (with credential) | CPU, cores: loadgen / minimal / proxy / upstream / mitmdump / irq / others |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
  ];
  for (const p of r.phases) {
    const same = (target: string) => r.phases.find((q) => q.kind === p.kind && q.target === target);
    const vs = (target: string) => {
      const base = same(target);
      return base ? f(ratio(rpsOf(p), rpsOf(base)), 2) : "n/a";
    };
    const load = p.kind === "fixed-rate" ? `keep-alive, open loop at ${int(rate)} req/s` : p.kind;
    rows.push(
      `| ${load} | ${p.target} | ${int(rpsOf(p) ?? Number.NaN)} | ${f(spreadOf(p), 1)} | ${f(p.p50Ms, 2)} | ${f(p.p99Ms, 2)} | ${vs("direct")} | ${vs("minimal")} | ${p.kind === "keep-alive" ? vs("mitmdump") : "n/a"} | ${f(cpuMsPerRequest(p), 3)} | ${p.errors} / ${p.non2xx} | ${int(p.upstreamRequests)} (${int(p.upstreamInjected)}) | ${procs.map((k) => (p.cpuCores[k] === undefined ? "–" : f(p.cpuCores[k], 2))).join(" / ")} |`,
    );
  }
  if (!r.phases.some((p) => p.kind === "keep-alive" && p.target === "mitmdump"))
    rows.push(
      `| keep-alive | mitmdump | n/a | | n/a | n/a | n/a | n/a | n/a | n/a | – | – | ${r.machine.mitmdump} |`,
    );
  const splice = spliceKeepAlive(r);
  rows.push(
    splice
      ? `| keep-alive (bench/splice-bench.ts) | splice | ${int(splice.splice.rps)} | | ${f(splice.splice.p50Ms, 2)} | ${f(splice.splice.p99Ms, 2)} | ${f(splice.ratio, 2)} | n/a | n/a | ${f(splice.proxyCpuMsPerRequest, 3)} | | | direct in that run: ${int(splice.direct.rps)} req/s, p99 ${f(splice.direct.p99Ms, 2)} ms |`
      : "| keep-alive | splice | not measured (bench/splice-bench.ts) | | | | | | | | | | |",
  );
  return rows;
}

function memoryTable(r: Results): string[] {
  const m = r.memory;
  const mn = m.minimal;
  const mem = memoryVsMinimal(r);
  const fi = m.freshIdle;
  const n = int(m.idle.connections);
  const row = (
    when: string,
    proxy: number | null | undefined,
    minimal: number | null | undefined,
    digits = 1,
  ) => `| ${when} | ${f(proxy, digits)} | ${f(minimal, digits)} | ${f(ratio(proxy, minimal), 2)} |`;
  const opened = (who: string, h: IdleHold) =>
    `${who} ${int(h.open)} open in ${f(h.openMs, 0)} ms, ${h.failed} failed`;
  const mitmPeak = r.phases.find((p) => p.target === "mitmdump")?.peakRssMiB;
  return [
    "| when | proxy | minimal Node MITM | × minimal MITM |",
    "| --- | ---: | ---: | ---: |",
    row("after start (idle, policy loaded), MiB", m.proxyFreshRssMiB, mn?.freshRssMiB),
    ...(fi
      ? [
          row(
            `holding ${n} idle keep-alive TLS connections, before any load, MiB`,
            fi.proxy.rssMiB,
            fi.minimal.rssMiB,
          ),
          row(
            "**per idle connection**: (holding − after start) / open, KiB",
            mem.perConnection.proxy,
            mem.perConnection.minimal,
            0,
          ),
        ]
      : []),
    row("after the load rows, MiB", m.proxyAfterLoadRssMiB, mn?.afterLoadRssMiB),
    row(
      `holding ${n} idle keep-alive TLS connections after the load rows, MiB`,
      m.idle.rssMiB,
      mn?.idleRssMiB,
    ),
    row(
      "per idle connection after the load rows: (holding − after the load rows) / open, KiB",
      kibPerConnection(m.idle, m.proxyAfterLoadRssMiB),
      mn ? ((mn.idleRssMiB - mn.afterLoadRssMiB) * 1024) / Math.max(1, mn.idleOpen) : null,
      0,
    ),
    row("peak over the whole run (VmHWM), MiB", m.proxyPeakRssMiB, mn?.peakRssMiB),
    ...(mitmPeak === undefined
      ? []
      : [`| (mitmdump's peak over its rows, for comparison: ${f(mitmPeak)} MiB) | | | |`]),
    "",
    `Connections: ${[
      ...(fi ? [opened("before any load: proxy", fi.proxy), opened("minimal MITM", fi.minimal)] : []),
      opened("after the load rows: proxy", m.idle),
      `minimal MITM ${int(mn?.idleOpen ?? Number.NaN)} open`,
    ].join("; ")}.`,
    "Both processes are read fresh (0.5 s after ready), then holding the idle connections (each has",
    "served one request) before any load, then again after the load rows, when the heap each grew",
    "under load is still there. The targets take the first readings: what an idle connection costs",
    "is the growth it causes divided by the connections open, for the proxy and the minimal MITM",
    "alike, so Node's own share (the TLS socket and its buffers) is in both.",
  ];
}

export function renderProxy(r: Results): string {
  const targets = targetsOf(r);
  const rate = Number(r.config.fixedRate ?? 0);
  const c = r.config;
  const maxOthers = Math.max(0, ...r.phases.map((p) => p.cpuCores.others ?? 0));
  const lines = [
    "## Proxy bench (`npm run bench:proxy`, bench/proxy-bench.ts)",
    "",
    ...(r.short ? ["**Short run**: settings below the defaults, so these numbers say less.", ""] : []),
    `- date: ${r.date}, commit ${r.commit}, whole run ${f(r.wallS, 0)} s`,
    `- machine: ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.machine.node}, mitmdump: ${r.machine.mitmdump}`,
    `- load: ${c.connections} connections (keep-alive) or ${c.connections} concurrent loops (new connection), ` +
      `${c.durationS} s measured per row in ${c.rounds} windows, each after ${c.warmupS} s of unmeasured load, ` +
      `GET with a ${c.bodyBytes}-byte response, ` +
      "loopback only (client → 127.0.0.1 proxy / mitmdump, or → 127.0.0.2 upstream), SNI and Host `api.test`",
    "",
    "### How the two cores are shared",
    "",
    "Nothing is pinned. Three processes share the machine's cores under the Linux scheduler: the load",
    "generator (the bench process, one thread: autocannon for keep-alive, a Node `https` loop for new",
    "connections), the upstream (one Node process, HTTPS), and the proxy (one Node process, the bundle",
    "the image runs), or in their own rows the minimal Node MITM (bench/lib/minimal-mitm.ts, bundled",
    "the same way: TLS terminated with a leaf from a run-CA-like CA, an undici Pool to the upstream,",
    "one header added, nothing else) or mitmdump. In the direct rows the load generator and the",
    "upstream have a core each; through a proxy, three busy processes share two cores, so the proxy",
    "rows also measure how much CPU the proxy takes from the others. The minimal MITM is the limit",
    "Node itself sets for this work on this machine, so `× minimal MITM` is the proxy's own cost;",
    "`CPU ms per request` is the middle process's CPU time divided by the requests it passed. The CPU column says, per row, how",
    "many cores each process used (1.00 = one full core); `irq` is interrupt time (much of loopback",
    "TCP runs there, charged to no process); `others` is what the rest of the machine used meanwhile.",
    "Each row is measured in several windows, the rows of a kind taking turns, so a neighbour's load",
    "falls on every row of a kind alike. req/s is the median of a row's windows (ratios too), and",
    "`windows ± %` is half their range over that median: how noisy the row was. Latency is pooled",
    "over the windows.",
    ...(maxOthers > 0.25
      ? [
          "",
          `**This run shared the machine**: other processes used up to ${f(maxOthers, 2)} cores during a row.`,
          "Absolute numbers are lower and noisier than on a quiet machine; the ratios less so.",
        ]
      : []),
    "",
    "### Throughput and latency",
    "",
    ...throughputTable(r),
    "",
    "Keep-alive flat out: autocannon 9, one request in flight per connection, no pipelining; it does",
    "not verify the server certificate (it cannot be made to), which costs nothing here because each",
    "connection shakes hands once, before the window. New connection: one verified TLS 1.3 handshake,",
    "one request with `Connection: close`, per request, the same loop for direct and proxy. Through",
    "the proxy, its upstream connections stay pooled (keep-alive) in both loads: that is its design,",
    "not a bench artefact. Latency is per request, measured by the client, 2xx only.",
    "",
    "Flat out, every row runs its target at saturation, so its latency is mostly queueing (32",
    "connections / req/s). The open-loop rows offer the same fixed rate to direct and proxy (half",
    "of the proxy's flat-out rate unless BENCH_FIXED_RATE says otherwise), with latency counted from",
    "each request's scheduled time: that is the latency the proxy adds when it is not the bottleneck.",
    "On a shared machine, read the CPU column too: when the cores are full anyway, these rows are not",
    "below saturation either, and their tails are the scheduler's as much as the proxy's.",
    ...r.phases
      .filter((p) => p.kind === "fixed-rate" && p.rps < 0.95 * Number(r.config.fixedRate ?? 0))
      .map(
        (p) => `**${p.target} did not keep up with the offered rate** (${int(p.rps)} of ${int(rate)} req/s).`,
      ),
    "",
    "### Memory (/proc/<pid>/status)",
    "",
    ...memoryTable(r),
    "",
    "### Policy decisions (in-process)",
    "",
    "`decide` (decideHost, then matchRule unless blocked) per lookup on `buildPolicyIndex(compilePolicy(vault))`, N rules and N",
    "host entries (half exact, half wildcard), lookups mixed: ¼ exact host hits, ¼ wildcard host hits,",
    "¼ rule hits, ¼ misses, spread over the whole vault. Median of rounds interleaved between sizes.",
    "",
    "| rules | host entries | ns per lookup | × smallest | compile + index ms |",
    "| ---: | ---: | ---: | ---: | ---: |",
    ...r.decisions.map(
      (d) =>
        `| ${int(d.rules)} | ${int(d.hostEntries)} | ${f(d.nsPerOp, 0)} | ${f(ratio(d.nsPerOp, r.decisions[0]?.nsPerOp), 2)} | ${f(d.buildMs, 0)} |`,
    ),
    "",
    "### Targets",
    "",
    "| target | goal | measured | |",
    "| --- | --- | --- | --- |",
    ...targets.map((t) => `| ${t.name} | ${t.goal} | ${t.measured} | ${mark(t.met, t.missedBy)} |`),
    "",
    "### Checks on the run itself",
    "",
    `- proxy decision log: ${Object.entries(r.proxyDecisionLog.byDecision)
      .map(([k, v]) => `${k} ${int(v)}`)
      .join(", ")}; TLS errors ${r.proxyDecisionLog.tlsErrors}, malformed ${r.proxyDecisionLog.malformed}. ` +
      "The client saw no error inside a measured window unless the table says so; the proxy's",
    "  `error` records are requests cut off when the bench stopped a load, between windows",
    `- lines of the proxy's output containing the credential: ${r.proxyDecisionLog.linesWithSecret} (must be 0)`,
    `- signed audit batches delivered to the bench control plane: ${int(r.audit.batches)}, carrying ` +
      `${int(r.audit.rows)} rows, in a ${f(r.wallS, 0)} s run (the proxy flushes its aggregate every second)`,
    "- through a proxy, every request the upstream got should carry the credential: see the",
    '  "upstream got (with credential)" column',
    "",
  ];
  return lines.join("\n");
}

/** The console table of a proxy run. */
export function consoleTable(r: Results): string {
  const out = [
    "",
    "load            through      req/s   ±%    p50 ms   p99 ms  ×direct ×minimal  CPU ms/req",
  ];
  for (const p of r.phases) {
    const same = (t: string) => r.phases.find((q) => q.kind === p.kind && q.target === t);
    out.push(
      `${(p.kind === "fixed-rate" ? `@${int(Number(r.config.fixedRate ?? 0))}/s` : p.kind).padEnd(15)} ${p.target.padEnd(10)} ${int(rpsOf(p) ?? Number.NaN).padStart(8)} ${f(spreadOf(p), 1).padStart(5)} ${f(p.p50Ms, 2).padStart(8)} ${f(p.p99Ms, 2).padStart(8)} ${f(ratio(rpsOf(p), rpsOf(same("direct"))), 2).padStart(8)} ${f(ratio(rpsOf(p), rpsOf(same("minimal"))), 2).padStart(8)} ${f(cpuMsPerRequest(p), 3).padStart(10)}`,
    );
  }
  out.push("", "targets:");
  for (const t of targetsOf(r)) out.push(`  ${mark(t.met, t.missedBy)}: ${t.name} ${t.goal}: ${t.measured}`);
  return out.join("\n");
}

/** The proxy bench's section of latest.json: its results, the targets and the summary rows. */
export function proxySection(r: Results, short: boolean): ProxySection {
  const targets = targetsOf(r);
  const get = (kind: Phase["kind"], target: string) =>
    r.phases.find((p) => p.kind === kind && p.target === target);
  const row = (kind: Phase["kind"], target: string, base: string, measure: string): SummaryRow => {
    const a = get(kind, target);
    const b = get(kind, base);
    return {
      measure,
      result: a ? `${int(rpsOf(a) ?? Number.NaN)} req/s (± ${f(spreadOf(a), 0)} %)` : "n/a",
      baseline: b
        ? `${int(rpsOf(b) ?? Number.NaN)} req/s (${base}, ± ${f(spreadOf(b), 0)} %)`
        : `n/a (${base})`,
      ratio: times(ratio(rpsOf(a), rpsOf(b))),
    };
  };
  const target = (prefix: string) => {
    const t = targets.find((x) => x.name.startsWith(prefix));
    return { target: t?.goal ?? "", met: t?.met ?? null, missedBy: t?.missedBy };
  };
  const small = r.decisions[0];
  const large = r.decisions.at(-1);
  const mem = memoryVsMinimal(r);
  const summary: SummaryRow[] = [
    {
      ...row("keep-alive", "proxy", "minimal", "keep-alive req/s, proxy vs the minimal Node MITM"),
      ...target("keep-alive req/s vs the minimal"),
    },
    row("keep-alive", "minimal", "direct", "keep-alive req/s, minimal Node MITM vs direct (Node's limit)"),
    row("keep-alive", "proxy", "direct", "keep-alive req/s through the proxy"),
    {
      ...row("keep-alive", "proxy", "mitmdump", "keep-alive req/s, proxy vs mitmdump"),
      ...target("keep-alive req/s vs mitmdump"),
    },
    {
      ...row("new-connection", "proxy", "direct", "new-connection req/s through the proxy"),
      ...target("new-connection req/s"),
    },
    {
      measure: `p99 added at a fixed ${int(Number(r.config.fixedRate ?? 0))} req/s`,
      result: `${f(get("fixed-rate", "proxy")?.p99Ms, 2)} ms`,
      baseline: `${f(get("fixed-rate", "direct")?.p99Ms, 2)} ms (direct)`,
      ratio: targets.find((t) => t.name.includes("open loop"))?.measured ?? "n/a",
      ...target("keep-alive p99 vs direct p99, open loop"),
    },
    {
      measure: `policy decision, ${int(small?.rules ?? 0)} rules (median)`,
      result: `${f((small?.nsPerOp ?? Number.NaN) / 1000, 2)} µs`,
      baseline: "",
      ratio: "",
      ...target(`decision time at ${int(small?.rules ?? 0)} rules`),
    },
    {
      measure: `policy decision, ${int(large?.rules ?? 0)} rules (median)`,
      result: `${f((large?.nsPerOp ?? Number.NaN) / 1000, 2)} µs`,
      baseline: `${f((small?.nsPerOp ?? Number.NaN) / 1000, 2)} µs (${int(small?.rules ?? 0)} rules)`,
      ratio: times(ratio(large?.nsPerOp, small?.nsPerOp)),
      ...target(`decision time at ${int(large?.rules ?? 0)} rules`),
    },
    {
      measure: `proxy RSS per idle keep-alive connection, ${int(r.memory.freshIdle?.proxy.open ?? 0)} held by a fresh process`,
      result: `${f(mem.perConnection.proxy, 0)} KiB`,
      baseline: `${f(mem.perConnection.minimal, 0)} KiB (minimal MITM, ${int(r.memory.freshIdle?.minimal.open ?? 0)} held)`,
      ratio: times(mem.perConnection.ratio),
      ...target("proxy RSS per idle"),
    },
    {
      measure: "proxy RSS fresh (started, policy loaded)",
      result: `${f(mem.fresh.proxy)} MiB`,
      baseline: `${f(mem.fresh.minimal)} MiB (minimal MITM)`,
      ratio: times(mem.fresh.ratio),
      ...target("proxy RSS fresh"),
    },
    {
      measure: "splice keep-alive req/s vs direct",
      result: spliceKeepAlive(r) ? `${int(spliceKeepAlive(r)?.splice.rps ?? 0)} req/s` : "not measured",
      baseline: spliceKeepAlive(r) ? `${int(spliceKeepAlive(r)?.direct.rps ?? 0)} req/s (direct)` : "",
      ratio: spliceKeepAlive(r) ? `${f(spliceKeepAlive(r)?.ratio, 2)}×` : "",
      ...target("splice"),
    },
  ];
  return {
    ...r,
    bench: "proxy",
    short: r.short ?? short,
    machine: r.machine,
    summary,
    targets,
  };
}

export type ProxySection = Results & SectionHead & { targets: Target[] };
