import { Hono } from "hono";
import type { Child } from "hono/jsx";
import {
  EgressVia,
  HostAction,
  InjectScheme,
  type InjectSpec,
  type PolicyDocument,
  type PolicyRouting,
  type RoutingReason,
} from "../contract/policy";
import { SecretName } from "../contract/proxy-wire";
import { fail, ok, type Result } from "../errors";
import { buildPolicyIndex } from "../policy/compile";
import { isCanonicalIp } from "../policy/host";
import { STARTER_PACK_HOSTS } from "../policy/starter-pack";
import { blockedPerDay, listBlockedHosts } from "../runs/audit-log";
import { listRuns } from "../runs/service";
import { dryRun, type HostOutcome } from "../vault/dry-run";
import {
  addStarterPack,
  deleteHost,
  getHost,
  type HostEntry,
  listHosts,
  putHost,
  updateHost,
} from "../vault/hosts";
import { listModels } from "../vault/models";
import { previewPolicy } from "../vault/policy";
import {
  createRule,
  deleteRule,
  getRule,
  listRules,
  type RuleInfo,
  type RuleInput,
  reorderRules,
  updateRule,
} from "../vault/rules";
import {
  createSecret,
  deleteSecret,
  getSecret,
  listSecrets,
  replaceSecret,
  type SecretInfo,
} from "../vault/secrets";
import { setDefault } from "../vault/settings";
import type { PageEnv } from "./context";
import { Flash, Layout, PostForm, readFlash } from "./layout";
import { BLOCKED_CHART_STYLE, BLOCKED_PAGE, BlockedSection, vaultBlockedRoutes } from "./vault-blocked";
import {
  act,
  answer,
  back,
  type Ctx,
  form,
  type Keep,
  keepQuery,
  PAGE,
  refused,
  text,
  who,
} from "./vault-forms";
import { ModelsSection, vaultModelRoutes } from "./vault-models";

// The vault page (/manage/vault): routing mode, secrets, rules, host policy, models (their own
// module, vault-models.tsx), recent blocked hosts (vault-blocked.tsx) and a dry run of a change. Every form posts to
// /manage/vault/... and is answered with a 303 back to the page with a flash (`?ok=` or `?error=`,
// the service's own detail); a refused form keeps its input (never a value). The page calls the same service functions as the API
// (src/vault/service.ts, src/runs/blocked-hosts.ts, src/vault/dry-run.ts), so it cannot drift from
// it. A secret's value is only ever read from a password field and handed to the service: it is
// never put in a page, a redirect or a flash, not even after an error.

/** Rows per section before it pages. */
const PAGE_SIZE = 100;
const MAX_SECRET_VALUE = 16_384;
const SECRET_NAME_RULE = "letters, digits, _ . - (at most 64), starting with a letter or _";

// ---- small pieces ----

const when = (d: Date) => `${d.toISOString().slice(0, 16).replace("T", " ")} UTC`;

/** Offset paging over a list the service returns whole: `?{param}=N`. */
function pageOf<T>(c: Ctx, items: readonly T[], param: string) {
  const raw = Number.parseInt(c.req.query(param) ?? "0", 10);
  const from = Number.isFinite(raw) && raw > 0 && raw < items.length ? raw : 0;
  return { rows: items.slice(from, from + PAGE_SIZE), from, total: items.length, param };
}

function Pager(props: { from: number; total: number; param: string; anchor: string }) {
  if (props.total <= PAGE_SIZE) return null;
  const link = (from: number) => `${PAGE}?${props.param}=${from}#${props.anchor}`;
  const to = Math.min(props.from + PAGE_SIZE, props.total);
  return (
    <p class="muted">
      {`${props.from + 1}–${to} of ${props.total}. `}
      {props.from > 0 ? <a href={link(Math.max(props.from - PAGE_SIZE, 0))}>Previous</a> : null}{" "}
      {to < props.total ? <a href={link(to)}>Next</a> : null}
    </p>
  );
}

function Section(props: { id: string; title: string; children?: Child }) {
  return (
    <section id={props.id}>
      <h2>{props.title}</h2>
      {props.children}
    </section>
  );
}

// ---- secrets ----

