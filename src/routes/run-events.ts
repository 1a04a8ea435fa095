import { RUN_STATES } from "@benchwright/shared/contract/run-states";
import { createRoute, z } from "@hono/zod-openapi";
import { runEvents } from "../db/schema";
import { unwrap } from "../errors";
import { IdParam, newRouter, problems } from "../router";
import { badCursor } from "../runs/cursor";
import { eventStream } from "../runs/event-stream";
import { EVENTS_PAGE_MAX, eventCursor, eventsAfter, positionOf, traceEventJson } from "../runs/events";
import { getRun } from "../runs/service";

// GET /v1/runs/{id}/events: the run's trace after a cursor (case O2), as a bounded page, or, with
// `Accept: text/event-stream`, as Server-Sent Events until the run has ended (each event's `id:`
// is its cursor, so a reconnect with Last-Event-ID goes on where it stopped).

const RunTraceEvent = z
  .object({
    cursor: z.string().openapi({ description: "This event's position: `after` reads what follows it" }),
    kind: z.enum(runEvents.kind.enumValues),
    state: z.string().nullable(),
    reason: z.string().nullable(),
    detail: z.unknown(),
    at: z.string().datetime(),
  })
  .openapi("RunTraceEvent");

const EventsPage = z
  .object({
    events: z.array(RunTraceEvent),
    cursor: z.string().openapi({ description: "Where this page ends: the next page's `after`" }),
    more: z.boolean().openapi({ description: "The page is full: more events may follow at once" }),
    status: z.enum(RUN_STATES).openapi({ description: "The run's status before this page was read" }),
  })
  .openapi("RunEventsPage");

const DESCRIPTION =
  "Bounded pages of the run's trace after `after` (absent: from its start), oldest first; the " +
  "cursor is opaque and bound to this run (another run's → 400). With `Accept: text/event-stream` " +
  "the same events as Server-Sent Events: `id:` is each event's cursor, `Last-Event-ID` (sent by " +
  "a reconnecting client) takes the place of `after`, comment lines keep the connection alive, " +
  "and `event: end` (data: the run's status and reason) closes the stream once the run has ended " +
  "and every event was sent. A stream may also close earlier (it lasts a few minutes at most): " +
  "reconnect with the last id. Read in order, pages and streams lose and repeat nothing.";

export const runEventsRoutes = newRouter().openapi(
  createRoute({
    method: "get",
    path: "/runs/{id}/events",
    tags: ["runs"],
    operationId: "listRunEvents",
    summary: "A run's trace after a cursor: pages, or Server-Sent Events while it runs",
    description: DESCRIPTION,
    request: {
      params: IdParam("run_"),
      query: z
        .object({
          after: z.string().max(200).optional(),
          limit: z.coerce.number().int().min(1).max(EVENTS_PAGE_MAX).default(100),
        })
        .strict(),
    },
    responses: {
      200: {
        description: "A page (application/json) or the stream (text/event-stream)",
        content: {
          "application/json": { schema: EventsPage },
          "text/event-stream": { schema: z.string().openapi({ description: "Server-Sent Events" }) },
        },
      },
      ...problems(400, 401, 404),
    },
  }),
  async (c) => {
    const run = unwrap(await getRun(c.var.db, c.var.principal, c.req.valid("param").id));
    const { after, limit } = c.req.valid("query");
    const streamed = c.req.header("accept")?.includes("text/event-stream") === true;
    const cursor = (streamed ? c.req.header("last-event-id") : undefined) || after;
    const position = cursor === undefined ? 0 : (positionOf(run.id, cursor) ?? unwrap<number>(badCursor()));
    if (streamed) {
      return new Response(eventStream(c.var.config, run.id, position), {
        headers: {
          "content-type": "text/event-stream; charset=utf-8",
          "cache-control": "no-store",
          "x-accel-buffering": "no",
        },
      });
    }
    const page = await eventsAfter(c.var.db, run.id, position, limit);
    return c.json(
      {
        events: page.events.map(traceEventJson),
        cursor: eventCursor(run.id, page.position),
        more: page.events.length === limit,
        status: run.status,
      },
      200,
    );
  },
);
