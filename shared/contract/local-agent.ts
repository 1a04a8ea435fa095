import { z } from "zod";
import { RoutingMode } from "./policy";
import { ImageDigest } from "./setup-image";

// The wire contract between the sandbox broker (Worker) and the local host agent (Node, root, on
// the development machine). Imported by both sides. Every call carries
// `Authorization: Bearer <LOCAL_AGENT_SECRET>`; the agent listens on loopback only.
//
//   GET    /v1/health                        → AgentHealth (what this machine can and cannot do)
//   POST   /v1/sandboxes                     ← CreateSandbox → SandboxInfo (201; 200 if it exists)
//   GET    /v1/sandboxes[?runId=]            → SandboxList (every sandbox not yet DELETEd)
//   DELETE /v1/sandboxes/{id}                → 204 (also when already gone: idempotent)
//   POST   /v1/sandboxes/{id}/exec           ← ExecRequest → ExecInfo (202)
//   GET    /v1/sandboxes/{id}/exec/{execId}?waitMs=&stdoutFrom=&stderrFrom= → ExecInfo
//   POST   /v1/sandboxes/{id}/exec/{execId}/kill → ExecInfo
//   POST   /v1/sandboxes/{id}/freeze           ← Freeze → 204 (every process of the sandbox but
//                                             its init stopped, or continued; idempotent; work,
//                                             task and proxy sandboxes)
//   PUT    /v1/sandboxes/{id}/bundle?dir=      ← a .tar.gz body → UnpackResult (200), unpacked
//                                             into dir by bw-unpack as the execute stage's uid;
//                                             a refused bundle is a 422 with { ok: false, code }
//   POST   /v1/sandboxes/{id}/seal             ← Seal → SealResult (ends the setup stage: every
//                                             process it started killed, the wiring files
//                                             re-installed from the caller's copy; setup-stage
//                                             execs refused from then on; idempotent)
//   PUT    /v1/sandboxes/{id}/hosts            ← SetHosts → 204 (default routing: the hosts
//                                             file's redirect entries rewritten from outside)
//   GET    /v1/sandboxes/{id}/artifacts?dir=&maxBytes=&maxFiles= → a .tar.gz (bw-collect's, as the
//                                             execute stage's uid; see contract/bundle.ts)
//   POST   /v1/sandboxes/{id}/capture          ← CaptureLayer → CapturedImage (contract/setup-image.ts;
//                                             a sandbox made with `capture`, sealed, before any
//                                             command: its filesystem changes kept as a layer)
//   GET    /v1/layers                          → LayerList (the setup layers this agent keeps)
//   DELETE /v1/layers/{digest}                 → 204 (also when gone); 409 in_use while a live
//                                             sandbox starts from it
//
// Errors are problem+json with a `code` from AgentErrorCode.

const Id = z.string().regex(/^[A-Za-z0-9_-]{1,64}$/, "1-64 of A-Z a-z 0-9 _ -");

/** orchestrator: the Harbor bridge's sandbox (runs the Harbor CLI; wired like a work sandbox). */
export const SandboxKind = z.enum(["proxy", "work", "task", "orchestrator"]);
export type SandboxKind = z.infer<typeof SandboxKind>;

/**
 * Listener ports of the proxy process inside the proxy sandbox (unprivileged ports); directTls and
 * directHttp take the connections a default-routing sandbox dials by address (DNAT'd, I4).
 */
export const PROXY_PORTS = {
  tls: 8443,
  http: 8080,
  explicit: 3128,
  dns: 5353,
  directTls: 8444,
  directHttp: 8081,
} as const;

/**
 * A sandbox's resource limits (its cgroup locally; the pod's limits on sandbox0; E2B's template
 * sizes). memory: the kernel kills past it; pids: processes and threads at once (a fork bomb
 * stops there); cpus: CPU time as a share of cores (throttled, never killed).
 */
export const Resources = z.strictObject({
  memoryMb: z.number().int().min(64).max(262_144),
  pids: z.number().int().min(16).max(1_000_000),
  cpus: z.number().min(0.1).max(256),
});
export type Resources = z.infer<typeof Resources>;

