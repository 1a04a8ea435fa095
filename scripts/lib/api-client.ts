// A minimal client of the public API for tests and benches: method, path and JSON body in; the
// status, the parsed JSON (null when the body is not JSON) and the raw text out.

export interface ApiClient {
  key: string;
  // biome-ignore lint/suspicious/noExplicitAny: callers read arbitrary JSON
  call(method: string, path: string, body?: unknown): Promise<{ status: number; json: any; text: string }>;
}

export function apiClient(apiUrl: string, key: string): ApiClient {
  return {
    key,
    async call(method, path, body) {
      const res = await fetch(`${apiUrl}${path}`, {
        method,
        headers: {
          authorization: `Bearer ${key}`,
          ...(body === undefined ? {} : { "content-type": "application/json" }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      const text = await res.text();
      let json: unknown = null;
      try {
        json = JSON.parse(text);
      } catch {}
      return { status: res.status, json, text };
    },
  };
}
