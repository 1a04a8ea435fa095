import { Readable } from "node:stream";
import type { Dispatcher } from "undici";

// One request through an undici pool, over HTTP/1.1 or HTTP/2 (whichever the origin chose in
// ALPN), with its response trailers. undici's request() loses HTTP/2 trailers (7.30: it parses
// nghttp2's trailer object as if it were a raw header list, and gets nothing), and gRPC's status
// lives in them, so this dispatches with a handler of its own: the raw trailers it is handed are
// a flat list of Buffers from HTTP/1.1 and an object from HTTP/2; both are read here.

/** An upstream's answer, on the main path and (without trailers) the model lane alike. */
export interface UpstreamAnswer {
  status: number;
  headers: Record<string, string | string[] | undefined>;
  /** The response body; backpressure reaches the upstream (undici pauses the socket or stream). */
  body: Readable;
  /** Filled in before `body` ends. */
  trailers: Record<string, string | string[]>;
}

/** Resolves when the response head arrives (informational 1xx answers are skipped). */
export function upstreamExchange(
  pool: Dispatcher,
  opts: Dispatcher.DispatchOptions,
): Promise<UpstreamAnswer> {
  return new Promise((resolve, reject) => {
    let abort: ((err?: Error) => void) | null = null;
    let resume: (() => void) | null = null;
    let body: Readable | null = null;
    let complete = false;
    const trailers: Record<string, string | string[]> = {};
    pool.dispatch(opts, {
      onConnect(abortFn) {
        abort = abortFn;
      },
      onHeaders(status, raw, resumeFn) {
        if (status < 200) return true;
        resume = resumeFn;
        body = new Readable({
          read: () => resume?.(),
          destroy(error, done) {
            // The client went away or a later stage failed: stop the upstream exchange too.
            if (!complete) abort?.(error ?? new Error("response body destroyed"));
            done(error);
          },
        });
        // Whoever reads the body sees its error (pipeline() checks an errored stream); this only
        // keeps an error with no reader yet (a refused encoding, a bodyless answer) from being thrown.
        body.on("error", () => {});
        resolve({ status, headers: headerRecord(raw), body, trailers });
        return true;
      },
      onData(chunk) {
        return body?.push(chunk) ?? false;
      },
      onComplete(raw) {
        complete = true;
        Object.assign(trailers, headerRecord(raw));
        body?.push(null);
      },
      onError(error) {
        if (body) body.destroy(error);
        else reject(error);
      },
    });
  });
}

/** Header fields from undici's raw form: `[name, value, ...]` (Buffers or strings) or an object. */
function headerRecord(raw: unknown): Record<string, string | string[]> {
  const out: Record<string, string | string[]> = {};
  const add = (name: string, value: string) => {
    const key = name.toLowerCase();
    if (key.startsWith(":") || key === "__proto__") return;
    const prior = out[key];
    out[key] = prior === undefined ? value : Array.isArray(prior) ? [...prior, value] : [prior, value];
  };
  if (Array.isArray(raw)) {
    for (let i = 0; i + 1 < raw.length; i += 2) add(latin1(raw[i]), latin1(raw[i + 1]));
  } else if (raw !== null && typeof raw === "object") {
    for (const [name, value] of Object.entries(raw)) {
      for (const v of Array.isArray(value) ? value : [value]) if (v !== undefined) add(name, latin1(v));
    }
  }
  return out;
}

const latin1 = (v: unknown): string => (Buffer.isBuffer(v) ? v.toString("latin1") : String(v));
