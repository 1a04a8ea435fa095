import { execFileSync } from "node:child_process";
import { cpus } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

// What every bench shares: its settings from the environment, where it runs (commit, machine),
// number formatting, and the shape of its section of bench/results/latest.{md,json} (page.ts).

export const ROOT = fileURLToPath(new URL("../..", import.meta.url));

/** bench/results, or BENCH_RESULTS_DIR (a trial run that must not touch the committed results). */
export const resultsDir = () => process.env.BENCH_RESULTS_DIR || join(ROOT, "bench/results");

/** A positive number from the environment, or `fallback`. */
export function num(key: string, fallback: number): number {
  const raw = process.env[key];
  const n = raw === undefined || raw === "" ? fallback : Number(raw);
  if (!Number.isFinite(n) || n <= 0) throw new Error(`${key} must be a positive number`);
  return n;
}

export function gitDescribe(): string {
  try {
    const head = execFileSync("git", ["rev-parse", "--short", "HEAD"], {
      cwd: ROOT,
      encoding: "utf8",
    }).trim();
    // The results the benches write themselves do not make the tree dirty.
    const dirty = execFileSync(
      "git",
      ["status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"],
      {
        cwd: ROOT,
        encoding: "utf8",
      },
    ).trim();
    return dirty ? `${head} (with uncommitted changes)` : head;
  } catch {
    return "unknown";
  }
}

export function machine(): { cores: number; cpu: string; node: string } {
  return { cores: cpus().length, cpu: cpus()[0]?.model ?? "unknown", node: process.version };
}

export const f = (n: number | null | undefined, digits = 1) =>
  n === null || n === undefined || !Number.isFinite(n) ? "n/a" : n.toFixed(digits);
export const ratio = (a: number | null | undefined, b: number | null | undefined) =>
  a === null || a === undefined || b === null || b === undefined || b === 0 ? null : a / b;
/** A ratio as printed: `0.25×`, or n/a. */
export const times = (n: number | null) => (n === null ? "n/a" : `${f(n, 2)}×`);
/** A target's verdict: met, missed (by how much, when known), or n/a. */
export const mark = (m: boolean | null, missedBy?: string) =>
  m === null ? "n/a" : m ? "met" : missedBy ? `missed by ${missedBy}` : "NOT met";
export const int = (n: number) => (Number.isFinite(n) ? Math.round(n).toLocaleString("en-US") : "n/a");

/** Median and p90 (nearest rank) of a few samples. */
export function quantiles(xs: readonly number[]): { n: number; median: number; p90: number } {
  const s = [...xs].sort((a, b) => a - b);
  const at = (p: number) => (s.length === 0 ? Number.NaN : (s[Math.ceil(p * s.length) - 1] as number));
  const median =
    s.length === 0
      ? Number.NaN
      : s.length % 2
        ? (s[(s.length - 1) / 2] as number)
        : ((s[s.length / 2 - 1] as number) + (s[s.length / 2] as number)) / 2;
  return { n: s.length, median, p90: at(0.9) };
}

export const BENCHES = ["proxy", "memory", "fuzz", "audit", "broker", "start", "setup"] as const;
export type BenchName = (typeof BENCHES)[number];

/** One line of the results page's summary (and of docs/performance.md's table). */
export interface SummaryRow {
  measure: string;
  /** The measured value, as a person reads it. */
  result: string;
  /** What it was compared with in the same run ("" when it stands alone). */
  baseline: string;
  /** result ÷ baseline, as printed ("" when it stands alone). */
  ratio: string;
  /** A target, when the issue set one; reported, never enforced. */
  target?: string;
  met?: boolean | null;
  /** How far from the target, when it was missed ("0.27×", "12.4 ms"). */
  missedBy?: string;
}

/** A bench's part of latest.json; the rest of the object is the bench's own data. */
export interface SectionHead {
  bench: BenchName;
  date: string;
  commit: string;
  machine: { cores: number; cpu: string; node: string };
  /** Settings below the defaults (a trial run): its numbers say less. */
  short: boolean;
  wallS: number;
  summary: SummaryRow[];
}

/** The head every bench's section starts with (its summary is filled in by the section). */
export function sectionHead<B extends BenchName>(bench: B, startedAt: number, short: boolean) {
  return {
    bench,
    date: new Date().toISOString(),
    commit: gitDescribe(),
    machine: machine(),
    short,
    wallS: (Date.now() - startedAt) / 1000,
    summary: [] as SummaryRow[],
  };
}

/**
 * Runs a bench's main and exits with its code (1 when it throws). A closed standard error (`| head`
 * closing the pipe) must not stop a run midway.
 */
export function runBench(label: string, main: () => Promise<number>): void {
  process.stderr.on("error", () => {});
  main().then(
    (code) => process.exit(code),
    (e: unknown) => {
      console.error(`${label} failed: ${(e as Error).stack ?? e}`);
      process.exit(1);
    },
  );
}

/** What a flat-out worker looks at: keep going while `running`, count only while `counting`. */
export interface WindowGate {
  running: boolean;
  counting: boolean;
}

/**
 * Runs `workers` flat out through warm-up and then the measured window (the gate's `counting` is
 * true inside it only), stops them and waits for their calls in flight; the window's seconds.
 */
export async function flatOutWindow(
  workers: number,
  work: (gate: WindowGate, index: number) => Promise<void>,
  warmupS: number,
  windowS: number,
): Promise<number> {
  const gate: WindowGate = { running: true, counting: false };
  const all = Promise.all(Array.from({ length: workers }, (_, i) => work(gate, i)));
  await new Promise((r) => setTimeout(r, warmupS * 1000));
  const t0 = performance.now();
  gate.counting = true;
  await new Promise((r) => setTimeout(r, windowS * 1000));
  gate.counting = false;
  const measured = (performance.now() - t0) / 1000;
  gate.running = false;
  await all;
  return measured;
}
