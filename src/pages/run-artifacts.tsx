import { isTerminal } from "../runs/service";
import { PostForm, When } from "./layout";
import { BadPage, nextLink } from "./run-audit-cards";
import type { RunView } from "./run-page";

// What a run left: the files its commands put in $BW_OUT (collected, or cut and why) and the bug
// reports filed on it, with the form to file one (an ended run takes reports too).

export function Artifacts(props: { view: RunView }) {
  const { run, artifacts } = props.view;
  if (!artifacts?.ok) return null;
  const { artifacts: files, cut } = artifacts.value;
  const size = (n: number | null) => (n === null ? "—" : `${n} B`);
  return (
    <section id="artifacts">
      <h2>Artifacts</h2>
      <p class="muted">
        The files the run's commands left in <code>$BW_OUT</code> of each sandbox, collected when they ended.
      </p>
      {files.length === 0 ? (
        <p class="empty">No artifacts{isTerminal(run.status) ? "." : " yet."}</p>
      ) : (
        <table>
          <thead>
            <tr>
              <th style="width:8rem">Sandbox</th>
              <th>Path</th>
              <th style="width:7rem">Size</th>
              <th>SHA-256</th>
            </tr>
          </thead>
          <tbody>
            {files.map((a) => (
              <tr>
                <td>{a.sandboxName}</td>
                <td class="mono">
                  <a href={`/runs/${run.id}/artifacts/${a.id}`} download>
                    {a.path}
                  </a>
                </td>
                <td>{size(a.size)}</td>
                <td class="mono muted">{a.sha256}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {cut.length === 0 ? null : (
        <>
          <h3>Cut</h3>
          <p class="muted">
            Not collected: past the size or count bound, a symlink (never followed), or not a regular readable
            file.
          </p>
          <table>
            <thead>
              <tr>
                <th style="width:8rem">Sandbox</th>
                <th>Path</th>
                <th style="width:8rem">Why</th>
                <th style="width:7rem">Size</th>
              </tr>
            </thead>
            <tbody>
              {cut.map((a) => (
                <tr>
                  <td>{a.sandboxName}</td>
                  <td class="mono">{a.path}</td>
                  <td>{a.cutReason}</td>
                  <td>{size(a.size)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </>
      )}
    </section>
  );
}

export function BugReports(props: { view: RunView }) {
  const { run, reports, csrf, query } = props.view;
  return (
    <section id="reports">
      <h2>Bug reports</h2>
      {!reports.ok ? (
        <BadPage runId={run.id} anchor="reports" detail={reports.error.detail} />
      ) : reports.value.items.length === 0 ? (
        <p class="empty">No bug reports{query.reports ? " on this page" : ""}.</p>
      ) : (
        <>
          {reports.value.items.map((r) => (
            <details>
              <summary>
                <strong>{r.title}</strong> <span class="muted">· </span>
                <When at={r.createdAt} /> <span class="mono muted">{r.id}</span>
              </summary>
              <pre>{r.body}</pre>
            </details>
          ))}
          {nextLink(run.id, query, "reports", reports.value.nextCursor)}
        </>
      )}
      <h3>File a bug report</h3>
      <PostForm action={`/runs/${run.id}/bug-reports`} csrf={csrf}>
        <p>
          <label>
            Title{" "}
            <input
              type="text"
              name="title"
              required
              maxlength={200}
              size={60}
              value={props.view.keptTitle ?? ""}
            />
          </label>
        </p>
        <p>
          <label>
            What happened
            <br />
            <textarea name="body" required rows={6} />
          </label>
        </p>
        <button type="submit">File the report</button>{" "}
        <span class="muted">It joins the run's trace; ended runs take reports too.</span>
      </PostForm>
    </section>
  );
}
