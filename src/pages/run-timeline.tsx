import type { Child } from "hono/jsx";
import type { RunState } from "../db/schema";
import { isTerminal, type RunRow, type TraceRow } from "../runs/service";
import { When } from "./layout";
import { stagesOf } from "./run-stages";

// The run page's timeline: the run's phases as a server-rendered SVG (the pages run no script and
// their CSP loads nothing), one lane per phase that happened, placed by the trace's own times,
// with the run's notes and its denied hosts marked on it. Every bar and mark carries a <title>
// (a tooltip, and what a screen reader reads), and a table below says the same in text.

export const PHASES = [
  "vault",
  "proxy",
  "sandboxes",
  "wiring",
  "setup",
  "execute",
  "teardown",
  "linger",
] as const;
export type PhaseName = (typeof PHASES)[number];

/** The run states that are one phase each; `running` is two (setup, execute), split below. */
const STATE_PHASE: Partial<Record<RunState, PhaseName>> = {
  fetching_vault: "vault",
  starting_proxy: "proxy",
  starting_sandboxes: "sandboxes",
  wiring: "wiring",
  finishing: "teardown",
  lingering: "linger",
};

export interface Phase {
  name: PhaseName;
  from: Date;
  to: Date;
  /** Still going: `to` is when the page was made. */
  ongoing: boolean;
}

export interface Mark {
  kind: "note" | "denial";
  at: Date;
  /** A denial's last refusal, when later than its first. */
  until?: Date | undefined;
  label: string;
}

/** A denied host as the run's audit counts it (blocked_host_log). */
export interface Denial {
  host: string;
  seenCount: number;
  firstSeen: Date;
  lastSeen: Date;
}

/**
 * The phases the trace shows, in order. Each state's transition row starts its phase and the next
 * transition ends it. `running` is split where the sandboxes' setup stage ended (its last
 * setup-stage row, from stagesOf): the trace has no "commands began" row, and no command starts
 * before every sandbox's setup is through (case G6), so setup's last row is execute's start.
 */
export function phasesOf(run: Pick<RunRow, "status">, trace: TraceRow[], now: Date): Phase[] {
  const moves = trace.filter((e) => e.kind === "transition" && e.state !== null);
  const live = !isTerminal(run.status);
  const out: Phase[] = [];
  for (const [i, t] of moves.entries()) {
    const next = moves[i + 1];
    const ongoing = !next && live;
    const to = next?.at ?? (ongoing ? now : t.at);
    const state = t.state as RunState;
    const name = STATE_PHASE[state];
    if (name) out.push({ name, from: t.at, to, ongoing });
    else if (state === "running") out.push(...runningPhases(trace, t.at, to, ongoing));
  }
  return out;
}

function runningPhases(trace: TraceRow[], from: Date, to: Date, ongoing: boolean): Phase[] {
  const stages = [...stagesOf(trace).values()];
  const setupEnds = stages.flatMap((s) => (s.setupLast ? [s.setupLast.getTime()] : []));
  if (setupEnds.length === 0) return [{ name: "execute", from, to, ongoing }];
  const executed = stages.some((s) => s.executeFirst !== null);
  // No execute-stage row yet: a live run is still in setup; an ended one stopped there.
  if (!executed) return [{ name: "setup", from, to, ongoing }];
  const split = new Date(Math.min(Math.max(...setupEnds), to.getTime()));
  return [
    { name: "setup", from, to: split, ongoing: false },
    { name: "execute", from: split, to, ongoing },
  ];
}

/** The run's notes (not the stages' own rows, which the bars are) and its denied hosts. */
export function marksOf(trace: TraceRow[], denials: readonly Denial[]): Mark[] {
  const notes: Mark[] = trace.flatMap((e) => {
    const d = e.detail as { stage?: unknown; code?: unknown; level?: unknown; text?: unknown } | null;
    if (e.kind !== "note" || typeof d?.stage === "string") return [];
    const text = typeof d?.text === "string" ? d.text : "";
    const code =
      typeof d?.code === "string" ? `${typeof d.level === "string" ? d.level : "note"} ${d.code}: ` : "";
    return [{ kind: "note" as const, at: e.at, label: `${code}${text}` }];
  });
  const denied: Mark[] = denials.map((h) => ({
    kind: "denial",
    at: h.firstSeen,
    until: h.lastSeen > h.firstSeen ? h.lastSeen : undefined,
    label: `${h.host} refused ${h.seenCount} time${h.seenCount === 1 ? "" : "s"}`,
  }));
  return [...notes, ...denied];
}

