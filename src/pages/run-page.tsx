import { MAX_LINGER_SECONDS, readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { WiringProof } from "@benchwright/shared/contract/wiring";
import type { Child } from "hono/jsx";
import type { Result } from "../errors";
import type { Page } from "../lists/cursor";
import type { ArtifactRow } from "../runs/artifacts";
import type { BugReport } from "../runs/bug-reports";
import type { Linger } from "../runs/linger";
import type { ModelCall, ModelUse } from "../runs/model-calls";
import type { BlockedRow, LimitRefusal, RouteRow, StrayPlaceholder } from "../runs/run-logs";
import { isTerminal, type RunNote, type RunRow, type runSandboxes, type TraceRow } from "../runs/service";
import { Flash, Layout, PostForm, When } from "./layout";
import { MODEL_CARD_STYLE, ModelCard } from "./model-card";
import { Artifacts, BugReports } from "./run-artifacts";
import { DeniedHosts, EgressRoutes, LimitRefusals, StrayPlaceholders } from "./run-audit-cards";
import { Stages } from "./run-stages";
import { TIMELINE_STYLE, Timeline } from "./run-timeline";
import { Trace } from "./run-trace";

// The run dashboard (/runs/{id}): why the run is where it is, what the platform changed about
// its network, what its boundary proved and refused, and the controls the API offers. Everything
// shown is what GET /v1/runs/{id} and the run's audit reads show; never a secret (the vault's
// values never reach the run's rows) and never an unescaped string (JSX escapes every value).

export type SandboxRow = Awaited<ReturnType<typeof runSandboxes>>[number];

export interface RunView {
  run: RunRow;
  trace: TraceRow[];
  sandboxes: SandboxRow[];
  halted: boolean;
  linger: Linger;
  blocked: Result<Page<BlockedRow>>;
  routes: Result<Page<RouteRow>>;
  limitRefusals: Result<Page<LimitRefusal>>;
  strayPlaceholders: Result<Page<StrayPlaceholder>>;
  reports: Result<Page<BugReport>>;
  /** The declared model, the totals of its calls and spend (GET /v1/runs/{id}/model-calls). */
  model?: Result<ModelUse> | undefined;
  /** Its last calls, newest first. */
  modelCalls?: Result<Page<ModelCall>> | undefined;
  /** When the page was made: a live run's model figures are as of then. */
  renderedAt?: Date | undefined;
  /** What the run's commands left in $BW_OUT, and what was cut (GET /v1/runs/{id}/artifacts). */
  artifacts?: Result<{ artifacts: ArtifactRow[]; cut: ArtifactRow[] }> | undefined;
  /** The query the page was asked with (card cursors), to build the cards' next links. */
  query: {
    blocked?: string | undefined;
    routes?: string | undefined;
    limits?: string | undefined;
    strays?: string | undefined;
    reports?: string | undefined;
  };
  flash: { ok?: string | undefined; error?: string | undefined };
  /** The title of a bug report the page refused, to fill the form again (never its body). */
  keptTitle?: string | undefined;
  csrf: string;
  /** A fresh egress agent command, on the one answer to the form that made it (never stored). */
  egressAgentCommand?: string | undefined;
  /** The reader asked the page not to reload itself (`?refresh=off`), to fill in a form. */
  refreshOff?: boolean | undefined;
}

/** How often a live run's page reloads itself. */
export const REFRESH_SECONDS = 5;

/**
 * Where and when a live run's page reloads itself, or null. Only while the run moves on its own
 * (a lingering run waits for its window, an ended one for nothing). The reload keeps the cards'
 * cursors and drops an ok flash (read once); a page answering a form with something to read or
 * redo (an error, a refused report's title, the egress agent's command shown once) stays put.
 */
export function pageRefresh(view: RunView): { seconds: number; url: string } | null {
  const { run, flash } = view;
  if (isTerminal(run.status) || run.status === "lingering" || view.refreshOff) return null;
  if (flash.error || view.keptTitle !== undefined || view.egressAgentCommand) return null;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(view.query)) if (v) q.set(k, v);
  const query = q.toString();
  return { seconds: REFRESH_SECONDS, url: `/runs/${encodeURIComponent(run.id)}${query ? `?${query}` : ""}` };
}

