import { isTerminal } from "@benchwright/shared/contract/run-states";
import { type DbSettings, openDb } from "../db/client";
import { EVENTS_PAGE_MAX, eventsAfter, traceEventJson } from "./events";
import { loadRun } from "./service";

// A run's trace after a position as Server-Sent Events (case O2). Each event's `id:` is its
// cursor, so a client that lost the connection sends it back as Last-Event-ID and misses nothing.
// Pulled: the database is read only when the client has taken what was sent, and a client that
// goes away cancels the stream (and its database handle) instead of leaving a loop behind.
// The stream ends with `event: end` once the run has ended and every event was sent; before
// that it ends after LIFETIME_MS without one (a client reconnects: no request runs for ever).

export interface StreamTiming {
  pollMs: number;
  keepAliveMs: number;
  lifetimeMs: number;
}

const TIMING: StreamTiming = { pollMs: 1000, keepAliveMs: 15_000, lifetimeMs: 5 * 60_000 };
/** What a reconnecting EventSource waits (`retry:`), in ms. */
const RETRY_MS = 2000;

export function eventStream(
  settings: DbSettings,
  runId: string,
  start: number,
  timing: StreamTiming = TIMING,
): ReadableStream<Uint8Array> {
  const encoder = new TextEncoder();
  const { db, close } = openDb(settings);
  const opened = Date.now();
  let position = start;
  let lastSent = opened;
  let started = false;
  const send = (controller: ReadableStreamDefaultController<Uint8Array>, text: string) => {
    lastSent = Date.now();
    controller.enqueue(encoder.encode(text));
  };
  const finish = async (controller: ReadableStreamDefaultController<Uint8Array>) => {
    controller.close();
    await close().catch(() => {});
  };
  return new ReadableStream<Uint8Array>({
    async pull(controller) {
      if (!started) {
        started = true;
        return send(controller, `retry: ${RETRY_MS}\n\n`);
      }
      try {
        for (;;) {
          // The status first: when it says ended, the events read after it include its last.
          const run = await loadRun(db, runId);
          const page = await eventsAfter(db, runId, position, EVENTS_PAGE_MAX);
          if (page.events.length > 0) {
            position = page.position;
            const frames = page.events.map(
              (e) => `id: ${e.cursor}\ndata: ${JSON.stringify(traceEventJson(e))}\n\n`,
            );
            return send(controller, frames.join(""));
          }
          if (!run || isTerminal(run.status)) {
            const end = { status: run?.status ?? null, reason: run?.reason ?? null };
            send(controller, `event: end\ndata: ${JSON.stringify(end)}\n\n`);
            return await finish(controller);
          }
          if (Date.now() - opened >= timing.lifetimeMs) return await finish(controller);
          if (Date.now() - lastSent >= timing.keepAliveMs) return send(controller, ": keep-alive\n\n");
          await new Promise((resolve) => setTimeout(resolve, timing.pollMs));
        }
      } catch {
        // The database failed: end the stream; the client reconnects from its last id.
        await finish(controller);
      }
    },
    async cancel() {
      await close().catch(() => {});
    },
  });
}
