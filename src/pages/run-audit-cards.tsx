import type { LimitKindName } from "@benchwright/shared/contract/http-limits";
import { PostForm, When } from "./layout";
import type { RunView } from "./run-page";

// The run page's audit cards: the hosts the run's boundary refused (each with "Allow this host"),
// its egress routes, the requests refused for a method or path limit and the placeholders sent
// to another host, a page of each, with the paging link they and the bug reports use. Hosts,
// methods, secret names and counts only: paths, queries, bodies and values are never recorded.

export function nextLink(
  runId: string,
  query: RunView["query"],
  key: keyof RunView["query"],
  cursor: string | null,
) {
  if (!cursor) return null;
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(query)) if (v && k !== key) q.set(k, v);
  q.set(key, cursor);
  return <a href={`/runs/${runId}?${q.toString()}#${key === "blocked" ? "denied" : key}`}>Next page →</a>;
}

export function BadPage(props: { runId: string; anchor: string; detail: string }) {
  return (
    <p class="error">
      {props.detail} <a href={`/runs/${props.runId}#${props.anchor}`}>First page</a>
    </p>
  );
}

export function DeniedHosts(props: { view: RunView }) {
  const { run, blocked, csrf, query } = props.view;
  return (
    <section id="denied">
      <h2>Denied hosts</h2>
      <p class="muted">
        Hosts this run's boundary refused (host and counts only). Allowing one adds an allow entry to the
        vault; the run's proxy picks it up within seconds.
      </p>
      {!blocked.ok ? (
        <BadPage runId={run.id} anchor="denied" detail={blocked.error.detail} />
      ) : blocked.value.items.length === 0 ? (
        <p class="empty">No host was refused{query.blocked ? " on this page" : ""}.</p>
      ) : (
        <>
          <table>
            <thead>
              <tr>
                <th>Host</th>
                <th style="width:5rem">Count</th>
                <th style="width:11rem">First seen</th>
                <th style="width:11rem">Last seen</th>
                <th style="width:6rem">Source</th>
                <th style="width:10rem" />
              </tr>
            </thead>
            <tbody>
              {blocked.value.items.map((h) => (
                <tr>
                  <td class="mono host">{h.host}</td>
                  <td>{h.seenCount}</td>
                  <td>
                    <When at={h.firstSeen} />
                  </td>
                  <td>
                    <When at={h.lastSeen} />
                  </td>
                  <td>{h.source === "local_agent" ? "local agent" : h.source}</td>
                  <td>
                    <PostForm action={`/runs/${run.id}/allow-host`} csrf={csrf} class="inline">
                      <input type="hidden" name="host" value={h.host} />
                      <button type="submit">Allow this host</button>
                    </PostForm>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          {nextLink(run.id, query, "blocked", blocked.value.nextCursor)}
        </>
      )}
    </section>
  );
}

export function EgressRoutes(props: { view: RunView }) {
  const { run, routes, query } = props.view;
  return (
    <section id="routes">
      <h2>Egress routes</h2>
      {!routes.ok ? (
        <BadPage runId={run.id} anchor="routes" detail={routes.error.detail} />
      ) : routes.value.items.length === 0 ? (
        <p class="empty">No traffic recorded{query.routes ? " on this page" : ""}.</p>
      ) : (
        <>
          <table>
            <thead>
              <tr>
                <th>Host</th>
                <th style="width:6rem">Route</th>
                <th style="width:5rem">Count</th>
                <th style="width:11rem">Last seen</th>
              </tr>
            </thead>
            <tbody>
              {routes.value.items.map((r) => (
                <tr>
                  <td class="mono host">{r.host}</td>
                  <td>{r.route}</td>
                  <td>{r.count}</td>
                  <td>
                    <When at={r.lastSeen} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          {nextLink(run.id, query, "routes", routes.value.nextCursor)}
        </>
      )}
    </section>
  );
}

const LIMIT_LABELS: Record<LimitKindName, string> = {
  method: "method not in the list",
  path: "path not in the list",
  unnormalisable_path: "path that does not normalise",
};

export function LimitRefusals(props: { view: RunView }) {
  const { run, limitRefusals: page, query } = props.view;
  return (
    <section id="limits">
      <h2>Refused by a method or path limit</h2>
      <p class="muted">
        Requests the run's proxy refused (403) because a host entry or rule of the vault limits the methods or
        paths it lets through. Host, method and which limit only: the path is never recorded.
      </p>
      {!page.ok ? (
        <BadPage runId={run.id} anchor="limits" detail={page.error.detail} />
      ) : page.value.items.length === 0 ? (
        <p class="empty">No request was refused by a limit{query.limits ? " on this page" : ""}.</p>
      ) : (
        <>
          <table>
            <thead>
              <tr>
                <th>Host</th>
                <th style="width:7rem">Method</th>
                <th style="width:14rem">Limit</th>
                <th style="width:5rem">Count</th>
                <th style="width:11rem">Last seen</th>
              </tr>
            </thead>
            <tbody>
              {page.value.items.map((r) => (
                <tr>
                  <td class="mono host">{r.host}</td>
                  <td class="mono">{r.method}</td>
                  <td>{LIMIT_LABELS[r.limit]}</td>
                  <td>{r.count}</td>
                  <td>
                    <When at={r.lastSeen} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          {nextLink(run.id, query, "limits", page.value.nextCursor)}
        </>
      )}
    </section>
  );
}

export function StrayPlaceholders(props: { view: RunView }) {
  const { run, strayPlaceholders: page, query } = props.view;
  return (
    <section id="strays">
      <h2>Placeholders sent to another host</h2>
      <p class="muted">
        A secret's placeholder found in a request to a host other than its rule's. It went out unswapped: that
        host saw only the placeholder, never the secret. Host and secret name only.
      </p>
      {!page.ok ? (
        <BadPage runId={run.id} anchor="strays" detail={page.error.detail} />
      ) : page.value.items.length === 0 ? (
        <p class="empty">No placeholder went to another host{query.strays ? " on this page" : ""}.</p>
      ) : (
        <>
          <table>
            <thead>
              <tr>
                <th>Host</th>
                <th style="width:14rem">Secret</th>
                <th style="width:5rem">Count</th>
                <th style="width:11rem">Last seen</th>
              </tr>
            </thead>
            <tbody>
              {page.value.items.map((r) => (
                <tr>
                  <td class="mono host">{r.host}</td>
                  <td class="mono">{r.secret}</td>
                  <td>{r.count}</td>
                  <td>
                    <When at={r.lastSeen} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
          {nextLink(run.id, query, "strays", page.value.nextCursor)}
        </>
      )}
    </section>
  );
}
