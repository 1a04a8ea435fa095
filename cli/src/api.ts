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

  async call<P extends keyof paths, M extends Method>(
    method: M,
    path: P,
    options: {
      params?: Record<string, string>;
      query?: Record<string, string | number | undefined>;
      body?: Body<Op<P, M>>;
    } = {},
  ): Promise<Success<Op<P, M>>> {
    let filled: string = path;
    for (const [name, value] of Object.entries(options.params ?? {})) {
      filled = filled.replace(`{${name}}`, encodeURIComponent(value));
    }
    const url = new URL(filled, this.url.endsWith("/") ? this.url : `${this.url}/`);
    for (const [name, value] of Object.entries(options.query ?? {})) {
      if (value !== undefined) url.searchParams.set(name, String(value));
    }
    let res: Response;
    try {
      res = await fetch(url, {
        method: method.toUpperCase(),
        headers: {
          authorization: `Bearer ${this.key}`,
          accept: "application/json",
          ...(options.body === undefined ? {} : { "content-type": "application/json" }),
        },
        body: options.body === undefined ? undefined : JSON.stringify(options.body),
        signal: AbortSignal.timeout(60_000),
      });
    } catch (error) {
      const cause = (error as { cause?: { code?: string; message?: string } }).cause;
      throw new NetworkError(
        `could not reach ${this.url}: ${cause?.code ?? cause?.message ?? (error as Error).message}`,
      );
    }
    const text = await res.text();
    // 204 (a delete): nothing to parse, and nothing the caller reads.
    if (res.status === 204) return undefined as Success<Op<P, M>>;
    let json: unknown;
    try {
      json = JSON.parse(text);
    } catch {
      throw new ApiError(res.status, "not_json", `HTTP ${res.status} with a body that is not JSON`, text);
    }
    if (!res.ok) {
      const p = json as Partial<Problem>;
      throw new ApiError(
        res.status,
        typeof p.code === "string" ? p.code : `http_${res.status}`,
        typeof p.detail === "string" ? p.detail : res.statusText,
        json,
      );
    }
    return json as Success<Op<P, M>>;
  }
}
