import { MAX_LINGER_SECONDS, RunSpec } from "@benchwright/shared/contract/run-spec";
import { RUN_STATES, type RunState } from "@benchwright/shared/contract/run-states";
import { z } from "@hono/zod-openapi";
import { type Context, Hono } from "hono";
import { cancelRun, coordinatorStub, launchRun } from "../coordinator/client";
import { ApiError } from "../errors";
import { agentCommand, publicUrl } from "../routes/egress-agent";
import { artifactDownload, listArtifacts } from "../runs/artifacts";
import { BENCHMARKS } from "../runs/benchmarks";
import { BugReportBody, BugReportTitle, createBugReport, listBugReports } from "../runs/bug-reports";
import { issueEgressToken } from "../runs/egress-token";
import { checkLinger } from "../runs/launch";
import { lingerOf } from "../runs/linger";
import { listModelCalls, runModelUse } from "../runs/model-calls";
import {
  listEgressRoutes,
  listLimitRefusals,
  listRunBlockedHosts,
  listStrayPlaceholders,
} from "../runs/run-logs";
import {
  benchmarkOf,
  getRun,
  haltedNow,
  isTerminal,
  listRuns,
  type RunRow,
  type RunsFilter,
  runSandboxes,
  runTrace,
} from "../runs/service";
import { relayStub } from "../tunnel/relay";
import { allowHosts } from "../vault/hosts";
import type { PageEnv } from "./context";
import { Flash, flashQuery, Layout, PostForm, readFlash, When } from "./layout";
import { MODEL_CALLS_SHOWN } from "./model-card";
import { type ProxyLook, ProxyPage } from "./proxy-page";
import { needsEgressAgent, RUN_PAGE_STYLE, RunPage, StatusPill } from "./run-page";

// The run pages: /runs (the caller's runs, newest first) and /runs/{id} (one run's dashboard) with
// its proxy's view at /runs/{id}/proxy. They call the service functions and coordinator methods
// the API's routes call, with the same checks: a run of another environment is a 404 page, as
// for no run at all. The session (and, for a POST, its CSRF token) is checked in routes.tsx.

const RUNS_PER_PAGE = 20;
/** The audit rows (denied hosts, egress routes, limit refusals, stray placeholders) a card shows per page. */
const CARD_ROWS = 50;
const REPORTS_PER_PAGE = 20;

type Ctx = Context<PageEnv>;

function NotFoundPage(props: { id: string; csrf: string }) {
  const shown = props.id.length > 80 ? `${props.id.slice(0, 80)}…` : props.id;
  return (
    <Layout title="No such run" csrf={props.csrf}>
      <h1>No such run</h1>
      <p class="error">
        There is no run <span class="mono">{shown}</span> in this environment.
      </p>
      <p>
        <a href="/runs">← Back to your runs</a>
      </p>
    </Layout>
  );
}

const notFound = (c: Ctx) =>
  c.html(<NotFoundPage id={c.req.param("id") ?? ""} csrf={c.var.session.csrf} />, 404);

/** The caller's run named in the path, or null (another environment's run too). */
async function ownRunRow(c: Ctx): Promise<RunRow | null> {
  const found = await getRun(c.var.db, c.var.session.principal, c.req.param("id") ?? "");
  return found.ok ? found.value : null;
}

/** The runs page's filter as the query string carries it (status, benchmark), kept across pages. */
interface RunsPageFilter {
  status?: RunState | undefined;
  benchmark?: string | undefined;
}

const filterQuery = (f: RunsPageFilter) => {
  const q = new URLSearchParams();
  if (f.status) q.set("status", f.status);
  if (f.benchmark) q.set("benchmark", f.benchmark);
  return q;
};

/** How long a run took (launch to end), or has taken so far: "42 s", "3 min 5 s", "2 h 10 min". */
function duration(run: Pick<RunRow, "createdAt" | "endedAt">, now: Date): string {
  const s = Math.max(0, Math.round(((run.endedAt ?? now).getTime() - run.createdAt.getTime()) / 1000));
  if (s < 60) return `${s} s`;
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
}

