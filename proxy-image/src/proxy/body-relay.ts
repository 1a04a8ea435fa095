import type { Readable, Writable } from "node:stream";
import type { Redactor } from "./redact";

// The one relay of a response body to the client, for the main path (handler/forward.ts) and the
// model lane (model/relay.ts) alike.

const prematureClose = (): Error =>
  Object.assign(new Error("Premature close"), { code: "ERR_STREAM_PREMATURE_CLOSE" });

/**
 * One response body from `source` to `dest`: masked in place (the chunks are the proxy's own),
 * counted into `exchange.bytesOut`, with backpressure (a full `dest` pauses `source`, and with it
 * the upstream). Settles as `pipeline([source, dest])` did, without its per-call AbortController
 * and stream plumbing: resolved when `dest` finishes; an error or a premature close of either side
 * destroys the other and rejects. A chunk is written at the end of the task that read it, so a
 * body that ends in the same read (most do) goes out with `dest.end(chunk)`: one write, where a
 * write then an end would cost a second, empty one on a TLS socket still flushing the first.
 */
export function relayBody(
  source: Readable,
  dest: Writable,
  redactor: Redactor | null,
  exchange: { bytesOut: number },
): Promise<void> {
  return new Promise((resolve, reject) => {
    let pending: Buffer | null = null;
    let ended = false;
    let settled = false;
    const flush = () => {
      const chunk = pending;
      pending = null;
      if (chunk !== null && !settled && !ended && !dest.write(chunk)) source.pause();
    };
    const fail = (error: Error) => {
      if (settled) return;
      settled = true;
      pending = null;
      cleanup();
      source.destroy(error);
      dest.destroy(error);
      reject(error);
    };
    const onData = (chunk: Buffer) => {
      const out = redactor ? redactor.push(chunk) : chunk;
      if (out.length === 0) return;
      exchange.bytesOut += out.length;
      if (pending !== null) flush();
      else queueMicrotask(flush);
      pending = out;
    };
    const onEnd = () => {
      ended = true;
      const tail = redactor?.end() ?? null;
      if (tail !== null) exchange.bytesOut += tail.length;
      let last = pending;
      pending = null;
      if (last !== null && tail !== null) {
        dest.write(last);
        last = tail;
      } else last ??= tail;
      if (last !== null) dest.end(last);
      else dest.end();
    };
    const onSourceError = (error: Error) => fail(error);
    const onSourceClose = () => {
      if (!ended) fail(prematureClose());
    };
    const onDestError = (error: Error) => fail(error);
    const onDestClose = () => {
      if (!settled) fail(prematureClose());
    };
    const onDrain = () => source.resume();
    const onFinish = () => {
      if (settled) return;
      settled = true;
      cleanup();
      resolve();
    };
    const cleanup = () => {
      source.off("data", onData);
      source.off("end", onEnd);
      source.off("error", onSourceError);
      source.off("close", onSourceClose);
      dest.off("error", onDestError);
      dest.off("close", onDestClose);
      dest.off("drain", onDrain);
      dest.off("finish", onFinish);
    };
    source.on("end", onEnd);
    source.on("error", onSourceError);
    source.on("close", onSourceClose);
    dest.on("error", onDestError);
    dest.on("close", onDestClose);
    dest.on("drain", onDrain);
    dest.on("finish", onFinish);
    if (source.destroyed && !ended) return fail((source.errored as Error | null) ?? prematureClose());
    if (dest.destroyed) return fail((dest.errored as Error | null) ?? prematureClose());
    source.on("data", onData);
  });
}
