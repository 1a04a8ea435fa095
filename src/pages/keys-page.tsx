import { API_KEY_SCOPES, type ApiKeyScope } from "@benchwright/shared/contract/api-key-scope";
import { Hono } from "hono";
import { unwrap } from "../errors";
import * as keys from "../keys/service";
import type { PageEnv } from "./context";
import { Flash, Layout, PostForm, readFlash, When } from "./layout";
import { act, answer, back, type Ctx, form, refused, text, who } from "./vault/forms";

// The keys page (case K3): the environment's API keys, a form to make one, a button to revoke
// each. A new key is shown on the answer to its form and nowhere else: not in a redirect (a URL
// lands in history and logs), not on a later visit. Reloading that answer would post the form
// again and make another key; the page says so.

export const KEYS_PAGE = "/manage/keys";
const to = { path: KEYS_PAGE, anchor: "keys" };

const EXPIRY_CHOICES = [
  ["", "never"],
  ["1d", "in a day"],
  ["30d", "in 30 days"],
  ["90d", "in 90 days"],
  ["365d", "in a year"],
] as const;

function KeysTable(props: { rows: keys.KeyInfo[]; csrf: string; canWrite: boolean }) {
  if (props.rows.length === 0) return <p class="empty">No keys.</p>;
  return (
    <table>
      <colgroup>
        <col class="c-name" />
        <col />
        <col class="c-act" />
        <col class="c-date" />
        <col class="c-date" />
        <col class="c-date" />
        <col class="c-btn" />
      </colgroup>
      <thead>
        <tr>
          <th>Name</th>
          <th>Prefix</th>
          <th>Scope</th>
          <th>Created</th>
          <th>Last used</th>
          <th>Expires</th>
          <th />
        </tr>
      </thead>
      <tbody>
        {props.rows.map((k) => (
          <tr>
            <td>
              {k.name}
              {k.current ? <span class="muted"> (this session's)</span> : null}
            </td>
            <td>
              <code>{k.prefix}…</code>
            </td>
            <td>{k.scope}</td>
            <td>
              <When at={k.createdAt} />
            </td>
            <td>
              <When at={k.lastUsedAt} />
            </td>
            <td>{k.expiresAt ? <When at={k.expiresAt} /> : <span class="muted">never</span>}</td>
            <td>
              {k.state !== "active" ? (
                <span class="muted">{k.state}</span>
              ) : props.canWrite ? (
                <PostForm action={`${KEYS_PAGE}/${k.id}/revoke`} csrf={props.csrf} class="inline">
                  <button type="submit">Revoke</button>
                </PostForm>
              ) : null}
            </td>
          </tr>
        ))}
      </tbody>
    </table>
  );
}

function CreateForm(props: { csrf: string }) {
  return (
    <PostForm action={KEYS_PAGE} csrf={props.csrf} class="fields">
      <label>
        Name <input name="name" required maxlength={100} size={24} />
      </label>
      <label>
        Scope{" "}
        <select name="scope">
          {API_KEY_SCOPES.toReversed().map((s) => (
            <option value={s}>{s === "full" ? "full" : "read (GET only)"}</option>
          ))}
        </select>
      </label>
      <label>
        Expires{" "}
        <select name="expiresIn">
          {EXPIRY_CHOICES.map(([v, label]) => (
            <option value={v}>{label}</option>
          ))}
        </select>
      </label>
      <button type="submit">Make a key</button>
    </PostForm>
  );
}

// A page of keys at a time; more than this in one environment is rare.
const KEYS_PER_PAGE = 100;

/** Links to the first page (when not on it) and the next (when there is one). */
function Paging(props: { cursor: string | undefined; next: string | null }) {
  if (!props.cursor && !props.next) return null;
  return (
    <p class="muted">
      {props.cursor ? <a href={`${KEYS_PAGE}#keys`}>First page</a> : null}{" "}
      {props.next ? (
        <a href={`${KEYS_PAGE}?cursor=${encodeURIComponent(props.next)}#keys`}>Next page</a>
      ) : null}
    </p>
  );
}

function KeysPage(props: {
  rows: keys.KeyInfo[];
  cursor: string | undefined;
  next: string | null;
  csrf: string;
  scope: ApiKeyScope;
  flash: { ok?: string; error?: string };
  made?: { name: string; key: string };
}) {
  const canWrite = props.scope === "full";
  return (
    <Layout title="API keys" csrf={props.csrf}>
      <h1>API keys</h1>
      <Flash {...props.flash} />
      {props.made ? (
        <section class="ok">
          <p>
            Made <strong>{props.made.name}</strong>. Copy the key now: it is shown only on this page, and
            reloading it would make another key.
          </p>
          <pre class="mono">{props.made.key}</pre>
        </section>
      ) : null}
      <section id="keys">
        <h2>Keys of this environment</h2>
        <p class="muted">
          A revoked or expired key is refused at once, everywhere, and so is every session opened with it.
          Last use is recorded to the minute.
        </p>
        <KeysTable rows={props.rows} csrf={props.csrf} canWrite={canWrite} />
        <Paging cursor={props.cursor} next={props.next} />
      </section>
      {canWrite ? (
        <section id="new">
          <h2>Make a key</h2>
          <CreateForm csrf={props.csrf} />
        </section>
      ) : (
        <p class="note">This session's key is read-only: it can look, not make or revoke keys.</p>
      )}
    </Layout>
  );
}

async function render(c: Ctx, made?: { name: string; key: string }, status: 200 | 201 = 200) {
  const session = c.var.session;
  const flash = made ? {} : await readFlash(session.csrf, (n) => c.req.query(n));
  // A page link this site did not give shows the first page, and says so.
  const cursor = made ? undefined : c.req.query("cursor") || undefined;
  const ring = c.var.config.keyRing;
  const asked = await keys.listKeys(c.var.db, who(c), { limit: KEYS_PER_PAGE, cursor, ring });
  const page = asked.ok
    ? asked.value
    : unwrap(await keys.listKeys(c.var.db, who(c), { limit: KEYS_PER_PAGE, ring }));
  return c.html(
    <KeysPage
      rows={page.items}
      cursor={asked.ok ? cursor : undefined}
      next={page.nextCursor}
      csrf={session.csrf}
      scope={session.scope}
      flash={
        asked.ok ? flash : { error: "That page link is not one this site gave: here is the first page." }
      }
      made={made}
    />,
    status,
  );
}

export const keysPageRoutes = new Hono<PageEnv>()
  .get(KEYS_PAGE, (c) => render(c))
  .post(KEYS_PAGE, (c) =>
    act(c, to, async () => {
      const f = await form(c);
      const name = text(f, "name");
      if (!name || name.length > 100)
        return back(c, { error: "Give the key a name (up to 100 characters)." }, to);
      const scope = API_KEY_SCOPES.find((s) => s === f.scope) ?? "full";
      const made = await keys.createKey(c.var.db, who(c), c.var.session.scope, {
        name,
        scope,
        expiresIn: text(f, "expiresIn"),
      });
      if (!made.ok) return refused(c, made.error, to);
      return render(c, { name, key: made.value.key }, 201);
    }),
  )
  .post(`${KEYS_PAGE}/:id/revoke`, (c) =>
    act(c, to, async () => {
      const id = c.req.param("id");
      const done = await keys.revokeKey(c.var.db, who(c), id);
      // Revoking the session's own key ends the session: off to the login page.
      if (done.ok && id === who(c).keyId) return c.redirect("/login", 303);
      return answer(c, done, () => `Revoked ${id}.`, to);
    }),
  );
