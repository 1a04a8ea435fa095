import { isTerminal } from "@benchwright/shared/contract/run-states";
import type { ApiClient } from "../../scripts/lib/api-client";
import { f, quantiles } from "./results";

// A run launched on the local stack and watched to its end, and where its start went (the run
// start and setup benches). The marks come from the run's own record, on one clock: its trace's
// transitions and first command output, the proxy's ready time and the run's end (PostgreSQL's
// timestamps), and each sandbox create as the host agent logs it (in the bench's process: the
// agent runs there). Each is in ms after POST /v1/runs was sent.

export interface TraceEvent {
  kind: string;
  state: string | null;
  reason: string | null;
  // biome-ignore lint/suspicious/noExplicitAny: trace rows are JSON
  detail: any;
  at: string;
}

/** GET /v1/runs/{id}, the parts the benches read. */
export interface RunJson {
  id: string;
  status: string;
  reason: string | null;
  endedAt: string | null;
  // biome-ignore lint/suspicious/noExplicitAny: the run proof is JSON
  proof: any;
  proxy?: { readyAt: string | null };
  notes?: Array<{ code: string; text: string }>;
  trace: TraceEvent[];
}

export interface Launched {
  runId: string;
  /** When POST /v1/runs was sent (epoch ms): every mark is counted from it. */
  t0: number;
  acceptedMs: number;
  run: RunJson;
}

/** POST /v1/runs, then GET until the run has ended. */
export async function launchAndWait(
  api: ApiClient,
  spec: unknown,
  options: { pollMs: number; timeoutMs: number },
): Promise<Launched> {
  const t0 = Date.now();
  const launched = await api.call("POST", "/v1/runs", spec);
  const acceptedMs = Date.now() - t0;
  if (launched.status !== 202) throw new Error(`launch: ${launched.status} ${launched.text}`);
  const runId = launched.json.id as string;
  const deadline = t0 + options.timeoutMs;
  for (;;) {
    const run = (await api.call("GET", `/v1/runs/${runId}`)).json as RunJson;
    if (isTerminal(run?.status as never)) return { runId, t0, acceptedMs, run };
    if (Date.now() > deadline)
      throw new Error(`run ${runId} did not end in ${options.timeoutMs / 1000} s: ${JSON.stringify(run)}`);
    await new Promise((r) => setTimeout(r, options.pollMs));
  }
}

/** The host agent's sandbox creates, from its log lines (startLocalStack's `log`: `[agent] {…}`). */
export class AgentCreates {
  private readonly byRun = new Map<string, Array<{ kind: string; ms: number; at: number }>>();

  /** Give it every line the stack logs; it keeps the `sandbox_created` events. */
  line(line: string): void {
    if (!line.startsWith("[agent] {")) return;
    try {
      const e = JSON.parse(line.slice("[agent] ".length));
      if (e.event !== "sandbox_created" || typeof e.runId !== "string") return;
      const list = this.byRun.get(e.runId) ?? [];
      list.push({ kind: String(e.kind), ms: Number(e.ms), at: Date.now() });
      this.byRun.set(e.runId, list);
    } catch {}
  }

  of(runId: string): ReadonlyArray<{ kind: string; ms: number; at: number }> {
    return this.byRun.get(runId) ?? [];
  }
}

/** A run's start, ms after POST /v1/runs (NaN: the run did not get there, or has no such step). */
export interface StartMarks {
  fetchingVault: number;
  startingProxy: number;
  /** The agent's create of the run's network (proxy) sandbox returned. */
  proxyMade: number;
  /** The proxy reported ready (NaN without a proxy process). */
  proxyReady: number;
  startingSandboxes: number;
  wiring: number;
  running: number;
  /** The first output of a command (not of a setup command). */
  firstOutput: number;
  ended: number;
}

