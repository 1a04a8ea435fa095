import { createMiddleware } from "hono/factory";
import type { PageEnv } from "./context";

// The pages' forms post only from the pages themselves (K1). The session's CSRF token already
// guards every signed-in form, but the login form has no session yet: a cross-site POST of an
// attacker's key would sign the browser into *their* account, and a key the user then pastes into
// "their" vault would be the attacker's to use. So every page POST, login included, must carry a
// browser's proof that it came from this site.
//
// Not hono's csrf middleware: it passes a request when *either* header looks right (a foreign
// Origin with `Sec-Fetch-Site: same-origin` passes), and its refusal is an HTTPException that the
// app's onError would turn into a 500. Here any sign of another site refuses, and so does a POST
// carrying neither header (every browser this UI supports sends Origin on a form POST).

/** The origins our forms are served from: the request's own, and PUBLIC_URL's when it is set. */
function ownOrigins(requestUrl: string, publicUrl: string | undefined): string[] {
  const origins = [new URL(requestUrl).origin];
  if (publicUrl) {
    try {
      origins.push(new URL(publicUrl).origin);
    } catch {
      // A malformed PUBLIC_URL is the config loader's to report; it admits nothing here.
    }
  }
  return origins;
}

/** Whether a state-changing request came from a page of this site, by its browser's headers. */
export function fromThisSite(
  headers: { origin?: string | undefined; secFetchSite?: string | undefined },
  requestUrl: string,
  publicUrl?: string,
): boolean {
  const { origin, secFetchSite } = headers;
  if (secFetchSite !== undefined && secFetchSite !== "same-origin") return false;
  if (origin !== undefined) return ownOrigins(requestUrl, publicUrl).includes(origin);
  return secFetchSite === "same-origin";
}

/** Refuses (403, nothing read or set) a page POST that did not come from this site. */
export const sameOriginForms = createMiddleware<PageEnv>(async (c, next) => {
  if (c.req.method === "GET" || c.req.method === "HEAD") return next();
  const sent = { origin: c.req.header("origin"), secFetchSite: c.req.header("sec-fetch-site") };
  if (!fromThisSite(sent, c.req.url, c.env.PUBLIC_URL)) {
    return c.text("This form was not sent from this site's pages; open the page and try again.", 403);
  }
  await next();
});
