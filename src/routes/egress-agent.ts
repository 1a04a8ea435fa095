import { readBearer } from "@benchwright/shared/contract/proxy-wire";
import { readStoredSpec } from "@benchwright/shared/contract/run-spec";
import {
  AgentPolicy,
  EGRESS_AGENT_PATH,
  EGRESS_AGENT_POLICY_PATH,
} from "@benchwright/shared/contract/tunnel";
import { createRoute, z } from "@hono/zod-openapi";
import { Hono } from "hono";
import { createMiddleware } from "hono/factory";
import type { AppEnv } from "../context";
import { ApiError, unwrap } from "../errors";
import { shownOnce } from "../idempotency/withheld";
import { IdParam, jsonOk, newRouter, problems } from "../router";
import { type EgressRun, findRunByEgressToken, issueEgressToken } from "../runs/egress-token";
import * as runs from "../runs/service";
import { ROLE_HEADER, RUN_HEADER, relayStub, type TunnelRole } from "../tunnel/relay";
import { previewPolicy } from "../vault/policy";

// The egress tunnel's doors (shared/contract/tunnel.ts):
// - POST /v1/runs/{id}/egress-agent-token (API key): a fresh token for the user's agent, shown once;
// - GET /egress-agent/tunnel and /egress-agent/policy (the run's egress token): the agent's end of
//   the relay, and its copy of the run's host policy (no rules, no secret names, no model);
// - the proxy's end, GET /internal/runs/{id}/tunnel, is checked by the internal API's proxy auth
//   and handed here (relayTo).

/** What a client that lost an answer with an agent token does (a new token replaces the old). */
export const LOST_AGENT_TOKEN =
  "ask for a new one, POST /v1/runs/{id}/egress-agent-token (it replaces this one)";

export const EgressAgentToken = z
  .object({
    token: shownOnce(z.string(), "bwe_...: shown once; a new one replaces it.", LOST_AGENT_TOKEN),
    command: shownOnce(
      z.string(),
      "What to run on your machine: the token in its environment (BENCHWRIGHT_EGRESS_TOKEN), never an argument.",
      LOST_AGENT_TOKEN,
    ),
  })
  .openapi("EgressAgentToken");

export const egressTokenRoutes = newRouter().openapi(
  createRoute({
    method: "post",
    path: "/runs/{id}/egress-agent-token",
    tags: ["runs"],
    operationId: "createEgressAgentToken",
    summary:
      "A token for the local egress agent of this run (replaces the previous one, whose agent is disconnected)",
    request: {
      params: IdParam("run_"),
      body: { content: { "application/json": { schema: z.object({}).strict() } }, required: false },
    },
    responses: { 201: jsonOk(EgressAgentToken, "Created"), ...problems(401, 404, 409) },
  }),
  async (c) => {
    const run = unwrap(await runs.getRun(c.var.db, c.var.principal, c.req.valid("param").id));
    const token = await issueEgressToken(c.var.db, run.id);
    if (token === null) throw new ApiError("run_ended", "The run has ended: it needs no egress agent.");
    // The previous token's agent, if connected, goes now.
    await relayStub(c.env, run.id).dropAgent();
    return c.json({ token, command: agentCommand(publicUrl(c.req.url, c.env.PUBLIC_URL), token) }, 201);
  },
);

/**
 * The command the user runs (the two-terminal example of docs/user-guide.md), from a checkout of
 * this repository or with the CLI package installed. `--no`: npx must never fetch a package of that
 * name from the registry instead. The token is in the command's environment, not its arguments
 * (K5): an argument shows in every process list on the machine; the agent refuses `--token`.
 */
export function agentCommand(url: string, token: string): string {
  return `BENCHWRIGHT_EGRESS_TOKEN=${token} npx --no benchwright egress-agent --url ${url}`;
}

/** The control plane's public URL: the configured one, else the one this request came in on. */
export function publicUrl(requestUrl: string, configured: string | null | undefined): string {
  return (configured || new URL(requestUrl).origin).replace(/\/+$/, "");
}

type AgentEnv = { Bindings: AppEnv["Bindings"]; Variables: AppEnv["Variables"] & { egressRun: EgressRun } };

const agentAuth = createMiddleware<AgentEnv>(async (c, next) => {
  const token = readBearer(c.req.header("authorization"));
  const run = token === null ? null : await findRunByEgressToken(c.var.db, token);
  if (run === null || run.ended) {
    throw new ApiError(
      "unauthorized",
      "The egress agent token is not valid (unknown, replaced by a newer one, or its run has ended).",
    );
  }
  c.set("egressRun", run);
  await next();
});

const suffix = (path: string) => path.replace(/^\/egress-agent/, "");

/** Mounted at /egress-agent, outside /v1: the run's egress token is the credential here. */
export const egressAgentRoutes = new Hono<AgentEnv>()
  .get(suffix(EGRESS_AGENT_PATH), agentAuth, (c) => relayTo(c.env, c.req.raw, c.var.egressRun.id, "agent"))
  .get(suffix(EGRESS_AGENT_POLICY_PATH), agentAuth, async (c) => {
    const run = c.var.egressRun;
    const { egress } = readStoredSpec(run.spec);
    const doc = await previewPolicy(c.var.db, run, { egress });
    const policy = AgentPolicy.parse({
      runId: run.id,
      version: doc.version,
      default: doc.default,
      egress: doc.egress,
      // Host decisions only: the agent dials host and port, while method and path limits are the
      // proxy's, which sees each request before it enters the tunnel (N3).
      hosts: doc.hosts.map(({ pattern, action, via }) => ({ pattern, action, ...(via ? { via } : {}) })),
    });
    return c.json(policy, 200, { "cache-control": "no-store" });
  });

/** Hands a checked WebSocket upgrade to the run's relay, as `role`. */
export function relayTo(
  env: Env,
  request: Request,
  runId: string,
  role: TunnelRole,
): Promise<Response> | Response {
  if (request.headers.get("upgrade")?.toLowerCase() !== "websocket") {
    throw new ApiError("invalid_request", "This is a WebSocket endpoint: send Upgrade: websocket.");
  }
  const headers = new Headers(request.headers);
  headers.set(ROLE_HEADER, role);
  headers.set(RUN_HEADER, runId);
  headers.delete("authorization");
  return relayStub(env, runId).fetch(new Request(request.url, { method: "GET", headers }));
}
