import type { components, paths } from "./api-types";

// A small typed client of the public API: paths and bodies come from the generated OpenAPI types
// (cli/src/api-types.ts), so a route that changes shape breaks the CLI's typecheck.

export type Schemas = components["schemas"];
export type Problem = Schemas["Problem"];

type Method = "get" | "post" | "put" | "patch" | "delete";
type Op<P extends keyof paths, M extends Method> = NonNullable<paths[P][M]>;
type Success<O> = O extends { responses: infer R }
  ? {
      [S in keyof R]: S extends 200 | 201 | 202
        ? R[S] extends { content: { "application/json": infer B } }
          ? B
          : never
        : never;
    }[keyof R]
  : never;
type Body<O> = O extends { requestBody?: { content: { "application/json": infer B } } } ? B : never;

/** The API answered with a problem (or something that is not JSON). */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    readonly detail: string,
    readonly body: unknown,
    /** Seconds the answer's Retry-After asked for (a 429, a 503), when it named any. */
    readonly retryAfter: number | null = null,
  ) {
    super(`${code}: ${detail}`);
  }
}

/** The API could not be reached at all. */
export class NetworkError extends Error {}

export class Api {
  constructor(
    readonly url: string,
    private readonly key: string,
  ) {}

  /** The absolute URL of a path, its {params} filled in (encoded) and its query set. */
  private urlOf(path: string, params: Record<string, string> = {}, query: Query = {}): URL {
    let filled = path;
    for (const [name, value] of Object.entries(params)) {
      filled = filled.replace(`{${name}}`, encodeURIComponent(value));
    }
    const url = new URL(filled, this.url.endsWith("/") ? this.url : `${this.url}/`);
    for (const [name, value] of Object.entries(query)) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    return url;
  }

  private async send(url: URL, init: RequestInit): Promise<Response> {
    try {
      return await fetch(url, {
        ...init,
        headers: { authorization: `Bearer ${this.key}`, ...(init.headers as Record<string, string>) },
        // The API never redirects; a redirect (to http://, say) is not followed with the key.
        redirect: "error",
        signal: init.signal ?? AbortSignal.timeout(60_000),
      });
    } catch (error) {
      throw this.unreachable(error);
    }
  }

  private unreachable(error: unknown): NetworkError {
    const cause = (error as { cause?: { code?: string; message?: string } }).cause ?? error;
    const c = cause as { code?: string; message?: string };
    return new NetworkError(
      `could not reach ${this.url}: ${c.code ?? c.message ?? (error as Error).message}`,
    );
  }

  async call<P extends keyof paths, M extends Method>(
    method: M,
    path: P,
    options: {
      params?: Record<string, string>;
      query?: Query;
      body?: Body<Op<P, M>>;
      headers?: Record<string, string>;
      /** Shown the answer's headers (a replay's Idempotent-* ones, say). */
      seen?: (headers: Headers) => void;
    } = {},
  ): Promise<Success<Op<P, M>>> {
    return this.json(method, path, options);
  }

  /**
   * A JSON call by path, the answer's type the caller's to name; `call` is the one typed from the
   * OpenAPI document (api-types.ts), and the one to use.
   */
  async json<T>(
    method: Method,
    path: string,
    options: {
      params?: Record<string, string>;
      query?: Query;
      body?: unknown;
      headers?: Record<string, string>;
      seen?: (headers: Headers) => void;
    } = {},
  ): Promise<T> {
    const res = await this.send(this.urlOf(path, options.params, options.query), {
      method: method.toUpperCase(),
      headers: {
        ...options.headers,
        accept: "application/json",
        ...(options.body === undefined ? {} : { "content-type": "application/json" }),
      },
      body: options.body === undefined ? undefined : JSON.stringify(options.body),
    });
    options.seen?.(res.headers);
    return answer<T>(res, await res.text());
  }

