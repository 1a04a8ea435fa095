import {
  ARTIFACT_DEFAULTS,
  BUNDLE_DEFAULTS,
  UNPACK_EXIT,
  UnpackResult,
} from "@benchwright/shared/contract/bundle";
import {
  freezeArgs,
  killArgs,
  pollArgs,
  RunnerFreeze,
  RunnerStatus,
  startArgs,
  toExecInfo,
} from "@benchwright/shared/contract/exec-runner";
import {
  ExecInfo,
  ExecRequest,
  type SandboxInfo,
  type SandboxKind,
  Seal,
  type SealResult,
} from "@benchwright/shared/contract/local-agent";
import { z } from "zod";
import { BackendError, type ComputeBackend, type ExecPoll, type SandboxSpec } from "../backend";
import {
  CONTAINERS,
  isLabelValue,
  LABELS,
  objectName,
  POD_PATHS,
  proxyNetworkPolicy,
  proxyPodName,
  proxyResize,
  proxyService,
  secretName,
  workNetworkPolicy,
  workPod,
} from "../kubernetes/manifests";
import { type RegistryEnv, registryFromEnv, type SetupRegistry } from "../registry-images";
import { Sandbox0Env } from "./config";
import {
  collectStdoutBound,
  LOG_LIMIT,
  lastJson,
  lastLine,
  MAX_POLL_WAIT_MS,
  PROXY_PROGRAMS,
  RUNNER_TIMEOUT_MS,
  type Sandbox0Timing,
  sandbox0Pods,
  TRANSFER_MS,
} from "./pods";
import { sandbox0SetupImages } from "./setup-images";

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

/** The sandbox0 backend from the Worker's env; the reason it is not configured otherwise. */
export function sandbox0FromEnv(
  env: Partial<Record<keyof Sandbox0Env, unknown>> & RegistryEnv,
): ComputeBackend | string {
  const parsed = Sandbox0Env.safeParse(env);
  if (!parsed.success) return [...new Set(parsed.error.issues.map((i) => i.message))].join("; ");
  return sandbox0Backend(parsed.data, {}, registryFromEnv(env));
}