/** "0.4 s", "12.3 s", "2 min 5 s", "1 h 2 min". */
export function took(ms: number): string {
  if (ms < 60_000) return `${(Math.max(0, ms) / 1000).toFixed(1)} s`;
  const s = Math.round(ms / 1000);
  if (s < 3600) return `${Math.floor(s / 60)} min${s % 60 ? ` ${s % 60} s` : ""}`;
  const m = Math.round(s / 60);
  return `${Math.floor(m / 60)} h${m % 60 ? ` ${m % 60} min` : ""}`;
}

const clock = (d: Date) => `${d.toISOString().slice(11, 19)} UTC`;
/** Coordinates to two decimals: enough for the drawing, and short in the page. */
const r2 = (v: number) => Math.round(v * 100) / 100;

// The drawing's units: a 1000-wide view box, names left of the plot, one lane per row.
export const VIEW_W = 1000;
export const LABEL_W = 110;
export const PLOT_W = 870;
const LANE_H = 24;
const BAR_H = 16;
const AXIS_H = 22;
/** A phase of a few milliseconds is still a visible sliver. */
const MIN_BAR_W = 1;
/** Tick spacings (seconds) the axis picks from: the first that makes at most 8 ticks. */
const STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 14_400, 21_600, 43_200];

export const TIMELINE_STYLE = `
svg.timeline{width:100%;height:auto;background:#f6f7f9;border:1px solid #e6e9ed;border-radius:4px;font-size:12px}
svg.timeline text{fill:#1b1f24}svg.timeline .axis text{fill:#666;font-size:11px}
svg.timeline .axis line{stroke:#d8dde3}svg.timeline .ongoing rect{opacity:.55;stroke:#1b1f24;stroke-dasharray:4 3}
.ph-vault{fill:#8e7cc3}.ph-proxy{fill:#5b8def}.ph-sandboxes{fill:#46a0a0}.ph-wiring{fill:#2e8b57}
.ph-setup{fill:#d9a32b}.ph-execute{fill:#d9822b}.ph-teardown{fill:#8a939c}.ph-linger{fill:#a9b4e0}
.mark-note{fill:#5b8def;stroke:#fff}.mark-denial{fill:#c23030;stroke:#fff}
.mark-span{stroke:#c23030;stroke-width:2}.mark-line{stroke:#1b1f24;stroke-opacity:.18;stroke-dasharray:2 3}
`;

export function Timeline(props: { run: RunRow; trace: TraceRow[]; denials: readonly Denial[]; now: Date }) {
  const phases = phasesOf(props.run, props.trace, props.now);
  const marks = marksOf(props.trace, props.denials);
  return (
    <section id="timeline">
      <h2>Timeline</h2>
      {phases.length === 0 ? (
        <p class="empty">Not started yet: the run's coordinator has not fetched its vault.</p>
      ) : (
        <>
          <Drawing phases={phases} marks={marks} />
          <TextTimeline phases={phases} marks={marks} />
        </>
      )}
    </section>
  );
}