function RunsFilterForm(props: { filter: RunsPageFilter }) {
  return (
    <form method="get" action="/runs" class="filter">
      <label>
        Status{" "}
        <select name="status">
          <option value="">any</option>
          {RUN_STATES.map((s) => (
            <option value={s} selected={props.filter.status === s}>
              {s}
            </option>
          ))}
        </select>
      </label>{" "}
      <label>
        Benchmark{" "}
        <select name="benchmark">
          <option value="">any</option>
          {Object.keys(BENCHMARKS).map((b) => (
            <option value={b} selected={props.filter.benchmark === b}>
              {b}
            </option>
          ))}
        </select>
      </label>{" "}
      <button type="submit">Filter</button>
      {props.filter.status || props.filter.benchmark ? (
        <>
          {" "}
          <a href="/runs">All runs</a>
        </>
      ) : null}
    </form>
  );
}

function RunsPage(props: {
  runs: RunRow[];
  nextCursor: string | null;
  paged: boolean;
  filter: RunsPageFilter;
  now: Date;
  error?: string | undefined;
  csrf: string;
}) {
  const filtered = Boolean(props.filter.status || props.filter.benchmark);
  const first = filterQuery(props.filter).toString();
  const older = filterQuery(props.filter);
  if (props.nextCursor) older.set("cursor", props.nextCursor);
  return (
    <Layout title="Runs" csrf={props.csrf}>
      <style>{RUN_PAGE_STYLE}</style>
      <h1>Runs</h1>
      <Flash error={props.error} />
      <LaunchForm csrf={props.csrf} />
      <RunsFilterForm filter={props.filter} />
      {props.runs.length === 0 ? (
        <p class="empty">
          {props.paged ? (
            <>
              No more runs. <a href={`/runs${first ? `?${first}` : ""}`}>Newest runs</a>
            </>
          ) : filtered ? (
            "No runs match this filter."
          ) : (
            "No runs yet. Launch one above (or with POST /v1/runs); it shows up here."
          )}
        </p>
      ) : (
        <section>
          <table>
            <thead>
              <tr>
                <th>Run</th>
                <th style="width:8rem">Benchmark</th>
                <th style="width:8rem">Status</th>
                <th>Reason</th>
                <th style="width:6rem">Routing</th>
                <th style="width:11rem">Created</th>
                <th style="width:7rem">Duration</th>
              </tr>
            </thead>
            <tbody>
              {props.runs.map((r) => (
                <tr>
                  <td class="mono">
                    <a href={`/runs/${r.id}`}>{r.id}</a>
                  </td>
                  <td>{benchmarkOf(r) ?? <span class="muted">commands</span>}</td>
                  <td>
                    <StatusPill run={r} />
                  </td>
                  <td>
                    {r.reason ? <code>{r.reason}</code> : <span class="muted">—</span>}
                    {r.reasonDetail ? <div class="muted">{r.reasonDetail}</div> : null}
                  </td>
                  <td>{r.routing ?? "—"}</td>
                  <td>
                    <When at={r.createdAt} />
                  </td>
                  <td title={r.endedAt ? "launch to end" : "so far"}>
                    {duration(r, props.now)}
                    {r.endedAt ? null : <span class="muted"> so far</span>}
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <p>
            {props.paged ? <a href={`/runs${first ? `?${first}` : ""}`}>← Newest</a> : null}{" "}
            {props.nextCursor ? <a href={`/runs?${older}`}>Older →</a> : null}
          </p>
        </section>
      )}
    </Layout>
  );
}

/** Launch a run: a built-in benchmark or commands (one per line), as POST /v1/runs takes them. */
function LaunchForm(props: { csrf: string }) {
  return (
    <section id="launch">
      <h2>Launch a run</h2>
      <PostForm action="/runs" csrf={props.csrf}>
        <label>
          Benchmark{" "}
          <select name="benchmark">
            {Object.keys(BENCHMARKS).map((name) => (
              <option value={name}>{name}</option>
            ))}
            <option value="">(the commands below)</option>
          </select>
        </label>{" "}
        <label>
          Linger (seconds, optional) <input name="lingerSeconds" inputmode="numeric" size={8} />
        </label>
        <details>
          <summary>Commands instead (one per line, each run by sh -c in the work sandbox)</summary>
          <textarea name="commands" rows={4} maxlength={8192} />
        </details>
        <button type="submit">Launch</button>
      </PostForm>
    </section>
  );
}

/** The run page, with a fresh egress agent command when one was just made. */
async function renderRun(c: Ctx, run: RunRow, egressAgentCommand?: string): Promise<Response> {
  const { db } = c.var;
  const p = c.var.session.principal;
  const ring = c.var.config.keyRing;
  const q = {
    blocked: query(c, "blocked"),
    routes: query(c, "routes"),
    limits: query(c, "limits"),
    strays: query(c, "strays"),
    reports: query(c, "reports"),
  };
  const renderedAt = new Date();
  const [
    trace,
    sandboxes,
    blocked,
    routes,
    limitRefusals,
    strayPlaceholders,
    reports,
    model,
    modelCalls,
    artifacts,
  ] = await Promise.all([
    runTrace(db, run.id),
    runSandboxes(db, run.id),
    listRunBlockedHosts(db, p, run.id, { limit: CARD_ROWS, cursor: q.blocked, ring }),
    listEgressRoutes(db, p, run.id, { limit: CARD_ROWS, cursor: q.routes, ring }),
    listLimitRefusals(db, p, run.id, { limit: CARD_ROWS, cursor: q.limits, ring }),
    listStrayPlaceholders(db, p, run.id, { limit: CARD_ROWS, cursor: q.strays, ring }),
    listBugReports(db, p, run.id, { limit: REPORTS_PER_PAGE, cursor: q.reports, ring }),
    runModelUse(db, p, run.id),
    listModelCalls(db, p, run.id, { limit: MODEL_CALLS_SHOWN, ring }),
    listArtifacts(db, p, run.id),
  ]);
  return c.html(
    <RunPage
      view={{
        run,
        trace,
        sandboxes,
        halted: haltedNow(run, trace),
        linger: lingerOf(run),
        blocked,
        routes,
        limitRefusals,
        strayPlaceholders,
        reports,
        model,
        modelCalls,
        renderedAt,
        artifacts,
        query: q,
        flash: await readFlash(c.var.session.csrf, (k) => query(c, k)),
        keptTitle: query(c, "title"),
        csrf: c.var.session.csrf,
        egressAgentCommand,
        refreshOff: query(c, "refresh") === "off",
      }}
    />,
  );
}

/** The launch form as a RunSpec, or the reason it is not one. */
function launchSpec(form: Record<string, unknown>): { ok: true; spec: RunSpec } | { ok: false; why: string } {
  const text = (k: string) => (typeof form[k] === "string" ? (form[k] as string).trim() : "");
  const commands = text("commands")
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l.length > 0);
  const linger = text("lingerSeconds");
  const asked = {
    ...(text("benchmark") ? { benchmark: text("benchmark") } : { commands }),
    ...(linger ? { lingerSeconds: /^\d{1,9}$/.test(linger) ? Number(linger) : -1 } : {}),
  };
  const parsed = RunSpec.safeParse(asked);
  if (!parsed.success) {
    return {
      ok: false,
      why: parsed.error.issues.map((i) => `${i.path.join(".") || "run"}: ${i.message}`).join("; "),
    };
  }
  return { ok: true, spec: parsed.data };
}

// ---- answering a form: a 303 back to the run's page with a flash ----

async function back(
  c: Ctx,
  runId: string,
  flash: { ok?: string; error?: string },
  anchor: string,
  keep: Record<string, string> = {},
): Promise<Response> {
  const q = await flashQuery(c.var.session.csrf, flash);
  for (const [k, v] of Object.entries(keep)) q.set(k, v);
  return c.redirect(`/runs/${encodeURIComponent(runId)}?${q}#${anchor}`, 303);
}

async function field(c: Ctx, name: string): Promise<string | undefined> {
  const v = (await c.req.parseBody())[name];
  return typeof v === "string" ? v : undefined;
}

// The API's bug report rules, for a form.
const ReportForm = z.object({ title: BugReportTitle, body: BugReportBody });

/** Halt or resume, as POST /v1/runs/{id}/halt and /resume: refused once the run has ended. */
async function halt(c: Ctx, on: boolean): Promise<Response> {
  const run = await ownRunRow(c);
  if (!run) return notFound(c);
  const accepted = !isTerminal(run.status) && (await coordinatorStub(c.env, run.id).halt(on));
  if (!accepted) {
    return back(
      c,
      run.id,
      { error: `Run ${run.id} has ended (${run.status}); there is nothing to ${on ? "halt" : "resume"}.` },
      "controls",
    );
  }
  return back(
    c,
    run.id,
    {
      ok: on
        ? "Halt asked for: the run's commands stop at its next step; the proxy keeps enforcing and picks up host policy edits within seconds."
        : "Resume asked for: the run's commands continue at its next step.",
    },
    "controls",
  );
}

const query = (c: Ctx, name: string) => {
  const v = c.req.query(name);
  return v === undefined || v === "" ? undefined : v;
};

export const runPageRoutes = new Hono<PageEnv>()
  .get("/runs", async (c) => {
    const cursor = query(c, "cursor");
    const status = query(c, "status");
    const filter: RunsPageFilter & RunsFilter = {
      status: RUN_STATES.find((s) => s === status),
      benchmark: query(c, "benchmark")?.slice(0, 64),
    };
    const page = await listRuns(
      c.var.db,
      c.var.session.principal,
      { limit: RUNS_PER_PAGE, cursor, ring: c.var.config.keyRing },
      filter,
    );
    const csrf = c.var.session.csrf;
    const now = new Date();
    if (!page.ok) {
      return c.html(
        <RunsPage
          runs={[]}
          nextCursor={null}
          paged
          filter={filter}
          now={now}
          error="That page link is not one this site gave."
          csrf={csrf}
        />,
        400,
      );
    }
    return c.html(
      <RunsPage
        runs={page.value.items}
        nextCursor={page.value.nextCursor}
        paged={cursor !== undefined}
        filter={filter}
        now={now}
        error={(await readFlash(csrf, (k) => query(c, k))).error}
        csrf={csrf}
      />,
    );
  })
  .post("/runs", async (c) => {
    const made = launchSpec(await c.req.parseBody());
    const refuse = async (why: string) =>
      c.redirect(`/runs?${await flashQuery(c.var.session.csrf, { error: why })}#launch`, 303);
    if (!made.ok) return refuse(`Not launched: ${made.why}.`);
    let run: RunRow;
    try {
      run = await launchRun(c.env, c.var.db, c.var.session.principal, made.spec, c.var.requestId);
    } catch (error) {
      if (error instanceof ApiError) return refuse(`Not launched: ${error.detail}`);
      throw error;
    }
    return back(c, run.id, { ok: "Launched." }, "status");
  })
  .get("/runs/:id", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    return renderRun(c, run);
  })
  .post("/runs/:id/egress-agent-token", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    // As POST /v1/runs/{id}/egress-agent-token. The command (its token) is on this one answer
    // only: rendered, never put in a redirect's URL, and the answer is not stored by the browser.
    const token = needsEgressAgent(run) ? await issueEgressToken(c.var.db, run.id) : null;
    if (token === null) {
      return back(c, run.id, { error: `Run ${run.id} has ended or needs no egress agent.` }, "status");
    }
    await relayStub(c.env, run.id).dropAgent();
    const command = agentCommand(publicUrl(c.req.url, c.env.PUBLIC_URL), token);
    c.header("cache-control", "no-store");
    return renderRun(c, run, command);
  })
  .get("/runs/:id/artifacts/:artifactId", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    // As GET /v1/runs/{id}/artifacts/{artifactId}: the bytes as an attachment, never rendered.
    const found = await artifactDownload(
      c.env.FILES,
      c.var.db,
      c.var.session.principal,
      run.id,
      c.req.param("artifactId"),
    );
    if (!found.ok) return c.text(found.error.detail, 404);
    return found.value;
  })
  .get("/runs/:id/proxy", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    const csrf = c.var.session.csrf;
    // As GET /v1/runs/{id}/proxy: an ended run's proxy is gone; else the coordinator reads the
    // view (resuming a paused lingering proxy first).
    let look: ProxyLook;
    if (isTerminal(run.status)) {
      look = {
        ok: false,
        code: "proxy_gone",
        detail: `Run ${run.id} has ended (${run.status}); its proxy is gone.`,
      };
    } else {
      const read = await coordinatorStub(c.env, run.id).view();
      look = read.ok ? read : { ...read, detail: `Run ${run.id}: ${read.detail}.` };
    }
    const status = look.ok ? 200 : look.code === "proxy_gone" ? 409 : 503;
    return c.html(<ProxyPage run={run} look={look} csrf={csrf} />, status);
  })
  .post("/runs/:id/cancel", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    // As POST /v1/runs/{id}/cancel (a no-op once the run has ended; the page says so).
    if (isTerminal(run.status)) {
      return back(
        c,
        run.id,
        { error: `Run ${run.id} has already ended (${run.status}); there is nothing to cancel.` },
        "controls",
      );
    }
    const accepted = (await cancelRun(c.env, c.var.db, run.id, c.var.requestId)) === "asked";
    const ok = !accepted
      ? "Cancelled: the run had not started; it is stopped."
      : run.status === "lingering"
        ? "Cancel asked for: the lingering proxy is torn down at the run's next step."
        : "Cancel asked for: the run stops at its next step and its sandboxes are torn down.";
    return back(c, run.id, { ok }, "status");
  })
  .post("/runs/:id/halt", (c) => halt(c, true))
  .post("/runs/:id/resume", (c) => halt(c, false))
  .post("/runs/:id/linger", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    const raw = ((await field(c, "seconds")) ?? "").trim();
    if (!/^[0-9]{1,15}$/.test(raw)) {
      return back(
        c,
        run.id,
        { error: `seconds: a whole number of seconds, 0 to ${MAX_LINGER_SECONDS}.` },
        "linger",
      );
    }
    const seconds = Number(raw);
    // The API's checks, in its words: the 24 h cap (linger_too_long), then an ended run (run_ended).
    const allowed = checkLinger(seconds);
    if (!allowed.ok) return back(c, run.id, { error: allowed.error.detail }, "linger");
    const accepted = !isTerminal(run.status) && (await coordinatorStub(c.env, run.id).linger(seconds));
    if (!accepted) {
      return back(
        c,
        run.id,
        { error: `Run ${run.id} has ended or is ending; its proxy can no longer be kept.` },
        "linger",
      );
    }
    const ok =
      run.status === "lingering"
        ? `The linger window is now ${seconds} s, counted from when the run began lingering${seconds === 0 ? ": it ends now" : ""}.`
        : seconds === 0
          ? "The proxy will not linger: it goes with the run."
          : `The proxy will linger ${seconds} s after the run's commands end.`;
    return back(c, run.id, { ok }, "linger");
  })
  .post("/runs/:id/allow-host", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    // The vault service's checks (an exact host name, canonicalised), in its words.
    const host = ((await field(c, "host")) ?? "").trim();
    const allowed = await allowHosts(c.var.db, c.var.session.principal, [host]);
    if (!allowed.ok) return back(c, run.id, { error: allowed.error.detail }, "denied");
    const name = allowed.value.entries[0]?.pattern ?? host;
    const ok =
      allowed.value.unchanged > 0
        ? `${name} was already allowed in the vault.`
        : `${name} is now allowed: ${allowed.value.created > 0 ? "a new allow entry" : "its entry is now allow"} in the vault. Running proxies pick it up within seconds; earlier refusals stay in this list.`;
    return back(c, run.id, { ok }, "denied");
  })
  .post("/runs/:id/bug-reports", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    const title = (await field(c, "title")) ?? "";
    const parsed = ReportForm.safeParse({ title, body: (await field(c, "body")) ?? "" });
    // A refused report keeps its title (short) across the redirect, never its body.
    const keep = { title: title.slice(0, 200) };
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      return back(c, run.id, { error: `${issue?.path.join(".")}: ${issue?.message}` }, "reports", keep);
    }
    const filed = await createBugReport(c.var.db, c.var.session.principal, { runId: run.id, ...parsed.data });
    if (!filed.ok) return back(c, run.id, { error: filed.error.detail }, "reports", keep);
    return back(
      c,
      run.id,
      { ok: `Bug report ${filed.value.id} filed; it is in the run's trace.` },
      "reports",
    );
  });
