import { defaultPlaceholderEnv } from "@benchwright/shared/contract/placeholder";
import { InjectScheme, type InjectSpec } from "@benchwright/shared/contract/policy";
import { SecretName } from "@benchwright/shared/contract/proxy-wire";
import { Hono } from "hono";
import { fail, ok, type Result } from "../../errors";
import {
  createRule,
  deleteRule,
  getRule,
  listRules,
  type RuleInfo,
  type RuleInput,
  reorderRules,
  updateRule,
} from "../../vault/rules";
import { listSecrets } from "../../vault/secrets";
import type { PageEnv } from "../context";
import { Flash, Layout, PostForm, readFlash } from "../layout";
import {
  act,
  answer,
  back,
  type Ctx,
  form,
  type Keep,
  listField,
  listText,
  PAGE,
  refused,
  text,
  who,
} from "./forms";
import { ButtonForm, CodeCell, DeleteCell, LimitsCell, Pager, pageOf, Section, Table } from "./section";

// The vault page's rules, in order (src/vault/rules.ts): added, edited on a page of their own,
// moved up or down and deleted, each with its placeholder variable and its method and path
// limits. A refused form keeps its fields.

const injectText = (i: InjectSpec) =>
  i.scheme === "query" ? `query ?${i.name}=` : `${i.scheme} → ${i.name}`;