/** The limits of a sandbox made without `resources`, per kind. */
export const DEFAULT_RESOURCES: Record<SandboxKind, Resources> = {
  proxy: { memoryMb: 1024, pids: 512, cpus: 1 },
  work: { memoryMb: 2048, pids: 1024, cpus: 1 },
  task: { memoryMb: 2048, pids: 1024, cpus: 1 },
  orchestrator: { memoryMb: 2048, pids: 1024, cpus: 1 },
};

/** Which limit the kernel enforced on a process of the sandbox (it was killed for it). */
export const ResourceLimit = z.enum(["memory", "pids"]);
export type ResourceLimit = z.infer<typeof ResourceLimit>;

export const CreateSandbox = z
  .discriminatedUnion("kind", [
    z.strictObject({
      kind: z.literal("proxy"),
      id: Id,
      runId: Id,
      resources: Resources.optional(),
    }),
    z.strictObject({
      kind: z.enum(["work", "task", "orchestrator"]),
      id: Id,
      runId: Id,
      /** The run's proxy sandbox: the only route out of this one. */
      proxySandboxId: Id,
      /**
       * default: only connections to the proxy's address on 80/443 are redirected to the proxy;
       * other traffic is forwarded (masqueraded) out through the proxy namespace.
       * catch-all: every TCP 80/443 goes to the proxy, UDP/TCP 53 to the proxy's resolver,
       * everything else is dropped in the proxy namespace (out of this sandbox's reach).
       */
      routing: RoutingMode,
      resources: Resources.optional(),
      /**
       * A setup image's builder: its filesystem changes stay readable by the agent (never by the
       * sandbox) so that POST …/capture can keep them once setup is sealed.
       */
      capture: z.literal(true).optional(),
      /**
       * Start from this stored layer (GET /v1/layers) over the work image, with no setup stage: the
       * agent checks the layer's bytes against the digest first (setup_image_missing,
       * setup_image_mismatch) and never starts around a bad one.
       */
      layer: z.strictObject({ digest: ImageDigest }).optional(),
    }),
  ])
  .refine((c) => c.kind === "proxy" || !(c.capture && c.layer), {
    message: "a sandbox started from a layer has no setup to capture",
    path: ["capture"],
  });
export type CreateSandbox = z.infer<typeof CreateSandbox>;

export const SandboxInfo = z.strictObject({
  id: Id,
  runId: Id,
  kind: SandboxKind,
  state: z.enum(["ready", "destroyed"]),
  /** Address of this sandbox in its network. */
  address: z.string(),
  /** work/task: the proxy's address as this sandbox sees it (hosts-file target, resolver). */
  proxyAddress: z.string().nullable(),
  /** proxy: the URL at which the control plane is reachable from inside this sandbox. */
  controlPlaneUrl: z.string().nullable(),
  routing: RoutingMode.nullable(),
  /**
   * work/task: an address:port outside the run that this sandbox could reach if nothing
   * stopped it (a listener the backend runs for this purpose). Under catch-all the wiring probe
   * must fail to connect to it; under default routing it would succeed.
   */
  probeTarget: z.string().nullable().default(null),
  /**
   * work/task: what the wiring program must do differently in this sandbox, merged into its
   * input by the coordinator. A backend whose setup stage has no root (Kubernetes pods) installs
   * the hosts entries itself (`hostsInstalled`) and points the CA files at a writable place.
   */
  wiring: z
    .strictObject({
      hostsInstalled: z.boolean().optional(),
      caDir: z.string().optional(),
      caBundlePath: z.string().optional(),
    })
    .nullable()
    .default(null),
});
export type SandboxInfo = z.infer<typeof SandboxInfo>;

/**
 * A sandbox as the agent lists it: what it is, whose it is, whether it is frozen. Listed until a
 * DELETE, also once its init died (state `destroyed`: the DELETE still frees its network), so
 * the broker can find sandboxes no run owns and destroy them.
 */
export const ListedSandbox = SandboxInfo.extend({ frozen: z.boolean() });
export type ListedSandbox = z.infer<typeof ListedSandbox>;

