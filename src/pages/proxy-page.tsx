import type { ProxyView } from "@benchwright/shared/contract/proxy-view";
import type { RunRow } from "../runs/service";

import { Layout, When } from "./layout";
import { RUN_PAGE_STYLE, StatusPill } from "./run-page";

// The run's proxy as it sees itself (/runs/{id}/proxy): what GET /v1/runs/{id}/proxy returns,
// read through the same coordinator call. Host, method and decision only; the view never holds a
// header value, a path or a secret (shared/contract/proxy-view.ts), and this page shows no more.

/** Decisions shown, newest first; the proxy keeps at most 100 (VIEW_RECENT_LIMIT). */
export const DECISIONS_SHOWN = 100;

export type ProxyLook =
  | { ok: true; view: ProxyView; resumed: boolean }
  | { ok: false; code: "proxy_gone" | "proxy_unreachable"; detail: string };

function Counts(props: { view: ProxyView }) {
  const c = props.view.counts;
  const a = props.view.audit;
  return (
    <section id="counts">
      <h2>Counts since the proxy started</h2>
      <table>
        <thead>
          <tr>
            <th>Requests</th>
            <th>Allowed</th>
            <th>With a vault credential</th>
            <th>Blocked</th>
            <th>Refused</th>
            <th>Errors</th>
          </tr>
        </thead>
        <tbody>
          <tr>
            <td>{c.requests}</td>
            <td>{c.allow}</td>
            <td>{c.injected}</td>
            <td>{c.block}</td>
            <td>{c.refuse}</td>
            <td>{c.error}</td>
          </tr>
        </tbody>
      </table>
      <h2>Policy</h2>
      <dl class="facts">
        <dt>State</dt>
        <dd>
          {props.view.policyState === "ready"
            ? "ready"
            : `${props.view.policyState}: the proxy denies everything until it holds a valid policy`}
        </dd>
        <dt>Version</dt>
        <dd>{props.view.policyVersion ?? <span class="muted">none</span>}</dd>
        <dt>Started</dt>
        <dd>
          <When at={props.view.startedAt} />
        </dd>
        <dt>This view taken</dt>
        <dd>
          <When at={props.view.generatedAt} />
        </dd>
      </dl>
      <h2>Audit delivery</h2>
      {a.accepting ? null : (
        <p class="warning">
          The audit spool is full: the proxy refuses new egress until the control plane takes its batches.
        </p>
      )}
      <dl class="facts">
        <dt>Rows recorded / sent</dt>
        <dd>
          {a.rowsRecorded} / {a.rowsSent}
        </dd>
        <dt>Rows rejected / refused</dt>
        <dd>
          {a.rowsRejected} / {a.rowsRefused}
        </dd>
        <dt>Batches sent / rejected</dt>
        <dd>
          {a.batchesSent} / {a.batchesRejected}
        </dd>
        <dt>Batches waiting</dt>
        <dd>{a.pendingBatches}</dd>
      </dl>
    </section>
  );
}

function Decisions(props: { view: ProxyView }) {
  const recent = props.view.recent.slice(-DECISIONS_SHOWN).reverse();
  return (
    <section id="decisions">
      <h2>Recent decisions</h2>
      {recent.length === 0 ? (
        <p class="empty">No request has gone through the proxy yet.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th style="width:11rem">At</th>
              <th>Host</th>
              <th style="width:5rem">Method</th>
              <th style="width:6rem">Decision</th>
              <th>Reason</th>
              <th style="width:4rem">Status</th>
              <th style="width:4rem">Rule</th>
              <th style="width:5rem">Listener</th>
            </tr>
          </thead>
          <tbody>
            {recent.map((d) => (
              <tr>
                <td>
                  <When at={d.at} />
                </td>
                <td class="mono">
                  {d.host ?? "—"}
                  {d.port !== null ? `:${d.port}` : ""}
                </td>
                <td>{d.method}</td>
                <td>{d.decision}</td>
                <td>{d.reason}</td>
                <td>{d.status}</td>
                <td>{d.rule === null ? "—" : `#${d.rule + 1}`}</td>
                <td>{d.listener}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </section>
  );
}

export function ProxyPage(props: { run: RunRow; look: ProxyLook; csrf: string }) {
  const { run, look } = props;
  return (
    <Layout title={`Proxy of ${run.id}`} csrf={props.csrf}>
      <style>{RUN_PAGE_STYLE}</style>
      <p>
        <a href={`/runs/${run.id}`}>← Run {run.id}</a>
      </p>
      <h1>The run's proxy</h1>
      <p>
        Run <span class="mono">{run.id}</span> <StatusPill run={run} />
      </p>
      {look.ok ? (
        <>
          {look.resumed ? (
            <p class="note">
              This proxy was paused for idleness; looking at it resumed it, and its idle clock starts again.
            </p>
          ) : run.status === "lingering" ? (
            <p class="muted">Looking at a lingering proxy keeps it awake: its idle clock starts again.</p>
          ) : null}
          <Counts view={look.view} />
          <Decisions view={look.view} />
        </>
      ) : (
        <p class={look.code === "proxy_gone" ? "warning" : "error"}>
          <code>{look.code}</code>{" "}
          {look.code === "proxy_gone" ? "This run has no proxy running." : "The run's proxy did not answer."}{" "}
          {look.detail}
        </p>
      )}
    </Layout>
  );
}
