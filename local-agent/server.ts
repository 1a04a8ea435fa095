import { createHash, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import type { Readable } from "node:stream";
import { fileURLToPath } from "node:url";
import { ARTIFACT_DEFAULTS, BUNDLE_DEFAULTS } from "@benchwright/shared/contract/bundle";
import {
  AgentHealth,
  CaptureLayer,
  CreateSandbox,
  ExecRequest,
  Freeze,
  LayerList,
  SandboxInfo,
  SandboxList,
  Seal,
  SealResult,
  SetHosts,
} from "@benchwright/shared/contract/local-agent";
import { levelOf, logLine } from "@benchwright/shared/contract/log";
import { CapturedImage, ImageDigest } from "@benchwright/shared/contract/setup-image";
import { z } from "zod";
import { type CgroupHost, detectCgroups } from "./cgroups";
import { AgentError, problemBody } from "./errors";
import { MAX_WAIT_MS } from "./exec";
import { checkHealth } from "./health";
import { LAYERS_DIR, LayerStore } from "./layers";
import type { AgentLog } from "./registry-options";
import { ensureRootfs, ROOTFS_DIR, WORK_IMAGE } from "./rootfs";
import { Registry } from "./sandboxes";
import { StateDir } from "./state-dir";

// The host agent's HTTP surface (shared/contract/local-agent.ts): loopback only, every call
// authenticated with the shared secret, every body parsed with the contract's schemas.

export interface AgentOptions {
  secret: string;
  /** Port on 127.0.0.1; 0 picks a free one. */
  port?: number;
  /** Where the control plane listens (host's loopback); relayed into each proxy sandbox. */
  controlPlane: string;
  /** nft binary (tests pass a broken one to inject faults). */
  nft?: string;
  stateDir?: string;
  /** First host uid given to sandboxes (default 200000). */
  uidBase?: number;
  /** One call per sandbox lifecycle event; default: a JSON line on stdout. */
  log?: AgentLog;
  /** The image's programs (default: this repository's proxy-image/dist). */
  imageDir?: string;
  /** The sandboxes' root filesystem's image (default localhost/benchwright-work). */
  workImage?: string;
  /** Where its exports are kept (default /var/lib/benchwright/rootfs). */
  rootfsDir?: string;
  /** Test-only BW_TEST_* settings for the proxy (the suite's own upstream CA and routes). */
  proxyTestEnv?: Record<string, string>;
  /** Where the setup layers are kept (default /var/lib/benchwright/setup-layers). */
  layersDir?: string;
}

export interface RunningAgent {
  url: string;
  port: number;
  close(): Promise<void>;
}

export const REPO_ROOT = dirname(dirname(fileURLToPath(import.meta.url)));
const MAX_BODY = 16 * 1024 * 1024;
const Id = SandboxInfo.shape.id;
const ListQuery = z.strictObject({ runId: Id.optional() });
const PollQuery = z.strictObject({
  /** Long-poll for the exec's end, at most 30 s (longer asks are cut to that). */
  waitMs: z.coerce
    .number()
    .int()
    .min(0)
    .default(0)
    .transform((ms) => Math.min(ms, MAX_WAIT_MS)),
  stdoutFrom: z.coerce.number().int().min(0).default(0),
  stderrFrom: z.coerce.number().int().min(0).default(0),
});

const digest = (s: string) => createHash("sha256").update(s).digest();

const SandboxPath = z
  .string()
  .max(4096)
  .regex(/^\/[^\0]*$/, "must be an absolute path")
  .refine((p) => !p.split("/").includes(".."), "must not contain .. segments");
const Count = (max: number) => z.coerce.number().int().min(1).max(max);
const BundleQuery = z.strictObject({
  dir: SandboxPath,
  maxBytes: Count(BUNDLE_DEFAULTS.maxUnpackedBytes * 64).default(BUNDLE_DEFAULTS.maxUnpackedBytes),
  maxFiles: Count(BUNDLE_DEFAULTS.maxFiles * 64).default(BUNDLE_DEFAULTS.maxFiles),
});
const ArtifactsQuery = z.strictObject({
  dir: SandboxPath,
  maxBytes: Count(ARTIFACT_DEFAULTS.maxBytes * 64).default(ARTIFACT_DEFAULTS.maxBytes),
  maxFiles: Count(ARTIFACT_DEFAULTS.maxFiles * 64).default(ARTIFACT_DEFAULTS.maxFiles),
});

export async function startAgent(options: AgentOptions): Promise<RunningAgent> {
  if (options.secret.length < 16) throw new Error("the agent secret must be at least 16 characters");
  const controlPlane = new URL(options.controlPlane);
  const nft = options.nft ?? "nft";
  const log: AgentLog =
    options.log ?? ((event) => process.stdout.write(`${logLine(levelOf(event), event)}\n`));
  const imageDir = options.imageDir ?? join(REPO_ROOT, "proxy-image", "dist");
  const health = await checkHealth({ nft, imageDir });
  const state = new StateDir(options.stateDir ?? "/run/benchwright");
  // The sandboxes' cgroups and root filesystem: without either, no sandbox is made at all.
  let cgroups: CgroupHost | null = null;
  let rootfs: string | null = null;
  if (health.ok) {
    const detected = detectCgroups();
    if (detected.ok) cgroups = detected.host;
    else health.problems.push(detected.problem);
    const exported = await ensureRootfs({
      image: options.workImage ?? WORK_IMAGE,
      root: options.rootfsDir ?? ROOTFS_DIR,
      log,
    });
    if (exported.ok) {
      rootfs = exported.dir;
      health.workImageId = `sha256:${exported.imageId}`;
    } else health.problems.push(exported.problem);
    health.ok = health.problems.length === 0;
  }
  const layers = new LayerStore(options.layersDir ?? LAYERS_DIR);
  if (health.ok) {
    const removed = [...(await state.prepare(nft)), ...layers.prepare()];
    if (removed.length > 0) log({ event: "leftovers_removed", removed });
  }
  const registry = new Registry({
    nft,
    state,
    controlPlane,
    uidBase: options.uidBase ?? 200_000,
    health,
    log,
    imageDir,
    rootfs,
    layers,
    cgroups,
    // The test-only upstreams the proxy may reach are the ones direct traffic may reach too.
    directAllowCidrs: (options.proxyTestEnv?.BW_TEST_ALLOW_CIDRS ?? "")
      .split(",")
      .map((c) => c.trim())
      .filter(Boolean),
    proxyTestEnv: options.proxyTestEnv ?? {},
  });
  const secretDigest = digest(options.secret);

  /** A JSON body, or a stream (`raw`: the artifacts' archive). */
  type Reply = {
    status: number;
    body?: unknown;
    raw?: { type: string; stream: Readable; abort: () => void };
  };
  type Route = [
    method: string,
    path: RegExp,
    handler: (req: IncomingMessage, params: string[], query: unknown) => Promise<Reply>,
  ];
  const routes: Route[] = [
    ["GET", /^\/v1\/health$/, async () => ({ status: 200, body: AgentHealth.parse(health) })],
    [
      "POST",
      /^\/v1\/sandboxes$/,
      async (req) => {
        const { info, created } = await registry.create(parse(CreateSandbox, await readJson(req)));
        return { status: created ? 201 : 200, body: info };
      },
    ],
    [
      "GET",
      /^\/v1\/sandboxes$/,
      async (_req, _params, query) => ({
        status: 200,
        body: SandboxList.parse({ sandboxes: registry.list(parse(ListQuery, query).runId) }),
      }),
    ],
    [
      "DELETE",
      /^\/v1\/sandboxes\/([^/]+)$/,
      async (_req, [id]) => {
        await registry.destroy(parse(Id, id));
        return { status: 204 };
      },
    ],
    [
      "POST",
      /^\/v1\/sandboxes\/([^/]+)\/exec$/,
      async (req, [id]) => {
        const { info, created } = registry.startExec(parse(Id, id), parse(ExecRequest, await readJson(req)));
        return { status: created ? 202 : 200, body: info };
      },
    ],
    [
      "GET",
      /^\/v1\/sandboxes\/([^/]+)\/exec\/([^/]+)$/,
      async (_req, [id, execId], query) => {
        const q = parse(PollQuery, query);
        const exec = registry.exec(parse(Id, id), parse(Id, execId));
        await exec.wait(q.waitMs);
        return { status: 200, body: exec.info(q.stdoutFrom, q.stderrFrom) };
      },
    ],
    [
      "POST",
      /^\/v1\/sandboxes\/([^/]+)\/freeze$/,
      async (req, [id]) => {
        await registry.freeze(parse(Id, id), parse(Freeze, await readJson(req)).frozen);
        return { status: 204 };
      },
    ],
    [
      "POST",
      /^\/v1\/sandboxes\/([^/]+)\/seal$/,
      async (req, [id]) => {
        const result = await registry.seal(parse(Id, id), parse(Seal, await readJson(req)));
        return { status: 200, body: SealResult.parse(result) };
      },
    ],
    [
      "PUT",
      /^\/v1\/sandboxes\/([^/]+)\/hosts$/,
      async (req, [id]) => {
        registry.setHosts(parse(Id, id), parse(SetHosts, await readJson(req)).hostsFile);
        return { status: 204 };
      },
    ],
    [
      "PUT",
      /^\/v1\/sandboxes\/([^/]+)\/bundle$/,
      async (req, [id], query) => {
        const q = parse(BundleQuery, query);
        const result = await registry.bundle(parse(Id, id), q.dir, req, {
          maxBytes: q.maxBytes,
          maxFiles: q.maxFiles,
          maxUploadBytes: BUNDLE_DEFAULTS.maxUploadBytes,
        });
        return { status: result.ok ? 200 : 422, body: result };
      },
    ],
    [
      "GET",
      /^\/v1\/sandboxes\/([^/]+)\/artifacts$/,
      async (_req, [id], query) => {
        const q = parse(ArtifactsQuery, query);
        const archive = await registry.artifacts(parse(Id, id), q.dir, q);
        return { status: 200, raw: { type: "application/gzip", ...archive } };
      },
    ],
    [
      "POST",
      /^\/v1\/sandboxes\/([^/]+)\/capture$/,
      async (req, [id]) => {
        const { maxBytes } = parse(CaptureLayer, await readJson(req));
        return { status: 200, body: CapturedImage.parse(await registry.capture(parse(Id, id), maxBytes)) };
      },
    ],
    ["GET", /^\/v1\/layers$/, async () => ({ status: 200, body: LayerList.parse(registry.layers()) })],
    [
      "DELETE",
      /^\/v1\/layers\/([^/]+)$/,
      async (_req, [digest]) => {
        await registry.deleteLayer(parse(ImageDigest, digest));
        return { status: 204 };
      },
    ],
    [
      "POST",
      /^\/v1\/sandboxes\/([^/]+)\/exec\/([^/]+)\/kill$/,
      async (_req, [id, execId]) => {
        const exec = registry.exec(parse(Id, id), parse(Id, execId));
        await exec.kill();
        return { status: 200, body: exec.info(0, 0) };
      },
    ],
  ];

  async function handle(req: IncomingMessage): Promise<Reply> {
    const auth = req.headers.authorization ?? "";
    const presented = auth.startsWith("Bearer ") ? auth.slice(7) : "";
    if (!timingSafeEqual(digest(presented), secretDigest)) {
      throw new AgentError("unauthorized", "missing or wrong Authorization: Bearer <agent secret>");
    }
    const url = new URL(req.url ?? "/", "http://agent");
    for (const [method, path, handler] of routes) {
      const match = req.method === method ? path.exec(url.pathname) : null;
      if (!match) continue;
      const params = match.slice(1).map((p) => {
        try {
          return decodeURIComponent(p);
        } catch {
          return p;
        }
      });
      return handler(req, params, Object.fromEntries(url.searchParams));
    }
    throw new AgentError("not_found", `no route ${req.method} ${url.pathname}`);
  }

  const server = createServer((req, res) => {
    handle(req)
      .then(({ status, body, raw }) => {
        if (!raw) {
          send(res, status, body);
          return;
        }
        res.writeHead(status, { "content-type": raw.type });
        raw.stream.on("error", () => res.destroy());
        res.on("close", () => {
          if (!res.writableFinished) raw.abort();
        });
        raw.stream.pipe(res);
      })
      .catch((error: unknown) => {
        req.resume();
        const e =
          error instanceof AgentError
            ? error
            : new AgentError("sandbox_failed", error instanceof Error ? error.message : String(error));
        const body = problemBody(e.code, e.detail);
        send(res, body.status, body, true);
      });
  });

  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(options.port ?? 0, "127.0.0.1", () => resolve());
  });
  const port = (server.address() as AddressInfo).port;
  let closing: Promise<void> | null = null;
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    close: () => {
      closing ??= (async () => {
        const stopped = new Promise((r) => server.close(r));
        server.closeAllConnections();
        await registry.close();
        await stopped;
      })();
      return closing;
    },
  };
}

function parse<T extends z.ZodType>(schema: T, value: unknown): z.output<T> {
  const result = schema.safeParse(value);
  if (!result.success) {
    const issues = result.error.issues.map((i) => `${i.path.join(".") || "(value)"}: ${i.message}`);
    throw new AgentError("invalid_request", issues.slice(0, 5).join("; "));
  }
  return result.data;
}

async function readJson(req: IncomingMessage): Promise<unknown> {
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const chunk of req as AsyncIterable<Buffer>) {
    size += chunk.length;
    if (size > MAX_BODY) throw new AgentError("invalid_request", `body larger than ${MAX_BODY} bytes`);
    chunks.push(chunk);
  }
  try {
    return JSON.parse(Buffer.concat(chunks).toString("utf8"));
  } catch {
    throw new AgentError("invalid_request", "body is not valid JSON");
  }
}

function send(res: ServerResponse, status: number, body: unknown, problem = false): void {
  if (res.headersSent) {
    res.end();
    return;
  }
  if (body === undefined) {
    res.writeHead(status).end();
    return;
  }
  const text = JSON.stringify(body);
  res.writeHead(status, {
    "content-type": problem ? "application/problem+json" : "application/json",
    "content-length": Buffer.byteLength(text),
  });
  res.end(text);
}