/** Says whether the page reloads itself, with the way to stop it (or to follow the run again). */
function Live(props: { view: RunView; refresh: { seconds: number; url: string } | null }) {
  const { run } = props.view;
  if (isTerminal(run.status) || run.status === "lingering") return null;
  const here = `/runs/${encodeURIComponent(run.id)}`;
  return props.refresh ? (
    <p class="muted" id="live">
      Live: this page reloads itself every {props.refresh.seconds} s while the run moves.{" "}
      <a href={`${here}?refresh=off`}>Stop reloading</a> (to fill in a form).
    </p>
  ) : (
    <p class="muted" id="live">
      This page does not reload itself now. <a href={here}>Follow the run</a>
    </p>
  );
}

// A few additions to the layout's sheet, for this page only.
const STYLE = `
.pill{display:inline-block;padding:0 .5rem;border-radius:999px;background:#e6e9ed;font-size:.85rem;font-weight:600}
.pill.good{background:#d6efe0}.pill.bad{background:#f6d5d5}.pill.live{background:#dce7fb}
dl.facts{display:grid;grid-template-columns:max-content 1fr;gap:.2rem 1rem;margin:.4rem 0}
dl.facts dt{color:#555}dl.facts dd{margin:0;overflow-wrap:anywhere}
.controls form{display:inline-block;margin:0 .6rem .4rem 0}
details{margin:.4rem 0}summary{cursor:pointer}
textarea{font:inherit;width:100%;max-width:48rem}
pre.stderr{border-left:3px solid #d9822b}
`;

export const RUN_PAGE_STYLE = STYLE;

export function StatusPill(props: { run: Pick<RunRow, "status" | "reason"> }) {
  const { status, reason } = props.run;
  const tone =
    status === "finished" && (reason === "completed" || reason === "linger_lapsed")
      ? "good"
      : isTerminal(status)
        ? "bad"
        : "live";
  return <span class={`pill ${tone}`}>{status}</span>;
}

const seconds = (s: number) =>
  s >= 3600 && s % 3600 === 0
    ? `${s} s (${s / 3600} h)`
    : s >= 60 && s % 60 === 0
      ? `${s} s (${s / 60} min)`
      : `${s} s`;

/** What to do about a note, where the platform can say more than the note's text. */
const ADVICE: Record<string, string> = {
  routing_change_not_retrofitted:
    "What to do: relaunch the run (same spec) so that every sandbox gets catch-all routing; until then only the hosts in its hosts file go through the proxy.",
  proxy_failed_unfiltered:
    'What to do: this run\'s traffic left unfiltered and without credentials; relaunch it without onProxyFailure "continue" to have it stop instead.',
};

function Card(props: { id: string; title: string; children?: Child }) {
  return (
    <section id={props.id}>
      <h2>{props.title}</h2>
      {props.children}
    </section>
  );
}

// ---- status and reason ----

