import type { HostAction } from "@benchwright/shared/contract/policy";
import { Hono } from "hono";
import { fail, ok, type Result } from "../../errors";
import { dryRun, type HostOutcome, type RuleView } from "../../vault/dry-run";
import { putHost } from "../../vault/hosts";
import { setDefault } from "../../vault/settings";
import type { PageEnv } from "../context";
import { Layout, PostForm } from "../layout";
import { act, back, type Ctx, form, type Keep, keepQuery, PAGE, refused, text, who } from "./forms";
import { hostAction } from "./hosts";
import { CatchAllCosts, RoutingLine } from "./routing";
import { CodeCell, LimitsCell, plural, Section, Table } from "./section";

// The vault page's dry run (src/vault/dry-run.ts): a draft host entry and/or default tried
// against the hosts a run recorded, on a page of its own, then saved as it was tried or not. It
// shows the limits each host and rule would hold requests to, and the placeholder variables the
// run's sandboxes would get.

/** Runs the form offers to replay. */
export const RECENT_RUNS = 20;

/** The draft the dry-run form describes: one host entry to add or switch, and/or the default. */
interface DraftForm {
  runId?: string | undefined;
  pattern?: string | undefined;
  action?: HostAction | undefined;
  default?: HostAction | undefined;
}

function draftFrom(
  get: (k: string) => string | undefined,
): Result<Required<Pick<DraftForm, "runId">> & DraftForm> {
  const runId = get("runId")?.trim();
  const pattern = get("pattern")?.trim() || undefined;
  const action = get("action") ? hostAction(get("action")) : null;
  const def = get("default") ? hostAction(get("default")) : null;
  if (!runId) return fail("invalid_request", "Pick a run: the dry run replays the hosts it recorded.");
  if (runId.length > 64) return fail("invalid_request", "A run id is at most 64 characters.");
  if (pattern && pattern.length > 300)
    return fail("invalid_request", "A host pattern is at most 300 characters.");
  if (pattern && !action) return fail("invalid_request", "Pick allow or block for the host entry.");
  if (get("default") && !def)
    return fail("invalid_request", "Pick allow or block as the default, or leave it as it is.");
  if (!pattern && !def) return fail("invalid_request", "Nothing to try: give a host entry or a new default.");
  return ok({
    runId,
    pattern,
    action: pattern ? (action ?? undefined) : undefined,
    default: def ?? undefined,
  });
}

const draftKeep = (get: (k: string) => string | undefined): Keep => ({
  dryRunId: get("runId"),
  dryPattern: get("pattern"),
  dryAction: get("action"),
  dryDefault: get("default"),
});

function describeDraft(d: DraftForm): string {
  const parts: string[] = [];
  if (d.pattern) parts.push(`${d.action === "allow" ? "allow" : "block"} ${d.pattern}`);
  if (d.default) parts.push(`hosts no entry names ${d.default === "allow" ? "allowed" : "blocked"}`);
  return parts.join("; ");
}

export function DrySection(props: { c: Ctx; runs: string[] }) {
  const q = (k: string) => props.c.req.query(k);
  return (
    <Section id="dry-run" title="Dry run a change">
      <p class="muted">
        Try a change against a run before saving it: every host the run reached or was refused is decided
        again, as its proxy would, under the change and under the vault as it is now. Nothing is saved until
        you say so.
      </p>
      {props.runs.length === 0 && !q("dryRunId") ? (
        <p class="empty">No runs yet: a dry run replays the hosts a run recorded.</p>
      ) : (
        <form method="get" action={`${PAGE}/dry-run`} class="fields">
          <label>
            Run{" "}
            <input
              name="runId"
              required
              maxlength={64}
              list="recent-runs"
              size={30}
              value={q("dryRunId") ?? ""}
            />
          </label>
          <datalist id="recent-runs">
            {props.runs.map((id) => (
              <option value={id} />
            ))}
          </datalist>{" "}
          <label>
            Host entry{" "}
            <input
              name="pattern"
              maxlength={300}
              placeholder="*.evil.example"
              value={q("dryPattern") ?? ""}
            />
          </label>{" "}
          <select name="action" aria-label="Host entry action">
            {(["block", "allow"] as const).map((a) => (
              <option value={a} selected={a === (q("dryAction") ?? "block")}>
                {a}
              </option>
            ))}
          </select>{" "}
          <label>
            Default{" "}
            <select name="default">
              <option value="">as it is</option>
              {(["allow", "block"] as const).map((a) => (
                <option value={a} selected={a === q("dryDefault")}>
                  {a}
                </option>
              ))}
            </select>
          </label>{" "}
          <button type="submit">Dry run</button>
        </form>
      )}
    </Section>
  );
}

function Outcome(props: { o: HostOutcome; rules: RuleView[] }) {
  const { o } = props;
  if (o.action === "block") return <strong>block</strong>;
  const rule = o.rule === null ? null : props.rules[o.rule];
  return (
    <>
      allow
      {o.rule !== null ? (
        <>
          {", inject rule "}#{o.rule + 1}
          {rule ? (
            <>
              {" "}
              (<code>{rule.secret}</code>)
            </>
          ) : null}
        </>
      ) : null}
      {`, ${o.route}`}
      {o.methods ? (
        <>
          {", only "}
          <code>{o.methods.join(" ")}</code>
        </>
      ) : null}
      {o.paths ? (
        <>
          {", paths "}
          <code>{o.paths.join(" ")}</code>
        </>
      ) : null}
    </>
  );
}

