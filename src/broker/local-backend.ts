import { z } from "zod";
import { ExecInfo, type ExecRequest, SandboxInfo, SandboxList } from "../contract/local-agent";
import { BackendError, type ComputeBackend, type ExecPoll, type SandboxSpec } from "./backend";

// The `local` backend: the host agent on this machine (local-agent/), over HTTP on loopback with
// a shared secret. Every answer is parsed with the shared contract.

export const LocalEnv = z.object({
  COMPUTE_BACKEND_URL: z.url({ error: "COMPUTE_BACKEND_URL is not an http URL" }),
  COMPUTE_BACKEND_SECRET: z
    .string({ error: "COMPUTE_BACKEND_SECRET is not set" })
    .min(16, "COMPUTE_BACKEND_SECRET is too short"),
});

/** The local backend from the Worker's env; the reason it is not configured otherwise. */
export function localFromEnv(env: Record<keyof z.infer<typeof LocalEnv>, unknown>): ComputeBackend | string {
  const parsed = LocalEnv.safeParse(env);
  if (!parsed.success) return parsed.error.issues.map((i) => i.message).join("; ");
  return localBackend(parsed.data.COMPUTE_BACKEND_URL, parsed.data.COMPUTE_BACKEND_SECRET);
}

const AgentProblem = z.object({ code: z.string(), detail: z.string().optional() });

export function localBackend(agentUrl: string, secret: string): ComputeBackend {
  async function call<T>(method: string, path: string, schema: z.ZodType<T> | null, body?: unknown) {
    let res: Response;
    try {
      res = await fetch(new URL(path, agentUrl), {
        method,
        headers: {
          authorization: `Bearer ${secret}`,
          ...(body === undefined ? {} : { "content-type": "application/json" }),
        },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
    } catch {
      throw new BackendError("backend_unreachable", "The local host agent does not answer.", true);
    }
    const text = await res.text();
    if (!res.ok) {
      const problem = AgentProblem.safeParse(safeJson(text));
      throw problem.success
        ? new BackendError(
            problem.data.code,
            problem.data.detail ?? `HTTP ${res.status}`,
            res.status >= 500 && problem.data.code === "internal_error",
          )
        : new BackendError(
            "backend_error",
            `The local host agent answered HTTP ${res.status}.`,
            res.status >= 500,
          );
    }
    if (!schema) return null as T;
    const parsed = schema.safeParse(safeJson(text));
    if (!parsed.success)
      throw new BackendError("backend_error", "The local host agent answered outside its contract.");
    return parsed.data;
  }
  const sandboxPath = (id: string) => `/v1/sandboxes/${encodeURIComponent(id)}`;
  return {
    name: "local",
    // The agent's setup stage is root of the sandbox, so the wiring program writes the hosts
    // file itself: the names are not part of the agent's contract.
    create: (spec: SandboxSpec) =>
      call(
        "POST",
        "/v1/sandboxes",
        SandboxInfo,
        spec.kind === "proxy"
          ? spec
          : {
              kind: spec.kind,
              id: spec.id,
              runId: spec.runId,
              proxySandboxId: spec.proxySandboxId,
              routing: spec.routing,
            },
      ),
    exec: (sandboxId: string, request: ExecRequest) =>
      call("POST", `${sandboxPath(sandboxId)}/exec`, ExecInfo, request),
    poll: (sandboxId: string, execId: string, poll: ExecPoll) => {
      const q = new URLSearchParams();
      if (poll.waitMs !== undefined) q.set("waitMs", String(poll.waitMs));
      if (poll.stdoutFrom !== undefined) q.set("stdoutFrom", String(poll.stdoutFrom));
      if (poll.stderrFrom !== undefined) q.set("stderrFrom", String(poll.stderrFrom));
      return call("GET", `${sandboxPath(sandboxId)}/exec/${encodeURIComponent(execId)}?${q}`, ExecInfo);
    },
    kill: (sandboxId: string, execId: string) =>
      call("POST", `${sandboxPath(sandboxId)}/exec/${encodeURIComponent(execId)}/kill`, ExecInfo),
    destroy: async (sandboxId: string) => {
      await call("DELETE", sandboxPath(sandboxId), null);
    },
    freeze: async (sandboxId: string, frozen: boolean) => {
      await call("POST", `${sandboxPath(sandboxId)}/freeze`, null, { frozen });
    },
    list: async () => {
      const { sandboxes } = await call("GET", "/v1/sandboxes", SandboxList);
      return sandboxes.map(({ id, runId, kind }) => ({ id, runId, kind }));
    },
  };
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