export function sandbox0Backend(
  config: Sandbox0Env,
  timing: Sandbox0Timing = {},
  registry: SetupRegistry = { settings: async () => null, signingKeyText: "" },
): ComputeBackend {
  const cluster = sandbox0Pods(config, timing);
  const images = sandbox0SetupImages(config, registry, cluster);

  return {
    name: "sandbox0",

    async create(spec: SandboxSpec): Promise<SandboxInfo> {
      cluster.checkId(spec.id, "sandbox_failed");
      cluster.checkId(spec.runId, "sandbox_failed");
      if (spec.kind === "proxy") {
        // The policy before the Service: nothing of the run exists unguarded.
        await cluster.ensurePolicy(
          proxyNetworkPolicy(cluster.ns, spec.runId, spec.id),
          "create the proxy's NetworkPolicy",
        );
        const body = proxyService(cluster.ns, spec.runId, spec.id);
        const svc =
          (await cluster.kube.create("services", body, { what: "create the proxy's Service" })) ??
          (await cluster.proxyServiceOf(spec.id));
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
      cluster.checkId(spec.proxySandboxId, "not_found");
      const svc = await cluster.proxyServiceOf(spec.proxySandboxId);
      if (svc.metadata?.labels?.[LABELS.run] !== spec.runId) {
        throw new BackendError("not_found", `run ${spec.runId} has no proxy sandbox ${spec.proxySandboxId}`);
      }
      let proxyAddress = svc.spec?.clusterIP as string;
      if (spec.routing === "catch-all") {
        // The redirect sends to the proxy pod itself: a DNAT to a Service address would rely on
        // the CNI translating packets after the pod's own NAT, which not every datapath does.
        const proxy = await cluster.liveProxyPod(spec.proxySandboxId);
        if (!proxy?.status?.podIP) {
          throw new BackendError(
            "sandbox_failed",
            "the run's proxy is not running, so catch-all routing has nowhere to send traffic",
          );
        }
        proxyAddress = proxy.status.podIP;
      }
      await cluster.ensurePolicy(
        workNetworkPolicy({
          ns: cluster.ns,
          runId: spec.runId,
          sandboxId: spec.id,
          kind: spec.kind,
          routing: spec.routing,
        }),
        "create the sandbox's NetworkPolicy",
      );
      const pod = workPod({
        ns: cluster.ns,
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
        ...(spec.capture ? { capture: true } : {}),
        // A setup image's digest, checked in the registry before the pod names it.
        ...(spec.layer ? { layer: await images.startFrom(spec.layer) } : {}),
      });
      // 409: made by an earlier call for this id; it is waited for like a new one.
      await cluster.kube.create("pods", pod, {
        what: "create the sandbox's pod",
        forbidden: "cannot_isolate",
      });
      const running = await cluster.waitRunning(pod.metadata.name);
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
      cluster.checkId(sandboxId);
      const parsed = ExecRequest.safeParse(input);
      if (!parsed.success)
        throw new BackendError("invalid_request", "the exec request is outside its contract");
      const request = parsed.data;
      const execId = request.id ?? `x_${crypto.randomUUID().replaceAll("-", "")}`;
      const program = request.argv[0] as string;
      if (program === "bw-proxy") return cluster.launchProxy(sandboxId, execId, request);
      if (PROXY_PROGRAMS.has(program)) return cluster.proxyCommand(sandboxId, execId, request);
      // Setup-stage commands run as root in the pod's setup container; the wiring (ours, needing
      // no root) and the execute stage in `work` as the sandbox's uid (docs/sandbox0.md).
      const container =
        request.stage === "setup" && program !== "bw-wiring"
          ? await cluster.setupStageContainer(sandboxId)
          : CONTAINERS.work;
      const start = {
        argv: request.argv,
        env: request.env,
        ...(request.cwd === undefined ? {} : { cwd: request.cwd }),
        ...(request.stdin === undefined ? {} : { stdin: request.stdin }),
        timeoutMs: request.timeoutMs,
      };
      const status = await cluster.runner(
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
      cluster.checkId(sandboxId);
      const waitMs = Math.min(Math.max(poll.waitMs ?? 0, 0), MAX_POLL_WAIT_MS);
      return cluster.workOrProxy(
        () =>
          cluster.inWorkOrSetup(sandboxId, async (container) =>
            toExecInfo(
              sandboxId,
              await cluster.runner(
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
          const pod = await cluster.kube.get("pods", proxyPodName(sandboxId, execId), {
            what: "read the proxy pod",
          });
          if (!pod) throw new BackendError("not_found", `sandbox ${sandboxId} has no exec ${execId}`);
          return cluster.proxyExecInfo(sandboxId, execId, pod, poll);
        },
      );
    },

    async kill(sandboxId: string, execId: string): Promise<ExecInfo> {
      cluster.checkId(sandboxId);
      return cluster.workOrProxy(
        () =>
          cluster.inWorkOrSetup(sandboxId, async (container) =>
            toExecInfo(
              sandboxId,
              await cluster.runner(
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
          const had = await cluster.kube.remove(
            "pods",
            proxyPodName(sandboxId, execId),
            cluster.podMeaning,
            0,
          );
          await cluster.kube.remove("secrets", secretName(sandboxId), {
            what: "delete the proxy's credentials",
          });
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
      cluster.checkId(sandboxId);
      await cluster.workOrProxy(
        async () => {
          await cluster.runner(sandboxId, freezeArgs(frozen), RunnerFreeze, "freeze the sandbox");
          // A halt during the setup stage stops (and continues) its commands too.
          const pod = await cluster.kube.get("pods", objectName(sandboxId), {
            what: "read the sandbox's pod",
          });
          if (pod && cluster.containerOf(pod, CONTAINERS.setup)?.state?.running) {
            await cluster.runner(
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
          const pods = (await cluster.sandboxPods(sandboxId)).filter(
            (p) => p.metadata?.labels?.[LABELS.kind] === "proxy" && !p.metadata.deletionTimestamp,
          );
          if (pods.length === 0) {
            await cluster.proxyServiceOf(sandboxId); // not_found when there is no such sandbox at all
            return;
          }
          for (const p of pods) {
            const name = p.metadata?.name as string;
            await cluster.kube.call(
              "PATCH",
              cluster.kube.path("pods", name, "resize"),
              { what: "resize the proxy pod", notFound: "sandbox_failed" },
              { body: proxyResize(frozen), contentType: "application/strategic-merge-patch+json" },
            );
          }
        },
      );
    },

    async destroy(sandboxId: string): Promise<void> {
      if (!isLabelValue(sandboxId)) return; // never one of ours
      const pods = await cluster.sandboxPods(sandboxId);
      const names = pods.map((p) => p.metadata?.name as string);
      for (const name of names) await cluster.kube.remove("pods", name, cluster.podMeaning, 0);
      // The policy goes only once its pods are gone: a terminating pod is still fenced in.
      await cluster.waitGone(names);
      await cluster.kube.remove("networkpolicies", objectName(sandboxId), {
        what: "delete the NetworkPolicy",
      });
      const proxy = pods.length === 0 || pods.some((p) => p.metadata?.labels?.[LABELS.kind] === "proxy");
      if (proxy) {
        await cluster.kube.remove("secrets", secretName(sandboxId), {
          what: "delete the proxy's credentials",
        });
        await cluster.kube.remove("services", objectName(sandboxId), { what: "delete the proxy's Service" });
      }
    },

    async list() {
      const meaning = { what: "list the sandboxes" };
      const objects = [
        ...(await cluster.kube.list("pods", cluster.ownedSelector, meaning)),
        ...(await cluster.kube.list("services", cluster.ownedSelector, meaning)),
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
      cluster.checkId(sandboxId);
      const bounds = { maxBytes: BUNDLE_DEFAULTS.maxUnpackedBytes, maxFiles: BUNDLE_DEFAULTS.maxFiles };
      const res = await cluster.workOrProxy(
        () =>
          cluster.kube.execBytes(
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
            { what: "unpack the bundle", notFound: cluster.NO_POD },
          ),
        () => cluster.noStages(sandboxId, bundle),
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
      cluster.checkId(sandboxId);
      const parsed = Seal.safeParse(input);
      if (!parsed.success) throw new BackendError("invalid_request", "the seal is outside its contract");
      const seal = parsed.data;
      const pod = await cluster.workPodOf(sandboxId);
      const name = pod.metadata?.name as string;
      if (seal.routing !== cluster.routingOf(pod)) {
        throw new BackendError(
          "invalid_request",
          `sandbox ${sandboxId} was made for ${cluster.routingOf(pod)} routing`,
        );
      }
      let killed = 0;
      if (cluster.containerNames(pod).includes(CONTAINERS.setup)) {
        const setup = cluster.containerOf(pod, CONTAINERS.setup);
        if (setup?.state?.running) {
          const id = /^[a-z0-9-]+:\/\/([0-9a-f]{12,128})$/.exec(setup.containerID ?? "")?.[1];
          if (!id) {
            throw new BackendError(
              "sandbox_failed",
              `sandbox ${sandboxId}: the setup container has no runtime id`,
            );
          }
          const res = await cluster.kube.exec(
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
        await cluster.waitSetupEnded(sandboxId, name);
      }
      await cluster.rewriteHosts(sandboxId, pod, seal.routing, seal.hostsFile, "write the hosts file again");
      return { killed };
    },

    async setHosts(sandboxId: string, hostsFile: string[]): Promise<void> {
      cluster.checkId(sandboxId);
      const pod = await cluster.workPodOf(sandboxId);
      // Under catch-all the redirect takes every host: the hosts block names only the platform's.
      if (cluster.routingOf(pod) !== "default") return;
      await cluster.rewriteHosts(sandboxId, pod, "default", hostsFile, "rewrite the hosts file");
    },
    async collect(sandboxId: string, options: { dir: string; maxBytes: number; maxFiles: number }) {
      cluster.checkId(sandboxId);
      const bounds = {
        maxBytes: Math.min(options.maxBytes, ARTIFACT_DEFAULTS.maxBytes),
        maxFiles: Math.min(options.maxFiles, ARTIFACT_DEFAULTS.maxFiles),
      };
      // Buffered, bounded: the archive is whole (and bw-collect said so by its exit) before any
      // of it is handed on, so a failed collect is never a half-read stream.
      const res = await cluster.workOrProxy(
        () =>
          cluster.kube.execBytes(
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
            { what: "collect the artifacts", notFound: cluster.NO_POD },
          ),
        () => cluster.noStages(sandboxId),
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
    // Setup images (issue 34) are images in the deployment's registry (setup-images.ts).
    baseImage: images.baseImage,
    captureLayer: images.captureLayer,
    dropLayer: images.dropLayer,
    // Registry images are found through their rows only: listing a registry's repositories would
    // need its catalog, and a push whose row was never written is left to the registry's cleanup.
    listLayers: async () => [],
  };
}
