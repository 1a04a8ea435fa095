import { BrokerCode } from "@benchwright/shared/contract/broker";
import { UnpackResult } from "@benchwright/shared/contract/bundle";
import {
  AgentHealth,
  type CaptureLayer,
  ExecInfo,
  type ExecRequest,
  LayerList,
  SandboxInfo,
  SandboxList,
  type Seal,
  SealResult,
  type SetHosts,
} from "@benchwright/shared/contract/local-agent";
import { CapturedImage } from "@benchwright/shared/contract/setup-image";
import { z } from "zod";
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
export function localFromEnv(
  env: Partial<Record<keyof z.infer<typeof LocalEnv>, unknown>>,
): ComputeBackend | string {
  const parsed = LocalEnv.safeParse(env);
  if (!parsed.success) return parsed.error.issues.map((i) => i.message).join("; ");
  return localBackend(parsed.data.COMPUTE_BACKEND_URL, parsed.data.COMPUTE_BACKEND_SECRET);
}

const AgentProblem = z.object({ code: z.string(), detail: z.string().optional() });

/** The agent's problem code as the broker's own; one outside the contract is a backend_error. */
function agentCode(code: string): BrokerCode {
  const known = BrokerCode.safeParse(code);
  return known.success ? known.data : "backend_error";
}

/**
 * The agent's work image digest, per agent, for a while: every claim asks for it, and it changes
 * only when the agent rebuilds its image (a restart). Kept per isolate rather than per backend
 * object, which the broker makes per call. Only a digest is cached, never "not read yet".
 */
const WORK_IMAGE_TTL_MS = 60_000;
const workImages = new Map<string, { digest: string; at: number }>();

export function localBackend(agentUrl: string, secret: string): ComputeBackend {
  /** One agent call; its answer when it is a success (or one of `alsoOk`), a BackendError otherwise. */
  async function send(
    method: string,
    path: string,
    body?: { json: unknown } | { stream: ReadableStream<Uint8Array>; type: string },
    alsoOk: readonly number[] = [],
  ): Promise<Response> {
    let res: Response;
    try {
      res = await fetch(new URL(path, agentUrl), {
        method,
        headers: {
          authorization: `Bearer ${secret}`,
          ...(body === undefined ? {} : { "content-type": "json" in body ? "application/json" : body.type }),
        },
        body: body === undefined ? undefined : "json" in body ? JSON.stringify(body.json) : body.stream,
      });
    } catch {
      throw new BackendError("backend_unreachable", "The local host agent does not answer.", true);
    }
    if (res.ok || alsoOk.includes(res.status)) return res;
    const problem = AgentProblem.safeParse(safeJson(await res.text()));
    throw problem.success
      ? new BackendError(
          agentCode(problem.data.code),
          problem.data.detail ?? `HTTP ${res.status}`,
          res.status >= 500 && problem.data.code === "internal_error",
        )
      : new BackendError(
          "backend_error",
          `The local host agent answered HTTP ${res.status}.`,
          res.status >= 500,
        );
  }
  function parse<T>(schema: z.ZodType<T>, text: string): T {
    const parsed = schema.safeParse(safeJson(text));
    if (!parsed.success)
      throw new BackendError("backend_error", "The local host agent answered outside its contract.");
    return parsed.data;
  }
  async function call<T>(method: string, path: string, schema: z.ZodType<T> | null, body?: unknown) {
    const res = await send(method, path, body === undefined ? undefined : { json: body });
    const text = await res.text();
    return schema ? parse(schema, text) : (null as T);
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
              ...(spec.resources ? { resources: spec.resources } : {}),
              ...(spec.capture ? { capture: true } : {}),
              ...(spec.layer ? { layer: { digest: spec.layer.digest } } : {}),
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
    // The bundle's bytes are streamed through (the broker reads them from R2); a refused bundle
    // is the agent's 422 with the same UnpackResult shape.
    putBundle: async (sandboxId: string, bundle: ReadableStream<Uint8Array>, dir: string) => {
      const q = new URLSearchParams({ dir });
      const res = await send(
        "PUT",
        `${sandboxPath(sandboxId)}/bundle?${q}`,
        { stream: bundle, type: "application/gzip" },
        [422],
      );
      const text = await res.text();
      // 200 carries { ok: true, ... } and 422 { ok: false, code }; another 422 is the agent
      // refusing the request itself.
      const result = UnpackResult.safeParse(safeJson(text));
      if (result.success && result.data.ok === (res.status === 200)) return result.data;
      const problem = AgentProblem.safeParse(safeJson(text));
      if (res.status === 422 && problem.success) {
        throw new BackendError(agentCode(problem.data.code), problem.data.detail ?? "HTTP 422");
      }
      throw new BackendError("backend_error", "The local host agent answered outside its contract.");
    },
    seal: (sandboxId: string, seal: Seal) => call("POST", `${sandboxPath(sandboxId)}/seal`, SealResult, seal),
    setHosts: async (sandboxId: string, hostsFile: string[]) => {
      const body: SetHosts = { hostsFile };
      await call("PUT", `${sandboxPath(sandboxId)}/hosts`, null, body);
    },
    collect: async (sandboxId: string, options: { dir: string; maxBytes: number; maxFiles: number }) => {
      const q = new URLSearchParams({
        dir: options.dir,
        maxBytes: String(options.maxBytes),
        maxFiles: String(options.maxFiles),
      });
      const res = await send("GET", `${sandboxPath(sandboxId)}/artifacts?${q}`);
      if (!res.body) throw new BackendError("backend_error", "The local host agent sent no archive.");
      return res.body;
    },
    baseImage: async () => {
      const cached = workImages.get(agentUrl);
      if (cached && Date.now() - cached.at < WORK_IMAGE_TTL_MS) return cached.digest;
      const { workImageId } = await call("GET", "/v1/health", AgentHealth);
      if (workImageId) workImages.set(agentUrl, { digest: workImageId, at: Date.now() });
      return workImageId;
    },
    captureLayer: (sandboxId: string, maxBytes: number) => {
      const body: CaptureLayer = { maxBytes };
      return call("POST", `${sandboxPath(sandboxId)}/capture`, CapturedImage, body);
    },
    dropLayer: async (digest: string) => {
      try {
        await call("DELETE", `/v1/layers/${encodeURIComponent(digest)}`, null);
        return "dropped";
      } catch (error) {
        if (error instanceof BackendError && error.code === "in_use") return "in_use";
        throw error;
      }
    },
    listLayers: async () => (await call("GET", "/v1/layers", LayerList)).layers,
  };
}

function safeJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch {
    return null;
  }
}
