import type { Result } from "../errors";
import type { Page } from "../lists/cursor";
import type { BudgetLine, MinuteTokens, ModelCall, ModelUse } from "../runs/model-calls";
import { When } from "./layout";

// The run page's model card: the declared model, what its calls spent over the run (against the
// run's modelBudget), tokens per minute as a server-rendered SVG (pages run no script and their
// CSP loads nothing), and the last calls. Only counts: prompts and outputs are never recorded.
// A run that has not ended shows the figures as of the page's load, with the time its proxy last
// reported them (the proxy flushes its audit batches every second or so; a reload shows more).

/** Calls listed on the card; GET /v1/runs/{id}/model-calls pages through all of them. */
export const MODEL_CALLS_SHOWN = 10;

export const MODEL_CARD_STYLE = `
.spend{display:grid;grid-template-columns:9rem 1fr 12rem;gap:.3rem .8rem;align-items:center;margin:.4rem 0}
.bar{height:.7rem;background:#e6e9ed;border-radius:3px;overflow:hidden}
.bar>span{display:block;height:100%;background:#5b8def}.bar.full>span{background:#c23030}
svg.tpm{width:100%;height:7rem;background:#f6f7f9;border:1px solid #e6e9ed;border-radius:4px}
.tpm-in{fill:#5b8def}.tpm-out{fill:#d9822b}
.key{display:inline-block;width:.7rem;height:.7rem;border-radius:2px;vertical-align:middle}
`;

const n = (v: number) => v.toLocaleString("en-US");

export interface ModelCardProps {
  use: Result<ModelUse> | undefined;
  calls: Result<Page<ModelCall>> | undefined;
  /** Whether the run has ended (its figures are final). */
  ended: boolean;
  /** When the page was made (what "as of" means for a live run). */
  at: Date;
}

export function ModelCard(props: ModelCardProps) {
  const use = props.use;
  if (!use?.ok) return null;
  const { model, totals, budget, perMinute, lastReportedAt } = use.value;
  return (
    <section id="model">
      <h2>Model</h2>
      {model === null ? (
        <p class="empty">This run declared no model.</p>
      ) : (
        <>
          <p class="note" id="model-outside-policy">
            The declared model stays outside host policy by design: it is what this run evaluates, so the
            run's proxy reaches its API host
            {model.baseHost ? (
              <>
                {" "}
                (<span class="mono">{model.baseHost}</span>)
              </>
            ) : null}{" "}
            whatever the vault's host rules and blocks say, with the model's key, through the model lane only.
            Every other host obeys the vault.
          </p>
          {props.ended ? null : (
            <p class="muted" id="model-live">
              Live: figures as of this page's load (<When at={props.at} />
              ); the run's proxy last reported {lastReportedAt ? <When at={lastReportedAt} /> : "nothing yet"}
              . It flushes its audit batches every second or so: reload for newer figures.
            </p>
          )}
          <dl class="facts">
            <dt>Model</dt>
            <dd class="mono">{model.name}</dd>
            <dt>Provider</dt>
            <dd>{model.provider ?? <span class="muted">—</span>}</dd>
            <dt>API host</dt>
            <dd class="mono">{model.baseHost ?? <span class="muted">—</span>}</dd>
            <dt>Calls</dt>
            <dd>{`${n(totals.calls)} (${n(totals.refused)} refused, ${n(totals.errors)} errors)`}</dd>
            <dt>Tokens</dt>
            <dd>
              {`${n(totals.inputTokens)} in (${n(totals.cachedInputTokens)} cached), ${n(totals.outputTokens)} out`}
            </dd>
            <dt>Latency</dt>
            <dd>
              {totals.latencyMs.p50 === null
                ? "—"
                : `p50 ${n(totals.latencyMs.p50)} ms, p95 ${n(totals.latencyMs.p95 ?? 0)} ms`}
            </dd>
          </dl>
          <Budget budget={budget} />
          <TokensChart perMinute={perMinute} />
          <LastCalls calls={props.calls} total={totals.calls} />
        </>
      )}
    </section>
  );
}

function Budget(props: { budget: ModelUse["budget"] }) {
  const b = props.budget;
  if (!b) return <p class="muted">No model budget: the run set no modelBudget.</p>;
  return (
    <>
      <h3>Budget</h3>
      <div class="spend" id="model-budget">
        <SpendRow label="Calls" unit="calls" line={b.calls} />
        <SpendRow label="Input tokens" unit="input tokens" line={b.inputTokens} />
        <SpendRow label="Output tokens" unit="output tokens" line={b.outputTokens} />
      </div>
      <p class="muted">
        Past a limit the lane refuses calls (429, in the format the caller spoke); a call in flight may take
        the input tokens past their limit by its own size.
      </p>
    </>
  );
}

