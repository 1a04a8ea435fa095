import { tryGetContext } from "hono/context-storage";
import type { Child } from "hono/jsx";
import type { Session } from "../auth/session";
import { timingSafeEqualHex } from "../crypto/api-keys";
import { hmacSha256Hex } from "../crypto/hmac";

// The pages' one layout: server-rendered HTML, one inline style sheet, no script. Long values
// (a 253-character host, an id) wrap instead of widening the page.

const STYLE = `
*{box-sizing:border-box}
body{font:15px/1.45 system-ui,sans-serif;overflow-wrap:anywhere;margin:0;color:#1b1f24;background:#f6f7f9}
header{display:flex;gap:1.5rem;align-items:center;padding:.6rem 1.2rem;background:#1b1f24;color:#fff}
header a{color:#fff;text-decoration:none}header form{margin-left:auto}
header .who{margin-left:auto;font-size:.85rem;color:#cfd6de}header .who~form{margin-left:0}
main{max-width:72rem;margin:0 auto;padding:1rem 1.2rem 3rem}
h1{font-size:1.4rem}h2{font-size:1.1rem;margin-top:1.6rem}
section{background:#fff;border:1px solid #d8dde3;border-radius:6px;padding:.8rem 1rem;margin:1rem 0}
table{border-collapse:collapse;width:100%;table-layout:fixed}
th,td{text-align:left;padding:.35rem .5rem;border-bottom:1px solid #e6e9ed;vertical-align:top;overflow-wrap:anywhere}
th{font-weight:600;font-size:.85rem;color:#555}
code,.mono{font-family:ui-monospace,monospace;font-size:.85rem;overflow-wrap:anywhere}
pre{white-space:pre-wrap;overflow-wrap:anywhere;background:#f1f3f5;padding:.5rem;border-radius:4px;max-height:30rem;overflow:auto}
form.inline{display:inline}
input,select,button{font:inherit;padding:.25rem .45rem}
button{cursor:pointer}
.note{border-left:4px solid #5b8def;padding:.4rem .7rem;background:#eef3fd;margin:.5rem 0}
.warning{border-left:4px solid #d9822b;padding:.4rem .7rem;background:#fdf3e8;margin:.5rem 0}
.error{border-left:4px solid #c23030;padding:.4rem .7rem;background:#fbeaea;margin:.5rem 0}
.ok{border-left:4px solid #2e8b57;padding:.4rem .7rem;background:#eaf6ef;margin:.5rem 0}
.muted{color:#666}
.empty{color:#666;font-style:italic}
h3{font-size:.95rem;margin:1rem 0 .4rem}
form.fields label{display:inline-block;margin:.2rem .6rem .2rem 0}
col.c-num{width:3rem}col.c-name{width:13rem}col.c-date{width:9.5rem}col.c-act{width:5.5rem}
col.c-btn{width:6rem}col.c-form{width:17rem}col.c-wide{width:40%}
td input{max-width:100%}
`;

/** The signed-in session of the request being rendered, if any (src/pages/routes.tsx). */
function currentSession(): Session | undefined {
  return tryGetContext<{ Variables: { session?: Session } }>()?.var.session;
}

export function Layout(props: {
  title: string;
  csrf?: string | undefined;
  /** Reload the page after `seconds` at `url` (a same-origin path): a live page, without script. */
  refresh?: { seconds: number; url: string } | undefined;
  children?: Child;
}) {
  const session = currentSession();
  return (
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="viewport" content="width=device-width, initial-scale=1" />
        <title>{`${props.title} · Benchwright`}</title>
        {props.refresh ? (
          <meta http-equiv="refresh" content={`${props.refresh.seconds}; url=${props.refresh.url}`} />
        ) : null}
        <style>{STYLE}</style>
      </head>
      <body>
        <header>
          <strong>Benchwright</strong>
          {props.csrf ? (
            <>
              <a href="/manage/vault">Vault</a>
              <a href="/runs">Runs</a>
              <a href="/manage/keys">API keys</a>
              {session ? (
                <span class="who">
                  Signed in as <strong>{session.account.email}</strong> · environment{" "}
                  <strong>{session.account.environment}</strong>
                </span>
              ) : null}
              <form method="post" action="/logout">
                <input type="hidden" name="_csrf" value={props.csrf} />
                <button type="submit">Log out</button>
              </form>
            </>
          ) : null}
        </header>
        <main>{props.children}</main>
      </body>
    </html>
  );
}

/** A time, in UTC to the second (— when there is none). */
export function When(props: { at: Date | string | null | undefined }) {
  if (!props.at) return <span class="muted">—</span>;
  const d = typeof props.at === "string" ? new Date(props.at) : props.at;
  if (Number.isNaN(d.getTime())) return <span class="muted">—</span>;
  const iso = d.toISOString();
  return <time datetime={iso}>{`${iso.slice(0, 10)} ${iso.slice(11, 19)} UTC`}</time>;
}

/** A form that posts with the session's CSRF token. */
export function PostForm(props: { action: string; csrf: string; class?: string; children?: Child }) {
  return (
    <form method="post" action={props.action} class={props.class}>
      <input type="hidden" name="_csrf" value={props.csrf} />
      {props.children}
    </form>
  );
}

/**
 * A flash travels in the redirect's query (`?ok=` / `?error=`) with `fs`, a MAC of its text keyed
 * by the session's CSRF token: a link made elsewhere (or for another session) shows no text on
 * our pages, so nobody can put words of theirs on them.
 */
export async function flashQuery(
  csrf: string,
  flash: { ok?: string; error?: string },
): Promise<URLSearchParams> {
  const ok = flash.ok ? cut(flash.ok) : undefined;
  const error = flash.error ? cut(flash.error) : undefined;
  const q = new URLSearchParams();
  if (ok) q.set("ok", ok);
  if (error) q.set("error", error);
  if (ok || error) q.set("fs", await flashMac(csrf, ok, error));
  return q;
}

/** A flash longer than this is cut: it travels in the redirect's URL. */
const MAX_FLASH = 600;
const cut = (s: string) => (s.length > MAX_FLASH ? `${s.slice(0, MAX_FLASH - 1)}…` : s);

/** The flash of a page's query if its MAC holds for this session; else none. */
export async function readFlash(
  csrf: string,
  query: (name: string) => string | undefined,
): Promise<{ ok?: string; error?: string }> {
  const ok = query("ok") || undefined;
  const error = query("error") || undefined;
  if (!ok && !error) return {};
  const sent = query("fs") ?? "";
  return timingSafeEqualHex(await flashMac(csrf, ok, error), sent) ? { ok, error } : {};
}

function flashMac(csrf: string, ok: string | undefined, error: string | undefined): Promise<string> {
  return hmacSha256Hex(csrf, `flash\u0000${ok ?? ""}\u0000${error ?? ""}`);
}

/** A flash message (read with readFlash), shown once. */
export function Flash(props: { ok?: string | undefined; error?: string | undefined }) {
  return (
    <>
      {props.ok ? <p class="ok">{props.ok}</p> : null}
      {props.error ? <p class="error">{props.error}</p> : null}
    </>
  );
}
