import { createExecutionContext } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { sql } from "drizzle-orm";
import { describe, expect, inject, it } from "vitest";
import { runEvents } from "../../src/db/schema";
import worker from "../../src/index";
import { lockTrace } from "../../src/runs/events";
import { addEvent, recordTransition } from "../../src/runs/service";
import { BASE, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { newRun, setRunStatus } from "./run-fixtures";

// GET /v1/runs/{id}/events: pages after a cursor and the live stream (case O2), read through the
// real Worker against the real database, with events written by the code the coordinator uses.

type Event = { cursor: string; kind: string; state: string | null; detail: unknown };

const output = (runId: string, n: number) =>
  withDb((db) => addEvent(db, runId, `out:${n}`, "output", { text: `line ${n}\n` }));
const texts = (events: Event[]) => events.map((e) => (e.detail as { text?: string } | null)?.text ?? e.state);

/** Every page after `after`, `limit` at a time, until a page that is not full. */
async function readPages(t: Tenant, runId: string, limit: number, after?: string) {
  const events: Event[] = [];
  let cursor = after;
  for (;;) {
    const query = new URLSearchParams({ limit: String(limit), ...(cursor ? { after: cursor } : {}) });
    const res = await t.api("GET", `/v1/runs/${runId}/events?${query}`);
    expect(res.status, res.text).toBe(200);
    events.push(...res.json.events);
    cursor = res.json.cursor;
    if (!res.json.more) return { events, cursor: cursor as string, status: res.json.status as string };
  }
}

/** One Server-Sent Events connection, read frame by frame; `drop` ends it from our side. */
async function openStream(t: Tenant, runId: string, lastEventId?: string) {
  const headers: Record<string, string> = { authorization: `Bearer ${t.key}`, accept: "text/event-stream" };
  if (lastEventId) headers["last-event-id"] = lastEventId;
  const res = await worker.fetch(
    new Request(`${BASE}/v1/runs/${runId}/events`, { headers }),
    env,
    createExecutionContext(),
  );
  expect(res.status).toBe(200);
  expect(res.headers.get("content-type")).toMatch(/^text\/event-stream/);
  const reader = (res.body as ReadableStream<Uint8Array>).pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  return {
    /** The next frame with data (comments and `retry:` skipped); null when the stream ended. */
    async next(): Promise<{ id: string | null; event: string; data: unknown } | null> {
      for (;;) {
        const end = buffer.indexOf("\n\n");
        if (end >= 0) {
          const frame = buffer.slice(0, end).split("\n");
          buffer = buffer.slice(end + 2);
          const field = (name: string) =>
            frame.find((l) => l.startsWith(`${name}: `))?.slice(name.length + 2) ?? null;
          const data = field("data");
          if (data === null) continue;
          return { id: field("id"), event: field("event") ?? "message", data: JSON.parse(data) };
        }
        const { value, done } = await reader.read();
        if (done) return null;
        buffer += value;
      }
    },
    drop: () => reader.cancel(),
  };
}

describe("GET /v1/runs/{id}/events", () => {
  // case O2
  it("pages after a cursor lose and repeat nothing, and a cursor goes on from where it was", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    for (let n = 1; n <= 7; n++) await output(run.id, n);
    const first = await readPages(t, run.id, 3);
    expect(texts(first.events)).toEqual([1, 2, 3, 4, 5, 6, 7].map((n) => `line ${n}\n`));
    expect(new Set(first.events.map((e) => e.cursor)).size).toBe(7);
    expect(first.status).toBe("running");

    // Nothing new: the same cursor, no event. Then new events (and a repeated write of an old
    // one, which the trace keeps once) come after it, and nothing before it again.
    const idle = await t.api("GET", `/v1/runs/${run.id}/events?after=${first.cursor}`);
    expect(idle.json).toMatchObject({ events: [], cursor: first.cursor, more: false });
    await output(run.id, 3);
    for (let n = 8; n <= 9; n++) await output(run.id, n);
    await withDb((db) => recordTransition(db, run.id, { to: "finished", reason: "completed" }));
    const rest = await readPages(t, run.id, 2, first.cursor);
    expect(texts(rest.events)).toEqual(["line 8\n", "line 9\n", "finished"]);
    // A cursor from the middle reads from there.
    const middle = await readPages(t, run.id, 50, first.events[4]?.cursor);
    expect(texts(middle.events)).toEqual(["line 6\n", "line 7\n", "line 8\n", "line 9\n", "finished"]);
  });

  it("refuses a cursor that is not one, or is another run's, and another tenant's run is a 404", async () => {
    const t = await newTenant();
    const mine = await newRun(t);
    const other = await newRun(t);
    await output(other.id, 1);
    const otherCursor = (await t.api("GET", `/v1/runs/${other.id}/events`)).json.events[0].cursor;
    expectProblem(
      await t.api("GET", `/v1/runs/${mine.id}/events?after=${otherCursor}`),
      400,
      "invalid_cursor",
    );
    expectProblem(
      await t.api("GET", `/v1/runs/${mine.id}/events?after=bm90LWEtY3Vyc29y`),
      400,
      "invalid_cursor",
    );
    expectProblem(await t.api("GET", `/v1/runs/${mine.id}/events?limit=201`), 400, "invalid_request");
    const stranger = await newTenant();
    expectProblem(await stranger.api("GET", `/v1/runs/${mine.id}/events`), 404, "not_found");
  });

  // case O2
  it("streams a live run, resumes from Last-Event-ID after a dropped connection, and ends with the run", async () => {
    const t = await newTenant();
    const run = await newRun(t, { status: "running" });
    await output(run.id, 1);
    const seen: Event[] = [];
    const first = await openStream(t, run.id);
    const a = await first.next();
    seen.push(a?.data as Event);
    expect(a?.id).toBe((a?.data as Event | undefined)?.cursor);
    expect(a?.id).toBeTruthy();
    // Written while the stream is open: it arrives on it.
    await output(run.id, 2);
    const b = await first.next();
    seen.push(b?.data as Event);
    // The connection drops; events are written while nobody listens.
    await first.drop();
    for (let n = 3; n <= 5; n++) await output(run.id, n);
    const second = await openStream(t, run.id, b?.id ?? undefined);
    await withDb((db) => recordTransition(db, run.id, { to: "finished", reason: "completed" }));
    let end: unknown = null;
    for (;;) {
      const frame = await second.next();
      if (!frame) break;
      if (frame.event === "end") end = frame.data;
      else seen.push(frame.data as Event);
    }
    expect(texts(seen)).toEqual(["line 1\n", "line 2\n", "line 3\n", "line 4\n", "line 5\n", "finished"]);
    expect(end).toEqual({ status: "finished", reason: "completed" });
    // The page read of the same trace has the same cursors: one position per event.
    expect((await readPages(t, run.id, 200)).events.map((e) => e.cursor)).toEqual(seen.map((e) => e.cursor));
  });

  it("a stream of an ended run sends what is left and ends", async () => {
    const t = await newTenant();
    const run = await newRun(t);
    await output(run.id, 1);
    await setRunStatus(run.id, "stopped");
    const stream = await openStream(t, run.id);
    expect(texts([(await stream.next())?.data as Event])).toEqual(["line 1\n"]);
    expect((await stream.next())?.event).toBe("end");
    expect(await stream.next()).toBeNull();
  });

  // case O2: two writers of one run; the one that took the earlier id commits last. A reader
  // must not get past the later one while the earlier is still to come. PGlite is one session:
  // its second writer cannot wait on the first's lock, so this needs the real PostgreSQL.
  it.skipIf((inject as (key: string) => unknown)("databaseKind") === "pglite")(
    "a run's events commit in id order, so a reader never skips one committed late",
    async () => {
      const t = await newTenant();
      const run = await newRun(t, { status: "running" });
      let commit = () => {};
      const held = new Promise<void>((resolve) => {
        commit = resolve;
      });
      let inserted = () => {};
      const insertedYet = new Promise<void>((resolve) => {
        inserted = resolve;
      });
      const early = withDb((db) =>
        db.transaction(async (tx) => {
          await lockTrace(tx, run.id);
          await tx
            .insert(runEvents)
            .values({ runId: run.id, key: "early", kind: "output", detail: { text: "early" } });
          inserted();
          await held;
        }),
      );
      await insertedYet;
      const late = output(run.id, 2);
      // The second writer waits on the run's trace lock (seen in pg_locks), so nothing is
      // readable yet, and the reader's cursor stays before both.
      await withDb(async (db) => {
        for (;;) {
          const waiting = await db.execute(
            sql`select count(*)::int as n from pg_locks where locktype = 'advisory' and not granted`,
          );
          if ((waiting.rows[0] as { n: number }).n > 0) break;
          await new Promise((r) => setTimeout(r, 20));
        }
      });
      const before = await readPages(t, run.id, 10);
      expect(before.events).toEqual([]);
      commit();
      await Promise.all([early, late]);
      const after = await readPages(t, run.id, 10, before.cursor);
      expect(texts(after.events)).toEqual(["early", "line 2\n"]);
    },
  );
});
