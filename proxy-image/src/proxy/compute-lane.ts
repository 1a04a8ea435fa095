import type { IncomingMessage, ServerResponse } from "node:http";

// The compute lane: a run's work (or orchestrator) sandbox asks the control plane for task
// environments at https://probe.benchwright.invalid/compute/..., the platform's own host inside
// the run (every sandbox's hosts file or redirect already sends it to this proxy, and the run CA
// covers it). This proxy forwards the call to the control plane's /compute API as it is, with
// the sandbox's own capability in Authorization: the proxy adds no credential of its own and no
// vault secret, and nothing else of the request (no cookies, no forwarding headers) goes along.

export const COMPUTE_PATH_PREFIX = "/compute/";
/** A compute call is a small JSON document (an argv, a name); anything bigger is refused. */
export const MAX_COMPUTE_BODY_BYTES = 256 * 1024;
const TIMEOUT_MS = 30_000;
const FORWARDED_REQUEST_HEADERS = ["authorization", "content-type", "accept"];
const FORWARDED_RESPONSE_HEADERS = ["content-type", "cache-control"];

export type ComputeLane = (req: IncomingMessage, res: ServerResponse, path: string) => Promise<number>;

/** Stable codes of the lane's own answers (problem+json `code`). */
export type ComputeLaneCode = "invalid_request" | "invalid_path";

// Case I7: a path must name a control-plane route under /compute/ as written. Anything a URL
// parser or router could resolve to another route is refused before any URL is built: dot
// segments, percent-escapes of `.`, `/`, `\` and `%` itself (double encoding), backslashes (WHATWG
// reads them as `/`), and a fragment.
const DOT_SEGMENT = /(?:^|\/)\.{1,2}(?:\/|$)/;
const RISKY_ESCAPE = /%(?:2e|2f|5c|25)/i;

/**
 * The control-plane URL for a compute-lane path, or null when the path could leave its prefix:
 * refused shapes first, then the URL is built and its pathname must be exactly the path asked
 * for (nothing normalised) and still under `<base path>/compute/`.
 */
export function computeUrl(base: string, path: string): URL | null {
  const query = path.indexOf("?");
  const pathname = query === -1 ? path : path.slice(0, query);
  if (!pathname.startsWith(COMPUTE_PATH_PREFIX)) return null;
  if (pathname.includes("\\") || pathname.includes("#") || path.includes("#")) return null;
  if (DOT_SEGMENT.test(pathname) || RISKY_ESCAPE.test(pathname)) return null;
  let baseUrl: URL;
  let url: URL;
  try {
    baseUrl = new URL(base);
    url = new URL(`${base}${path}`);
  } catch {
    return null;
  }
  // Built, the URL must still be under the prefix, and name exactly the path asked for.
  const basePath = baseUrl.pathname.replace(/\/+$/, "");
  if (url.origin !== baseUrl.origin || !url.pathname.startsWith(`${basePath}${COMPUTE_PATH_PREFIX}`))
    return null;
  return url.pathname === `${basePath}${pathname}` ? url : null;
}

/** Forwards one request; resolves with the status sent back to the sandbox. */
export function computeLane(
  controlPlaneUrl: string,
  fetchFn: typeof fetch = (url, init) => fetch(url, init),
): ComputeLane {
  const base = controlPlaneUrl.replace(/\/+$/, "");
  return async (req, res, path) => {
    const method = req.method ?? "GET";
    const url = computeUrl(base, path);
    if (url === null) {
      req.resume();
      return answer(res, 400, "the path must stay under /compute/, as written", "invalid_path");
    }
    if (!["GET", "POST", "DELETE"].includes(method)) return answer(res, 405, "method not allowed");
    const body = await readBody(req);
    if (body === null) return answer(res, 413, `at most ${MAX_COMPUTE_BODY_BYTES} bytes`);
    const headers = new Headers();
    for (const name of FORWARDED_REQUEST_HEADERS) {
      const value = req.headers[name];
      if (typeof value === "string") headers.set(name, value);
    }
    let upstream: Response;
    try {
      upstream = await fetchFn(url, {
        method,
        headers,
        body: method === "GET" || body.length === 0 ? undefined : body,
        redirect: "manual",
        signal: AbortSignal.timeout(TIMEOUT_MS),
      });
    } catch {
      return answer(res, 502, "the control plane did not answer");
    }
    const text = Buffer.from(await upstream.arrayBuffer());
    const out: Record<string, string> = { "content-length": String(text.length) };
    for (const name of FORWARDED_RESPONSE_HEADERS) {
      const value = upstream.headers.get(name);
      if (value !== null) out[name] = value;
    }
    res.writeHead(upstream.status, out);
    res.end(text);
    return upstream.status;
  };
}

async function readBody(req: IncomingMessage): Promise<Buffer | null> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_COMPUTE_BODY_BYTES) return null;
    chunks.push(chunk);
  }
  return Buffer.concat(chunks);
}

function answer(
  res: ServerResponse,
  status: number,
  detail: string,
  code: ComputeLaneCode = "invalid_request",
): number {
  const body = JSON.stringify({ title: "Compute lane", status, detail, code });
  res.writeHead(status, {
    "content-type": "application/problem+json",
    "content-length": Buffer.byteLength(body),
  });
  res.end(body);
  return status;
}
