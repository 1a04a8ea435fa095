import { f, quantiles, ratio, type SectionHead, type SummaryRow, times } from "./results";
import { medianPhases, PHASES, type Phase, phaseTable, type StartMarks } from "./run-phases";

// The run start bench's section of the results page (bench/start-bench.ts).

export type StartKind = "no-proxy" | "proxy";

export interface StartSample {
  kind: StartKind;
  runId: string;
  /** Finished and completed, printed its line, and had a proxy exactly when it should. */
  ok: boolean;
  status: string;
  /** POST /v1/runs answered (202), ms after it was sent. */
  acceptedMs: number;
  /** The trace's `running` transition and first command output, and the run's end, ms after the POST. */
  toRunningMs: number;
  toOutputMs: number;
  toEndMs: number;
  /** Where the start went (absent in sections written before the breakdown). */
  marks?: StartMarks;
}

export interface StartResults extends SectionHead {
  config: { runs: number; pollMs: number };
  postgres: string;
  samples: StartSample[];
}

type Measure = "acceptedMs" | "toRunningMs" | "toOutputMs" | "toEndMs";
const MEASURES: Array<[Measure, string]> = [
  ["acceptedMs", "POST /v1/runs answered"],
  ["toRunningMs", "`running`"],
  ["toOutputMs", "first command output"],
  ["toEndMs", "run ended (finished)"],
];

const stats = (r: StartResults, kind: StartKind, m: Measure) =>
  quantiles(r.samples.filter((s) => s.kind === kind && s.ok).map((s) => s[m]));

const marksOf = (r: StartResults, kind: StartKind) =>
  r.samples.filter((s) => s.kind === kind && s.ok && s.marks).map((s) => s.marks as StartMarks);

/**
 * What the proxy adds to run start, phase by phase (medians with − without, ms), largest first:
 * null when the section has no breakdown.
 */
export function proxyAdds(r: StartResults): Array<{ phase: Phase; label: string; ms: number }> | null {
  const without = marksOf(r, "no-proxy");
  const withProxy = marksOf(r, "proxy");
  if (without.length === 0 || withProxy.length === 0) return null;
  const a = medianPhases(without);
  const b = medianPhases(withProxy);
  return PHASES.map(([phase, label]) => ({
    phase,
    label,
    ms: (Number.isFinite(b[phase]) ? b[phase] : 0) - (Number.isFinite(a[phase]) ? a[phase] : 0),
  })).sort((x, y) => y.ms - x.ms);
}

export function startSection(r: StartResults): StartResults {
  const summary: SummaryRow[] = (["toRunningMs", "toOutputMs"] as const).map((m) => {
    const p = stats(r, "proxy", m);
    const n = stats(r, "no-proxy", m);
    return {
      measure: `run start on the local backend, POST /v1/runs → ${m === "toRunningMs" ? "`running`" : "first command output"} (median)`,
      result: `${f(p.median / 1000, 2)} s with a proxy (vault with a rule)`,
      baseline: `${f(n.median / 1000, 2)} s without (empty vault)`,
      ratio: times(ratio(p.median, n.median)),
    };
  });
  const adds = proxyAdds(r);
  if (adds) {
    const top = adds.filter((a) => a.ms >= 50).slice(0, 3);
    const p = stats(r, "proxy", "toOutputMs").median;
    const n = stats(r, "no-proxy", "toOutputMs").median;
    summary.push({
      measure: "what the proxy adds to run start (POST → first output), the largest phases (medians)",
      result: `+${f((p - n) / 1000, 2)} s: ${top.map((a) => `${a.label} +${f(a.ms, 0)} ms`).join("; ") || "no phase over 50 ms"}`,
      baseline: "",
      ratio: "",
    });
  }
  return { ...r, summary };
}

export function renderStart(r: StartResults): string {
  const bad = r.samples.filter((s) => !s.ok);
  const lines = [
    "## Run start bench (`npm run bench:start`, bench/start-bench.ts)",
    "",
    ...(r.short ? [`**Short run**: ${r.config.runs} runs of each kind, below the default 5.`, ""] : []),
    `- date: ${r.date}, commit ${r.commit}, whole run ${f(r.wallS, 0)} s`,
    `- machine: ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.machine.node}, PostgreSQL ${r.postgres}`,
    `- ${r.config.runs} measured runs of each kind, taking turns, after one unmeasured run of each; one command (\`echo\`)`,
    "",
    "The local stack as the end-to-end tests run it (scripts/lib/local-stack.ts: the host agent, `wrangler",
    "dev` with the run coordinator, a throwaway PostgreSQL). Times run from sending POST /v1/runs to",
    "the run's trace rows (their own timestamps, same clock): the `running` transition and the first",
    "output of the command. Without a proxy: a tenant with an empty vault (nothing to enforce, so the",
    "run's network sandbox gets no proxy process). With: a tenant whose vault has a secret and a rule,",
    "so the proxy is started, fetches its policy and reports ready, and the wiring step proves the",
    "redirect before the command runs. The coordinator polls every 250 ms, which sets the grain.",
    "",
    "| ms after POST /v1/runs | without proxy: median | p90 | with proxy: median | p90 | × without (median) |",
    "| --- | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const [m, label] of MEASURES) {
    const n = stats(r, "no-proxy", m);
    const p = stats(r, "proxy", m);
    lines.push(
      `| ${label} | ${f(n.median, 0)} | ${f(n.p90, 0)} | ${f(p.median, 0)} | ${f(p.p90, 0)} | ${f(ratio(p.median, n.median), 2)} |`,
    );
  }
  const withProxy = marksOf(r, "proxy");
  const without = marksOf(r, "no-proxy");
  if (withProxy.length > 0 && without.length > 0) {
    lines.push(
      "",
      "Where the start goes, phase by phase (bench/lib/run-phases.ts): the trace's transitions, the",
      "proxy's ready time (`proxy.readyAt`) and the host agent's create of the network sandbox (its log),",
      "ms after POST /v1/runs. Each phase's median; they need not add up to the total's median. Without a",
      "proxy the network sandbox is still made (it holds the run's network namespace), but no proxy starts.",
      "",
      ...phaseTable({ label: "without proxy", marks: without }, { label: "with proxy", marks: withProxy }),
    );
  }
  lines.push(
    "",
    bad.length === 0
      ? `All ${r.samples.length} measured runs finished as expected (completed, printed their line, a proxy exactly when the vault had a rule).`
      : `**${bad.length} runs did not go as expected** and are left out: ${bad.map((s) => `${s.runId} (${s.kind}, ${s.status})`).join(", ")}.`,
  );
  return lines.join("\n");
}
