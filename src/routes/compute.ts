import { SetupCommands } from "@benchwright/shared/contract/run-spec";
import { Hono } from "hono";
import { z } from "zod";
import { renewCapability } from "../compute/capability";
import { type ComputeEnv, requireCapability, unauthorized } from "../compute/middleware";
import { coordinatorStub } from "../coordinator/client";
import type { EnvironmentAnswer } from "../coordinator/ports";
import { ApiError } from "../errors";
import { parseBody } from "./internal";

// The compute API: what a run's work or orchestrator sandbox (the Harbor bridge) calls, through
// its run's proxy, with the run's compute-control capability, to get per-task environments. It
// reaches the broker only through the run's coordinator, so every environment is a task sandbox
// of that run: recorded, wired to the run's proxy and proved like any other, torn down with the
// run, and given no capability of its own. No backend credential is ever involved here.

const Name = z.string().regex(/^[A-Za-z0-9_.-]{1,64}$/, "1-64 of A-Z a-z 0-9 _ . -");
const SandboxId = z.string().regex(/^sbx_[A-Za-z0-9_-]{1,60}$/);
const ExecId = z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "1-64 of A-Z a-z 0-9 _ -");

/** A Harbor task's environment recipe comes as `setup`: run after the run's setup, kept as a setup image. */
const NewEnvironment = z.strictObject({ name: Name, setup: SetupCommands.optional() });
const NewExec = z.strictObject({
  /** The caller's idempotency key: the same id returns the same exec. */
  id: ExecId,
  argv: z.array(z.string().max(65_536)).min(1).max(1024),
  stdin: z.string().max(262_144).optional(),
  timeoutMs: z.number().int().min(1).max(3_600_000).default(600_000),
});
const Offsets = z.strictObject({
  stdoutFrom: z.coerce.number().int().min(0).default(0),
  stderrFrom: z.coerce.number().int().min(0).default(0),
});

type Refused = Extract<EnvironmentAnswer, { ok: false }>;

function answer<R extends { ok: true } | Refused>(result: R): Exclude<R, Refused> {
  if (result.ok) return result as Exclude<R, Refused>;
  const refused = result as Refused;
  const code = {
    not_found: "not_found",
    run_ended: "run_ended",
    limit: "too_many_environments",
    conflict: "environment_conflict",
  } as const;
  throw new ApiError(code[refused.code], `${refused.why[0]?.toUpperCase() ?? ""}${refused.why.slice(1)}.`);
}

function idParam(value: string): string {
  if (!SandboxId.safeParse(value).success) throw new ApiError("not_found", `No environment ${value}.`);
  return value;
}

export const computeRoutes = new Hono<ComputeEnv>()
  .use("*", requireCapability)
  .get("/capability", (c) => {
    const cap = c.var.capability;
    return c.json({ runId: cap.run.id, holder: cap.holderSandboxId, expiresAt: cap.expiresAt.toISOString() });
  })
  // A capability lives 15 minutes; a longer orchestration renews it (the old one stops working).
  // A renewal that lost a race with another of the same token finds it revoked: the same 401.
  .post("/capability/renew", async (c) => {
    const fresh = await renewCapability(c.var.db, c.var.capability);
    if (fresh === null) throw unauthorized();
    return c.json({ token: fresh.token, expiresAt: fresh.expiresAt.toISOString() }, 200, {
      "cache-control": "no-store",
    });
  })
  .post("/environments", async (c) => {
    const body = parseBody(NewEnvironment, await c.req.text());
    const made = answer(await coordinatorStub(c.env, c.var.capability.run.id).addEnvironment(body));
    return c.json(made.environment, 202);
  })
  .get("/environments/:id", async (c) => {
    const id = idParam(c.req.param("id"));
    const found = answer(await coordinatorStub(c.env, c.var.capability.run.id).environment(id));
    return c.json(found.environment);
  })
  .delete("/environments/:id", async (c) => {
    const id = idParam(c.req.param("id"));
    const gone = answer(await coordinatorStub(c.env, c.var.capability.run.id).removeEnvironment(id));
    return c.json(gone.environment);
  })
  .post("/environments/:id/exec", async (c) => {
    const id = idParam(c.req.param("id"));
    const body = parseBody(NewExec, await c.req.text());
    const runId = c.var.capability.run.id;
    const started = answer(
      await coordinatorStub(c.env, runId).environmentExec(runId, id, {
        execId: body.id,
        argv: body.argv,
        ...(body.stdin === undefined ? {} : { stdin: body.stdin }),
        timeoutMs: body.timeoutMs,
      }),
    );
    return c.json(started.exec, 202);
  })
  .get("/environments/:id/exec/:execId", async (c) => {
    const id = idParam(c.req.param("id"));
    const execId = ExecId.safeParse(c.req.param("execId"));
    if (!execId.success) throw new ApiError("not_found", "No such exec.");
    const offsets = Offsets.safeParse(c.req.query());
    if (!offsets.success)
      throw new ApiError("invalid_request", "stdoutFrom and stderrFrom are offsets (0 or more).");
    const runId = c.var.capability.run.id;
    const polled = answer(
      await coordinatorStub(c.env, runId).environmentPoll(runId, id, execId.data, offsets.data),
    );
    return c.json(polled.exec);
  });
