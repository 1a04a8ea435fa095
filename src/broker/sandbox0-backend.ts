import { z } from "zod";
import { ARTIFACT_DEFAULTS, BUNDLE_DEFAULTS, UNPACK_EXIT, UnpackResult } from "../contract/bundle";
import {
  freezeArgs,
  killArgs,
  pollArgs,
  RunnerFreeze,
  RunnerStatus,
  runnerAnswer,
  startArgs,
  toExecInfo,
} from "../contract/exec-runner";
import {
  ExecInfo,
  ExecRequest,
  type SandboxInfo,
  type SandboxKind,
  Seal,
  type SealResult,
} from "../contract/local-agent";
import { ReinstallResult, type WiringReinstall } from "../contract/wiring";
import { BackendError, type ComputeBackend, type ExecPoll, notSupported, type SandboxSpec } from "./backend";
import { type CallMeaning, KubeClient, type KubeObject } from "./kubernetes/client";
import {
  CONTAINERS,
  isLabelValue,
  LABELS,
  MANAGED_BY,
  objectName,
  POD_PATHS,
  proxyNetworkPolicy,
  proxyPod,
  proxyPodName,
  proxyResize,
  proxySecret,
  proxyService,
  ROUTING_ANNOTATION,
  secretName,
  workNetworkPolicy,
  workPod,
} from "./kubernetes/manifests";

// The `sandbox0` backend: a Kubernetes pod per sandbox (DigitalOcean Kubernetes), driven through
// the Kubernetes API with fetch only, from the SandboxBroker Durable Object. docs/sandbox0.md says
// what it makes, what it guarantees and how to set it up.
//
// - proxy sandbox: create() makes its Service and NetworkPolicy; the pod itself is made by the
//   exec of `bw-proxy` (one pod per launch), with the run's proxy credentials in a Secret only
//   that pod references. Its poll is the pod's state and log; kill deletes pod and Secret; freeze
//   resizes its CPU in place.
// - work/task/orchestrator: create() makes the NetworkPolicy, then the pod (init containers
//   copy the tools in and, under catch-all, install the redirect) and waits for it to run. Every
//   exec is detached under the pod's exec runner; each look at it is one short Kubernetes exec.

const setting = (name: string) => z.string({ error: `${name} is not set` }).min(1, `${name} is not set`);

const LOOPBACK = new Set(["127.0.0.1", "localhost", "[::1]"]);
function isApiUrl(text: string): boolean {
  try {
    const u = new URL(text);
    // The token goes with every call: never in clear text off this machine.
    return u.protocol === "https:" || (u.protocol === "http:" && LOOPBACK.has(u.hostname));
  } catch {
    return false;
  }
}
function isHttpUrl(text: string): boolean {
  try {
    return ["http:", "https:"].includes(new URL(text).protocol);
  } catch {
    return false;
  }
}

export const Sandbox0Env = z.object({
  SANDBOX0_API_URL: setting("SANDBOX0_API_URL").refine(
    isApiUrl,
    "SANDBOX0_API_URL must be an https URL (http only on loopback)",
  ),
  SANDBOX0_TOKEN: setting("SANDBOX0_TOKEN"),
  SANDBOX0_NAMESPACE: setting("SANDBOX0_NAMESPACE").regex(
    /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/,
    "SANDBOX0_NAMESPACE is not a Kubernetes namespace name",
  ),
  SANDBOX0_PROXY_IMAGE: setting("SANDBOX0_PROXY_IMAGE"),
  SANDBOX0_WORK_IMAGE: setting("SANDBOX0_WORK_IMAGE"),
  PUBLIC_URL: setting("PUBLIC_URL").refine(isHttpUrl, "PUBLIC_URL is not an http(s) URL"),
});
export type Sandbox0Env = z.infer<typeof Sandbox0Env>;

/** The sandbox0 backend from the Worker's env; the reason it is not configured otherwise. */
export function sandbox0FromEnv(env: Partial<Record<keyof Sandbox0Env, unknown>>): ComputeBackend | string {
  const parsed = Sandbox0Env.safeParse(env);
  if (!parsed.success) return [...new Set(parsed.error.issues.map((i) => i.message))].join("; ");
  return sandbox0Backend(parsed.data);
}

/** Exec env entries that go into the proxy's Secret, never into a pod spec. */
const SECRET_ENV = new Set(["BW_PROXY_TOKEN", "BW_AUDIT_KEY"]);
const isSecretEnv = (key: string) => SECRET_ENV.has(key) || /(TOKEN|SECRET|PASSWORD|_KEY)$/.test(key);

/** Programs of the proxy image; every other exec runs under a work pod's runner. */
const PROXY_PROGRAMS = new Set(["bw-proxy", "bw-proxy-view"]);

