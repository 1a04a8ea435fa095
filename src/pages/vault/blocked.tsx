import type { HostAction } from "@benchwright/shared/contract/policy";
import { Hono } from "hono";
import type { Result } from "../../errors";
import type { Page } from "../../lists/cursor";
import type { AccountBlockedHost, BlockedDay, BlockedSource } from "../../runs/audit-log";
import { allowHosts } from "../../vault/hosts";
import type { PageEnv } from "../context";
import { act, back, type Ctx, form, PAGE, refused, text, who } from "./forms";
import { ButtonForm, CodeCell, Section, Table, when } from "./section";

// The vault page's "Recent blocked hosts": a chart of refusals per day (a server-rendered SVG:
// the pages run no script and load nothing), the hosts across all runs of the environment, each
// with "Allow this host", which posts here and adds an allow entry as POST /v1/vault/hosts would.

const n = (v: number) => v.toLocaleString("en-US");

export const BLOCKED_CHART_STYLE = `
figure.per-day{margin:.6rem 0}
svg.per-day{width:100%;max-width:44rem;height:auto;background:#f6f7f9;border:1px solid #e6e9ed;border-radius:4px;font-size:11px}
svg.per-day .bar{fill:#c23030}svg.per-day text{fill:#666}svg.per-day line{stroke:#d8dde3}
`;

// The chart's units: one column a day, the busiest day CHART_H high, the date under every other.
const COL_W = 40;
const BAR_W = 28;
const CHART_H = 100;
const TOP = 14;
const AXIS_H = 18;

/** Refusals per day, one column a day (an empty day an empty column), each titled. */
export function DeniedPerDay(props: { days: BlockedDay[] }) {
  const { days } = props;
  const total = days.reduce((sum, d) => sum + d.refusals, 0);
  if (days.length === 0 || total === 0) return null;
  const peak = Math.max(1, ...days.map((d) => d.refusals));
  const width = days.length * COL_W;
  const base = TOP + CHART_H;
  return (
    <figure class="per-day">
      <svg
        class="per-day"
        viewBox={`0 0 ${width} ${base + AXIS_H}`}
        role="img"
        aria-labelledby="per-day-title"
      >
        <title id="per-day-title">{`Refusals per day over the last ${days.length} days: ${n(total)} in all, at most ${n(peak)} a day.`}</title>
        <line x1={0} x2={width} y1={base} y2={base} />
        {days.map((d, i) => {
          const h = Math.round((d.refusals / peak) * CHART_H * 100) / 100;
          const x = i * COL_W + (COL_W - BAR_W) / 2;
          return (
            <g data-day={d.day} data-refusals={d.refusals}>
              <title>{`${d.day}: ${n(d.refusals)} refusal${d.refusals === 1 ? "" : "s"} of ${d.hosts} host${d.hosts === 1 ? "" : "s"}`}</title>
              {h > 0 ? <rect class="bar" x={x} y={base - h} width={BAR_W} height={h} /> : null}
              {d.refusals > 0 ? (
                <text x={i * COL_W + COL_W / 2} y={base - h - 3} text-anchor="middle">
                  {n(d.refusals)}
                </text>
              ) : null}
              {i % 2 === (days.length - 1) % 2 ? (
                <text x={i * COL_W + COL_W / 2} y={base + AXIS_H - 5} text-anchor="middle">
                  {d.day.slice(5)}
                </text>
              ) : null}
            </g>
          );
        })}
      </svg>
      <figcaption class="muted">
        Refusals per day (UTC), the last {days.length} days to today. Each run's count for a host falls on the
        day it last refused it.
      </figcaption>
    </figure>
  );
}

/** Hosts listed a page. */
export const BLOCKED_PAGE = 25;

const SOURCE_TEXT: Record<BlockedSource, string> = {
  proxy: "proxy",
  local_agent: "local agent",
  both: "proxy and local agent",
};

export function BlockedSection(props: {
  c: Ctx;
  csrf: string;
  page: Result<Page<AccountBlockedHost>>;
  /** Refusals per day, oldest first (blockedPerDay). */
  days: BlockedDay[];
  /** Decides a host as a run started now would (the compiled policy's own lookup). */
  decide: (host: string) => HostAction;
}) {
  const { c, csrf, page } = props;
  const cursor = c.req.query("blockedCursor");
  return (
    <Section id="blocked" title="Recent blocked hosts">
      <p class="muted">
        Hosts your runs were refused, across all runs, most recently seen first. Hosts and counts only: paths,
        queries and bodies are never recorded.
      </p>
      <DeniedPerDay days={props.days} />
      {!page.ok ? (
        <p class="error">
          {page.error.detail} <a href={`${PAGE}#blocked`}>Back to the first page</a>
        </p>
      ) : (
        <Table
          rows={page.value.items}
          empty={cursor ? "No more blocked hosts." : "No run has been refused a host yet."}
          head={["Host", "Seen", "First seen", "Last seen", "Refused by", "Runs", "Action"]}
          widths={["", "c-num", "c-date", "c-date", "c-act", "c-form", "c-btn"]}
          row={(h) => (
            <tr>
              <CodeCell text={h.host} />
              <td>{h.seenCount}</td>
              <td>{when(h.firstSeen)}</td>
              <td>{when(h.lastSeen)}</td>
              <td>{SOURCE_TEXT[h.source]}</td>
              <td>
                {h.runs.map((id, i) => (
                  <>
                    {i > 0 ? ", " : ""}
                    <a href={`/runs/${encodeURIComponent(id)}`} class="mono">
                      {id}
                    </a>
                  </>
                ))}
                {h.runCount > h.runs.length ? ` and ${h.runCount - h.runs.length} more` : ""}
              </td>
              <td>
                {props.decide(h.host) === "allow" ? (
                  <span class="muted">allowed now</span>
                ) : (
                  <ButtonForm
                    action={`${PAGE}/blocked-hosts/allow`}
                    csrf={csrf}
                    label="Allow this host"
                    hidden={{ host: h.host, blockedCursor: cursor }}
                  />
                )}
              </td>
            </tr>
          )}
        />
      )}
      {cursor || (page.ok && page.value.nextCursor) ? (
        <p class="muted">
          {cursor ? <a href={`${PAGE}#blocked`}>First page</a> : null}{" "}
          {page.ok && page.value.nextCursor ? (
            <a href={`${PAGE}?blockedCursor=${encodeURIComponent(page.value.nextCursor)}#blocked`}>
              Next page
            </a>
          ) : null}
        </p>
      ) : null}
    </Section>
  );
}

export const blockedRoutes = new Hono<PageEnv>().post(`${PAGE}/blocked-hosts/allow`, (c) =>
  act(c, "blocked", async () => {
    const f = await form(c);
    const host = text(f, "host");
    // Back to the page of the list the button was on.
    const keep = { blockedCursor: f.blockedCursor };
    if (!host) return back(c, { error: "Which host? The form named none." }, "blocked", keep);
    if (host.length > 300)
      return back(c, { error: "A host name is at most 300 characters." }, "blocked", keep);
    const done = await allowHosts(c.var.db, who(c), [host]);
    if (!done.ok) return refused(c, done.error, "blocked", keep);
    const name = done.value.entries[0]?.pattern ?? host;
    const ok =
      done.value.unchanged > 0
        ? `${name} was allowed already.`
        : `Allowed ${name}: runs reach it from now on (a running run's proxy picks the change up within seconds).`;
    return back(c, { ok }, "blocked", keep);
  }),
);