function Drawing(props: { phases: Phase[]; marks: Mark[] }) {
  const { phases, marks } = props;
  const t0 = Math.min(...phases.map((p) => p.from.getTime()));
  const t1 = Math.max(...phases.map((p) => p.to.getTime()));
  const span = Math.max(1, t1 - t0);
  // Marks outside the phases (a late audit batch) sit at the nearer edge.
  const x = (d: Date) => LABEL_W + (Math.min(Math.max(d.getTime(), t0), t1) - t0) * (PLOT_W / span);
  const notes = marks.filter((m) => m.kind === "note");
  const denials = marks.filter((m) => m.kind === "denial");
  const lanes = phases.length + (notes.length > 0 ? 1 : 0) + (denials.length > 0 ? 1 : 0);
  const height = lanes * LANE_H + AXIS_H;
  const laneY = (i: number) => i * LANE_H + (LANE_H - BAR_H) / 2;
  const rows: Child[] = phases.map((p, i) => {
    const left = x(p.from);
    const width = Math.max(MIN_BAR_W, x(p.to) - left);
    const label = `${p.name}: ${clock(p.from)} to ${p.ongoing ? "now" : clock(p.to)}, ${took(p.to.getTime() - p.from.getTime())}${p.ongoing ? " so far" : ""}`;
    const right = left + width + 6 < VIEW_W - 70;
    return (
      <g
        class={p.ongoing ? "phase ongoing" : "phase"}
        data-phase={p.name}
        data-from={p.from.toISOString()}
        data-to={p.to.toISOString()}
      >
        <title>{label}</title>
        <text x={LABEL_W - 8} y={laneY(i) + BAR_H - 4} text-anchor="end">
          {p.name}
        </text>
        <rect class={`ph-${p.name}`} x={r2(left)} y={laneY(i)} width={r2(width)} height={BAR_H} rx={2} />
        <text
          x={r2(right ? left + width + 6 : left + width - 6)}
          y={laneY(i) + BAR_H - 4}
          text-anchor={right ? "start" : "end"}
        >
          {took(p.to.getTime() - p.from.getTime())}
        </text>
      </g>
    );
  });
  const markLane = (list: Mark[], lane: number, name: string) => {
    const cy = lane * LANE_H + LANE_H / 2;
    return (
      <g class={`marks marks-${name}`}>
        <text x={LABEL_W - 8} y={cy + 4} text-anchor="end">
          {name}
        </text>
        {list.map((m) => {
          const cx = r2(x(m.at));
          return (
            <g class={`mark ${m.kind}`} data-at={m.at.toISOString()}>
              <title>{`${m.label} (${clock(m.at)}${m.until ? ` to ${clock(m.until)}` : ""})`}</title>
              <line class="mark-line" x1={cx} x2={cx} y1={0} y2={cy} />
              {m.until ? <line class="mark-span" x1={cx} x2={r2(x(m.until))} y1={cy} y2={cy} /> : null}
              {m.kind === "note" ? (
                <circle class="mark-note" cx={cx} cy={cy} r={5} />
              ) : (
                <path
                  class="mark-denial"
                  d={`M${cx} ${cy - 6}L${r2(cx + 6)} ${cy + 5}L${r2(cx - 6)} ${cy + 5}Z`}
                />
              )}
            </g>
          );
        })}
      </g>
    );
  };
  let lane = phases.length;
  if (notes.length > 0) rows.push(markLane(notes, lane++, "notes"));
  if (denials.length > 0) rows.push(markLane(denials, lane++, "denials"));
  const step = (STEPS.find((s) => span / 1000 / s <= 8) ?? Math.ceil(span / 8000)) * 1000;
  const ticks: Child[] = [];
  for (let t = 0; t <= span; t += step) {
    const tx = r2(LABEL_W + t * (PLOT_W / span));
    ticks.push(
      <g>
        <line x1={tx} x2={tx} y1={0} y2={lanes * LANE_H + 4} />
        <text x={tx} y={height - 5} text-anchor="middle">
          {t < 60_000 ? `${t / 1000} s` : took(t)}
        </text>
      </g>,
    );
  }
  return (
    <svg
      class="timeline"
      viewBox={`0 0 ${VIEW_W} ${height}`}
      role="img"
      aria-labelledby="timeline-title"
      data-start={new Date(t0).toISOString()}
      data-span-ms={span}
    >
      <title id="timeline-title">{`The run's phases over ${took(span)}: ${phases.map((p) => p.name).join(", ")}; ${notes.length} note(s), ${denials.length} denied host(s).`}</title>
      <g class="axis">{ticks}</g>
      {rows}
    </svg>
  );
}

/** The same timeline in words, for whoever does not see the drawing. */
function TextTimeline(props: { phases: Phase[]; marks: Mark[] }) {
  return (
    <details>
      <summary>The timeline as a table</summary>
      <table id="timeline-table">
        <thead>
          <tr>
            <th style="width:8rem">Phase or mark</th>
            <th style="width:12rem">From</th>
            <th style="width:12rem">To</th>
            <th>Took, or what</th>
          </tr>
        </thead>
        <tbody>
          {props.phases.map((p) => (
            <tr>
              <td>{p.name}</td>
              <td>
                <When at={p.from} />
              </td>
              <td>{p.ongoing ? "now (still going)" : <When at={p.to} />}</td>
              <td>{took(p.to.getTime() - p.from.getTime())}</td>
            </tr>
          ))}
          {props.marks.map((m) => (
            <tr>
              <td>{m.kind}</td>
              <td>
                <When at={m.at} />
              </td>
              <td>{m.until ? <When at={m.until} /> : <span class="muted">—</span>}</td>
              <td>{m.label}</td>
            </tr>
          ))}
        </tbody>
      </table>
    </details>
  );
}
