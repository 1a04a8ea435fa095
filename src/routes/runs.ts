import { RoutingMode } from "@benchwright/shared/contract/policy";
import { ProxyView } from "@benchwright/shared/contract/proxy-view";
import { LingerSeconds, RunSpec, readStoredSpec } from "@benchwright/shared/contract/run-spec";
import { createRoute, z } from "@hono/zod-openapi";
import type { Context } from "hono";
import type { AppEnv } from "../context";
import { cancelRun, coordinatorStub, launchRun } from "../coordinator/client";
import { RUN_STATES } from "../db/schema";
import { ApiError, unwrap } from "../errors";
import { shownOnce } from "../idempotency/withheld";
import { IdParam, iso, jsonBody, jsonOk, NextCursor, newRouter, PageQuery, problems } from "../router";
import { issueEgressToken } from "../runs/egress-token";
import { checkLinger } from "../runs/launch";
import { Linger, lingerOf } from "../runs/linger";
import * as runs from "../runs/service";
import { previewPolicy } from "../vault/policy";
import { agentCommand, EgressAgentToken, LOST_AGENT_TOKEN, publicUrl } from "./egress-agent";

const Note = z
  .object({ level: z.enum(["note", "warning"]), code: z.string(), text: z.string() })
  .openapi("RunNote");

const Event = z
  .object({
    kind: z.enum(["transition", "note", "output", "proxy", "bug_report"]),
    state: z.string().nullable(),
    reason: z.string().nullable(),
    detail: z.unknown(),
    at: z.string().datetime(),
  })
  .openapi("RunEvent");

const Sandbox = z
  .object({
    id: z.string(),
    kind: z.enum(["proxy", "work", "task", "orchestrator"]),
    taskIndex: z.number().int().nullable(),
    backend: z.string(),
    status: z.enum(["creating", "ready", "destroyed", "failed"]),
    routing: RoutingMode.nullable().openapi({ description: "Installed when it was made" }),
    createdAt: z.string().datetime(),
    destroyedAt: z.string().datetime().nullable(),
  })
  .openapi("Sandbox");

const RunSummary = z
  .object({
    id: z.string(),
    status: z.enum(RUN_STATES),
    reason: z.string().nullable().openapi({ description: "Why the run ended (stable code)" }),
    reasonDetail: z.string().nullable(),
    routing: RoutingMode.nullable(),
    backend: z.string(),
    benchmark: z
      .string()
      .nullable()
      .openapi({ description: "The built-in benchmark it ran; null: commands" }),
    createdAt: z.string().datetime(),
    startedAt: z.string().datetime().nullable(),
    endedAt: z.string().datetime().nullable(),
  })
  .openapi("RunSummary");

const RunDetail = RunSummary.extend({
  spec: RunSpec.openapi({ description: "The run spec as launched" }),
  policyVersion: z.number().int().nullable(),
  notes: z.array(Note).openapi({ description: "Network the platform changed" }),
  proof: z.unknown().openapi({ description: "What the wiring step proved about the boundary" }),
  proxy: z.object({ caFingerprint: z.string().nullable(), readyAt: z.string().datetime().nullable() }),
  halted: z.boolean().openapi({ description: "Halted for review (POST /v1/runs/{id}/halt)" }),
  linger: Linger,
  sandboxes: z.array(Sandbox),
  trace: z.array(Event),
}).openapi("Run");

const summary = (r: runs.RunRow): z.infer<typeof RunSummary> => ({
  id: r.id,
  status: r.status,
  reason: r.reason,
  reasonDetail: r.reasonDetail,
  routing: r.routing,
  backend: r.backend,
  benchmark: runs.benchmarkOf(r),
  createdAt: r.createdAt.toISOString(),
  startedAt: iso(r.startedAt),
  endedAt: iso(r.endedAt),
});

const tags = ["runs"];

function haltRoute(action: "halt" | "resume", summary: string) {
  return createRoute({
    method: "post",
    path: `/runs/{id}/${action}`,
    tags,
    operationId: `${action}Run`,
    summary,
    request: {
      params: IdParam("run_"),
      body: { content: { "application/json": { schema: z.object({}).strict() } }, required: false },
    },
    responses: {
      202: jsonOk(RunSummary, "Accepted: applied at the run's next step"),
      ...problems(401, 404, 409),
    },
  });
}

