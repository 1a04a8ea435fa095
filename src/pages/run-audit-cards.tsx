import type { LimitKindName } from "@benchwright/shared/contract/http-limits";
import type { Child } from "hono/jsx";
import type { Result } from "../errors";
import type { Page } from "../lists/cursor";
import { PostForm, When } from "./layout";
import type { RunView } from "./run-page";

// The run page's audit cards: the hosts the run's boundary refused (each with "Allow this host"),
// its egress routes, the requests refused for a method or path limit and the placeholders sent
// to another host, a page of each, with the paging link they and the bug reports use. Hosts,
// methods, secret names and counts only: paths, queries, bodies and values are never recorded.
// The four are one card (AuditCard) given its columns.

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

/** A column of an audit card: its heading, width and how a row fills it. */
interface Column<Row> {
  head: string;
  width?: string;
  cell: (row: Row) => Child;
  class?: string;
}

/** One page of one run tally as a card: a table of its rows, or why not, and the next-page link. */
function AuditCard<Row>(props: {
  view: RunView;
  anchor: string;
  queryKey: keyof RunView["query"];
  title: string;
  intro?: Child;
  page: Result<Page<Row>>;
  empty: string;
  columns: Column<Row>[];
}) {
  const { run, query } = props.view;
  const { page } = props;
  return (
    <section id={props.anchor}>
      <h2>{props.title}</h2>
      {props.intro ? <p class="muted">{props.intro}</p> : null}
      {!page.ok ? (
        <BadPage runId={run.id} anchor={props.anchor} detail={page.error.detail} />
      ) : page.value.items.length === 0 ? (
        <p class="empty">
          {props.empty}
          {query[props.queryKey] ? " on this page" : ""}.
        </p>
      ) : (
        <>
          <table>
            <thead>
              <tr>
                {props.columns.map((c) => (
                  <th {...(c.width ? { style: `width:${c.width}` } : {})}>{c.head}</th>
                ))}
              </tr>
            </thead>
            <tbody>
              {page.value.items.map((row) => (
                <tr>
                  {props.columns.map((c) => (
                    <td {...(c.class ? { class: c.class } : {})}>{c.cell(row)}</td>
                  ))}
                </tr>
              ))}
            </tbody>
          </table>
          {nextLink(run.id, query, props.queryKey, page.value.nextCursor)}
        </>
      )}
    </section>
  );
}

const hostColumn = { head: "Host", class: "mono host", cell: (r: { host: string }) => r.host };
const countColumn = { head: "Count", width: "5rem", cell: (r: { count: number }) => r.count };
const lastSeenColumn = {
  head: "Last seen",
  width: "11rem",
  cell: (r: { lastSeen: Date }) => <When at={r.lastSeen} />,
};

export function DeniedHosts(props: { view: RunView }) {
  const { run, csrf } = props.view;
  return (
    <AuditCard
      view={props.view}
      anchor="denied"
      queryKey="blocked"
      title="Denied hosts"
      intro="Hosts this run's boundary refused (host and counts only). Allowing one adds an allow entry to the vault; the run's proxy picks it up within seconds."
      page={props.view.blocked}
      empty="No host was refused"
      columns={[
        hostColumn,
        { head: "Count", width: "5rem", cell: (h) => h.seenCount },
        { head: "First seen", width: "11rem", cell: (h) => <When at={h.firstSeen} /> },
        lastSeenColumn,
        {
          head: "Source",
          width: "6rem",
          cell: (h) => (h.source === "local_agent" ? "local agent" : h.source),
        },
        {
          head: "",
          width: "10rem",
          cell: (h) => (
            <PostForm action={`/runs/${run.id}/allow-host`} csrf={csrf} class="inline">
              <input type="hidden" name="host" value={h.host} />
              <button type="submit">Allow this host</button>
            </PostForm>
          ),
        },
      ]}
    />
  );
}

export function EgressRoutes(props: { view: RunView }) {
  return (
    <AuditCard
      view={props.view}
      anchor="routes"
      queryKey="routes"
      title="Egress routes"
      page={props.view.routes}
      empty="No traffic recorded"
      columns={[
        hostColumn,
        { head: "Route", width: "6rem", cell: (r) => r.route },
        countColumn,
        lastSeenColumn,
      ]}
    />
  );
}

const LIMIT_LABELS: Record<LimitKindName, string> = {
  method: "method not in the list",
  path: "path not in the list",
  unnormalisable_path: "path that does not normalise",
};

export function LimitRefusals(props: { view: RunView }) {
  return (
    <AuditCard
      view={props.view}
      anchor="limits"
      queryKey="limits"
      title="Refused by a method or path limit"
      intro="Requests the run's proxy refused (403) because a host entry or rule of the vault limits the methods or paths it lets through. Host, method and which limit only: the path is never recorded."
      page={props.view.limitRefusals}
      empty="No request was refused by a limit"
      columns={[
        hostColumn,
        { head: "Method", width: "7rem", class: "mono", cell: (r) => r.method },
        { head: "Limit", width: "14rem", cell: (r) => LIMIT_LABELS[r.limit] },
        countColumn,
        lastSeenColumn,
      ]}
    />
  );
}

export function StrayPlaceholders(props: { view: RunView }) {
  return (
    <AuditCard
      view={props.view}
      anchor="strays"
      queryKey="strays"
      title="Placeholders sent to another host"
      intro="A secret's placeholder found in a request to a host other than its rule's. It went out unswapped: that host saw only the placeholder, never the secret. Host and secret name only."
      page={props.view.strayPlaceholders}
      empty="No placeholder went to another host"
      columns={[
        hostColumn,
        { head: "Secret", width: "14rem", class: "mono", cell: (r) => r.secret },
        countColumn,
        lastSeenColumn,
      ]}
    />
  );
}