async function dryRunPage(c: Ctx): Promise<Response> {
  const get = (k: string) => c.req.query(k);
  const draft = draftFrom(get);
  if (!draft.ok) return refused(c, draft.error, "dry-run", draftKeep(get));
  const d = draft.value;
  const result = await dryRun(c.var.db, who(c), {
    runId: d.runId,
    changes: {
      default: d.default,
      hosts: d.pattern && d.action ? { upsert: [{ pattern: d.pattern, action: d.action }] } : undefined,
    },
  });
  if (!result.ok) return refused(c, result.error, "dry-run", draftKeep(get));
  const r = result.value;
  const csrf = c.var.session.csrf;
  const toCatchAll = r.routing.draft.mode === "catch-all" && r.routing.current.mode !== "catch-all";
  return c.html(
    <Layout title="Dry run" csrf={csrf}>
      <h1>Dry run</h1>
      <p class="muted">
        <a href={`${PAGE}?${keepQuery(draftKeep(get))}#dry-run`}>Back to the vault</a>
      </p>
      <p>
        The change: <strong>{describeDraft(d)}</strong>, tried against run{" "}
        <a href={`/runs/${encodeURIComponent(r.runId)}`} class="mono">
          {r.runId}
        </a>
        .
      </p>
      <Section id="dry-routing" title="Routing">
        <p>
          Now: <RoutingLine routing={r.routing.current} />
          <br />
          With the change: <RoutingLine routing={r.routing.draft} />
        </p>
        {toCatchAll ? (
          <CatchAllCosts
            blockDefault={d.default === "block"}
            csrf={csrf}
            title="This change switches runs to catch-all routing, which costs:"
          />
        ) : null}
        {r.routing.draft.mode !== r.routing.current.mode ? (
          <p class="note">
            A run already running keeps the routing it started with; the new mode applies to sandboxes made
            after the change.
          </p>
        ) : null}
      </Section>
      <Section id="dry-hosts" title="The run's hosts">
        <p class="muted">
          {`${plural(r.counts.hosts, "host")} recorded, ${r.counts.changed} decided differently.`}
          {r.truncated ? ` Showing the first ${r.hosts.length}, changed ones first.` : ""} Only hosts the run
          tried are here; hosts it never reached cannot be replayed.
        </p>
        <Table
          rows={r.hosts}
          empty="This run recorded no hosts: nothing to replay."
          head={["Host", "Now", "With the change", "Changed"]}
          widths={["", "c-form", "c-form", "c-act"]}
          row={(h) => (
            <tr>
              <CodeCell text={h.host} />
              <td>
                <Outcome o={h.current} rules={r.rules.current} />
              </td>
              <td>
                <Outcome o={h.draft} rules={r.rules.draft} />
              </td>
              <td>{h.changed ? <strong>changed</strong> : "—"}</td>
            </tr>
          )}
        />
      </Section>
      <Section id="dry-rules" title="Rules and placeholders with the change">
        <Table
          rows={r.rules.draft}
          empty="No rules: no credential is injected and the run's sandboxes get no placeholders."
          head={["#", "Host", "Secret", "Placeholder", "Limits"]}
          widths={["c-num", "", "c-name", "c-name", "c-name"]}
          row={(rule) => (
            <tr>
              <td>{rule.index + 1}</td>
              <CodeCell text={rule.host} />
              <CodeCell text={rule.secret} />
              <td>
                {rule.placeholderEnv ? <code>{rule.placeholderEnv}</code> : <span class="muted">none</span>}
                {rule.placeholderIn.includes("body") ? <span class="muted"> (+ body)</span> : null}
              </td>
              <LimitsCell methods={rule.methods} paths={rule.paths} />
            </tr>
          )}
        />
        <p class="muted">
          {r.placeholders.draft.length === 0
            ? "The run's sandboxes would get no placeholder variables."
            : `The run's sandboxes would get: ${r.placeholders.draft.map((p) => `${p.env} (${p.secret})`).join(", ")}.`}
        </p>
      </Section>
      <PostForm action={`${PAGE}/dry-run/save`} csrf={csrf} class="fields">
        {d.pattern ? <input type="hidden" name="pattern" value={d.pattern} /> : null}
        {d.action ? <input type="hidden" name="action" value={d.action} /> : null}
        {d.default ? <input type="hidden" name="default" value={d.default} /> : null}
        <button type="submit">Save this change</button> <span class="muted">{describeDraft(d)}</span>
      </PostForm>
    </Layout>,
  );
}

export const dryRunRoutes = new Hono<PageEnv>()
  .get(`${PAGE}/dry-run`, dryRunPage)
  .post(`${PAGE}/dry-run/save`, (c) =>
    act(c, "routing", async () => {
      const f = await form(c);
      const pattern = text(f, "pattern");
      const action = hostAction(f.action);
      const def = f.default ? hostAction(f.default) : null;
      if (pattern && !action) return back(c, { error: "Pick allow or block for the host entry." }, "dry-run");
      if (!pattern && !def) return back(c, { error: "Nothing to save." }, "dry-run");
      // Two vault changes when the draft has both; the entry first, so a refused entry saves nothing.
      const saved: string[] = [];
      if (pattern && action) {
        const entry = await putHost(c.var.db, who(c), { pattern, action });
        if (!entry.ok) return refused(c, entry.error, "hosts", { hostPattern: pattern, hostAction: action });
        saved.push(`${entry.value.action === "allow" ? "allowed" : "blocked"} ${entry.value.pattern}`);
      }
      if (def) {
        const settings = await setDefault(c.var.db, who(c), def);
        if (!settings.ok) {
          const done = saved.length > 0 ? ` (saved: ${saved.join("; ")})` : "";
          return back(c, { error: `${settings.error.detail}${done}` }, "routing");
        }
        saved.push(`hosts no entry names ${settings.value.default === "allow" ? "allowed" : "blocked"}`);
      }
      return back(c, { ok: `Saved: ${saved.join("; ")}.` }, "routing");
    }),
  );
