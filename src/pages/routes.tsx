import { Hono } from "hono";
import { contextStorage } from "hono/context-storage";
import { deleteCookie, getCookie, setCookie } from "hono/cookie";
import { createMiddleware } from "hono/factory";
import { grantForKey } from "../auth/middleware";
import { scopeAllows } from "../auth/scope";
import {
  csrfMatches,
  endSession,
  openSession,
  readSession,
  SESSION_COOKIE,
  SESSION_TTL_MS,
} from "../auth/session";
import type { PageEnv } from "./context";
import { keysPageRoutes } from "./keys-page";
import { Layout } from "./layout";
import { problemPageRoutes } from "./problems";
import { runPageRoutes } from "./run-pages";
import { sameOriginForms } from "./same-origin";
import { vaultPageRoutes } from "./vault/page";

// The pages a user reads the boundary through: log in with an API key (a session cookie), the
// vault page and the run pages. Server-rendered; forms post back and redirect (no script). Every
// POST comes from this site's pages (Origin / Sec-Fetch-Site, login included) and, once signed
// in, carries the session's CSRF token; every page is sent with a strict CSP.

const CSP =
  "default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; form-action 'self'; frame-ancestors 'none'; base-uri 'none'";

/** Where to go after logging in: a path of this site only (never `//host` or a URL). */
export function safeNext(next: unknown): string {
  return typeof next === "string" && /^\/(?![/\\])[\x21-\x7e]*$/.test(next) ? next : "/manage/vault";
}

/** A session, or off to the login page; a POST without the session's CSRF token is refused. */
const requireSession = createMiddleware<PageEnv>(async (c, next) => {
  const token = getCookie(c, SESSION_COOKIE);
  const session = token ? await readSession(c.var.db, token) : null;
  if (!session) {
    if (c.req.method !== "GET") return c.text("Your session has ended; log in again.", 401);
    const url = new URL(c.req.url);
    return c.redirect(`/login?next=${encodeURIComponent(url.pathname + url.search)}`, 303);
  }
  if (c.req.method === "POST") {
    const form = await c.req.parseBody();
    if (!csrfMatches(session, form._csrf))
      return c.text("This form is stale or not ours; reload the page.", 403);
  }
  // A read key's session may look, not change anything (K3); logging out changes only itself.
  if (!scopeAllows(session.scope, c.req.method) && c.req.path !== "/logout") {
    return c.text("read_only_key: this session's API key is read-only; it cannot change anything.", 403);
  }
  c.set("session", session);
  await next();
});

function LoginPage(props: { next: string; error?: string }) {
  return (
    <Layout title="Log in">
      <h1>Log in</h1>
      <p class="muted">
        With an API key of yours (npm start prints one). It opens a session in this browser.
      </p>
      {props.error ? <p class="error">{props.error}</p> : null}
      <form method="post" action="/login">
        <input type="hidden" name="next" value={props.next} />
        <label>
          API key <input type="password" name="key" autocomplete="off" required size={50} />
        </label>{" "}
        <button type="submit">Log in</button>
      </form>
    </Layout>
  );
}

export const pageRoutes = new Hono<PageEnv>()
  .use("*", async (c, next) => {
    await next();
    c.res.headers.set("content-security-policy", CSP);
    c.res.headers.set("x-content-type-options", "nosniff");
    c.res.headers.set("referrer-policy", "same-origin");
    c.res.headers.set("cache-control", "no-store");
  })
  // The layout reads the signed-in account from the request (every page's header shows it)
  // without each page passing it down.
  .use("*", contextStorage())
  // The pages' own paths only: a POST to a path that is no page (an API typo) stays a 404.
  .use("/login", sameOriginForms)
  .use("/logout", sameOriginForms)
  .use("/manage/*", sameOriginForms)
  .use("/runs", sameOriginForms)
  .use("/runs/*", sameOriginForms)
  .get("/", (c) => c.redirect("/manage/vault", 303))
  .route("/", problemPageRoutes)
  .get("/login", (c) => c.html(<LoginPage next={safeNext(c.req.query("next"))} />))
  .post("/login", async (c) => {
    const form = await c.req.parseBody();
    const next = safeNext(form.next);
    const grant = typeof form.key === "string" ? await grantForKey(c.var.db, form.key.trim()) : null;
    if (!grant) {
      return c.html(
        <LoginPage next={next} error="That API key is not valid (unknown, revoked or expired)." />,
        401,
      );
    }
    setCookie(c, SESSION_COOKIE, await openSession(c.var.db, grant.principal), {
      httpOnly: true,
      sameSite: "Strict",
      secure: new URL(c.req.url).protocol === "https:",
      path: "/",
      maxAge: SESSION_TTL_MS / 1000,
    });
    return c.redirect(next, 303);
  })
  .use("/logout", requireSession)
  .post("/logout", async (c) => {
    const token = getCookie(c, SESSION_COOKIE);
    if (token) await endSession(c.var.db, token);
    deleteCookie(c, SESSION_COOKIE, { path: "/" });
    return c.redirect("/login", 303);
  })
  .use("/manage/*", requireSession)
  .use("/runs", requireSession)
  .use("/runs/*", requireSession)
  .route("/", vaultPageRoutes)
  .route("/", keysPageRoutes)
  .route("/", runPageRoutes);