const WORK_START_DEADLINE_MS = 45_000;
const SETUP_END_DEADLINE_MS = 30_000;
const POD_GONE_DEADLINE_MS = 30_000;
const RUNNER_TIMEOUT_MS = 30_000;
const SYNC_EXEC_MAX_MS = 60_000;
const MAX_POLL_WAIT_MS = 5_000;
const LOG_LIMIT = 1024 * 1024;
/** Longest an unpack or a collect may take in the pod. */
const TRANSFER_MS = 10 * 60_000;

/**
 * The most stdout a collect may write: its byte bound plus what the archive adds around the files
 * (two 512-byte blocks of header and padding a file, the manifest's line a file or cut, gzip's
 * worst case on incompressible data), so a sound archive always fits and nothing else is buffered.
 */
export function collectStdoutBound(bounds: { maxBytes: number; maxFiles: number }): number {
  return bounds.maxBytes + Math.ceil(bounds.maxBytes / 64) + bounds.maxFiles * 2 * 1024 + 1024 * 1024;
}

const lastLine = (text: string) =>
  text
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .at(-1) ?? "";
function lastJson(text: string): unknown {
  try {
    return JSON.parse(lastLine(text));
  } catch {
    return null;
  }
}
/** Waiting reasons of a container that will not start by waiting longer. */
const FATAL_WAITING = new Set([
  "ErrImagePull",
  "ImagePullBackOff",
  "InvalidImageName",
  "CreateContainerConfigError",
  "CreateContainerError",
  "RunContainerError",
]);

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const byteLength = (text: string) => new TextEncoder().encode(text).length;

/** Waits the backend bounds; tests shorten them (never through the Worker's env). */
export interface Sandbox0Timing {
  /** How long seal waits for the kubelet to report the setup container ended. */
  setupEndMs?: number;
}

