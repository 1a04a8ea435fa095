import { f, quantiles, ratio, type SectionHead, type SummaryRow, times } from "./results";
import { phaseTable, type StartMarks } from "./run-phases";

// The setup images bench's section of the results page (bench/setup-bench.ts).

/** The bench's kinds of run, in the order the page shows them (the issue's (1)–(6)). */
export const SETUP_KINDS = ["one-cold", "eight-cold", "rebuild", "distinct", "warm", "no-setup"] as const;
export type SetupKind = (typeof SETUP_KINDS)[number];

const LABEL: Record<SetupKind, string> = {
  "one-cold": "(1) 1 task, cold (a fresh environment)",
  "eight-cold": "(2) 8 tasks, cold (a fresh environment)",
  rebuild: '(3) 8 tasks, `setupImage: "rebuild"` (the environment of (2))',
  distinct: "(4) 8 tasks, each with a task setup of its own (9 keys; a fresh environment): the old cost",
  warm: "(5) 8 tasks again, warm (the environment of (2))",
  "no-setup": "(6) the same commands, no setup (the environment and vault of (2))",
};

export interface SetupSample {
  kind: SetupKind;
  round: number;
  runId: string;
  /** Finished and completed, a proxy enforced, every sandbox printed its line (and, with setup, imported the packages). */
  ok: boolean;
  status: string;
  /** The work sandbox and the task sandboxes. */
  sandboxes: number;
  acceptedMs: number;
  /** POST /v1/runs → the first command output / the run's end. */
  firstOutputMs: number;
  wallMs: number;
  marks: StartMarks;
  /** Sandboxes whose setup stage ran (setup commands exited in them). */
  setupRanIn: number;
  /** Setup images the trace says were built now (captured) / started from. */
  imagesBuilt: number;
  imagesUsed: number;
  /** Runs named as the builder of an image a sandbox started from ("built by run X"). */
  builtBy: string[];
  /** Wheels the demo index served during the run. */
  wheelDownloads: number;
  /** The setup script's own measure of its work (before any padding), per sandbox that ran it. */
  setupWorkMs: number[];
  /** The codes of the run's notes. */
  notes: string[];
  /** The trace's other setup image rows (why setup ran uncached), as written. */
  imageNotes: string[];
}

export interface SetupResults extends SectionHead {
  config: {
    rounds: number;
    tasks: number;
    packages: number;
    modules: number;
    minSetupS: number;
    pollMs: number;
  };
  postgres: string;
  /** The unmeasured first run (1 task, no padding): the setup's own time, and the sleep added to it. */
  calibration: { runId: string; workMs: number; padMs: number };
  samples: SetupSample[];
}

const okOf = (r: SetupResults, kind: SetupKind) => r.samples.filter((s) => s.kind === kind && s.ok);
const median = (xs: number[]) => quantiles(xs.filter((x) => Number.isFinite(x))).median;
const p50 = (r: SetupResults, kind: SetupKind, m: "wallMs" | "firstOutputMs") =>
  median(okOf(r, kind).map((s) => s[m]));
/** A setup work time: the calibration's when the rows measured none. */
const setupWork = (r: SetupResults) => {
  const measured = median(okOf(r, "one-cold").flatMap((s) => s.setupWorkMs));
  return Number.isFinite(measured) ? measured : r.calibration.workMs;
};
const s1 = (ms: number) => `${f(ms / 1000, 1)} s`;
const plural = (n: number, what: string) => `${n} ${what}${n === 1 ? "" : "s"}`;

/** Warm runs whose every sandbox started from the image their round's cold 8-task run built ("built by run X"). */
function warmFromCold(r: SetupResults): { from: number; of: number } {
  const warm = okOf(r, "warm");
  const from = warm.filter((w) => {
    const cold = r.samples.find((s) => s.kind === "eight-cold" && s.round === w.round);
    return (
      cold !== undefined &&
      w.setupRanIn === 0 &&
      w.imagesUsed === w.sandboxes &&
      w.builtBy.length === 1 &&
      w.builtBy[0] === cold.runId
    );
  }).length;
  return { from, of: warm.length };
}