async function halt(c: Context<AppEnv>, on: boolean) {
  const run = unwrap(await runs.getRun(c.var.db, c.var.principal, c.req.param("id") ?? ""));
  const accepted = !runs.isTerminal(run.status) && (await coordinatorStub(c.env, run.id).halt(on));
  if (!accepted)
    throw new ApiError(
      "run_ended",
      `Run ${run.id} has ended (${run.status}); there is nothing to ${on ? "halt" : "resume"}.`,
    );
  return c.json(summary(run), 202);
}
const params = IdParam("run_");

/**
 * A run that will wait for the user's egress agent gets its token in the launch answer: egress
 * local, or a vault that routes some host through the tunnel now. (Later, or for a vault edited
 * after the launch: POST /v1/runs/{id}/egress-agent-token.)
 */
async function egressAgentAtLaunch(c: Context<AppEnv>, runId: string, spec: RunSpec) {
  const local = spec.egress === "local";
  if (!local) {
    const preview = await previewPolicy(c.var.db, c.var.principal, { egress: "direct" });
    if (!preview.routing.reasons.includes("tunnel_host")) return null;
  }
  const token = await issueEgressToken(c.var.db, runId);
  return token ? { token, command: agentCommand(publicUrl(c.req.url, c.env.PUBLIC_URL), token) } : null;
}