export const SandboxList = z.strictObject({ sandboxes: z.array(ListedSandbox) });
export type SandboxList = z.infer<typeof SandboxList>;

/**
 * setup: root of the sandbox's own user namespace (no privilege outside it; cannot change the
 * network, which belongs to the host's namespace). execute: an unprivileged uid with no
 * capabilities and no_new_privs. The proxy sandbox's process runs in its setup identity.
 */
export const ExecStage = z.enum(["setup", "execute"]);
export type ExecStage = z.infer<typeof ExecStage>;

/**
 * An exec in a sandbox. The image's programs run by name (`bw-proxy`, `bw-proxy-view`,
 * `bw-wiring`). On the local agent `bw-wiring` in the execute stage is the re-proof after the
 * seal and runs beside the sandbox, in a clean root of host files with the sandbox's network and
 * seal-owned files (docs/local-backend.md): it takes no `env` and no `cwd`.
 */
export const ExecRequest = z.strictObject({
  /**
   * Idempotency key chosen by the caller: an exec whose id this sandbox has already started
   * returns that exec (running or exited) instead of starting another. So a coordinator step
   * replayed after a crash never runs a command twice.
   */
  id: Id.optional(),
  argv: z.array(z.string().max(65_536)).min(1).max(1024),
  env: z.record(z.string().regex(/^[A-Za-z_][A-Za-z0-9_]*$/), z.string().max(65_536)).default({}),
  stage: ExecStage,
  /** Written to the process's stdin, then stdin is closed. */
  stdin: z.string().max(1_048_576).optional(),
  cwd: z.string().max(4096).optional(),
  /** Killed (SIGKILL) after this long; null: no limit (the proxy process). */
  timeoutMs: z.number().int().min(1).max(86_400_000).nullable().default(600_000),
});
export type ExecRequest = z.input<typeof ExecRequest>;

export const ExecInfo = z.strictObject({
  execId: Id,
  sandboxId: Id,
  state: z.enum(["running", "exited"]),
  exitCode: z.number().int().nullable(),
  signal: z.string().nullable(),
  /** Output from the requested offsets on (the agent keeps at most the last 1 MiB of each). */
  stdout: z.string(),
  stderr: z.string(),
  stdoutEnd: z.number().int().min(0),
  stderrEnd: z.number().int().min(0),
  /** Exited because the sandbox hit this limit (killed by the kernel, or by the agent at it). */
  limit: ResourceLimit.optional(),
});
export type ExecInfo = z.infer<typeof ExecInfo>;

/** How much of each output stream an exec keeps: its last 1 MiB. */
export const EXEC_OUTPUT_LIMIT = 1024 * 1024;

/** Length of the longest prefix that does not end inside a multi-byte UTF-8 character. */
function completeUtf8Length(data: Uint8Array): number {
  for (let back = 1; back <= Math.min(4, data.length); back++) {
    const byte = data[data.length - back] as number;
    if ((byte & 0xc0) === 0x80) continue; // continuation byte: look further back
    const need = byte >= 0xf0 ? 4 : byte >= 0xe0 ? 3 : byte >= 0xc0 ? 2 : 1;
    return need > back ? data.length - back : data.length;
  }
  return data.length;
}

/**
 * One page of an ExecInfo stream, the same rule wherever the bytes are kept (the local agent's
 * memory, the exec runner's files): `data` is what is kept from absolute offset `begin` on, for a
 * caller who asked from `from`. Cut on UTF-8 character boundaries so pages concatenate to the
 * original text; a character still being written waits for the next page unless `final`.
 */
export function outputPage(
  data: Uint8Array,
  begin: number,
  from: number,
  final: boolean,
): { text: string; end: number } {
  let page = data;
  let at = begin;
  if (from < begin) {
    // The oldest kept byte may be mid-character: skip continuation bytes.
    let skip = 0;
    while (skip < page.length && skip < 3 && ((page[skip] as number) & 0xc0) === 0x80) skip++;
    page = page.subarray(skip);
    at += skip;
  }
  if (!final) page = page.subarray(0, completeUtf8Length(page));
  return { text: new TextDecoder().decode(page), end: at + page.length };
}

