import { f, int, quantiles, ratio, type SectionHead, type SummaryRow, times } from "./results";

// The broker bench's section of the results page (bench/broker-bench.ts).

/** run: a broker instance per run (issue 24); shared: the one instance of before ("broker"). */
export type BrokerInstances = "run" | "shared";
export type BrokerOp = "create" | "exec" | "poll" | "destroyRun";

export interface BrokerOpStats {
  calls: number;
  p50Ms: number;
  p99Ms: number;
}

export interface BrokerRow {
  instances: BrokerInstances;
  /** Calls completed per second in each window, in the order measured. */
  windows: number[];
  /** The median of the windows. */
  callsPerS: number;
  /** Half the windows' range, as % of their median: how noisy. */
  spreadPct: number;
  /** Every call of every window, by client-side latency (HTTP to the bench Worker included). */
  p50Ms: number;
  p99Ms: number;
  /** The same calls timed inside the Worker around the broker stub's call. */
  stubP99Ms: number;
  ops: Record<BrokerOp, BrokerOpStats>;
  errors: number;
  /** The first few errors' messages. */
  firstErrors: string[];
}

export interface BrokerResults extends SectionHead {
  config: { runs: number; durationS: number; rounds: number; warmupS: number; polls: number };
  postgres: string;
  /** The machine's 1-minute load average as the bench started and as it ended (others' work too). */
  loadAverage: { start: number; end: number };
  rows: BrokerRow[];
}

const LABEL: Record<BrokerInstances, string> = {
  run: "an instance per run (now)",
  shared: "one shared instance (before)",
};

const find = (r: BrokerResults, i: BrokerInstances) => r.rows.find((x) => x.instances === i);

/**
 * Per-run ÷ shared calls/s of each round (the two windows of a round are back to back, so a
 * neighbour's load drifts less between them than across the run): their median and range.
 */
export function pairedRatios(r: BrokerResults): { median: number; min: number; max: number } {
  const run = find(r, "run")?.windows ?? [];
  const shared = find(r, "shared")?.windows ?? [];
  const each = run.flatMap((w, i) => (shared[i] ? [w / (shared[i] as number)] : []));
  return { median: quantiles(each).median, min: Math.min(...each), max: Math.max(...each) };
}

export function brokerSection(r: BrokerResults): BrokerResults {
  const run = find(r, "run");
  const shared = find(r, "shared");
  const summary: SummaryRow[] = [
    {
      measure: `broker calls/s, ${r.config.runs} runs at once (create, exec, polls, destroyRun on the sandbox0 contract server)`,
      result: `${int(run?.callsPerS ?? Number.NaN)} calls/s (an instance per run)`,
      baseline: `${int(shared?.callsPerS ?? Number.NaN)} calls/s (one shared instance)`,
      ratio: `${times(pairedRatios(r).median)} (median of per-round ratios)`,
    },
    {
      measure: `broker poll p99, ${r.config.runs} runs at once`,
      result: `${f(run?.ops.poll.p99Ms, 1)} ms (an instance per run)`,
      baseline: `${f(shared?.ops.poll.p99Ms, 1)} ms (one shared instance)`,
      ratio: times(ratio(run?.ops.poll.p99Ms, shared?.ops.poll.p99Ms)),
    },
  ];
  return { ...r, summary };
}

export function renderBroker(r: BrokerResults): string {
  const c = r.config;
  const shared = find(r, "shared");
  const lines = [
    "## Broker bench (`npm run bench:broker`, bench/broker-bench.ts)",
    "",
    ...(r.short ? ["**Short run**: settings below the defaults, so these numbers say less.", ""] : []),
    `- date: ${r.date}, commit ${r.commit}, whole run ${f(r.wallS, 0)} s`,
    `- machine: ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.machine.node}, PostgreSQL ${r.postgres} (throwaway cluster); ` +
      `load average ${f(r.loadAverage.start, 1)} at the start, ${f(r.loadAverage.end, 1)} at the end`,
    `- ${c.runs} runs at once, each flat out through cycles of create (proxy sandbox), exec (\`bw-proxy\`), ` +
      `${c.polls} polls and destroyRun; ${c.durationS} s measured per row in ${c.rounds} windows, the two rows taking turns, ` +
      `each after ${c.warmupS} s unmeasured`,
    "",
    "Broker calls through the real `SandboxBroker` Durable Object in `wrangler dev` (workerd), each",
    "opening its Neon connection to a real PostgreSQL and calling the sandbox0 backend against the",
    "Kubernetes contract server (test/contract/kubernetes-server.ts, loopback). The only difference",
    "between the rows is which broker instance serves a call: the run's own (`brokerStub(env, runId)`)",
    'or the one every call went to before issue 24 (`idFromName("broker")`). calls/s is the median',
    "of the windows (± half their range); latencies are over every call of every window, as the",
    "client sees them (one loopback HTTP hop to the bench Worker included); stub p99 is the same",
    "calls timed inside the Worker. A destroyRun waits for the pod to be gone (the contract server",
    "keeps it Terminating for one read; the backend looks again after 500 ms), so its latency is",
    "mostly that wait.",
    "",
    "| broker instances | calls/s | windows ± % | × shared | p50 ms | p99 ms | stub p99 ms | create p99 | exec p99 | poll p99 | destroyRun p99 | errors |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const x of r.rows) {
    lines.push(
      `| ${LABEL[x.instances]} | ${int(x.callsPerS)} | ${x.windows.map((w) => int(w)).join(", ")} ± ${f(x.spreadPct, 0)} % | ` +
        `${f(ratio(x.callsPerS, shared?.callsPerS), 2)} | ${f(x.p50Ms, 1)} | ${f(x.p99Ms, 1)} | ${f(x.stubP99Ms, 1)} | ` +
        `${f(x.ops.create.p99Ms, 1)} | ${f(x.ops.exec.p99Ms, 1)} | ${f(x.ops.poll.p99Ms, 1)} | ${f(x.ops.destroyRun.p99Ms, 1)} | ` +
        `${x.errors}${x.firstErrors.length ? ` (${x.firstErrors.join("; ")})` : ""} |`,
    );
  }
  const paired = pairedRatios(r);
  lines.push(
    "",
    `Per-run ÷ shared calls/s, round by round: median ${f(paired.median, 2)}×, from ${f(paired.min, 2)}× to ${f(paired.max, 2)}×.`,
    "",
    "What a deployment's single object suffers (one thread in one place, a per-object request limit,",
    "its failure or reset stopping every run) a local workerd does not reproduce: here every instance",
    "runs in one workerd process on the same cores as PostgreSQL, the contract server and the client.",
    "So the ratio says what the split costs or gains on one machine, not all it gains in a deployment.",
    "Most of a call's time here is the Neon connection each broker call opens (its SCRAM login; see",
    "the audit bench's cost of one connection).",
  );
  return lines.join("\n");
}