function SpendRow(props: { label: string; unit: string; line: BudgetLine }) {
  const { used, limit } = props.line;
  if (limit === null) {
    return (
      <>
        <span>{props.label}</span>
        <span class="muted">no limit</span>
        <span>{`${n(used)} ${props.unit}`}</span>
      </>
    );
  }
  const share = Math.min(100, Math.round((used / limit) * 100));
  return (
    <>
      <span>{props.label}</span>
      <span class={used >= limit ? "bar full" : "bar"} title={`${share}%`}>
        <span style={`width:${share}%`} />
      </span>
      <span>{`${n(used)} / ${n(limit)} ${props.unit}`}</span>
    </>
  );
}

// The chart's drawing units: one column per minute, the tallest minute's stack CHART_H high.
const COL_W = 10;
const BAR_W = 8;
const CHART_H = 100;

/** Tokens per minute, input below output in each minute's stack; each minute titled. */
function TokensChart(props: { perMinute: MinuteTokens[] }) {
  const { perMinute } = props;
  if (perMinute.length === 0) return <p class="empty">No calls yet.</p>;
  const peak = Math.max(1, ...perMinute.map((m) => m.inputTokens + m.outputTokens));
  const h = (tokens: number) => (tokens / peak) * CHART_H;
  const first = perMinute[0]?.minute;
  const last = perMinute.at(-1)?.minute;
  return (
    <>
      <h3>Tokens per minute</h3>
      <svg
        class="tpm"
        viewBox={`0 0 ${perMinute.length * COL_W} ${CHART_H}`}
        preserveAspectRatio="none"
        role="img"
        aria-label={`Tokens per minute, peak ${n(peak)}`}
      >
        {perMinute.map((m, i) => {
          const hIn = h(m.inputTokens);
          const hOut = h(m.outputTokens);
          const x = i * COL_W + (COL_W - BAR_W) / 2;
          const iso = m.minute.toISOString();
          return (
            <g data-minute={iso} data-input={m.inputTokens} data-output={m.outputTokens}>
              <title>{`${iso.slice(11, 16)} UTC: ${n(m.inputTokens)} in, ${n(m.outputTokens)} out`}</title>
              {hIn > 0 ? <rect class="tpm-in" x={x} y={CHART_H - hIn} width={BAR_W} height={hIn} /> : null}
              {hOut > 0 ? (
                <rect class="tpm-out" x={x} y={CHART_H - hIn - hOut} width={BAR_W} height={hOut} />
              ) : null}
            </g>
          );
        })}
      </svg>
      <p class="muted">
        <span class="key" style="background:#5b8def" /> input <span class="key" style="background:#d9822b" />{" "}
        output · {first ? <When at={first} /> : null} to {last ? <When at={last} /> : null} (at most the last
        hour with calls), peak {n(peak)} tokens a minute.
      </p>
    </>
  );
}

function LastCalls(props: { calls: Result<Page<ModelCall>> | undefined; total: number }) {
  const calls = props.calls;
  if (!calls?.ok || calls.value.items.length === 0) return null;
  return (
    <>
      <h3>Last calls</h3>
      <table id="model-calls">
        <thead>
          <tr>
            <th style="width:11rem">At</th>
            <th>Model</th>
            <th style="width:9rem">Endpoint</th>
            <th style="width:4rem">Status</th>
            <th style="width:10rem">Tokens (in / out / cached)</th>
            <th style="width:5rem">ms</th>
            <th style="width:8rem">Refused</th>
          </tr>
        </thead>
        <tbody>
          {calls.value.items.map((c) => (
            <tr>
              <td>
                <When at={c.at} />
              </td>
              <td class="mono">{c.model}</td>
              <td class="mono">{`${c.endpoint}${c.stream ? " (stream)" : ""}`}</td>
              <td>{c.status}</td>
              <td>{`${n(c.inputTokens)} / ${n(c.outputTokens)} / ${n(c.cachedInputTokens)}`}</td>
              <td>{n(c.ms)}</td>
              <td>{c.refused ?? <span class="muted">—</span>}</td>
            </tr>
          ))}
        </tbody>
      </table>
      {props.total > calls.value.items.length ? (
        <p class="muted">
          {`The newest ${calls.value.items.length} of ${n(props.total)}; GET /v1/runs/{id}/model-calls lists them all.`}
        </p>
      ) : null}
    </>
  );
}