/**
 * Halting a run for review (its work and task sandboxes), or pausing a lingering run's proxy
 * sandbox while nobody inspects it: the sandbox's processes stop, then continue.
 */
export const Freeze = z.strictObject({ frozen: z.boolean() });
export type Freeze = z.infer<typeof Freeze>;

/**
 * Ends a work or task sandbox's setup stage. The wiring's files (hosts, resolver, CA bundle and
 * the run CA's own file) are re-written from this copy (the coordinator's, which is the proxy's),
 * whatever the setup stage did to them; with `caCertPem` null (no proxy enforces the run) they
 * are restored to the image's.
 */
export const Seal = z.strictObject({
  routing: RoutingMode,
  /** default routing: the exact names redirected to the proxy (the platform's are added). */
  hostsFile: z.array(z.string().max(253)).max(10_000),
  caCertPem: z.string().max(65_536).nullable(),
});
export type Seal = z.infer<typeof Seal>;

export const SealResult = z.strictObject({
  /** Processes of the setup stage still running when it ended, killed. */
  killed: z.number().int().min(0),
});
export type SealResult = z.infer<typeof SealResult>;

/** A vault edit while the run runs (default routing): the hosts file's redirect, rewritten. */
export const SetHosts = z.strictObject({ hostsFile: z.array(z.string().max(253)).max(10_000) });
export type SetHosts = z.infer<typeof SetHosts>;

export const AgentHealth = z.strictObject({
  ok: z.boolean(),
  /** When not ok: each reason this machine cannot isolate a sandbox, in plain words. */
  problems: z.array(z.string()),
  /**
   * The work image sandboxes start from, by digest (`sha256:` and buildah's image id): a setup
   * image's base (its key, contract/setup-image.ts). Null while the agent has not read it.
   */
  workImageId: ImageDigest.nullable().default(null),
});
export type AgentHealth = z.infer<typeof AgentHealth>;

export const AgentErrorCode = z.enum([
  "unauthorized",
  "invalid_request",
  "not_found",
  "cannot_isolate",
  "sandbox_failed",
  /** A setup-stage exec after the sandbox was sealed. */
  "sealed",
  /**
   * The seal could not end the setup stage (its processes outlived the kill rounds, or its
   * namespace limits or wiring files could not be held): what is left is frozen, and the
   * sandbox runs nothing more; destroy it.
   */
  "setup_not_sealed",
  /** Capture: the sandbox is not sealed yet (its setup could still be writing). */
  "not_sealed",
  /** Capture: a command already ran in it, or it was not made with `capture`. */
  "capture_too_late",
  /** Create from a layer: the agent has no complete layer of that digest. */
  "setup_image_missing",
  /** Create from a layer: the stored bytes do not hash to the digest (removed, never started). */
  "setup_image_mismatch",
  /** Capture: the layer is larger than the caller's bound. */
  "setup_image_too_large",
  /** Capture: the changes hold what a layer cannot keep (an owner it cannot map, a device…). */
  "setup_image_unsupported",
  /** Capture: a file holds one run's own wiring (its CA): never kept (case P4). */
  "setup_image_holds_run_files",
  /** DELETE /v1/layers/{digest}: a live sandbox starts from it. */
  "in_use",
]);
export type AgentErrorCode = z.infer<typeof AgentErrorCode>;

/** POST /v1/sandboxes/{id}/capture: the largest layer the caller keeps (over → setup_image_too_large). */
export const CaptureLayer = z.strictObject({ maxBytes: z.number().int().min(1) });
export type CaptureLayer = z.infer<typeof CaptureLayer>;

export const LayerList = z.strictObject({
  layers: z.array(
    z.strictObject({
      digest: ImageDigest,
      bytes: z.number().int().min(0),
      createdAt: z.string(),
      /** Live sandboxes started from it (a DELETE waits until none). */
      inUse: z.number().int().min(0),
    }),
  ),
});
export type LayerList = z.infer<typeof LayerList>;