function Summary(props: { view: RunView }) {
  const { run, halted } = props.view;
  const ended = isTerminal(run.status);
  return (
    <Card id="status" title="Status">
      <dl class="facts">
        <dt>Status</dt>
        <dd>
          <StatusPill run={run} />
          {halted ? (
            <>
              {" "}
              <span class="pill live">halted for review</span>
            </>
          ) : null}
        </dd>
        <dt>Reason</dt>
        <dd>
          {run.reason ? <code>{run.reason}</code> : <span class="muted">— (not ended)</span>}
          {run.reasonDetail ? <div>{run.reasonDetail}</div> : null}
        </dd>
        <dt>Routing</dt>
        <dd>{run.routing ?? <span class="muted">not chosen yet</span>}</dd>
        <dt>Backend</dt>
        <dd>{run.backend}</dd>
        <dt>Created</dt>
        <dd>
          <When at={run.createdAt} />
        </dd>
        <dt>Started</dt>
        <dd>
          <When at={run.startedAt} />
        </dd>
        <dt>Ended</dt>
        <dd>
          <When at={run.endedAt} />
        </dd>
        <dt>Policy version</dt>
        <dd>{run.policyVersion ?? <span class="muted">—</span>}</dd>
      </dl>
      {run.status === "queued" ? (
        <p class="empty">Queued: the run's coordinator has not started it yet.</p>
      ) : null}
      {ended && run.status !== "finished" ? (
        <p class={run.status === "failed" ? "error" : "warning"}>
          {run.status === "failed" ? "Failed" : "Stopped"}: <code>{run.reason ?? "unknown"}</code>
          {run.reasonDetail ? ` — ${run.reasonDetail}` : ""}
        </p>
      ) : null}
      {run.status === "finished" && run.reason === "command_failed" ? (
        <p class="warning">A command exited non-zero: {run.reasonDetail}</p>
      ) : null}
    </Card>
  );
}

// ---- controls: cancel, halt / resume, linger, look at the proxy ----

function Controls(props: { view: RunView }) {
  const { run, halted, linger, csrf } = props.view;
  const id = run.id;
  const ended = isTerminal(run.status);
  return (
    <Card id="controls" title="Controls">
      {ended ? (
        <p class="muted">The run has ended ({run.status}); nothing is left to stop, halt or keep.</p>
      ) : (
        <div class="controls">
          <PostForm action={`/runs/${id}/cancel`} csrf={csrf}>
            <button type="submit">
              {run.status === "lingering" ? "Cancel (ends the linger)" : "Cancel"}
            </button>
          </PostForm>
          {run.status === "lingering" ? null : halted ? (
            <PostForm action={`/runs/${id}/resume`} csrf={csrf}>
              <button type="submit">Resume</button>
            </PostForm>
          ) : (
            <PostForm action={`/runs/${id}/halt`} csrf={csrf}>
              <button type="submit">Halt for review</button>
            </PostForm>
          )}
          <a href={`/runs/${id}/proxy`}>Look at the proxy</a>
        </div>
      )}
      <h3 id="linger">Linger</h3>
      <dl class="facts">
        <dt>Asked for</dt>
        <dd>
          {linger.seconds === null ? (
            <span class="muted">none: the proxy goes with the run</span>
          ) : (
            seconds(linger.seconds)
          )}
        </dd>
        <dt>Until</dt>
        <dd>
          {linger.until ? <When at={linger.until} /> : <span class="muted">set once the run lingers</span>}
        </dd>
        <dt>Paused</dt>
        <dd>
          {linger.paused
            ? "yes, for idleness; the next look at the proxy resumes it"
            : run.status === "lingering"
              ? "no"
              : "—"}
        </dd>
      </dl>
      {ended ? null : (
        <PostForm action={`/runs/${id}/linger`} csrf={csrf}>
          <label>
            Keep the proxy for{" "}
            <input type="number" name="seconds" min={0} max={MAX_LINGER_SECONDS} step={1} required size={8} />{" "}
            seconds after the commands end
          </label>{" "}
          <button type="submit">Set linger</button>
          <div class="muted">
            At most {MAX_LINGER_SECONDS} s (24 h); 0 ends a linger at once.
            {run.status === "lingering" ? " Counted from when the run began lingering." : ""}
          </div>
        </PostForm>
      )}
    </Card>
  );
}

// ---- the egress agent (a run that egresses through the user's machine) ----

