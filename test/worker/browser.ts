import { createExecutionContext, waitOnExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import worker from "../../src/index";
import { BASE, type Tenant } from "./harness";

// A browser for the page tests: logs in with a tenant's API key, keeps the session cookie, and
// posts forms with the CSRF token the pages embed. Redirects are not followed (tests read them).

export interface PageResponse {
  status: number;
  headers: Headers;
  html: string;
  /** The Location of a redirect, path and query only. */
  location: string | null;
}

async function send(path: string, init: RequestInit): Promise<PageResponse> {
  const ctx = createExecutionContext();
  const res = await worker.fetch(new Request(`${BASE}${path}`, { ...init, redirect: "manual" }), env, ctx);
  const html = await res.text();
  await waitOnExecutionContext(ctx);
  const loc = res.headers.get("location");
  return {
    status: res.status,
    headers: res.headers,
    html,
    location: loc ? new URL(loc, BASE).pathname + new URL(loc, BASE).search : null,
  };
}

export interface Browser {
  cookie: string | null;
  get(path: string): Promise<PageResponse>;
  /**
   * Posts a form; `_csrf` is taken from the last page read unless given. The request carries what
   * a browser sends for a form of our own pages (Origin, `Sec-Fetch-Site: same-origin`) unless
   * `site` says otherwise: a header set to null is left out (K1's cross-site cases).
   */
  post(
    path: string,
    fields: Record<string, string | string[]>,
    site?: { origin?: string | null; secFetchSite?: string | null },
  ): Promise<PageResponse>;
  csrf: string | null;
}

function siteHeaders(site: { origin?: string | null; secFetchSite?: string | null }) {
  const origin = site.origin === undefined ? new URL(BASE).origin : site.origin;
  const fetchSite = site.secFetchSite === undefined ? "same-origin" : site.secFetchSite;
  return {
    ...(origin === null ? {} : { origin }),
    ...(fetchSite === null ? {} : { "sec-fetch-site": fetchSite }),
  };
}

export function newBrowser(): Browser {
  const b: Browser = {
    cookie: null,
    csrf: null,
    async get(path) {
      const res = await send(path, { headers: b.cookie ? { cookie: b.cookie } : {} });
      const token = /name="_csrf" value="([0-9a-f]{64})"/.exec(res.html)?.[1];
      if (token) b.csrf = token;
      return res;
    },
    async post(path, fields, site = {}) {
      const form = new URLSearchParams();
      if (b.csrf && !("_csrf" in fields)) form.append("_csrf", b.csrf);
      for (const [k, v] of Object.entries(fields)) for (const one of [v].flat()) form.append(k, one);
      const res = await send(path, {
        method: "POST",
        headers: {
          "content-type": "application/x-www-form-urlencoded",
          ...(b.cookie ? { cookie: b.cookie } : {}),
          ...siteHeaders(site),
        },
        body: form.toString(),
      });
      const set = res.headers.get("set-cookie");
      if (set) {
        const pair = set.split(";")[0] ?? "";
        b.cookie = pair.endsWith("=") ? null : pair;
      }
      return res;
    },
  };
  return b;
}

/** A browser logged in as the tenant, having read `path` (so it holds a CSRF token). */
export async function loggedIn(t: Tenant, path = "/manage/vault"): Promise<Browser> {
  const b = newBrowser();
  const res = await b.post("/login", { key: t.key, next: path });
  if (res.status !== 303 || !b.cookie)
    throw new Error(`login failed: ${res.status} ${res.html.slice(0, 200)}`);
  await b.get(path);
  return b;
}