/** The fields of a rule, for adding one (empty) or editing one (filled in). */
function RuleFields(props: {
  secrets: string[];
  host?: string | undefined;
  secret?: string | undefined;
  scheme?: string | undefined;
  header?: string | undefined;
  /** The variable as typed: blank is the secret's name. */
  env?: string | undefined;
  noPlaceholder?: boolean | undefined;
  body?: boolean | undefined;
  methods?: string | undefined;
  paths?: string | undefined;
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
      </label>{" "}
      <label>
        Placeholder variable{" "}
        <input name="placeholderEnv" maxlength={64} placeholder="the secret's name" value={props.env ?? ""} />
      </label>{" "}
      <label>
        <input type="checkbox" name="noPlaceholder" value="1" checked={props.noPlaceholder ?? false} /> no
        placeholder
      </label>{" "}
      <label>
        <input type="checkbox" name="placeholderBody" value="1" checked={props.body ?? false} /> swap it in
        bodies too
      </label>{" "}
      <label>
        Methods{" "}
        <input
          name="methods"
          maxlength={300}
          placeholder="any (e.g. GET, HEAD)"
          value={props.methods ?? ""}
        />
      </label>{" "}
      <label>
        Paths{" "}
        <textarea name="paths" rows={2} maxlength={4096} placeholder="any (one per line, e.g. /repos/acme/)">
          {props.paths ?? ""}
        </textarea>
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

export function RulesSection(props: { c: Ctx; csrf: string; rules: RuleInfo[]; secrets: string[] }) {
  const { c, csrf, rules } = props;
  const page = pageOf(c, rules, "rulesFrom");
  return (
    <Section id="rules" title="Rules, in order">
      <p class="muted">
        For a request to a host, the first rule whose host matches injects its secret. A rule's host is
        allowed for as long as the rule exists. Runs' sandboxes get each rule's placeholder (not the secret)
        in its variable, which the proxy swaps for the secret on the rule's host only. A request outside a
        rule's methods or paths is refused (403).
      </p>
      <Table
        rows={page.rows}
        empty="No rules yet: no credential is injected anywhere."
        head={["#", "Host", "Secret", "Inject", "Placeholder", "Limits", "Order", "Edit", "Delete"]}
        widths={["c-num", "", "c-name", "c-name", "c-name", "c-name", "c-btn", "c-act", "c-act"]}
        row={(r, i) => {
          const at = page.from + i;
          return (
            <tr>
              <td>{at + 1}</td>
              <CodeCell text={r.host} />
              <CodeCell text={r.secret} />
              <td>{injectText(r.inject)}</td>
              <td>
                {r.placeholderEnv ? <code>{r.placeholderEnv}</code> : <span class="muted">none</span>}
                {r.placeholderIn.includes("body") ? <span class="muted"> (+ body)</span> : null}
              </td>
              <LimitsCell methods={r.methods} paths={r.paths} />
              <td>
                {at > 0 ? (
                  <ButtonForm
                    action={`${PAGE}/rules/${r.id}/move`}
                    csrf={csrf}
                    label="Up"
                    hidden={{ direction: "up" }}
                    title="Move up"
                    inline
                  />
                ) : null}{" "}
                {at < rules.length - 1 ? (
                  <ButtonForm
                    action={`${PAGE}/rules/${r.id}/move`}
                    csrf={csrf}
                    label="Down"
                    hidden={{ direction: "down" }}
                    title="Move down"
                    inline
                  />
                ) : null}
              </td>
              <td>
                <a href={`${PAGE}/rules/${r.id}/edit`}>Edit</a>
              </td>
              <DeleteCell action={`${PAGE}/rules/${r.id}/delete`} csrf={csrf} />
            </tr>
          );
        }}
      />
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
            env={c.req.query("ruleEnv")}
            noPlaceholder={c.req.query("ruleNoPlaceholder") === "1"}
            body={c.req.query("ruleBody") === "1"}
            methods={c.req.query("ruleMethods")}
            paths={c.req.query("rulePaths")}
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
  // Blank is the secret's name, sent as such so that an edit can go back to it.
  const env =
    f.noPlaceholder === "1"
      ? null
      : (text(f, "placeholderEnv") ?? defaultPlaceholderEnv(secret) ?? undefined);
  return ok({
    host,
    secret,
    inject: { scheme: scheme.data, name },
    placeholderEnv: env,
    placeholderIn: f.placeholderBody === "1" ? ["body"] : [],
    methods: listField(f, "methods"),
    paths: listField(f, "paths"),
  });
}

const ruleKeep = (f: Record<string, string>): Keep => ({
  ruleHost: f.host,
  ruleSecret: f.secret,
  ruleScheme: f.scheme,
  ruleHeader: f.header,
  ruleEnv: f.placeholderEnv,
  ruleNoPlaceholder: f.noPlaceholder,
  ruleBody: f.placeholderBody,
  ruleMethods: f.methods,
  rulePaths: f.paths,
});

async function ruleEditPage(c: Ctx): Promise<Response> {
  const id = c.req.param("id") ?? "";
  const [rule, secrets] = await Promise.all([getRule(c.var.db, who(c), id), listSecrets(c.var.db, who(c))]);
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
          env={
            q("ruleEnv") ??
            (r.placeholderEnv === defaultPlaceholderEnv(r.secret) ? "" : (r.placeholderEnv ?? ""))
          }
          noPlaceholder={q("ruleSecret") ? q("ruleNoPlaceholder") === "1" : r.placeholderEnv === null}
          body={q("ruleSecret") ? q("ruleBody") === "1" : r.placeholderIn.includes("body")}
          methods={q("ruleMethods") ?? listText(r.methods)}
          paths={q("rulePaths") ?? (r.paths ?? []).join("\n")}
        />{" "}
        <button type="submit">Save rule</button>
      </PostForm>
    </Layout>,
  );
}

export const rulesRoutes = new Hono<PageEnv>()
  .post(`${PAGE}/rules`, (c) =>
    act(c, "rules", async () => {
      const f = await form(c);
      const input = ruleInput(f);
      if (!input.ok) return refused(c, input.error, "rules", ruleKeep(f));
      const made = await createRule(c.var.db, who(c), input.value);
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
      const done = await updateRule(c.var.db, who(c), id, input.value);
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
      const rules = await listRules(c.var.db, who(c));
      const ids = rules.map((r) => r.id);
      const at = ids.indexOf(id);
      if (at < 0) {
        const missing = await getRule(c.var.db, who(c), id);
        return missing.ok ? back(c, {}, "rules") : refused(c, missing.error, "rules");
      }
      const to = direction === "up" ? at - 1 : at + 1;
      if (to < 0 || to >= ids.length) return back(c, { ok: `Rule #${at + 1} stays where it is.` }, "rules");
      [ids[at], ids[to]] = [ids[to] ?? id, id];
      const done = await reorderRules(c.var.db, who(c), ids);
      return answer(c, done, () => `Moved rule #${at + 1} to #${to + 1}.`, "rules");
    }),
  )
  .post(`${PAGE}/rules/:id/delete`, (c) =>
    act(c, "rules", async () => {
      const done = await deleteRule(c.var.db, who(c), c.req.param("id"));
      return answer(c, done, () => "Deleted the rule.", "rules");
    }),
  );