export function startMarks(launched: Launched, creates: AgentCreates): StartMarks {
  const { run, t0 } = launched;
  const at = (iso: string | null | undefined) => (iso ? Date.parse(iso) - t0 : Number.NaN);
  const entered = (state: string) =>
    at(run.trace.find((e) => e.kind === "transition" && e.state === state)?.at);
  const output = run.trace.find(
    (e) => e.kind === "output" && typeof e.detail?.text === "string" && e.detail?.stage !== "setup",
  );
  const proxy = creates.of(launched.runId).find((c) => c.kind === "proxy");
  return {
    fetchingVault: entered("fetching_vault"),
    startingProxy: entered("starting_proxy"),
    proxyMade: proxy ? proxy.at - t0 : Number.NaN,
    proxyReady: at(run.proxy?.readyAt),
    startingSandboxes: entered("starting_sandboxes"),
    wiring: entered("wiring"),
    running: entered("running"),
    firstOutput: at(output?.at),
    ended: at(run.endedAt),
  };
}

/** The phases of a run's start, in order; together they are POST → first command output. */
export const PHASES = [
  ["queued", "queued: POST → the coordinator takes it (`fetching_vault`)"],
  ["vault", "vault read and compiled (→ `starting_proxy`)"],
  ["proxySandbox", "network sandbox made (the agent's create)"],
  ["proxyReady", "proxy started: credentials, policy fetched, reported ready"],
  ["proxySeen", "the coordinator sees it (→ `starting_sandboxes`)"],
  ["sandboxes", "work and task sandboxes made (→ `wiring`)"],
  ["wiring", "wiring installed and probed in each (→ `running`)"],
  ["firstOutput", "`running` → first command output (bundle, setup, seal, re-proof, exec)"],
] as const;
export type Phase = (typeof PHASES)[number][0];

export function phasesOf(m: StartMarks): Record<Phase, number> {
  const proxyDone = Number.isNaN(m.proxyReady) ? m.proxyMade : m.proxyReady;
  return {
    queued: m.fetchingVault,
    vault: m.startingProxy - m.fetchingVault,
    proxySandbox: m.proxyMade - m.startingProxy,
    proxyReady: m.proxyReady - m.proxyMade,
    proxySeen: m.startingSandboxes - proxyDone,
    sandboxes: m.wiring - m.startingSandboxes,
    wiring: m.running - m.wiring,
    firstOutput: m.firstOutput - m.running,
  };
}

/** Each phase's median over some runs (NaN when none of them had it). */
export function medianPhases(marks: readonly StartMarks[]): Record<Phase, number> {
  const all = marks.map(phasesOf);
  return Object.fromEntries(
    PHASES.map(([p]) => [p, quantiles(all.map((a) => a[p]).filter((x) => Number.isFinite(x))).median]),
  ) as Record<Phase, number>;
}

/**
 * A table of the phases' medians, ms, for two kinds of run side by side and what the second adds
 * (its median minus the first's), with each kind's POST → first output median as the last row.
 */
export function phaseTable(
  a: { label: string; marks: readonly StartMarks[] },
  b: { label: string; marks: readonly StartMarks[] },
): string[] {
  const pa = medianPhases(a.marks);
  const pb = medianPhases(b.marks);
  const added = (x: number, y: number) =>
    Number.isFinite(y) ? f(y - (Number.isFinite(x) ? x : 0), 0) : "n/a";
  const lines = [`| phase, ms (median) | ${a.label} | ${b.label} | added |`, "| --- | ---: | ---: | ---: |"];
  for (const [p, label] of PHASES) {
    lines.push(`| ${label} | ${f(pa[p], 0)} | ${f(pb[p], 0)} | ${added(pa[p], pb[p])} |`);
  }
  const ta = quantiles(a.marks.map((m) => m.firstOutput)).median;
  const tb = quantiles(b.marks.map((m) => m.firstOutput)).median;
  lines.push(`| **POST → first command output** | ${f(ta, 0)} | ${f(tb, 0)} | ${added(ta, tb)} |`);
  return lines;
}
