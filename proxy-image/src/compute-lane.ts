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

/** Forwards one request; resolves with the status sent back to the sandbox. */
export function computeLane(
  controlPlaneUrl: string,
  fetchFn: typeof fetch = (url, init) => fetch(url, init),
): ComputeLane {
  const base = controlPlaneUrl.replace(/\/+$/, "");
  return async (req, res, path) => {
    const method = req.method ?? "GET";
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
      upstream = await fetchFn(`${base}${path}`, {
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

function answer(res: ServerResponse, status: number, detail: string): number {
  const body = JSON.stringify({ title: "Compute lane", status, detail, code: "invalid_request" });
  res.writeHead(status, {
    "content-type": "application/problem+json",
    "content-length": Buffer.byteLength(body),
  });
  res.end(body);
  return status;
}