/** A ratio target `≤ limit`: met, or missed by how much (and what the result needed to be). */
function target(
  value: number,
  baseline: number,
  limit: number,
): Pick<SummaryRow, "target" | "met" | "missedBy"> {
  const r = ratio(value, baseline);
  return {
    target: `≤ ${limit}×`,
    met: r === null || !Number.isFinite(r) ? null : r <= limit,
    missedBy:
      r === null || !Number.isFinite(r) ? undefined : `${f(r - limit, 2)}×, needs ≤ ${s1(limit * baseline)}`,
  };
}

export function setupSection(r: SetupResults): SetupResults {
  const one = p50(r, "one-cold", "wallMs");
  const eight = p50(r, "eight-cold", "wallMs");
  const warm = p50(r, "warm", "firstOutputMs");
  const bare = p50(r, "no-setup", "firstOutputMs");
  const rebuild = p50(r, "rebuild", "wallMs");
  const distinct = p50(r, "distinct", "wallMs");
  const work = setupWork(r);
  const summary: SummaryRow[] = [
    {
      measure: `the benchmark's setup: a venv, ${r.config.packages} packages from the demo index through the proxy, compileall (1-task cold runs, median)`,
      result: `${s1(work)}${r.calibration.padMs > 0 ? ` + ${s1(r.calibration.padMs)} of sleep` : ""}`,
      baseline: `at least ${r.config.minSetupS} s asked`,
      ratio: "",
    },
    {
      measure: `a run of ${r.config.tasks} tasks vs 1 task, cold, POST → end (p50)`,
      result: `${s1(eight)} (${r.config.tasks} tasks)`,
      baseline: `${s1(one)} (1 task)`,
      ratio: times(ratio(eight, one)),
      ...target(eight, one, 1.3),
    },
    {
      measure: "a second run of the same benchmark, warm, POST → first command output (p50)",
      result: s1(warm),
      baseline: `${s1(bare)} (the same commands without setup, same vault)`,
      ratio: times(ratio(warm, bare)),
      ...target(warm, bare, 1.2),
    },
    {
      measure: `a run of ${r.config.tasks} tasks with \`setupImage: "rebuild"\`, POST → end (p50)`,
      result: s1(rebuild),
      baseline: `${s1(eight)} (cold)`,
      ratio: times(ratio(rebuild, eight)),
    },
    {
      measure: `a run of ${r.config.tasks} tasks each with a setup of its own (the old cost: setup in every sandbox), POST → end (p50)`,
      result: s1(distinct),
      baseline: `${s1(eight)} (one shared setup)`,
      ratio: times(ratio(distinct, eight)),
    },
  ];
  return { ...r, summary };
}