function SecretsSection(props: {
  c: Ctx;
  csrf: string;
  secrets: SecretInfo[];
  usedBy: Map<string, number[]>;
}) {
  const { c, csrf } = props;
  const page = pageOf(c, props.secrets, "secretsFrom");
  return (
    <Section id="secrets" title="Secrets">
      <p class="muted">
        Values are write-only: they are encrypted in the vault and reach only a run's proxy. This page shows
        each secret's name and fingerprint, never its value.
      </p>
      {page.total === 0 ? (
        <p class="empty">No secrets yet. Add one below, then a rule that injects it.</p>
      ) : (
        <table>
          <colgroup>
            <col class="c-name" />
            <col />
            <col class="c-date" />
            <col class="c-form" />
            <col class="c-btn" />
          </colgroup>
          <thead>
            <tr>
              <th>Name</th>
              <th>Fingerprint</th>
              <th>Updated</th>
              <th>Replace value</th>
              <th>Delete</th>
            </tr>
          </thead>
          <tbody>
            {page.rows.map((s) => {
              const used = props.usedBy.get(s.name) ?? [];
              return (
                <tr>
                  <td>
                    <code>{s.name}</code>
                    {used.length > 0 ? (
                      <div class="muted">{`used by rule ${used.map((n) => `#${n}`).join(", ")}`}</div>
                    ) : null}
                  </td>
                  <td>
                    <code>{s.fingerprint}</code>
                  </td>
                  <td>{when(s.updatedAt)}</td>
                  <td>
                    <PostForm action={`${PAGE}/secrets/${s.id}/replace`} csrf={csrf}>
                      <input
                        type="password"
                        name="value"
                        autocomplete="new-password"
                        required
                        aria-label={`New value for ${s.name}`}
                        size={16}
                      />{" "}
                      <button type="submit">Replace</button>
                    </PostForm>
                  </td>
                  <td>
                    <PostForm action={`${PAGE}/secrets/${s.id}/delete`} csrf={csrf}>
                      <button type="submit">Delete</button>
                    </PostForm>
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
      <Pager {...page} anchor="secrets" />
      <h3>Add a secret</h3>
      <PostForm action={`${PAGE}/secrets`} csrf={csrf} class="fields">
        <label>
          Name{" "}
          <input
            name="name"
            required
            maxlength={64}
            pattern="[A-Za-z_][A-Za-z0-9_.\-]{0,63}"
            placeholder="OPENROUTER_API_KEY"
            value={c.req.query("secretName") ?? ""}
          />
        </label>{" "}
        <label>
          Value <input type="password" name="value" autocomplete="new-password" required maxlength={16384} />
        </label>{" "}
        <button type="submit">Add secret</button>
      </PostForm>
    </Section>
  );
}

/** The API's own bounds on a value (the service checks its characters); never quotes it. */
function valueProblem(value: string): string | null {
  if (value === "") return "Enter the secret's value.";
  if (value.length > MAX_SECRET_VALUE) return "A secret value is at most 16 KiB.";
  return null;
}

// ---- routing mode ----

const REASONS: Record<RoutingReason, string> = {
  block_default:
    "The default is block: a host no entry allows is refused, so every connection must reach the proxy.",
  wildcard_block: "A wildcard block entry: a hosts file can only redirect exact names.",
  wildcard_rule: "A rule for a wildcard host: a hosts file can only redirect exact names.",
  ip_literal: "An entry or rule names an IP address: connections to an IP never look at the hosts file.",
  local_egress: "The run egresses through your own machine.",
  tunnel_host:
    "A host is routed through your own machine (via tunnel): only catch-all routing brings its traffic to the proxy and the tunnel.",
};

/** The entries behind a reason, so the user sees what to change. */
function culprits(doc: PolicyDocument, reason: RoutingReason): string[] {
  const blocks = doc.hosts.filter((h) => h.action === "block").map((h) => h.pattern);
  const rules = doc.rules.map((r) => r.host);
  switch (reason) {
    case "wildcard_block":
      return blocks.filter((p) => p.startsWith("*."));
    case "wildcard_rule":
      return rules.filter((p) => p.startsWith("*."));
    case "ip_literal":
      return [...new Set([...blocks, ...rules].filter(isCanonicalIp))];
    case "tunnel_host":
      return doc.hosts.filter((h) => h.via === "tunnel").map((h) => h.pattern);
    default:
      return [];
  }
}

/** The plain warning of what catch-all routing costs (the vault page and the dry run). */
function CatchAllCosts(props: { blockDefault: boolean; csrf: string; title?: string }) {
  return (
    <div class="warning">
      <p>
        <strong>{props.title ?? "What catch-all costs:"}</strong>
      </p>
      <ul>
        <li>Runs are slower: every connection goes through the proxy, not only the ones it acts on.</li>
        {props.blockDefault ? (
          <li>
            Package and source hosts (npm, PyPI, GitHub, Debian, ...) must be allowed, or installs fail.{" "}
            <PostForm action={`${PAGE}/starter-pack`} csrf={props.csrf} class="inline">
              <button type="submit">Allow the starter pack</button>
            </PostForm>
          </li>
        ) : null}
        <li>
          A run stops, before any benchmark code runs, if the redirect cannot be installed in its sandbox.
        </li>
      </ul>
    </div>
  );
}

function RoutingSection(props: { doc: PolicyDocument; csrf: string }) {
  const { doc } = props;
  const catchAll = doc.routing.mode === "catch-all";
  return (
    <Section id="routing" title="Routing mode">
      <p>
        A run started now gets <strong>{catchAll ? "catch-all" : "default"}</strong> routing
        <span class="muted">{` (vault version ${doc.version})`}</span>.{" "}
        {catchAll
          ? "Every outbound connection on ports 80 and 443 goes to the run's proxy, which is its only way out."
          : "Only the hosts the vault names exactly (rules and block entries) are sent to the proxy, through the sandbox's hosts file; everything else goes direct. On the local backend the proxy also sees every other connection on ports 80 and 443 and refuses a blocked name there, but a block does not stop code that sends another name to a blocked host's address, nor other ports; on sandbox0 and E2B it holds only for code that uses the hosts file."}
      </p>
      {doc.routing.reasons.length > 0 ? (
        <>
          <p>Why catch-all:</p>
          <ul>
            {doc.routing.reasons.map((r) => {
              const which = culprits(doc, r);
              return (
                <li>
                  {REASONS[r]}
                  {which.length > 0 ? (
                    <>
                      {" "}
                      {which.slice(0, 10).map((w, i) => (
                        <>
                          {i > 0 ? ", " : ""}
                          <code>{w}</code>
                        </>
                      ))}
                      {which.length > 10 ? ` and ${which.length - 10} more` : ""}
                    </>
                  ) : null}
                </li>
              );
            })}
          </ul>
        </>
      ) : null}
      {catchAll ? <CatchAllCosts blockDefault={doc.default === "block"} csrf={props.csrf} /> : null}
      <p class="muted">A run that egresses through your own machine always gets catch-all routing.</p>
      {doc.note ? <p class="note">{doc.note}</p> : null}
    </Section>
  );
}

// ---- rules ----

const injectText = (i: InjectSpec) =>
  i.scheme === "query" ? `query ?${i.name}=` : `${i.scheme} → ${i.name}`;

/** The fields of a rule, for adding one (empty) or editing one (filled in). */
function RuleFields(props: {
  secrets: string[];
  host?: string | undefined;
  secret?: string | undefined;
  scheme?: string | undefined;
  header?: string | undefined;
}) {
  const scheme = props.scheme ?? "bearer";
  return (
    <>
      <label>
        Host{" "}
        <input
          name="host"
          required
          maxlength={300}
          placeholder="api.openrouter.ai"
          value={props.host ?? ""}
        />
      </label>{" "}
      <label>
        Secret{" "}
        <select name="secret" required>
          {props.secrets.map((n) => (
            <option value={n} selected={n === props.secret}>
              {n}
            </option>
          ))}
        </select>
      </label>{" "}
      <label>
        Inject as{" "}
        <select name="scheme">
          {InjectScheme.options.map((o) => (
            <option value={o} selected={o === scheme}>
              {SCHEME_TEXT[o]}
            </option>
          ))}
        </select>
      </label>{" "}
      <label>
        Header or parameter{" "}
        <input name="header" maxlength={128} placeholder="authorization" value={props.header ?? ""} />
      </label>
    </>
  );
}

const SCHEME_TEXT: Record<InjectScheme, string> = {
  bearer: "bearer (Authorization: Bearer …)",
  basic: "basic (user:password)",
  raw: "raw header value",
  query: "query parameter",
};

function RulesSection(props: { c: Ctx; csrf: string; rules: RuleInfo[]; secrets: string[] }) {
  const { c, csrf, rules } = props;
  const page = pageOf(c, rules, "rulesFrom");
  return (
    <Section id="rules" title="Rules, in order">
      <p class="muted">
        For a request to a host, the first rule whose host matches injects its secret. A rule's host is
        allowed for as long as the rule exists.
      </p>
      {page.total === 0 ? (
        <p class="empty">No rules yet: no credential is injected anywhere.</p>
      ) : (
        <table>
          <colgroup>
            <col class="c-num" />
            <col />
            <col class="c-name" />
            <col class="c-name" />
            <col class="c-btn" />
            <col class="c-act" />
            <col class="c-act" />
          </colgroup>
          <thead>
            <tr>
              <th>#</th>
              <th>Host</th>
              <th>Secret</th>
              <th>Inject</th>
              <th>Order</th>
              <th>Edit</th>
              <th>Delete</th>
            </tr>
          </thead>
          <tbody>
            {page.rows.map((r, i) => {
              const at = page.from + i;
              return (
                <tr>
                  <td>{at + 1}</td>
                  <td>
                    <code>{r.host}</code>
                  </td>
                  <td>
                    <code>{r.secret}</code>
                  </td>
                  <td>{injectText(r.inject)}</td>
                  <td>
                    {at > 0 ? (
                      <PostForm action={`${PAGE}/rules/${r.id}/move`} csrf={csrf} class="inline">
                        <input type="hidden" name="direction" value="up" />
                        <button type="submit" title="Move up">
                          Up
                        </button>
                      </PostForm>
                    ) : null}{" "}
                    {at < rules.length - 1 ? (
                      <PostForm action={`${PAGE}/rules/${r.id}/move`} csrf={csrf} class="inline">
                        <input type="hidden" name="direction" value="down" />
                        <button type="submit" title="Move down">
                          Down
                        </button>
                      </PostForm>
                    ) : null}
                  </td>
                  <td>
                    <a href={`${PAGE}/rules/${r.id}/edit`}>Edit</a>
                  </td>
                  <td>
                    <PostForm action={`${PAGE}/rules/${r.id}/delete`} csrf={csrf}>
                      <button type="submit">Delete</button>
                    </PostForm>
                  </td>
                </tr>
              );
            })}
          </tbody>
        </table>
      )}
      <Pager {...page} anchor="rules" />
      <h3>Add a rule</h3>
      {props.secrets.length === 0 ? (
        <p class="empty">Add a secret first: a rule injects one.</p>
      ) : (
        <PostForm action={`${PAGE}/rules`} csrf={csrf} class="fields">
          <RuleFields
            secrets={props.secrets}
            host={c.req.query("ruleHost")}
            secret={c.req.query("ruleSecret")}
            scheme={c.req.query("ruleScheme")}
            header={c.req.query("ruleHeader")}
          />{" "}
          <button type="submit">Add rule</button>
        </PostForm>
      )}
    </Section>
  );
}

/** A rule form's fields, checked as the API checks its body; the service checks the rest. */
function ruleInput(f: Record<string, string>): Result<RuleInput> {
  const host = text(f, "host");
  const secret = text(f, "secret");
  const scheme = InjectScheme.safeParse(text(f, "scheme") ?? "bearer");
  const name = text(f, "header");
  if (!host) return fail("invalid_request", "Give the rule a host.");
  if (host.length > 300) return fail("invalid_request", "A host is at most 300 characters.");
  if (!secret) return fail("invalid_request", "Pick the secret the rule injects.");
  if (!SecretName.safeParse(secret).success) return fail("invalid_request", "That is not a secret name.");
  if (!scheme.success) return fail("invalid_request", "Pick how the secret is injected.");
  if (name && name.length > 128)
    return fail("invalid_request", "A header or parameter name is at most 128 characters.");
  return ok({ host, secret, inject: { scheme: scheme.data, name } });
}

const ruleKeep = (f: Record<string, string>): Keep => ({
  ruleHost: f.host,
  ruleSecret: f.secret,
  ruleScheme: f.scheme,
  ruleHeader: f.header,
});

async function ruleEditPage(c: Ctx): Promise<Response> {
  const id = c.req.param("id") ?? "";
  const [rule, secrets] = await Promise.all([getRule(db(c), who(c), id), listSecrets(db(c), who(c))]);
  const csrf = c.var.session.csrf;
  if (!rule.ok) {
    return c.html(
      <Layout title="No such rule" csrf={csrf}>
        <h1>No such rule</h1>
        <p class="error">{rule.error.detail}</p>
        <p>
          <a href={`${PAGE}#rules`}>Back to the vault</a>
        </p>
      </Layout>,
      404,
    );
  }
  const r = rule.value;
  const q = (k: string) => c.req.query(k);
  return c.html(
    <Layout title="Edit rule" csrf={csrf}>
      <h1>Edit rule</h1>
      <Flash {...(await readFlash(csrf, q))} />
      <p class="muted">
        <a href={`${PAGE}#rules`}>Back to the vault</a>
      </p>
      <PostForm action={`${PAGE}/rules/${r.id}`} csrf={csrf} class="fields">
        <RuleFields
          secrets={secrets.map((s) => s.name)}
          host={q("ruleHost") ?? r.host}
          secret={q("ruleSecret") ?? r.secret}
          scheme={q("ruleScheme") ?? r.inject.scheme}
          header={q("ruleHeader") ?? r.inject.name}
        />{" "}
        <button type="submit">Save rule</button>
      </PostForm>
    </Layout>,
  );
}

// ---- host policy ----

function HostsSection(props: { c: Ctx; csrf: string; hosts: HostEntry[]; defaultAction: HostAction }) {
  const { c, csrf } = props;
  const page = pageOf(c, props.hosts, "hostsFrom");
  const other = (a: HostAction): HostAction => (a === "allow" ? "block" : "allow");
  return (
    <Section id="hosts" title="Host policy">
      <PostForm action={`${PAGE}/default`} csrf={csrf} class="fields">
        <label>
          Hosts no entry names are{" "}
          <select name="default">
            {(["allow", "block"] as const).map((a) => (
              <option value={a} selected={a === props.defaultAction}>
                {a === "allow" ? "allowed" : "blocked"}
              </option>
            ))}
          </select>
        </label>{" "}
        <button type="submit">Save default</button>
      </PostForm>
      <div class="fields">
        <PostForm action={`${PAGE}/starter-pack`} csrf={csrf} class="inline">
          <button type="submit">Add the starter pack</button>
        </PostForm>{" "}
        <span class="muted">
          allows {STARTER_PACK_HOSTS.length} package and source hosts (npm, PyPI, GitHub, Debian, Ubuntu,
          crates, Go, Maven, ...); entries you have are left as they are.
        </span>
      </div>
      {page.total === 0 ? (
        <p class="empty">No host entries: every host gets the default.</p>
      ) : (
        <table>
          <colgroup>
            <col />
            <col class="c-name" />
            <col class="c-name" />
            <col class="c-btn" />
            <col class="c-btn" />
          </colgroup>
          <thead>
            <tr>
              <th>Pattern</th>
              <th>Action</th>
              <th>Route</th>
              <th>Change</th>
              <th>Delete</th>
            </tr>
          </thead>
          <tbody>
            {page.rows.map((h) => (
              <tr>
                <td>
                  <code>{h.pattern}</code>
                </td>
                <td>
                  {h.action}
                  {h.implicit ? <span class="muted"> (for a rule)</span> : null}
                </td>
                <td>
                  {h.action === "block" ? (
                    <span class="muted">—</span>
                  ) : (
                    <PostForm action={`${PAGE}/hosts/${h.id}`} csrf={csrf}>
                      <ViaSelect selected={h.via} label={`Route of ${h.pattern}`} />{" "}
                      <button type="submit">Set</button>
                    </PostForm>
                  )}
                </td>
                <td>
                  <PostForm action={`${PAGE}/hosts/${h.id}`} csrf={csrf}>
                    <input type="hidden" name="action" value={other(h.action)} />
                    <button type="submit">{other(h.action) === "allow" ? "Allow" : "Block"}</button>
                  </PostForm>
                </td>
                <td>
                  <PostForm action={`${PAGE}/hosts/${h.id}/delete`} csrf={csrf}>
                    <button type="submit">Delete</button>
                  </PostForm>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      <Pager {...page} anchor="hosts" />
      <h3>Allow or block a host</h3>
      <PostForm action={`${PAGE}/hosts`} csrf={csrf} class="fields">
        <label>
          Host or <code>*.domain</code>{" "}
          <input
            name="pattern"
            required
            maxlength={300}
            placeholder="*.evil.example"
            value={c.req.query("hostPattern") ?? ""}
          />
        </label>{" "}
        <select name="action" aria-label="Action">
          {(["block", "allow"] as const).map((a) => (
            <option value={a} selected={a === (c.req.query("hostAction") ?? "block")}>
              {a}
            </option>
          ))}
        </select>{" "}
        <ViaSelect selected={hostVia(c.req.query("hostVia")) ?? null} label="Route (allowed hosts only)" />{" "}
        <button type="submit">Save entry</button>
      </PostForm>
      <p class="muted">
        An allowed host's route: <strong>tunnel</strong> sends its traffic through your own machine (the
        egress agent), which makes runs use catch-all routing; <strong>direct</strong> sends it straight out;
        unset, the run decides (a run launched with egress "local" sends everything through your machine). A
        blocked host has no route.
      </p>
    </Section>
  );
}

/** The route choice of an allowed host; "" is unset (the run's egress decides). */
function ViaSelect(props: { selected: EgressVia | null; label: string }) {
  const options: [string, string][] = [
    ["", "as the run's egress"],
    ["tunnel", "tunnel (your machine)"],
    ["direct", "direct"],
  ];
  return (
    <select name="via" aria-label={props.label}>
      {options.map(([value, label]) => (
        <option value={value} selected={value === (props.selected ?? "")}>
          {label}
        </option>
      ))}
    </select>
  );
}

function hostAction(v: string | undefined): HostAction | null {
  const parsed = HostAction.safeParse(v);
  return parsed.success ? parsed.data : null;
}

/** A form's route: "" or absent → null (unset); anything else must be tunnel or direct. */
function hostVia(v: string | undefined): EgressVia | null | undefined {
  if (v === undefined || v === "") return null;
  const parsed = EgressVia.safeParse(v);
  return parsed.success ? parsed.data : undefined;
}

// ---- dry run ----

const RECENT_RUNS = 20;

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

function DrySection(props: { c: Ctx; runs: string[] }) {
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

function Outcome(props: { o: HostOutcome; rules: RuleInfo[] }) {
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
    </>
  );
}

function RoutingLine(props: { routing: PolicyRouting }) {
  const { mode, reasons } = props.routing;
  return (
    <>
      <strong>{mode}</strong>
      {reasons.length > 0 ? ` (${reasons.map((r) => REASONS[r].replace(/[:.].*$/, "")).join("; ")})` : ""}
    </>
  );
}

async function dryRunPage(c: Ctx): Promise<Response> {
  const get = (k: string) => c.req.query(k);
  const draft = draftFrom(get);
  if (!draft.ok) return refused(c, draft.error, "dry-run", draftKeep(get));
  const d = draft.value;
  const [result, rules] = await Promise.all([
    dryRun(db(c), who(c), {
      runId: d.runId,
      changes: {
        default: d.default,
        hosts: d.pattern && d.action ? { upsert: [{ pattern: d.pattern, action: d.action }] } : undefined,
      },
    }),
    listRules(db(c), who(c)),
  ]);
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
        {r.hosts.length === 0 ? (
          <p class="empty">This run recorded no hosts: nothing to replay.</p>
        ) : (
          <table>
            <colgroup>
              <col />
              <col class="c-form" />
              <col class="c-form" />
              <col class="c-act" />
            </colgroup>
            <thead>
              <tr>
                <th>Host</th>
                <th>Now</th>
                <th>With the change</th>
                <th>Changed</th>
              </tr>
            </thead>
            <tbody>
              {r.hosts.map((h) => (
                <tr>
                  <td>
                    <code>{h.host}</code>
                  </td>
                  <td>
                    <Outcome o={h.current} rules={rules} />
                  </td>
                  <td>
                    <Outcome o={h.draft} rules={rules} />
                  </td>
                  <td>{h.changed ? <strong>changed</strong> : "—"}</td>
                </tr>
              ))}
            </tbody>
          </table>
        )}
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

// ---- the page ----

async function vaultPage(c: Ctx): Promise<Response> {
  const p = who(c);
  const [secrets, rules, hosts, models, doc, blocked, perDay, recent] = await Promise.all([
    listSecrets(db(c), p),
    listRules(db(c), p),
    listHosts(db(c), p),
    listModels(db(c), p),
    previewPolicy(db(c), p, { egress: "direct" }),
    listBlockedHosts(db(c), p, { limit: BLOCKED_PAGE, cursor: c.req.query("blockedCursor") || undefined }),
    blockedPerDay(db(c), p, new Date()),
    listRuns(db(c), p, RECENT_RUNS, undefined),
  ]);
  const index = buildPolicyIndex(doc);
  const usedBy = new Map<string, number[]>();
  for (const [i, r] of rules.entries()) usedBy.set(r.secret, [...(usedBy.get(r.secret) ?? []), i + 1]);
  const csrf = c.var.session.csrf;
  return c.html(
    <Layout title="Vault" csrf={csrf}>
      <style>{BLOCKED_CHART_STYLE}</style>
      <h1>Vault</h1>
      <Flash {...(await readFlash(csrf, (k) => c.req.query(k)))} />
      <RoutingSection doc={doc} csrf={csrf} />
      <SecretsSection c={c} csrf={csrf} secrets={secrets} usedBy={usedBy} />
      <RulesSection c={c} csrf={csrf} rules={rules} secrets={secrets.map((s) => s.name)} />
      <HostsSection c={c} csrf={csrf} hosts={hosts} defaultAction={doc.default} />
      <ModelsSection c={c} csrf={csrf} models={models} secrets={secrets.map((s) => s.name)} />
      <BlockedSection
        c={c}
        csrf={csrf}
        page={blocked}
        days={perDay}
        decide={(h) => index.decideHost(h).action}
      />
      <DrySection c={c} runs={recent.ok ? recent.value.items.map((r) => r.id) : []} />
    </Layout>,
  );
}

const plural = (n: number, one: string) => `${n} ${one}${n === 1 ? "" : "s"}`;

export const vaultPageRoutes = new Hono<PageEnv>()
  .get(PAGE, vaultPage)
  .route("/", vaultModelRoutes)
  .route("/", vaultBlockedRoutes)
  // ---- secrets ----
  .post(`${PAGE}/secrets`, (c) =>
    act(c, "secrets", async () => {
      const f = await form(c);
      const name = text(f, "name");
      // The value is taken as typed (no trim: spaces may be part of it) and never sent back.
      const value = f.value ?? "";
      if (!name) return back(c, { error: "Give the secret a name." }, "secrets");
      if (!SecretName.safeParse(name).success) {
        // Not quoted back: a value pasted into the wrong field must not come back in a URL.
        const error = `That is not a secret name: ${SECRET_NAME_RULE}.`;
        return back(c, { error }, "secrets");
      }
      const bad = valueProblem(value);
      if (bad) return back(c, { error: bad }, "secrets", { secretName: name });
      const made = await createSecret(db(c), c.var.config.keyRing, who(c), { name, value });
      return answer(c, made, (s) => `Added ${s.name} (${s.fingerprint}).`, "secrets", { secretName: name });
    }),
  )
  .post(`${PAGE}/secrets/:id/replace`, (c) =>
    act(c, "secrets", async () => {
      const value = (await form(c)).value ?? "";
      const bad = valueProblem(value);
      if (bad) return back(c, { error: bad }, "secrets");
      const done = await replaceSecret(db(c), c.var.config.keyRing, who(c), c.req.param("id"), {
        value,
      });
      return answer(c, done, (s) => `Replaced the value of ${s.name} (now ${s.fingerprint}).`, "secrets");
    }),
  )
  .post(`${PAGE}/secrets/:id/delete`, (c) =>
    act(c, "secrets", async () => {
      const id = c.req.param("id");
      const secret = await getSecret(db(c), who(c), id);
      if (!secret.ok) return refused(c, secret.error, "secrets");
      const done = await deleteSecret(db(c), who(c), id);
      return answer(c, done, () => `Deleted ${secret.value.name}.`, "secrets");
    }),
  )
  // ---- rules ----
  .post(`${PAGE}/rules`, (c) =>
    act(c, "rules", async () => {
      const f = await form(c);
      const input = ruleInput(f);
      if (!input.ok) return refused(c, input.error, "rules", ruleKeep(f));
      const made = await createRule(db(c), who(c), input.value);
      return answer(
        c,
        made,
        (r) => `Added rule #${r.position + 1}: ${r.secret} for ${r.host}.`,
        "rules",
        ruleKeep(f),
      );
    }),
  )
  .get(`${PAGE}/rules/:id/edit`, ruleEditPage)
  .post(`${PAGE}/rules/:id`, (c) => {
    const id = c.req.param("id");
    const edit = { path: `${PAGE}/rules/${encodeURIComponent(id)}/edit` };
    return act(c, edit, async () => {
      const f = await form(c);
      const input = ruleInput(f);
      if (!input.ok) return refused(c, input.error, edit, ruleKeep(f));
      const done = await updateRule(db(c), who(c), id, input.value);
      // A rule that is not (or no longer) in this vault: back to the vault, not to its edit page.
      if (!done.ok && done.error.code === "not_found") return refused(c, done.error, "rules");
      return done.ok
        ? back(c, { ok: `Saved rule #${done.value.position + 1}.` }, "rules")
        : refused(c, done.error, edit, ruleKeep(f));
    });
  })
  .post(`${PAGE}/rules/:id/move`, (c) =>
    act(c, "rules", async () => {
      const id = c.req.param("id");
      const direction = (await form(c)).direction;
      if (direction !== "up" && direction !== "down") {
        return back(c, { error: "Move a rule up or down." }, "rules");
      }
      const rules = await listRules(db(c), who(c));
      const ids = rules.map((r) => r.id);
      const at = ids.indexOf(id);
      if (at < 0) {
        const missing = await getRule(db(c), who(c), id);
        return missing.ok ? back(c, {}, "rules") : refused(c, missing.error, "rules");
      }
      const to = direction === "up" ? at - 1 : at + 1;
      if (to < 0 || to >= ids.length) return back(c, { ok: `Rule #${at + 1} stays where it is.` }, "rules");
      [ids[at], ids[to]] = [ids[to] ?? id, id];
      const done = await reorderRules(db(c), who(c), ids);
      return answer(c, done, () => `Moved rule #${at + 1} to #${to + 1}.`, "rules");
    }),
  )
  .post(`${PAGE}/rules/:id/delete`, (c) =>
    act(c, "rules", async () => {
      const done = await deleteRule(db(c), who(c), c.req.param("id"));
      return answer(c, done, () => "Deleted the rule.", "rules");
    }),
  )
  // ---- host policy ----
  .post(`${PAGE}/hosts`, (c) =>
    act(c, "hosts", async () => {
      const f = await form(c);
      const pattern = text(f, "pattern");
      const action = hostAction(f.action);
      const via = hostVia(f.via);
      const keep = { hostPattern: pattern, hostAction: f.action, hostVia: f.via };
      if (!pattern) return back(c, { error: "Give a host or *.domain." }, "hosts", keep);
      if (pattern.length > 300)
        return back(c, { error: "A host pattern is at most 300 characters." }, "hosts");
      if (!action) return back(c, { error: "Pick allow or block." }, "hosts", keep);
      if (via === undefined) return back(c, { error: "Pick tunnel, direct or no route." }, "hosts", keep);
      const done = await putHost(db(c), who(c), { pattern, action, via });
      return answer(
        c,
        done,
        (h) =>
          `${h.action === "allow" ? "Allowed" : "Blocked"} ${h.pattern}${h.via ? ` (route: ${h.via})` : ""}.`,
        "hosts",
        keep,
      );
    }),
  )
  .post(`${PAGE}/hosts/:id`, (c) =>
    act(c, "hosts", async () => {
      const f = await form(c);
      // The row's Allow/Block button sends action; its route form sends via ("" clears it).
      if (f.via !== undefined) {
        const via = hostVia(f.via);
        if (via === undefined) return back(c, { error: "Pick tunnel, direct or no route." }, "hosts");
        const done = await updateHost(db(c), who(c), c.req.param("id"), { via });
        return answer(
          c,
          done,
          (h) =>
            h.via
              ? `${h.pattern} now goes ${h.via === "tunnel" ? "through your machine (tunnel)" : "direct"}.`
              : `${h.pattern} now goes as the run's egress says.`,
          "hosts",
        );
      }
      const action = hostAction(f.action);
      if (!action) return back(c, { error: "Pick allow or block." }, "hosts");
      const done = await updateHost(db(c), who(c), c.req.param("id"), { action });
      return answer(c, done, (h) => `${h.action === "allow" ? "Allowed" : "Blocked"} ${h.pattern}.`, "hosts");
    }),
  )
  .post(`${PAGE}/hosts/:id/delete`, (c) =>
    act(c, "hosts", async () => {
      const id = c.req.param("id");
      const entry = await getHost(db(c), who(c), id);
      if (!entry.ok) return refused(c, entry.error, "hosts");
      const done = await deleteHost(db(c), who(c), id);
      return answer(c, done, () => `Deleted the entry for ${entry.value.pattern}.`, "hosts");
    }),
  )
  .post(`${PAGE}/default`, (c) =>
    act(c, "hosts", async () => {
      const action = hostAction((await form(c)).default);
      if (!action) return back(c, { error: "Pick allow or block as the default." }, "hosts");
      const done = await setDefault(db(c), who(c), action);
      return answer(
        c,
        done,
        (s) =>
          s.default === "allow"
            ? "Hosts no entry names are now allowed."
            : "Hosts no entry names are now blocked.",
        "routing",
      );
    }),
  )
  .post(`${PAGE}/starter-pack`, (c) =>
    act(c, "hosts", async () => {
      const done = await addStarterPack(db(c), who(c));
      return answer(
        c,
        done,
        ({ added, kept }) =>
          `Starter pack: allowed ${plural(added.length, "host")}` +
          (kept.length > 0
            ? `; left ${plural(kept.length, "host")} you already had an entry for as they were.`
            : "."),
        "hosts",
      );
    }),
  )
  // ---- dry run ----
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
        const entry = await putHost(db(c), who(c), { pattern, action });
        if (!entry.ok) return refused(c, entry.error, "hosts", { hostPattern: pattern, hostAction: action });
        saved.push(`${entry.value.action === "allow" ? "allowed" : "blocked"} ${entry.value.pattern}`);
      }
      if (def) {
        const settings = await setDefault(db(c), who(c), def);
        if (!settings.ok) {
          const done = saved.length > 0 ? ` (saved: ${saved.join("; ")})` : "";
          return back(c, { error: `${settings.error.detail}${done}` }, "routing");
        }
        saved.push(`hosts no entry names ${settings.value.default === "allow" ? "allowed" : "blocked"}`);
      }
      return back(c, { ok: `Saved: ${saved.join("; ")}.` }, "routing");
    }),
  );

function db(c: Ctx) {
  return c.var.db;
}