  /**
   * GET a body that is not JSON (an artifact's bytes): the response to read as a stream, once
   * it is known to be a success. No overall timeout (a large file takes what it takes); the
   * caller's signal ends it.
   */
  async download(path: string, params: Record<string, string>, signal?: AbortSignal): Promise<Response> {
    const res = await this.send(this.urlOf(path, params), {
      method: "GET",
      headers: { accept: "application/octet-stream, application/problem+json" },
      signal: signal ?? new AbortController().signal,
    });
    if (!res.ok) answer(res, await res.text());
    return res;
  }

  /**
   * GET a body read as it comes (Server-Sent Events): the response once it is a success. No
   * overall timeout; the caller's signal ends it.
   */
  async stream(
    path: string,
    params: Record<string, string>,
    headers: Record<string, string>,
    signal: AbortSignal,
  ): Promise<Response> {
    const res = await this.send(this.urlOf(path, params), { method: "GET", headers, signal });
    if (!res.ok) answer(res, await res.text());
    return res;
  }

  /**
   * POST bytes (a bundle) with their length, reporting how many the connection has taken. The
   * body is a stream pulled one chunk at a time (so progress follows the socket, not a buffer
   * copy) with its Content-Length set, so the API can refuse a bundle that is too large from the
   * header alone; an answer that comes before the body is all sent (413) is the answer.
   */
  async upload<T>(
    path: string,
    bytes: Uint8Array,
    contentType: string,
    onProgress?: (sent: number, total: number) => void,
  ): Promise<T> {
    const CHUNK = 256 * 1024;
    let sent = 0;
    const body = new ReadableStream<Uint8Array>(
      {
        pull(controller) {
          if (sent >= bytes.byteLength) {
            controller.close();
            return;
          }
          const chunk = bytes.subarray(sent, sent + CHUNK);
          sent += chunk.byteLength;
          controller.enqueue(chunk);
          onProgress?.(sent, bytes.byteLength);
        },
      },
      { highWaterMark: 0 },
    );
    let res: Response;
    try {
      res = await this.send(this.urlOf(path), {
        method: "POST",
        headers: {
          accept: "application/json",
          "content-type": contentType,
          "content-length": String(bytes.byteLength),
        },
        body,
        // Node's fetch sends a stream body only half-duplex; the DOM type does not know the field.
        ...({ duplex: "half" } as object),
        // No overall timeout: a large bundle on a slow link takes what it takes.
        signal: new AbortController().signal,
      });
    } catch (error) {
      // A server that refuses a body it has not read may close before its answer is read.
      if (error instanceof NetworkError && sent > 0 && sent < bytes.byteLength) {
        throw new NetworkError(
          `${error.message} (the connection closed after ${sent} of ${bytes.byteLength} bytes: the API may refuse a bundle this large; its limit is 64 MiB unless its operator set another)`,
        );
      }
      throw error;
    }
    return answer<T>(res, await res.text());
  }
}

type Query = Record<string, string | number | undefined>;

/** Retry-After in seconds (its HTTP-date form too), or null when absent or unreadable. */
function retryAfterOf(headers: Headers): number | null {
  const value = headers.get("retry-after")?.trim();
  if (!value) return null;
  if (/^\d+$/.test(value)) return Number(value);
  const at = Date.parse(value);
  return Number.isNaN(at) ? null : Math.max(0, (at - Date.now()) / 1000);
}

/** A response's JSON, or the ApiError its problem (or a body that is not JSON) says. */
function answer<T>(res: Response, text: string): T {
  const { status, statusText } = res;
  const retryAfter = retryAfterOf(res.headers);
  // 204 (a delete): nothing to parse, and nothing the caller reads.
  if (status === 204) return undefined as T;
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    throw new ApiError(status, "not_json", `HTTP ${status} with a body that is not JSON`, text, retryAfter);
  }
  if (status < 200 || status > 299) {
    const p = json as Partial<Problem>;
    throw new ApiError(
      status,
      typeof p.code === "string" ? p.code : `http_${status}`,
      typeof p.detail === "string" ? p.detail : statusText,
      json,
      retryAfter,
    );
  }
  return json as T;
}