/** Whether the run sends traffic through the user's machine (so needs their egress agent). */
export function needsEgressAgent(run: RunRow): boolean {
  const local = readStoredSpec(run.spec).egress === "local";
  const awaited = (run.notes as Array<{ code: string }>).some((n) => n.code === "egress_agent_awaited");
  return local || awaited;
}

function EgressAgent(props: { view: RunView }) {
  const { run, csrf, egressAgentCommand } = props.view;
  if (!needsEgressAgent(run) || isTerminal(run.status)) return null;
  return (
    <Card id="egress-agent" title="Egress agent">
      <p>
        This run sends traffic through your own machine: run the egress agent there. Its commands start once
        the agent is connected; while it is away, hosts routed through it are refused (never sent direct).
      </p>
      {egressAgentCommand ? (
        <>
          <p>
            <strong>Shown once.</strong> Run this on your machine (the token in it replaces any earlier one):
          </p>
          <pre>{egressAgentCommand}</pre>
        </>
      ) : null}
      <PostForm action={`/runs/${run.id}/egress-agent-token`} csrf={csrf}>
        <button type="submit">{egressAgentCommand ? "Another command" : "Get the agent's command"}</button>
        <span class="muted"> A new token disconnects the agent of the previous one.</span>
      </PostForm>
    </Card>
  );
}

// ---- Network the platform changed ----

function Notes(props: { run: RunRow }) {
  const notes = (props.run.notes as RunNote[] | null) ?? [];
  return (
    <Card id="notes" title="Network the platform changed">
      {notes.length === 0 ? (
        <p class="empty">Nothing: the run's network is as the vault asks.</p>
      ) : (
        notes.map((n) => (
          <div class={n.level === "warning" ? "warning" : "note"}>
            <strong>{n.level === "warning" ? "Warning" : "Note"}</strong> <code>{n.code}</code>
            <div>{n.text}</div>
            {ADVICE[n.code] ? <div>{ADVICE[n.code]}</div> : null}
          </div>
        ))
      )}
    </Card>
  );
}

// ---- the boundary proof ----

interface WiringEvent {
  sandbox: string;
  name: string;
  routing: string;
  proof: unknown;
}

