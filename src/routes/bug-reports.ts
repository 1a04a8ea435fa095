import { createRoute, z } from "@hono/zod-openapi";
import { unwrap } from "../errors";
import { IdParam, jsonBody, jsonOk, NextCursor, newRouter, PageQuery, problems } from "../router";
import * as reports from "../runs/bug-reports";

// Bug reports on a run: stored in the run's trace (see src/runs/bug-reports.ts), so the run's
// owner sees them in GET /v1/runs/{id} too. Another tenant's run id is 404, as for no run.

const NewBugReport = z
  .object({
    runId: z.string().min(1).max(64).openapi({ example: "run_0123456789abcdef" }),
    title: reports.BugReportTitle,
    body: reports.BugReportBody,
  })
  .strict();

const BugReportCreated = z
  .object({ id: z.string(), runId: z.string(), title: z.string(), createdAt: z.string().datetime() })
  .strict()
  .openapi("BugReportCreated");

const BugReport = BugReportCreated.extend({
  body: z.string(),
  reportedBy: z.string().openapi({ description: "Id of the API key that filed it" }),
})
  .strict()
  .openapi("BugReport");

const query = PageQuery.strict();

const toJson = (r: reports.BugReport): z.infer<typeof BugReport> => ({
  id: r.id,
  runId: r.runId,
  title: r.title,
  body: r.body,
  reportedBy: r.reportedBy,
  createdAt: r.createdAt.toISOString(),
});

const tags = ["runs"];

export const bugReportsRoutes = newRouter()
  .openapi(
    createRoute({
      method: "post",
      path: "/bug-reports",
      tags,
      operationId: "createBugReport",
      summary: "Report a bug on one of your runs (ended runs too); it joins the run's trace",
      request: jsonBody(NewBugReport),
      responses: { 201: jsonOk(BugReportCreated, "Created"), ...problems(400, 401, 404) },
    }),
    async (c) => {
      const r = unwrap(await reports.createBugReport(c.var.db, c.var.principal, c.req.valid("json")));
      return c.json({ id: r.id, runId: r.runId, title: r.title, createdAt: r.createdAt.toISOString() }, 201);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/bug-reports",
      tags,
      operationId: "listRunBugReports",
      summary: "A run's bug reports, newest first",
      request: { params: IdParam("run_"), query },
      responses: {
        200: jsonOk(
          z.object({
            bugReports: z.array(BugReport),
            nextCursor: NextCursor,
          }),
        ),
        ...problems(400, 401, 404),
      },
    }),
    async (c) => {
      const page = unwrap(
        await reports.listBugReports(c.var.db, c.var.principal, c.req.valid("param").id, {
          ...c.req.valid("query"),
          ring: c.var.config.keyRing,
        }),
      );
      return c.json({ bugReports: page.items.map(toJson), nextCursor: page.nextCursor }, 200);
    },
  );
