import { type Context, Hono } from "hono";
import type { Child } from "hono/jsx";
import { SecretName } from "../contract/proxy-wire";
import { ApiError, type Failure, type Result } from "../errors";
import * as vault from "../vault/service";
import type { PageEnv } from "./context";
import { Flash, Layout, PostForm } from "./layout";

// The vault page (/manage/vault): secrets, rules, host policy, routing mode. Every form posts to
// /manage/vault/... and is answered with a 303 back to the page with a flash (`?ok=` or
// `?error=`, the service's own detail). The page calls the same service functions as the API
// (src/vault/service.ts), so it cannot drift from it. A secret's value is only ever read from a
// password field and handed to the service: it is never put in a page, a redirect or a flash,
// not even after an error.

type Ctx = Context<PageEnv>;

const PAGE = "/manage/vault";
/** Rows per section before it pages. */
const PAGE_SIZE = 100;
/** A flash longer than this is cut (it travels in the redirect's URL). */
const MAX_FLASH = 600;
const MAX_SECRET_VALUE = 16_384;

// ---- answering a form ----

/** Form fields kept across the redirect so a refused form is not retyped (never a value). */
type Keep = Record<string, string | undefined>;

/** Back to the page with a flash, the kept fields and the section to scroll to. */
function back(c: Ctx, flash: { ok?: string; error?: string }, section: string, keep: Keep = {}): Response {
  const q = new URLSearchParams();
  if (flash.ok) q.set("ok", cut(flash.ok));
  if (flash.error) q.set("error", cut(flash.error));
  for (const [k, v] of Object.entries(keep)) if (v) q.set(k, v.slice(0, 300));
  return c.redirect(`${PAGE}?${q}#${section}`, 303);
}

const cut = (s: string) => (s.length > MAX_FLASH ? `${s.slice(0, MAX_FLASH - 1)}…` : s);

/** A service's answer as a redirect: its detail on failure (the API's own words), else `ok`. */
function answer<T>(
  c: Ctx,
  result: Result<T>,
  ok: (value: T) => string,
  section: string,
  keep: Keep = {},
): Response {
  return result.ok ? back(c, { ok: ok(result.value) }, section) : refused(c, result.error, section, keep);
}

const refused = (c: Ctx, f: Failure, section: string, keep: Keep = {}) =>
  back(c, { error: f.detail }, section, keep);

/** Runs a form action; an ApiError a service throws becomes a flash like a returned failure. */
async function act(c: Ctx, section: string, fn: () => Promise<Response>): Promise<Response> {
  try {
    return await fn();
  } catch (e) {
    if (e instanceof ApiError) return refused(c, e, section);
    throw e;
  }
}

async function form(c: Ctx): Promise<Record<string, string>> {
  const body = await c.req.parseBody();
  const fields: Record<string, string> = {};
  for (const [k, v] of Object.entries(body)) if (typeof v === "string") fields[k] = v;
  return fields;
}

/** A trimmed text field, or undefined when missing or blank. */
function text(fields: Record<string, string>, name: string): string | undefined {
  const v = fields[name]?.trim();
  return v ? v : undefined;
}

const who = (c: Ctx) => c.var.session.principal;

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
  secrets: vault.SecretInfo[];
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

// ---- the page ----

async function vaultPage(c: Ctx): Promise<Response> {
  const p = who(c);
  const db = c.var.db;
  const [secrets, rules] = await Promise.all([vault.listSecrets(db, p), vault.listRules(db, p)]);
  const usedBy = new Map<string, number[]>();
  for (const [i, r] of rules.entries()) usedBy.set(r.secret, [...(usedBy.get(r.secret) ?? []), i + 1]);
  const csrf = c.var.session.csrf;
  return c.html(
    <Layout title="Vault" csrf={csrf}>
      <h1>Vault</h1>
      <Flash ok={c.req.query("ok")} error={c.req.query("error")} />
      <SecretsSection c={c} csrf={csrf} secrets={secrets} usedBy={usedBy} />
    </Layout>,
  );
}

export const vaultPageRoutes = new Hono<PageEnv>()
  .get(PAGE, vaultPage)
  // ---- secrets ----
  .post(`${PAGE}/secrets`, (c) =>
    act(c, "secrets", async () => {
      const f = await form(c);
      const name = text(f, "name");
      // The value is taken as typed (no trim: spaces may be part of it) and never sent back.
      const value = f.value ?? "";
      if (!name) return back(c, { error: "Give the secret a name." }, "secrets");
      if (!SecretName.safeParse(name).success) {
        return back(
          c,
          {
            error: `${name.slice(0, 80)} is not a secret name: letters, digits, _ . - (at most 64), starting with a letter or _.`,
          },
          "secrets",
        );
      }
      const bad = valueProblem(value);
      if (bad) return back(c, { error: bad }, "secrets", { secretName: name });
      const made = await vault.createSecret(db(c), c.var.config.keyRing, who(c), { name, value });
      return answer(c, made, (s) => `Added ${s.name} (${s.fingerprint}).`, "secrets", { secretName: name });
    }),
  )
  .post(`${PAGE}/secrets/:id/replace`, (c) =>
    act(c, "secrets", async () => {
      const value = (await form(c)).value ?? "";
      const bad = valueProblem(value);
      if (bad) return back(c, { error: bad }, "secrets");
      const done = await vault.replaceSecret(db(c), c.var.config.keyRing, who(c), c.req.param("id"), {
        value,
      });
      return answer(c, done, (s) => `Replaced the value of ${s.name} (now ${s.fingerprint}).`, "secrets");
    }),
  )
  .post(`${PAGE}/secrets/:id/delete`, (c) =>
    act(c, "secrets", async () => {
      const id = c.req.param("id");
      const secret = await vault.getSecret(db(c), who(c), id);
      if (!secret.ok) return refused(c, secret.error, "secrets");
      const done = await vault.deleteSecret(db(c), who(c), id);
      return answer(c, done, () => `Deleted ${secret.value.name}.`, "secrets");
    }),
  );

function db(c: Ctx) {
  return c.var.db;
}
