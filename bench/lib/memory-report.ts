import { f, int, quantiles, ratio, type SectionHead, type SummaryRow, times } from "./results";

// The proxy memory bench's section of the results page (bench/memory-bench.ts).

export interface MemorySample {
  name: string;
  freshRssMiB: number;
  idleRssMiB: number;
  idleOpen: number;
  idleFailed: number;
  /** V8 heap in use after a full GC (process.memoryUsage().heapUsed), fresh and holding. */
  freshHeapMiB: number;
  idleHeapMiB: number;
}

export interface MemoryResults extends SectionHead {
  config: { rounds: number; idleConnections: number; idleMaxS: number };
  /** Each build: what it is, its text's length in characters, and how many are above U+00FF. */
  variants: Array<{ name: string; what: string; chars: number; wide: number }>;
  samples: MemorySample[];
}

interface Row {
  name: string;
  fresh: { median: number; min: number; max: number };
  idle: { median: number; min: number; max: number };
  freshHeap: number;
  idleHeap: number;
  idleOpen: number;
  /** Median over rounds of (holding − fresh) / connections open, KiB. */
  perConnectionKiB: number;
}

function rowsOf(r: MemoryResults): Row[] {
  const span = (xs: number[]) => ({
    median: quantiles(xs).median,
    min: Math.min(...xs),
    max: Math.max(...xs),
  });
  return r.variants.map((v) => {
    const s = r.samples.filter((x) => x.name === v.name);
    return {
      name: v.name,
      fresh: span(s.map((x) => x.freshRssMiB)),
      idle: span(s.map((x) => x.idleRssMiB)),
      freshHeap: quantiles(s.map((x) => x.freshHeapMiB)).median,
      idleHeap: quantiles(s.map((x) => x.idleHeapMiB)).median,
      idleOpen: Math.min(...s.map((x) => x.idleOpen)),
      perConnectionKiB: quantiles(s.map((x) => ((x.idleRssMiB - x.freshRssMiB) * 1024) / x.idleOpen)).median,
    };
  });
}

export function memorySection(r: MemoryResults): MemoryResults {
  const rows = rowsOf(r);
  const get = (name: string) => rows.find((x) => x.name === name);
  const before = get("before");
  const shipped = get("shipped");
  const minimal = get("minimal MITM");
  // The proxy bench's memory targets, here over several fresh processes a build.
  const perConnection = ratio(shipped?.perConnectionKiB, minimal?.perConnectionKiB);
  const fresh = ratio(shipped?.fresh.median, minimal?.fresh.median);
  const summary: SummaryRow[] = [
    {
      measure: "proxy RSS fresh, shipped build vs the build before (minified, undici lib files)",
      result: `${f(shipped?.fresh.median)} MiB`,
      baseline: `${f(before?.fresh.median)} MiB (before)`,
      ratio: times(ratio(shipped?.fresh.median, before?.fresh.median)),
    },
    {
      measure: "proxy V8 heap after a full GC, fresh, shipped build vs before",
      result: `${f(shipped?.freshHeap)} MiB`,
      baseline: `${f(before?.freshHeap)} MiB (before)`,
      ratio: times(ratio(shipped?.freshHeap, before?.freshHeap)),
    },
    {
      measure: `proxy RSS holding ${int(r.config.idleConnections)} idle connections, shipped vs before`,
      result: `${f(shipped?.idle.median)} MiB`,
      baseline: `${f(before?.idle.median)} MiB (before)`,
      ratio: times(ratio(shipped?.idle.median, before?.idle.median)),
    },
    {
      measure: "proxy RSS per idle connection (fresh process), shipped build vs the minimal Node MITM",
      result: `${f(shipped?.perConnectionKiB, 0)} KiB`,
      baseline: `${f(minimal?.perConnectionKiB, 0)} KiB (minimal MITM)`,
      ratio: times(perConnection),
      target: "≤ 1.1×",
      met: perConnection === null ? null : perConnection <= 1.1,
      missedBy:
        perConnection === null || minimal === undefined
          ? undefined
          : `${f(perConnection - 1.1, 2)}×, needs ≤ ${f(1.1 * minimal.perConnectionKiB, 0)} KiB`,
    },
    {
      measure: "proxy RSS fresh, shipped build vs the minimal Node MITM",
      result: `${f(shipped?.fresh.median)} MiB`,
      baseline: `${f(minimal?.fresh.median)} MiB (minimal MITM)`,
      ratio: times(fresh),
      target: "≤ 1.2×",
      met: fresh === null ? null : fresh <= 1.2,
      missedBy:
        fresh === null || minimal === undefined
          ? undefined
          : `${f(fresh - 1.2, 2)}×, needs ≤ ${f(1.2 * minimal.fresh.median)} MiB`,
    },
    {
      measure: `minimal Node MITM RSS holding ${int(r.config.idleConnections)} idle connections (Node's floor)`,
      result: `${f(minimal?.idle.median)} MiB`,
      baseline: `${f(minimal?.fresh.median)} MiB (fresh)`,
      ratio: times(ratio(minimal?.idle.median, minimal?.fresh.median)),
    },
  ];
  return { ...r, summary };
}

export function renderMemory(r: MemoryResults): string {
  const rows = rowsOf(r);
  const before = rows.find((x) => x.name === "before");
  const range = (x: Row["fresh"]) => `${f(x.min)}–${f(x.max)}`;
  const lines = [
    "## Proxy memory bench (`npm run bench:memory`, bench/memory-bench.ts)",
    "",
    ...(r.short ? ["**Short run**: settings below the defaults, so these numbers say less.", ""] : []),
    `- date: ${r.date}, commit ${r.commit}, whole run ${f(r.wallS, 0)} s`,
    `- machine: ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.machine.node}`,
    `- ${r.config.rounds} rounds, builds taking turns, a fresh process each time; RSS (VmRSS) 1 s after ready,` +
      ` then holding ${int(r.config.idleConnections)} idle keep-alive TLS connections (each served one request)`,
    "",
    "The proxy bundle built four ways from the same source, and the minimal Node MITM (bench/lib/minimal-mitm.ts)",
    "as the floor. A bundle whose text has even one character above U+00FF is held by V8 as a two-byte",
    "string (twice its length in bytes) for as long as the process lives; undici's index loads fetch,",
    "WebSocket, the caches and the mocks, which the proxy never uses. Medians, with the range of rounds.",
    "Heap: V8's heap in use after a full GC (a preloaded probe, `--expose-gc`), what is live rather",
    "than what the allocator kept.",
    "",
    "| build | what | characters (above U+00FF) | fresh RSS MiB | range | × before | fresh heap MiB | holding idle RSS MiB | range | × before | holding heap MiB | connections open | per connection KiB |",
    "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const row of rows) {
    const v = r.variants.find((x) => x.name === row.name);
    lines.push(
      `| ${row.name} | ${v?.what ?? ""} | ${int(v?.chars ?? Number.NaN)} (${int(v?.wide ?? Number.NaN)}) | ${f(row.fresh.median)} | ${range(row.fresh)} | ${f(ratio(row.fresh.median, before?.fresh.median), 2)} | ${f(row.freshHeap)} | ${f(row.idle.median)} | ${range(row.idle)} | ${f(ratio(row.idle.median, before?.idle.median), 2)} | ${f(row.idleHeap)} | ${int(row.idleOpen)} | ${f(row.perConnectionKiB, 0)} |`,
    );
  }
  lines.push("");
  return lines.join("\n");
}