function ProofCard(props: { run: RunRow; trace: TraceRow[] }) {
  const proof = props.run.proof as {
    enforced?: boolean;
    reason?: string;
    routing?: string;
    sandboxes?: string[];
    sandbox?: string;
  } | null;
  const wirings = props.trace
    .filter((e) => e.kind === "proxy" && (e.detail as WiringEvent | null)?.proof !== undefined)
    .map((e) => e.detail as WiringEvent);
  const ready = props.trace.find(
    (e) => e.kind === "proxy" && (e.detail as WiringEvent | null)?.proof === undefined,
  );
  return (
    <Card id="proof" title="The boundary proof">
      {proof === null ? (
        <p class="empty">
          Not proved yet: the wiring step proves the boundary before any benchmark code runs.
        </p>
      ) : proof.enforced ? (
        <p class="ok">
          Enforced: the redirect to the run's proxy was installed and proved ({proof.routing} routing) in{" "}
          {proof.sandboxes?.length ?? 0} sandbox(es) before any benchmark code ran.
        </p>
      ) : proof.reason === "nothing_to_enforce" ? (
        <p class="note">
          Not enforced: the vault has nothing for a proxy to do (no rules, no blocks, allow default).
        </p>
      ) : proof.reason === "proxy_failed_unfiltered" ? (
        <p class="warning">
          Not enforced: the proxy failed and the run went on unfiltered, as it was launched to.
        </p>
      ) : (
        <p class="warning">
          Not proved in sandbox <code>{proof.sandbox ?? "?"}</code>: the run stopped before its benchmark code
          ran there.
        </p>
      )}
      {ready ? (
        <p class="muted">
          Proxy ready; run CA SHA-256{" "}
          <code>
            {String((ready.detail as { caFingerprint256?: unknown } | null)?.caFingerprint256 ?? "?")}
          </code>
        </p>
      ) : null}
      {wirings.map((w) => {
        const parsed = WiringProof.safeParse(w.proof);
        return (
          <details open={!parsed.success || !parsed.data.ok}>
            <summary>
              Wiring in <strong>{w.name}</strong> ({w.routing}):{" "}
              {parsed.success && parsed.data.ok ? "proved" : "not proved"}
            </summary>
            {parsed.success ? (
              <table>
                <thead>
                  <tr>
                    <th>Probe</th>
                    <th>Expected</th>
                    <th>Observed</th>
                    <th>OK</th>
                  </tr>
                </thead>
                <tbody>
                  {parsed.data.probes.map((p) => (
                    <tr>
                      <td>{p.name}</td>
                      <td>{p.expected}</td>
                      <td>{p.observed}</td>
                      <td>{p.ok ? "yes" : "no"}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            ) : (
              <p class="error">
                The wiring program gave no proof:{" "}
                {String((w.proof as { error?: unknown } | null)?.error ?? "no output")}
              </p>
            )}
          </details>
        );
      })}
    </Card>
  );
}

// ---- sandboxes ----

function Sandboxes(props: { run: RunRow; sandboxes: SandboxRow[] }) {
  const tasks = readStoredSpec(props.run.spec).tasks ?? [];
  return (
    <Card id="sandboxes" title="Sandboxes">
      {props.sandboxes.length === 0 ? (
        <p class="empty">None made{isTerminal(props.run.status) ? "" : " yet"}.</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th>Kind</th>
              <th>Task</th>
              <th>Routing</th>
              <th>Status</th>
              <th>Created</th>
              <th>Destroyed</th>
              <th>Id</th>
            </tr>
          </thead>
          <tbody>
            {props.sandboxes.map((s) => (
              <tr>
                <td>{s.kind}</td>
                <td>{s.taskIndex === null ? "—" : (tasks[s.taskIndex]?.name ?? `#${s.taskIndex}`)}</td>
                <td>{s.routing ?? "—"}</td>
                <td>{s.status}</td>
                <td>
                  <When at={s.createdAt} />
                </td>
                <td>
                  <When at={s.destroyedAt} />
                </td>
                <td class="mono">{s.id}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
    </Card>
  );
}

export function RunPage(props: { view: RunView }) {
  const { run, trace, sandboxes, flash, csrf } = props.view;
  const refresh = pageRefresh(props.view);
  const now = props.view.renderedAt ?? new Date();
  const blocked = props.view.blocked;
  return (
    <Layout title={`Run ${run.id}`} csrf={csrf} refresh={refresh ?? undefined}>
      <style>{STYLE + MODEL_CARD_STYLE + TIMELINE_STYLE}</style>
      <p>
        <a href="/runs">← Runs</a>
      </p>
      <h1>
        Run <span class="mono">{run.id}</span>
      </h1>
      <Flash ok={flash.ok} error={flash.error} />
      <Live view={props.view} refresh={refresh} />
      <Summary view={props.view} />
      <Timeline run={run} trace={trace} denials={blocked.ok ? blocked.value.items : []} now={now} />
      <Controls view={props.view} />
      <EgressAgent view={props.view} />
      <Notes run={run} />
      <ProofCard run={run} trace={trace} />
      <DeniedHosts view={props.view} />
      <EgressRoutes view={props.view} />
      <LimitRefusals view={props.view} />
      <StrayPlaceholders view={props.view} />
      <ModelCard
        use={props.view.model}
        calls={props.view.modelCalls}
        ended={isTerminal(run.status)}
        at={now}
      />
      <Sandboxes run={run} sandboxes={sandboxes} />
      <Stages run={run} trace={trace} />
      <Trace run={run} trace={trace} />
      <Artifacts view={props.view} />
      <BugReports view={props.view} />
    </Layout>
  );
}