export function sandbox0Backend(config: Sandbox0Env, timing: Sandbox0Timing = {}): ComputeBackend {
  // Values of the current proxy launch's Secret: kept out of every error message too.
  let hidden: string[] = [];
  const kube = new KubeClient(
    { apiUrl: config.SANDBOX0_API_URL, token: config.SANDBOX0_TOKEN, namespace: config.SANDBOX0_NAMESPACE },
    () => hidden,
  );
  const ns = config.SANDBOX0_NAMESPACE;
  /** The exec of a pod that is not there is a 404 of this code: then try the proxy's way. */
  const NO_POD = "pod_not_found";

  const ownedSelector = `${LABELS.managedBy}=${MANAGED_BY}`;
  const sandboxSelector = (id: string) => `${ownedSelector},${LABELS.sandbox}=${id}`;

  function checkId(id: string, code = "not_found"): void {
    // Ids go into labels as they are (the mapping back); one that cannot is not ours.
    if (!isLabelValue(id))
      throw new BackendError(code, `sandbox id ${JSON.stringify(id)} cannot be a Kubernetes label`);
  }

  /** Creates a NetworkPolicy, or rewrites the existing one to exactly this. */
  async function ensurePolicy(policy: { metadata: { name: string } }, what: string): Promise<void> {
    const meaning = { what, forbidden: "cannot_isolate", notFound: "cannot_isolate" };
    const made = await kube.create("networkpolicies", policy, meaning);
    if (made === null) await kube.replace("networkpolicies", policy.metadata.name, policy, meaning);
  }

  async function proxyServiceOf(proxyId: string): Promise<KubeObject> {
    const svc = await kube.get("services", objectName(proxyId), { what: "read the proxy's Service" });
    if (!svc?.spec?.clusterIP) throw new BackendError("not_found", `no proxy sandbox ${proxyId}`);
    return svc;
  }

  async function sandboxPods(id: string): Promise<KubeObject[]> {
    return kube.list("pods", sandboxSelector(id), { what: "list the sandbox's pods" });
  }

  /** The proxy pod that serves now: running, not being deleted. */
  async function liveProxyPod(proxyId: string): Promise<KubeObject | null> {
    const pods = await sandboxPods(proxyId);
    return (
      pods.find(
        (p) =>
          p.metadata?.labels?.[LABELS.kind] === "proxy" &&
          !p.metadata.deletionTimestamp &&
          p.status?.phase === "Running" &&
          p.status.containerStatuses?.find((c) => c.name === "proxy")?.state?.running,
      ) ?? null
    );
  }

  /** Why a pod will not run, if it will not. */
  function failureOf(pod: KubeObject): string | null {
    const st = pod.status ?? {};
    for (const c of st.initContainerStatuses ?? []) {
      const t = c.state?.terminated;
      if (t && t.exitCode !== 0) {
        return `init container ${c.name} failed (exit ${t.exitCode}${t.reason ? `, ${t.reason}` : ""}${t.message ? `: ${t.message.trim()}` : ""})`;
      }
    }
    for (const c of [...(st.initContainerStatuses ?? []), ...(st.containerStatuses ?? [])]) {
      const w = c.state?.waiting;
      if (w?.reason && FATAL_WAITING.has(w.reason)) {
        return `container ${c.name} cannot start: ${w.reason}${w.message ? `: ${w.message}` : ""}`;
      }
    }
    if (st.phase === "Failed" || st.phase === "Succeeded") {
      return `the pod ended (${st.phase}${st.reason ? `, ${st.reason}` : ""}${st.message ? `: ${st.message}` : ""})`;
    }
    return null;
  }

  const containerOf = (pod: KubeObject, name: string) =>
    pod.status?.containerStatuses?.find((c) => c.name === name);
  const containerNames = (pod: KubeObject) =>
    ((pod.spec?.containers ?? []) as Array<{ name?: string }>).map((c) => c.name ?? "");

  async function waitRunning(name: string): Promise<KubeObject> {
    const deadline = Date.now() + WORK_START_DEADLINE_MS;
    for (;;) {
      const pod = await kube.get("pods", name, { what: "read the sandbox's pod" });
      if (!pod) throw new BackendError("sandbox_failed", `the pod ${name} is gone`);
      const failed = failureOf(pod);
      if (failed) throw new BackendError("sandbox_failed", failed);
      // Every container: the sealer must hold its copy before any setup command runs.
      const running = containerNames(pod).every((n) => containerOf(pod, n)?.state?.running);
      if (pod.status?.phase === "Running" && running) return pod;
      if (Date.now() >= deadline) {
        // Worth another try later (an image pull, a node being added): create is idempotent.
        throw new BackendError("sandbox_starting", `the pod ${name} is still starting`, true);
      }
      await sleep(1_000);
    }
  }

  // ---- the work pods' runner ----

  async function runner<T>(
    sandboxId: string,
    args: string[],
    schema: z.ZodType<T>,
    what: string,
    stdin?: string,
    extraMs = 0,
    container: string = CONTAINERS.work,
  ): Promise<T> {
    const res = await kube.exec(
      objectName(sandboxId),
      container,
      [POD_PATHS.runner, ...args],
      { stdin, timeoutMs: RUNNER_TIMEOUT_MS + extraMs },
      { what, notFound: NO_POD },
    );
    const answer = runnerAnswer(res.stdout, res.exitCode, schema);
    if (answer.ok) return answer.data;
    if (answer.refusal) {
      const code =
        answer.refusal.error === "not_found"
          ? "not_found"
          : answer.refusal.error === "bad_request"
            ? "invalid_request"
            : "sandbox_failed";
      throw new BackendError(code, `the sandbox's exec runner refused (${what}): ${answer.refusal.detail}`);
    }
    throw new BackendError(
      "sandbox_failed",
      `the sandbox's exec runner answered outside its contract (${what}, exit ${res.exitCode})`,
    );
  }

  /** Runs `work` against a work pod; `proxy` when the sandbox has no such pod (a proxy sandbox). */
  async function workOrProxy<T>(work: () => Promise<T>, proxy: () => Promise<T>): Promise<T> {
    try {
      return await work();
    } catch (e) {
      if (e instanceof BackendError && e.code === NO_POD) return proxy();
      throw e;
    }
  }

  /**
   * A runner operation on an exec: in `work`, else (the runner knows no such exec) in the setup
   * container while it runs. Each container's runner has its own state, so poll and kill find a
   * setup-stage exec only where it started.
   */
  async function inWorkOrSetup<T>(sandboxId: string, op: (container: string) => Promise<T>): Promise<T> {
    try {
      return await op(CONTAINERS.work);
    } catch (e) {
      if (!(e instanceof BackendError && e.code === "not_found")) throw e;
      const pod = await kube.get("pods", objectName(sandboxId), { what: "read the sandbox's pod" });
      if (!pod || !containerOf(pod, CONTAINERS.setup)?.state?.running) throw e;
      return op(CONTAINERS.setup);
    }
  }

  // ---- the two stages ----

  /** The work pod of a sandbox; a proxy sandbox has no stages, and no sandbox is not_found. */
  async function workPodOf(sandboxId: string): Promise<KubeObject> {
    const pod = await kube.get("pods", objectName(sandboxId), { what: "read the sandbox's pod" });
    return pod ?? noStages(sandboxId);
  }

  function routingOf(pod: KubeObject): string {
    return (
      pod.metadata?.annotations?.[ROUTING_ANNOTATION] ??
      // A pod from before the annotation: catch-all pods alone have the redirect.
      (((pod.spec?.initContainers ?? []) as Array<{ name?: string }>).some((c) => c.name === "bw-redirect")
        ? "catch-all"
        : "default")
    );
  }

  /** Where a setup-stage command runs: the root `setup` container while there is one. */
  async function setupStageContainer(sandboxId: string): Promise<string> {
    const pod = await kube.get("pods", objectName(sandboxId), { what: "read the sandbox's pod" });
    // No pod: the runner's exec answers (a proxy sandbox, or none). No setup container: a
    // sandbox made without a setup stage runs everything as its one uid.
    if (!pod || !containerNames(pod).includes(CONTAINERS.setup)) return CONTAINERS.work;
    if (!containerOf(pod, CONTAINERS.setup)?.state?.running) {
      throw new BackendError("sealed", `sandbox ${sandboxId}: the setup stage has ended (sealed)`);
    }
    return CONTAINERS.setup;
  }

  async function waitSetupEnded(sandboxId: string, name: string): Promise<void> {
    const deadline = Date.now() + (timing.setupEndMs ?? SETUP_END_DEADLINE_MS);
    for (;;) {
      const pod = await kube.get("pods", name, { what: "read the sandbox's pod" });
      if (!pod) throw new BackendError("sandbox_failed", `the pod ${name} is gone`);
      if (containerOf(pod, CONTAINERS.setup)?.state?.terminated) return;
      if (Date.now() >= deadline) {
        // What the setup stage left may still run: the execute stage must not start beside it.
        throw new BackendError(
          "sandbox_failed",
          `sandbox ${sandboxId}: the setup container did not end after seal, so its processes may still run`,
        );
      }
      await sleep(500);
    }
  }

  /** The pod's /etc/hosts block written again by the sealer (bw-init hosts → bw-wiring reinstall). */
  async function rewriteHosts(
    sandboxId: string,
    pod: KubeObject,
    routing: "default" | "catch-all",
    hostsFile: string[],
    what: string,
  ): Promise<void> {
    if (!containerNames(pod).includes(CONTAINERS.seal)) {
      throw notSupported("sandbox0", `${what} in a pod made before the sealer (bw-seal)`);
    }
    const aliases = (pod.spec?.hostAliases ?? []) as Array<{ ip?: string }>;
    const input: WiringReinstall = {
      mode: routing,
      proxyAddress: aliases[0]?.ip ?? "",
      hostsFile: routing === "default" ? hostsFile : [],
      caCertPem: null, // the run CA lives in /bw/run/ca, which setup mounts read-only
      hostsPath: "/etc/hosts",
      nsswitchPath: null, // each container's own image's: setup cannot change the work container's
    };
    const res = await kube.exec(
      pod.metadata?.name as string,
      CONTAINERS.seal,
      ["bw-init", "hosts"],
      { stdin: `${JSON.stringify(input)}\n`, timeoutMs: RUNNER_TIMEOUT_MS },
      { what },
    );
    const result = ReinstallResult.safeParse(lastJson(res.stdout));
    if (res.exitCode !== 0 || !result.success || !result.data.ok) {
      const why =
        (result.success ? result.data.error : null) ?? (lastLine(res.stderr) || `exit ${res.exitCode}`);
      throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: ${what}: ${why.slice(0, 400)}`);
    }
  }

  // ---- the proxy pod ----

  async function proxyExecInfo(sandboxId: string, execId: string, pod: KubeObject, from: ExecPoll) {
    const name = pod.metadata?.name as string;
    const cs = pod.status?.containerStatuses?.find((c) => c.name === "proxy");
    const terminated = cs?.state?.terminated;
    const failed = terminated ? null : failureOf(pod);
    const started = Boolean(cs?.state?.running || terminated);
    const log = started
      ? ((await kube.log(name, "proxy", LOG_LIMIT, { what: "read the proxy's log" })) ?? "")
      : "";
    // The kubelet keeps stdout and stderr as one log: it is reported as stdout, offsets in bytes.
    const bytes = new TextEncoder().encode(log);
    const outFrom = Math.min(from.stdoutFrom ?? 0, bytes.length);
    const stderr = failed ?? "";
    const errBytes = byteLength(stderr);
    const errFrom = Math.min(from.stderrFrom ?? 0, errBytes);
    const exited = Boolean(terminated) || failed !== null;
    return ExecInfo.parse({
      execId,
      sandboxId,
      state: exited ? "exited" : "running",
      exitCode: terminated ? terminated.exitCode : null,
      signal: null,
      stdout: new TextDecoder().decode(bytes.subarray(outFrom)),
      stderr: new TextDecoder().decode(new TextEncoder().encode(stderr).subarray(errFrom)),
      stdoutEnd: bytes.length,
      stderrEnd: errBytes,
    });
  }

  async function launchProxy(sandboxId: string, execId: string, request: z.output<typeof ExecRequest>) {
    const existing = await kube.get("pods", proxyPodName(sandboxId, execId), { what: "read the proxy pod" });
    if (existing) return proxyExecInfo(sandboxId, execId, existing, {});
    const svc = await proxyServiceOf(sandboxId);
    const runId = svc.metadata?.labels?.[LABELS.run];
    if (!runId) throw new BackendError("not_found", `no proxy sandbox ${sandboxId}`);
    const plain: Record<string, string> = {};
    const secret: Record<string, string> = {};
    for (const [k, v] of Object.entries(request.env)) (isSecretEnv(k) ? secret : plain)[k] = v;
    plain.BW_CONTROL_PLANE_URL = config.PUBLIC_URL;
    hidden = Object.values(secret);
    const body = proxySecret(ns, runId, sandboxId, secret);
    const meaning = { what: "store the proxy's credentials" };
    // A fresh launch brings fresh credentials: they replace whatever a killed launch left.
    if ((await kube.create("secrets", body, meaning)) === null) {
      await kube.replace("secrets", secretName(sandboxId), body, meaning);
    }
    const pod = proxyPod({
      ns,
      runId,
      sandboxId,
      execId,
      image: config.SANDBOX0_PROXY_IMAGE,
      argv: request.argv,
      plainEnv: plain,
      secretKeys: Object.keys(secret),
      serviceIp: svc.spec?.clusterIP as string,
    });
    const made = await kube.create("pods", pod, {
      what: "create the proxy pod",
      forbidden: "cannot_isolate",
    });
    const now = made ?? (await kube.get("pods", pod.metadata.name, { what: "read the proxy pod" }));
    if (!now) throw new BackendError("sandbox_failed", "the proxy pod vanished as it was made");
    return proxyExecInfo(sandboxId, execId, now, {});
  }

  /** A short synchronous exec in the running proxy (bw-proxy-view). */
  async function proxyCommand(sandboxId: string, execId: string, request: z.output<typeof ExecRequest>) {
    const pod = await liveProxyPod(sandboxId);
    if (!pod) throw new BackendError("sandbox_failed", `the proxy of sandbox ${sandboxId} is not running`);
    const res = await kube.exec(
      pod.metadata?.name as string,
      "proxy",
      request.argv,
      { stdin: request.stdin, timeoutMs: Math.min(request.timeoutMs ?? SYNC_EXEC_MAX_MS, SYNC_EXEC_MAX_MS) },
      { what: `run ${request.argv[0]} in the proxy` },
    );
    return ExecInfo.parse({
      execId,
      sandboxId,
      state: "exited",
      exitCode: res.exitCode,
      signal: null,
      stdout: res.stdout,
      stderr: res.stderr,
      stdoutEnd: byteLength(res.stdout),
      stderrEnd: byteLength(res.stderr),
    });
  }

  async function waitGone(names: string[]): Promise<void> {
    const deadline = Date.now() + POD_GONE_DEADLINE_MS;
    for (const name of names) {
      for (;;) {
        const pod = await kube.get("pods", name, { what: "read the pod being deleted" });
        if (!pod) break;
        if (Date.now() >= deadline) {
          // Its NetworkPolicy stays until the pod is gone; the next destroy finishes the job.
          throw new BackendError("backend_unreachable", `the pod ${name} is still terminating`, true);
        }
        await sleep(500);
      }
    }
  }

  const podMeaning: CallMeaning = { what: "delete the pod" };

  /** A sandbox without a work pod: a proxy sandbox has no stages (bundles, artifacts); or none. */
  async function noStages(sandboxId: string, input?: ReadableStream<Uint8Array>): Promise<never> {
    if (input && !input.locked) await input.cancel().catch(() => {});
    await proxyServiceOf(sandboxId); // not_found when there is no such sandbox at all
    throw new BackendError("invalid_request", `sandbox ${sandboxId} is a proxy sandbox: it has no stages`);
  }

  return {
    name: "sandbox0",

    async create(spec: SandboxSpec): Promise<SandboxInfo> {
      checkId(spec.id, "sandbox_failed");
      checkId(spec.runId, "sandbox_failed");
      if (spec.kind === "proxy") {
        // The policy before the Service: nothing of the run exists unguarded.
        await ensurePolicy(proxyNetworkPolicy(ns, spec.runId, spec.id), "create the proxy's NetworkPolicy");
        const body = proxyService(ns, spec.runId, spec.id);
        const svc =
          (await kube.create("services", body, { what: "create the proxy's Service" })) ??
          (await proxyServiceOf(spec.id));
        return {
          id: spec.id,
          runId: spec.runId,
          kind: "proxy",
          state: "ready",
          address: svc.spec?.clusterIP ?? "",
          proxyAddress: null,
          controlPlaneUrl: config.PUBLIC_URL,
          routing: null,
          probeTarget: null,
          wiring: null,
        };
      }
      checkId(spec.proxySandboxId, "not_found");
      const svc = await proxyServiceOf(spec.proxySandboxId);
      if (svc.metadata?.labels?.[LABELS.run] !== spec.runId) {
        throw new BackendError("not_found", `run ${spec.runId} has no proxy sandbox ${spec.proxySandboxId}`);
      }
      let proxyAddress = svc.spec?.clusterIP as string;
      if (spec.routing === "catch-all") {
        // The redirect sends to the proxy pod itself: a DNAT to a Service address would rely on
        // the CNI translating packets after the pod's own NAT, which not every datapath does.
        const proxy = await liveProxyPod(spec.proxySandboxId);
        if (!proxy?.status?.podIP) {
          throw new BackendError(
            "sandbox_failed",
            "the run's proxy is not running, so catch-all routing has nowhere to send traffic",
          );
        }
        proxyAddress = proxy.status.podIP;
      }
      await ensurePolicy(
        workNetworkPolicy({
          ns,
          runId: spec.runId,
          sandboxId: spec.id,
          kind: spec.kind,
          routing: spec.routing,
        }),
        "create the sandbox's NetworkPolicy",
      );
      const pod = workPod({
        ns,
        runId: spec.runId,
        sandboxId: spec.id,
        kind: spec.kind,
        routing: spec.routing,
        proxyImage: config.SANDBOX0_PROXY_IMAGE,
        workImage: config.SANDBOX0_WORK_IMAGE,
        proxyAddress,
        hostsFile: spec.hostsFile,
        ...(spec.resources ? { resources: spec.resources } : {}),
        ...(spec.setup ? { setup: true } : {}),
      });
      // 409: made by an earlier call for this id; it is waited for like a new one.
      await kube.create("pods", pod, { what: "create the sandbox's pod", forbidden: "cannot_isolate" });
      const running = await waitRunning(pod.metadata.name);
      const aliases = (running.spec as { hostAliases?: Array<{ ip?: string }> } | undefined)?.hostAliases;
      return {
        id: spec.id,
        runId: spec.runId,
        kind: spec.kind,
        state: "ready",
        address: running.status?.podIP ?? "",
        proxyAddress: aliases?.[0]?.ip ?? proxyAddress,
        controlPlaneUrl: null,
        routing: spec.routing,
        probeTarget: null,
        // No root in the pod: the hosts entries are the pod's hostAliases, the CA goes to /bw/run.
        wiring: { hostsInstalled: true, caDir: POD_PATHS.caDir, caBundlePath: POD_PATHS.caBundle },
      };
    },

    async exec(sandboxId: string, input: ExecRequest): Promise<ExecInfo> {
      checkId(sandboxId);
      const parsed = ExecRequest.safeParse(input);
      if (!parsed.success)
        throw new BackendError("invalid_request", "the exec request is outside its contract");
      const request = parsed.data;
      const execId = request.id ?? `x_${crypto.randomUUID().replaceAll("-", "")}`;
      const program = request.argv[0] as string;
      if (program === "bw-proxy") return launchProxy(sandboxId, execId, request);
      if (PROXY_PROGRAMS.has(program)) return proxyCommand(sandboxId, execId, request);
      // Setup-stage commands run as root in the pod's setup container; the wiring (ours, needing
      // no root) and the execute stage in `work` as the sandbox's uid (docs/sandbox0.md).
      const container =
        request.stage === "setup" && program !== "bw-wiring"
          ? await setupStageContainer(sandboxId)
          : CONTAINERS.work;
      const start = {
        argv: request.argv,
        env: request.env,
        ...(request.cwd === undefined ? {} : { cwd: request.cwd }),
        ...(request.stdin === undefined ? {} : { stdin: request.stdin }),
        timeoutMs: request.timeoutMs,
      };
      const status = await runner(
        sandboxId,
        startArgs(execId),
        RunnerStatus,
        "start the command",
        `${JSON.stringify(start)}\n`,
        0,
        container,
      );
      return toExecInfo(sandboxId, status);
    },

    async poll(sandboxId: string, execId: string, poll: ExecPoll): Promise<ExecInfo> {
      checkId(sandboxId);
      const waitMs = Math.min(Math.max(poll.waitMs ?? 0, 0), MAX_POLL_WAIT_MS);
      return workOrProxy(
        () =>
          inWorkOrSetup(sandboxId, async (container) =>
            toExecInfo(
              sandboxId,
              await runner(
                sandboxId,
                pollArgs(execId, poll.stdoutFrom ?? 0, poll.stderrFrom ?? 0, waitMs),
                RunnerStatus,
                "poll the command",
                undefined,
                waitMs,
                container,
              ),
            ),
          ),
        async () => {
          const pod = await kube.get("pods", proxyPodName(sandboxId, execId), { what: "read the proxy pod" });
          if (!pod) throw new BackendError("not_found", `sandbox ${sandboxId} has no exec ${execId}`);
          return proxyExecInfo(sandboxId, execId, pod, poll);
        },
      );
    },

    async kill(sandboxId: string, execId: string): Promise<ExecInfo> {
      checkId(sandboxId);
      return workOrProxy(
        () =>
          inWorkOrSetup(sandboxId, async (container) =>
            toExecInfo(
              sandboxId,
              await runner(
                sandboxId,
                killArgs(execId),
                RunnerStatus,
                "kill the command",
                undefined,
                0,
                container,
              ),
            ),
          ),
        async () => {
          // The launch's pod and the credentials it held: a relaunch makes both anew.
          const had = await kube.remove("pods", proxyPodName(sandboxId, execId), podMeaning, 0);
          await kube.remove("secrets", secretName(sandboxId), { what: "delete the proxy's credentials" });
          if (!had) throw new BackendError("not_found", `sandbox ${sandboxId} has no exec ${execId}`);
          return ExecInfo.parse({
            execId,
            sandboxId,
            state: "exited",
            exitCode: null,
            signal: "SIGKILL",
            stdout: "",
            stderr: "",
            stdoutEnd: 0,
            stderrEnd: 0,
          });
        },
      );
    },

    async freeze(sandboxId: string, frozen: boolean): Promise<void> {
      checkId(sandboxId);
      await workOrProxy(
        async () => {
          await runner(sandboxId, freezeArgs(frozen), RunnerFreeze, "freeze the sandbox");
          // A halt during the setup stage stops (and continues) its commands too.
          const pod = await kube.get("pods", objectName(sandboxId), { what: "read the sandbox's pod" });
          if (pod && containerOf(pod, CONTAINERS.setup)?.state?.running) {
            await runner(
              sandboxId,
              freezeArgs(frozen),
              RunnerFreeze,
              "freeze the setup stage",
              undefined,
              0,
              CONTAINERS.setup,
            );
          }
        },
        async () => {
          // A proxy is paused by shrinking its CPU in place: it keeps its memory (its CA key and
          // policy), its connections and its node slot; it is not stopped (docs/sandbox0.md).
          const pods = (await sandboxPods(sandboxId)).filter(
            (p) => p.metadata?.labels?.[LABELS.kind] === "proxy" && !p.metadata.deletionTimestamp,
          );
          if (pods.length === 0) {
            await proxyServiceOf(sandboxId); // not_found when there is no such sandbox at all
            return;
          }
          for (const p of pods) {
            const name = p.metadata?.name as string;
            await kube.call(
              "PATCH",
              kube.path("pods", name, "resize"),
              { what: "resize the proxy pod", notFound: "sandbox_failed" },
              { body: proxyResize(frozen), contentType: "application/strategic-merge-patch+json" },
            );
          }
        },
      );
    },

    async destroy(sandboxId: string): Promise<void> {
      if (!isLabelValue(sandboxId)) return; // never one of ours
      const pods = await sandboxPods(sandboxId);
      const names = pods.map((p) => p.metadata?.name as string);
      for (const name of names) await kube.remove("pods", name, podMeaning, 0);
      // The policy goes only once its pods are gone: a terminating pod is still fenced in.
      await waitGone(names);
      await kube.remove("networkpolicies", objectName(sandboxId), { what: "delete the NetworkPolicy" });
      const proxy = pods.length === 0 || pods.some((p) => p.metadata?.labels?.[LABELS.kind] === "proxy");
      if (proxy) {
        await kube.remove("secrets", secretName(sandboxId), { what: "delete the proxy's credentials" });
        await kube.remove("services", objectName(sandboxId), { what: "delete the proxy's Service" });
      }
    },

    async list() {
      const meaning = { what: "list the sandboxes" };
      const objects = [
        ...(await kube.list("pods", ownedSelector, meaning)),
        ...(await kube.list("services", ownedSelector, meaning)),
      ];
      const seen = new Map<string, { id: string; runId: string; kind: SandboxKind }>();
      for (const o of objects) {
        const l = o.metadata?.labels ?? {};
        const id = l[LABELS.sandbox];
        const runId = l[LABELS.run];
        const kind = l[LABELS.kind];
        if (!id || !runId || !["proxy", "work", "task", "orchestrator"].includes(kind ?? "")) continue;
        if (!seen.has(id)) seen.set(id, { id, runId, kind: kind as SandboxKind });
      }
      return [...seen.values()];
    },

    // Bundles in and artifacts out need no root: bw-unpack and bw-collect run in the work
    // container as its uid, the archive going in on the exec's stdin (v5 closes it) and coming
    // out on its stdout.
    async putBundle(sandboxId: string, bundle: ReadableStream<Uint8Array>, dir: string) {
      checkId(sandboxId);
      const bounds = { maxBytes: BUNDLE_DEFAULTS.maxUnpackedBytes, maxFiles: BUNDLE_DEFAULTS.maxFiles };
      const res = await workOrProxy(
        () =>
          kube.execBytes(
            objectName(sandboxId),
            "work",
            [
              POD_PATHS.unpack,
              dir,
              "--max-bytes",
              String(bounds.maxBytes),
              "--max-files",
              String(bounds.maxFiles),
            ],
            { stdin: bundle, timeoutMs: TRANSFER_MS, maxStdoutBytes: LOG_LIMIT },
            { what: "unpack the bundle", notFound: NO_POD },
          ),
        () => noStages(sandboxId, bundle),
      );
      const stdout = new TextDecoder().decode(res.stdout);
      const result = UnpackResult.safeParse(lastJson(stdout));
      const expected =
        res.exitCode === UNPACK_EXIT.ok ? true : res.exitCode === UNPACK_EXIT.refused ? false : null;
      if (!result.success || expected === null || result.data.ok !== expected) {
        const why = lastLine(res.stderr) || `exit ${res.exitCode}`;
        throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: bw-unpack: ${why.slice(0, 400)}`);
      }
      return result.data;
    },
    // The setup stage ends in the pod: the sealer kills what it left, the kubelet reports its
    // container ended (its runtime kills the rest of its cgroup), then the sealer writes the hosts
    // block again. The run CA needs nothing: setup mounts it read-only.
    async seal(sandboxId: string, input: Seal): Promise<SealResult> {
      checkId(sandboxId);
      const parsed = Seal.safeParse(input);
      if (!parsed.success) throw new BackendError("invalid_request", "the seal is outside its contract");
      const seal = parsed.data;
      const pod = await workPodOf(sandboxId);
      const name = pod.metadata?.name as string;
      if (seal.routing !== routingOf(pod)) {
        throw new BackendError(
          "invalid_request",
          `sandbox ${sandboxId} was made for ${routingOf(pod)} routing`,
        );
      }
      let killed = 0;
      if (containerNames(pod).includes(CONTAINERS.setup)) {
        const setup = containerOf(pod, CONTAINERS.setup);
        if (setup?.state?.running) {
          const id = /^[a-z0-9-]+:\/\/([0-9a-f]{12,128})$/.exec(setup.containerID ?? "")?.[1];
          if (!id) {
            throw new BackendError(
              "sandbox_failed",
              `sandbox ${sandboxId}: the setup container has no runtime id`,
            );
          }
          const res = await kube.exec(
            name,
            CONTAINERS.seal,
            ["bw-init", "seal", id],
            { timeoutMs: RUNNER_TIMEOUT_MS },
            { what: "end the setup stage" },
          );
          const answer = z.strictObject({ killed: z.number().int().min(0) }).safeParse(lastJson(res.stdout));
          if (res.exitCode !== 0 || !answer.success) {
            const why = lastLine(res.stderr) || `exit ${res.exitCode}`;
            throw new BackendError(
              "sandbox_failed",
              `sandbox ${sandboxId}: bw-init seal: ${why.slice(0, 400)}`,
            );
          }
          killed = answer.data.killed;
        }
        await waitSetupEnded(sandboxId, name);
      }
      await rewriteHosts(sandboxId, pod, seal.routing, seal.hostsFile, "write the hosts file again");
      return { killed };
    },

    async setHosts(sandboxId: string, hostsFile: string[]): Promise<void> {
      checkId(sandboxId);
      const pod = await workPodOf(sandboxId);
      // Under catch-all the redirect takes every host: the hosts block names only the platform's.
      if (routingOf(pod) !== "default") return;
      await rewriteHosts(sandboxId, pod, "default", hostsFile, "rewrite the hosts file");
    },
    async collect(sandboxId: string, options: { dir: string; maxBytes: number; maxFiles: number }) {
      checkId(sandboxId);
      const bounds = {
        maxBytes: Math.min(options.maxBytes, ARTIFACT_DEFAULTS.maxBytes),
        maxFiles: Math.min(options.maxFiles, ARTIFACT_DEFAULTS.maxFiles),
      };
      // Buffered, bounded: the archive is whole (and bw-collect said so by its exit) before any
      // of it is handed on, so a failed collect is never a half-read stream.
      const res = await workOrProxy(
        () =>
          kube.execBytes(
            objectName(sandboxId),
            "work",
            [
              POD_PATHS.collect,
              options.dir,
              "--max-bytes",
              String(bounds.maxBytes),
              "--max-files",
              String(bounds.maxFiles),
            ],
            { timeoutMs: TRANSFER_MS, maxStdoutBytes: collectStdoutBound(bounds) },
            { what: "collect the artifacts", notFound: NO_POD },
          ),
        () => noStages(sandboxId),
      );
      if (res.exitCode !== 0) {
        const why = lastLine(res.stderr) || `exit ${res.exitCode}`;
        throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: bw-collect: ${why.slice(0, 400)}`);
      }
      const archive = res.stdout;
      return new ReadableStream<Uint8Array>({
        start(controller) {
          controller.enqueue(archive);
          controller.close();
        },
      });
    },
  };
}