export const runsRoutes = newRouter()
  .openapi(
    createRoute({
      method: "post",
      path: "/runs",
      tags,
      operationId: "createRun",
      summary: "Launch a run",
      request: jsonBody(RunSpec),
      responses: {
        202: jsonOk(
          RunSummary.extend({
            egressAgent: shownOnce(
              EgressAgentToken,
              "When the run egresses through your machine (egress local, or a host via tunnel): the token and command for its egress agent, shown once.",
              LOST_AGENT_TOKEN,
            ),
          }),
          "Accepted: the run is queued",
        ),
        ...problems(400, 401),
      },
    }),
    async (c) => {
      const spec = c.req.valid("json");
      const run = await launchRun(c.env, c.var.db, c.var.principal, spec, c.var.requestId);
      const egressAgent = await egressAgentAtLaunch(c, run.id, spec);
      return c.json({ ...summary(run), ...(egressAgent ? { egressAgent } : {}) }, 202);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs",
      tags,
      operationId: "listRuns",
      summary: "List runs, newest first; filter by status, benchmark and launch time",
      request: {
        query: PageQuery.extend({
          status: z.enum(RUN_STATES).optional().openapi({ description: "Only runs in this state" }),
          benchmark: z
            .string()
            .max(64)
            .optional()
            .openapi({ description: "Only runs of this built-in benchmark" }),
          since: z.iso
            .datetime({ offset: true })
            .optional()
            .openapi({ description: "Only runs launched at or after this time" }),
          until: z.iso
            .datetime({ offset: true })
            .optional()
            .openapi({ description: "Only runs launched before this time" }),
        }).strict(),
      },
      responses: {
        200: jsonOk(z.object({ runs: z.array(RunSummary), nextCursor: NextCursor })),
        ...problems(400, 401),
      },
    }),
    async (c) => {
      const { limit, cursor, since, until, ...filter } = c.req.valid("query");
      const page = unwrap(
        await runs.listRuns(
          c.var.db,
          c.var.principal,
          { limit, cursor, ring: c.var.config.keyRing },
          {
            ...filter,
            since: since ? new Date(since) : undefined,
            until: until ? new Date(until) : undefined,
          },
        ),
      );
      return c.json({ runs: page.items.map(summary), nextCursor: page.nextCursor }, 200);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}",
      tags,
      operationId: "getRun",
      summary: "Read a run: status and reason, notes, proof, sandboxes, trace",
      request: { params },
      responses: { 200: jsonOk(RunDetail), ...problems(401, 404) },
    }),
    async (c) => {
      const run = unwrap(await runs.getRun(c.var.db, c.var.principal, c.req.valid("param").id));
      const [trace, boxes] = await Promise.all([
        runs.runTrace(c.var.db, run.id),
        runs.runSandboxes(c.var.db, run.id),
      ]);
      return c.json(
        {
          ...summary(run),
          spec: readStoredSpec(run.spec),
          policyVersion: run.policyVersion,
          notes: run.notes as runs.RunNote[],
          proof: run.proof,
          proxy: { caFingerprint: run.caFingerprint, readyAt: iso(run.proxyReadyAt) },
          halted: runs.haltedNow(run, trace),
          linger: lingerOf(run),
          sandboxes: boxes.map((b) => ({
            ...b,
            createdAt: b.createdAt.toISOString(),
            destroyedAt: iso(b.destroyedAt),
          })),
          trace: trace.map((e) => ({ ...e, at: e.at.toISOString() })),
        },
        200,
      );
    },
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/runs/{id}/cancel",
      tags,
      operationId: "cancelRun",
      summary: "Cancel a run: it stops, its sandboxes are torn down (no-op once it has ended)",
      request: {
        params,
        // No options yet; a body, if sent, must be empty (unknown fields are refused, case C3).
        body: { content: { "application/json": { schema: z.object({}).strict() } }, required: false },
      },
      responses: { 202: jsonOk(RunSummary, "Accepted"), ...problems(401, 404) },
    }),
    async (c) => {
      const run = unwrap(await runs.getRun(c.var.db, c.var.principal, c.req.valid("param").id));
      if (!runs.isTerminal(run.status)) await cancelRun(c.env, c.var.db, run.id, c.var.requestId);
      return c.json(summary(run), 202);
    },
  )
  .openapi(
    haltRoute(
      "halt",
      "Halt a running run for review: its commands stop; the proxy keeps enforcing and picks up host policy edits",
    ),
    (c) => halt(c, true),
  )
  .openapi(
    haltRoute(
      "resume",
      "Resume a halted run (a policy edit that needs catch-all routing is noted, not retrofitted)",
    ),
    (c) => halt(c, false),
  )
  .openapi(
    createRoute({
      method: "post",
      path: "/runs/{id}/linger",
      tags,
      operationId: "setRunLinger",
      summary:
        "Keep the run's proxy sandbox this long after its commands end (at most 24 h); while lingering, changes the window",
      request: {
        params,
        ...jsonBody(z.object({ seconds: LingerSeconds }).strict().openapi("LingerRequest")),
      },
      responses: { 202: jsonOk(RunSummary, "Accepted"), ...problems(400, 401, 404, 409) },
    }),
    async (c) => {
      const { seconds } = c.req.valid("json");
      unwrap(checkLinger(seconds));
      const run = unwrap(await runs.getRun(c.var.db, c.var.principal, c.req.valid("param").id));
      const accepted = !runs.isTerminal(run.status) && (await coordinatorStub(c.env, run.id).linger(seconds));
      if (!accepted) {
        throw new ApiError(
          "run_ended",
          `Run ${run.id} has ended or is ending; its proxy can no longer be kept.`,
        );
      }
      return c.json(summary(run), 202);
    },
  )
  .openapi(
    createRoute({
      method: "get",
      path: "/runs/{id}/proxy",
      tags,
      operationId: "getRunProxy",
      summary:
        "The run's proxy as it sees itself (counters, recent decisions, audit); resumes a paused lingering proxy",
      request: { params },
      responses: {
        200: jsonOk(z.object({ resumed: z.boolean(), view: ProxyView }).openapi("ProxyViewResponse")),
        ...problems(401, 404, 409, 503),
      },
    }),
    async (c) => {
      const run = unwrap(await runs.getRun(c.var.db, c.var.principal, c.req.valid("param").id));
      if (runs.isTerminal(run.status)) {
        throw new ApiError("proxy_gone", `Run ${run.id} has ended (${run.status}); its proxy is gone.`);
      }
      const read = await coordinatorStub(c.env, run.id).view();
      if (!read.ok) throw new ApiError(read.code, `Run ${run.id}: ${read.detail}.`);
      return c.json({ resumed: read.resumed, view: read.view }, 200);
    },
  );