export function renderSetup(r: SetupResults): string {
  const bad = r.samples.filter((s) => !s.ok);
  const lines = [
    "## Setup images bench (`npm run bench:setup`, bench/setup-bench.ts)",
    "",
    ...(r.short
      ? [
          `**Short run**: ${plural(r.config.rounds, "round")} (default 3), setup of at least ${r.config.minSetupS} s (default 10).`,
          "",
        ]
      : []),
    `- date: ${r.date}, commit ${r.commit}, whole run ${f(r.wallS, 0)} s`,
    `- machine: ${r.machine.cores} cores (${r.machine.cpu}), Node ${r.machine.node}, PostgreSQL ${r.postgres}`,
    `- ${plural(r.config.rounds, "round")}, the six kinds of run taking turns in each, after one unmeasured run (${r.calibration.runId})`,
    `- setup: a venv, ${r.config.packages} generated packages of ${r.config.modules} modules each pip-installed from the demo index (through the run's proxy, hashes required), compileall; its own work ${s1(setupWork(r))} (median of the 1-task cold runs; ${s1(r.calibration.workMs)} in the unmeasured run), ${r.calibration.padMs > 0 ? `padded with \`sleep ${f(r.calibration.padMs / 1000, 1)}\` to at least ${r.config.minSetupS} s` : `no padding (at least ${r.config.minSetupS} s by itself)`}`,
    "",
    "The local stack as the end-to-end tests run it (host agent, `wrangler dev`, a throwaway PostgreSQL)",
    "and the demo upstream serving a PEP 503 index in its own namespace. Every environment's vault",
    "blocks by default and allows the index host (catch-all routing: a proxy runs in every run, and",
    "setup reaches the index only through it). Each run has a work sandbox and its tasks, every one",
    "running the run's setup; each command prints a line and imports the packages. Cold runs get an",
    "environment of their own (no setup image yet); (3), (5) and (6) run in the environment of (2).",
    "Times are from POST /v1/runs to the run's trace rows (their own timestamps) and its end.",
    "",
    "| run | sandboxes | POST → end, p50 | p90 | POST → first output, p50 | setup ran in | images built / started from | wheel downloads | runs ok |",
    "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
  ];
  for (const kind of SETUP_KINDS) {
    const all = r.samples.filter((s) => s.kind === kind);
    const ok = okOf(r, kind);
    if (all.length === 0) continue;
    const wall = quantiles(ok.map((s) => s.wallMs));
    const m = (pick: (s: SetupSample) => number) => f(median(ok.map(pick)), 0);
    lines.push(
      `| ${LABEL[kind]} | ${all[0]?.sandboxes ?? "?"} | ${s1(wall.median)} | ${s1(wall.p90)} | ${s1(p50(r, kind, "firstOutputMs"))} | ${m((s) => s.setupRanIn)} | ${m((s) => s.imagesBuilt)} / ${m((s) => s.imagesUsed)} | ${m((s) => s.wheelDownloads)} | ${ok.length} of ${all.length} |`,
    );
  }
  const reuse = warmFromCold(r);
  lines.push(
    "",
    `In ${reuse.from} of ${reuse.of} warm runs (5) every sandbox started from the setup image their round's cold run (2) built (the trace's "built by run …") and none ran setup.`,
  );
  const targets = setupSection(r).summary.filter((s) => s.target);
  lines.push(
    "",
    "Targets (p50, ratios of the same bench run):",
    "",
    ...targets.map(
      (t) =>
        `- ${t.measure}: ${t.result} against ${t.baseline} = ${t.ratio}, target ${t.target}: ${t.met === null || t.met === undefined ? "n/a" : t.met ? "met" : `missed by ${t.missedBy}`}`,
    ),
  );
  const warm = okOf(r, "warm").map((s) => s.marks);
  const bare = okOf(r, "no-setup").map((s) => s.marks);
  if (warm.length > 0 && bare.length > 0) {
    lines.push(
      "",
      "Where the warm run's start goes against the run without setup (bench/lib/run-phases.ts; each",
      "phase's median, ms after POST /v1/runs; they need not add up to the total's median):",
      "",
      ...phaseTable({ label: "(6) no setup", marks: bare }, { label: "(5) warm", marks: warm }),
    );
  }
  const noted = [...new Set(r.samples.flatMap((s) => s.notes.filter((n) => n.startsWith("setup_image"))))];
  if (noted.length > 0)
    lines.push("", `Setup image notes on the runs: ${noted.map((n) => `\`${n}\``).join(", ")}.`);
  const said = [...new Set(r.samples.flatMap((s) => s.imageNotes ?? []))];
  if (said.length > 0)
    lines.push("", "What the traces said about setup images besides:", "", ...said.map((t) => `- ${t}`));
  lines.push(
    "",
    bad.length === 0
      ? `All ${r.samples.length} measured runs finished as expected (completed, a proxy enforced, every sandbox printed its line and imported the packages).`
      : `**${bad.length} runs did not go as expected** and are left out: ${bad.map((s) => `${s.runId} (${s.kind}, ${s.status})`).join(", ")}.`,
  );
  return lines.join("\n");
}
