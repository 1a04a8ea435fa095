import type { BrokerCode } from "@benchwright/shared/contract/broker";
import { runnerAnswer } from "@benchwright/shared/contract/exec-runner";
import { ExecInfo, type ExecRequest } from "@benchwright/shared/contract/local-agent";
import { ReinstallResult, type WiringReinstall } from "@benchwright/shared/contract/wiring";
import type { z } from "zod";
import { BackendError, type ExecPoll, notSupported } from "../backend";
import { type CallMeaning, KubeClient, type KubeObject } from "../kubernetes/client";
import {
  CONTAINERS,
  isLabelValue,
  LABELS,
  MANAGED_BY,
  objectName,
  POD_PATHS,
  proxyPod,
  proxyPodName,
  proxySecret,
  ROUTING_ANNOTATION,
  secretName,
} from "../kubernetes/manifests";
import type { Sandbox0Env } from "./config";

// The sandbox0 backend's Kubernetes side; its calls are in backend.ts (docs/sandbox0.md).

/** Exec env entries that go into the proxy's Secret, never into a pod spec. */
const SECRET_ENV = new Set(["BW_PROXY_TOKEN", "BW_AUDIT_KEY"]);
const isSecretEnv = (key: string) => SECRET_ENV.has(key) || /(TOKEN|SECRET|PASSWORD|_KEY)$/.test(key);

/** Programs of the proxy image; every other exec runs under a work pod's runner. */
export const PROXY_PROGRAMS = new Set(["bw-proxy", "bw-proxy-view"]);

const WORK_START_DEADLINE_MS = 45_000;
const SETUP_END_DEADLINE_MS = 30_000;
const POD_GONE_DEADLINE_MS = 30_000;
export const RUNNER_TIMEOUT_MS = 30_000;
const SYNC_EXEC_MAX_MS = 60_000;
export const MAX_POLL_WAIT_MS = 5_000;
export const LOG_LIMIT = 1024 * 1024;
/** Longest an unpack or a collect may take in the pod. */
export const TRANSFER_MS = 10 * 60_000;

/**
 * The most stdout a collect may write: its byte bound plus what the archive adds around the files
 * (two 512-byte blocks of header and padding a file, the manifest's line a file or cut, gzip's
 * worst case on incompressible data), so a sound archive always fits and nothing else is buffered.
 */
export function collectStdoutBound(bounds: { maxBytes: number; maxFiles: number }): number {
  return bounds.maxBytes + Math.ceil(bounds.maxBytes / 64) + bounds.maxFiles * 2 * 1024 + 1024 * 1024;
}

export const lastLine = (text: string) =>
  text
    .split("\n")
    .map((l) => l.trim())
    .filter(Boolean)
    .at(-1) ?? "";
export function lastJson(text: string): unknown {
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

/**
 * The backend's Kubernetes side: its client, the pods and Services of a sandbox, the work pods'
 * runner and the proxy's launch, as the calls of sandbox0Backend (backend.ts) use them.
 */
export function sandbox0Pods(config: Sandbox0Env, timing: Sandbox0Timing = {}) {
  // Values of the current proxy launch's Secret: kept out of every error message too.
  let hidden: string[] = [];
  const kube = new KubeClient(
    { apiUrl: config.SANDBOX0_API_URL, token: config.SANDBOX0_TOKEN, namespace: config.SANDBOX0_NAMESPACE },
    () => hidden,
  );
  const ns = config.SANDBOX0_NAMESPACE;
  /** The exec of a pod that is not there is a 404 of this code: then try the proxy's way. */
  const NO_POD: BrokerCode = "pod_not_found";

  const ownedSelector = `${LABELS.managedBy}=${MANAGED_BY}`;
  const sandboxSelector = (id: string) => `${ownedSelector},${LABELS.sandbox}=${id}`;

  function checkId(id: string, code: BrokerCode = "not_found"): void {
    // Ids go into labels as they are (the mapping back); one that cannot is not ours.
    if (!isLabelValue(id))
      throw new BackendError(code, `sandbox id ${JSON.stringify(id)} cannot be a Kubernetes label`);
  }

  /** Creates a NetworkPolicy, or rewrites the existing one to exactly this. */
  async function ensurePolicy(policy: { metadata: { name: string } }, what: string): Promise<void> {
    const meaning: CallMeaning = { what, forbidden: "cannot_isolate", notFound: "cannot_isolate" };
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
    kube,
    ns,
    NO_POD,
    ownedSelector,
    checkId,
    ensurePolicy,
    proxyServiceOf,
    sandboxPods,
    liveProxyPod,
    containerOf,
    containerNames,
    waitRunning,
    runner,
    workOrProxy,
    inWorkOrSetup,
    workPodOf,
    routingOf,
    setupStageContainer,
    waitSetupEnded,
    rewriteHosts,
    proxyExecInfo,
    launchProxy,
    proxyCommand,
    waitGone,
    podMeaning,
    noStages,
  };
}
