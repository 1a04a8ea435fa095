import { type Context, Hono } from "hono";
import { coordinatorStub } from "../coordinator/run-coordinator";
import { listBlockedHosts, listEgressRoutes } from "../routes/run-audit";
import { listBugReports } from "../runs/bug-reports";
import { getRun, isTerminal, listRuns, type RunRow, runSandboxes, runTrace } from "../runs/service";
import type { PageEnv } from "./context";
import { Flash, Layout } from "./layout";
import { type ProxyLook, ProxyPage } from "./proxy-page";
import { haltedNow, lingerOf, RUN_PAGE_STYLE, RunPage, StatusPill, When } from "./run-page";

// The run pages: /runs (the caller's runs, newest first) and /runs/{id} (one run's dashboard) with
// its proxy's view at /runs/{id}/proxy. They call the service functions and coordinator methods
// the API's routes call, with the same checks: a run of another environment is a 404 page, as
// for no run at all. The session (and, for a POST, its CSRF token) is checked in routes.tsx.

const RUNS_PER_PAGE = 20;
/** The denied hosts, egress routes and bug reports shown per page of their card. */
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

function RunsPage(props: {
  runs: RunRow[];
  nextCursor: string | null;
  paged: boolean;
  error?: string | undefined;
  csrf: string;
}) {
  return (
    <Layout title="Runs" csrf={props.csrf}>
      <style>{RUN_PAGE_STYLE}</style>
      <h1>Runs</h1>
      <Flash error={props.error} />
      {props.runs.length === 0 ? (
        <p class="empty">
          {props.paged ? (
            <>
              No more runs. <a href="/runs">Newest runs</a>
            </>
          ) : (
            "No runs yet. Launch one with POST /v1/runs (see the README); it shows up here."
          )}
        </p>
      ) : (
        <section>
          <table>
            <thead>
              <tr>
                <th>Run</th>
                <th style="width:8rem">Status</th>
                <th>Reason</th>
                <th style="width:6rem">Routing</th>
                <th style="width:11rem">Created</th>
                <th style="width:11rem">Ended</th>
              </tr>
            </thead>
            <tbody>
              {props.runs.map((r) => (
                <tr>
                  <td class="mono">
                    <a href={`/runs/${r.id}`}>{r.id}</a>
                  </td>
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
                  <td>
                    <When at={r.endedAt} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          <p>
            {props.paged ? <a href="/runs">← Newest</a> : null}{" "}
            {props.nextCursor ? (
              <a href={`/runs?cursor=${encodeURIComponent(props.nextCursor)}`}>Older →</a>
            ) : null}
          </p>
        </section>
      )}
    </Layout>
  );
}

const query = (c: Ctx, name: string) => {
  const v = c.req.query(name);
  return v === undefined || v === "" ? undefined : v;
};

export const runPageRoutes = new Hono<PageEnv>()
  .get("/runs", async (c) => {
    const cursor = query(c, "cursor");
    const page = await listRuns(c.var.db, c.var.session.principal, RUNS_PER_PAGE, cursor);
    const csrf = c.var.session.csrf;
    if (!page.ok) {
      return c.html(
        <RunsPage
          runs={[]}
          nextCursor={null}
          paged
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
        csrf={csrf}
      />,
    );
  })
  .get("/runs/:id", async (c) => {
    const run = await ownRunRow(c);
    if (!run) return notFound(c);
    const { db } = c.var;
    const p = c.var.session.principal;
    const q = { blocked: query(c, "blocked"), routes: query(c, "routes"), reports: query(c, "reports") };
    const [trace, sandboxes, blocked, routes, reports] = await Promise.all([
      runTrace(db, run.id),
      runSandboxes(db, run.id),
      listBlockedHosts(db, p, run.id, CARD_ROWS, q.blocked),
      listEgressRoutes(db, p, run.id, CARD_ROWS, q.routes),
      listBugReports(db, p, run.id, REPORTS_PER_PAGE, q.reports),
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
          reports,
          query: q,
          flash: { ok: query(c, "ok"), error: query(c, "error") },
          csrf: c.var.session.csrf,
        }}
      />,
    );
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
  });
