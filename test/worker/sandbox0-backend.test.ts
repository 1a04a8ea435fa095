import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { eq } from "drizzle-orm";
import { describe, expect, inject, it } from "vitest";
import { tarGzEntries } from "../../src/archive/entries";
import { BackendError, type ComputeBackend } from "../../src/broker/backend";
import { objectName, POD_PATHS, proxyPodName, secretName } from "../../src/broker/kubernetes/manifests";
import { SandboxBroker } from "../../src/broker/sandbox-broker";
import { sandbox0Backend, sandbox0FromEnv } from "../../src/broker/sandbox0/backend";
import { Sandbox0Env } from "../../src/broker/sandbox0/config";
import { CollectManifest, DEFAULT_OUT_DIR } from "../../src/contract/bundle";
import type { ExecInfo, ExecRequest } from "../../src/contract/local-agent";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { WORK_DIR } from "../../src/coordinator/steps/stages";
import { randomId } from "../../src/crypto/api-keys";
import { runs, sandboxes } from "../../src/db/schema";
import type { ContractOptions, RecordedRequest } from "../contract/kubernetes-contract";
import { file, streamOf, tarGz } from "./archives";
import { proxyOf } from "./backend-fixtures";
import { newTenant, withDb } from "./harness";
import { newRun } from "./run-fixtures";

// The sandbox0 backend against the Kubernetes CONTRACT SERVER (test/contract/kubernetes-server.ts:
// the documented API shapes, loopback only; a work pod's execs run the real exec runner there).
// Each test has a namespace of its own, so the requests it asserts are exactly its own.

const k8s = inject("kubernetes");
const PROXY_IMAGE =
  "registry.contract.test/benchwright-proxy@sha256:1111111111111111111111111111111111111111111111111111111111111111";
const WORK_IMAGE =
  "registry.contract.test/benchwright-work@sha256:2222222222222222222222222222222222222222222222222222222222222222";
const PUBLIC_URL = "https://boundary.contract.test";
const PROBE_HOST = "probe.benchwright.invalid";
const MODEL_HOST = "model.benchwright.invalid";
const PRIVATE_RANGES = ["10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "169.254.0.0/16"];
const PROXY_PORTS = [
  { port: 8443, protocol: "TCP" },
  { port: 8080, protocol: "TCP" },
  { port: 3128, protocol: "TCP" },
  { port: 5353, protocol: "TCP" },
  { port: 5353, protocol: "UDP" },
];
const LABEL = {
  managedBy: "app.kubernetes.io/managed-by",
  run: "benchwright.dev/run",
  sandbox: "benchwright.dev/sandbox",
  kind: "benchwright.dev/kind",
};

// biome-ignore lint/suspicious/noExplicitAny: Kubernetes objects are read field by field
type Obj = any;

const newNs = () => `t-${crypto.randomUUID().slice(0, 12)}`;

function envFor(ns: string, over: Record<string, string> = {}) {
  return {
    SANDBOX0_API_URL: k8s.url,
    SANDBOX0_TOKEN: k8s.token,
    SANDBOX0_NAMESPACE: ns,
    SANDBOX0_PROXY_IMAGE: PROXY_IMAGE,
    SANDBOX0_WORK_IMAGE: WORK_IMAGE,
    PUBLIC_URL,
    ...over,
  };
}

function backendIn(ns: string, over: Record<string, string> = {}): ComputeBackend {
  const made = sandbox0FromEnv(envFor(ns, over));
  if (typeof made === "string") throw new Error(made);
  return made;
}

async function recorded(ns: string): Promise<RecordedRequest[]> {
  const res = await fetch(`${k8s.url}/_contract/requests?namespace=${ns}`);
  return (await res.json()) as RecordedRequest[];
}

async function objects(
  ns: string,
): Promise<Record<"pods" | "services" | "secrets" | "networkpolicies", Obj[]>> {
  const res = await fetch(`${k8s.url}/_contract/objects?namespace=${ns}`);
  return (await res.json()) as Record<"pods" | "services" | "secrets" | "networkpolicies", Obj[]>;
}

async function contractOptions(options: ContractOptions): Promise<void> {
  const res = await fetch(`${k8s.url}/_contract/options`, { method: "POST", body: JSON.stringify(options) });
  expect(res.status).toBe(204);
}

async function terminate(ns: string, pod: string, exitCode: number, log: string): Promise<void> {
  const res = await fetch(`${k8s.url}/_contract/terminate`, {
    method: "POST",
    body: JSON.stringify({ namespace: ns, pod, exitCode, log }),
  });
  expect(res.status).toBe(204);
}

const line = (r: RecordedRequest) => `${r.method} ${r.path}${r.status ? ` ${r.status}` : ""}`;
const api = (ns: string, resource: string, name?: string) =>
  `${resource === "networkpolicies" ? "/apis/networking.k8s.io/v1" : "/api/v1"}/namespaces/${ns}/${resource}${name ? `/${name}` : ""}`;

async function expectBackendError(p: Promise<unknown>, code: string): Promise<BackendError> {
  const error = await p.then(
    () => null,
    (e: unknown) => e,
  );
  expect(error).toBeInstanceOf(BackendError);
  expect((error as BackendError).code).toBe(code);
  return error as BackendError;
}

const b64 = (s: string) => btoa(s);

/** Polls an exec until it exits (real processes: each poll waits up to 2 s for the exit). */
async function waitExit(b: ComputeBackend, sandboxId: string, execId: string): Promise<ExecInfo> {
  for (let i = 0; i < 20; i++) {
    const info = await b.poll(sandboxId, execId, { waitMs: 2000 });
    if (info.state === "exited") return info;
  }
  throw new Error(`exec ${execId} did not exit`);
}

async function run(b: ComputeBackend, sandboxId: string, request: ExecRequest): Promise<ExecInfo> {
  const started = await b.exec(sandboxId, request);
  return waitExit(b, sandboxId, started.execId);
}

describe("sandbox0 configuration", () => {
  it("names each missing setting, refuses a token over clear text, never echoes the token", () => {
    const missing = sandbox0FromEnv({});
    expect(typeof missing).toBe("string");
    for (const name of [
      "SANDBOX0_API_URL",
      "SANDBOX0_TOKEN",
      "SANDBOX0_NAMESPACE",
      "SANDBOX0_PROXY_IMAGE",
      "SANDBOX0_WORK_IMAGE",
      "PUBLIC_URL",
    ]) {
      expect(missing).toContain(`${name} is not set`);
    }
    const token = `tok-canary-${crypto.randomUUID()}`;
    const clear = sandbox0FromEnv(
      envFor("ns", { SANDBOX0_API_URL: "http://k8s.example.com", SANDBOX0_TOKEN: token }),
    );
    expect(clear).toBe("SANDBOX0_API_URL must be an https URL (http only on loopback)");
    expect(sandbox0FromEnv(envFor("Bad_NS"))).toBe("SANDBOX0_NAMESPACE is not a Kubernetes namespace name");
    const ok = sandbox0FromEnv(envFor("ns", { SANDBOX0_API_URL: "https://k8s.example.com" }));
    expect(typeof ok === "string" ? ok : ok.name).toBe("sandbox0");
  });
});

describe("sandbox0 proxy sandbox", () => {
  it("create makes the policy, then the Service; the Service IP is the proxy's address; idempotent", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const proxyId = randomId("sbx_");
    const info = await b.create({ kind: "proxy", id: proxyId, runId });
    const reqs = await recorded(ns);
    expect(reqs.map(line)).toEqual([
      `POST ${api(ns, "networkpolicies")} 201`,
      `POST ${api(ns, "services")} 201`,
    ]);
    const labels = {
      [LABEL.managedBy]: "benchwright",
      [LABEL.run]: runId,
      [LABEL.sandbox]: proxyId,
      [LABEL.kind]: "proxy",
    };
    const policy = reqs[0]?.body as Obj;
    expect(policy.metadata).toEqual({ name: objectName(proxyId), namespace: ns, labels });
    expect(policy.spec.podSelector).toEqual({
      matchLabels: { [LABEL.sandbox]: proxyId, [LABEL.kind]: "proxy" },
    });
    expect(policy.spec.policyTypes).toEqual(["Ingress", "Egress"]);
    expect(policy.spec.ingress).toEqual([
      {
        from: [
          {
            podSelector: {
              matchLabels: { [LABEL.run]: runId },
              matchExpressions: [
                { key: LABEL.kind, operator: "In", values: ["work", "task", "orchestrator"] },
              ],
            },
          },
        ],
        ports: PROXY_PORTS,
      },
    ]);
    const internet = policy.spec.egress.find((e: Obj) => e.to[0].ipBlock);
    expect(internet.to[0].ipBlock.cidr).toBe("0.0.0.0/0");
    expect(internet.to[0].ipBlock.except).toEqual(expect.arrayContaining(PRIVATE_RANGES));
    expect(policy.spec.egress.find((e: Obj) => e.to[0].podSelector)?.to[0].podSelector).toEqual({
      matchLabels: { "k8s-app": "kube-dns" },
    });

    const service = reqs[1]?.body as Obj;
    expect(service.metadata).toEqual({ name: objectName(proxyId), namespace: ns, labels });
    expect(service.spec.type).toBe("ClusterIP");
    expect(service.spec.selector).toEqual({ [LABEL.sandbox]: proxyId, [LABEL.kind]: "proxy" });
    expect(service.spec.ports.map((p: Obj) => `${p.port}/${p.protocol}->${p.targetPort}`)).toEqual([
      "443/TCP->8443",
      "80/TCP->8080",
      "8443/TCP->8443",
      "8080/TCP->8080",
      "3128/TCP->3128",
      "5353/TCP->5353",
      "5353/UDP->5353",
    ]);
    const [svc] = (await objects(ns)).services;
    expect(info).toEqual({
      id: proxyId,
      runId,
      kind: "proxy",
      state: "ready",
      address: svc.spec.clusterIP,
      proxyAddress: null,
      controlPlaneUrl: PUBLIC_URL,
      routing: null,
      probeTarget: null,
      wiring: null,
    });

    // Again (a replayed step): the policy is rewritten to exactly this, the Service read back.
    expect(await b.create({ kind: "proxy", id: proxyId, runId })).toEqual(info);
    expect((await recorded(ns)).slice(2).map(line)).toEqual([
      `POST ${api(ns, "networkpolicies")} 409`,
      `PUT ${api(ns, "networkpolicies", objectName(proxyId))} 200`,
      `POST ${api(ns, "services")} 409`,
      `GET ${api(ns, "services", objectName(proxyId))} 200`,
    ]);
  });

  it("the bw-proxy exec makes a Secret and the pod that alone references it; poll, view, exit, kill, relaunch", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const token = `bwp_canary_${crypto.randomUUID()}`;
    const audit = `whsec_canary_${crypto.randomUUID()}`;
    const { proxyId, info, launch } = await proxyOf(b, runId, { token, audit });
    const pod1 = proxyPodName(proxyId, "proxy-1");
    expect(launch).toEqual({
      execId: "proxy-1",
      sandboxId: proxyId,
      state: "running",
      exitCode: null,
      signal: null,
      stdout: "",
      stderr: "",
      stdoutEnd: 0,
      stderrEnd: 0,
    });
    const reqs = (await recorded(ns)).slice(2);
    expect(reqs.map(line)).toEqual([
      `GET ${api(ns, "pods", pod1)} 404`,
      `GET ${api(ns, "services", objectName(proxyId))} 200`,
      `POST ${api(ns, "secrets")} 201`,
      `POST ${api(ns, "pods")} 201`,
    ]);
    const secret = reqs[2]?.body as Obj;
    expect(secret).toEqual({
      apiVersion: "v1",
      kind: "Secret",
      metadata: {
        name: secretName(proxyId),
        namespace: ns,
        labels: {
          [LABEL.managedBy]: "benchwright",
          [LABEL.run]: runId,
          [LABEL.sandbox]: proxyId,
          [LABEL.kind]: "proxy",
        },
      },
      type: "Opaque",
      data: { BW_PROXY_TOKEN: b64(token), BW_AUDIT_KEY: b64(audit) },
    });
    const pod = reqs[3]?.body as Obj;
    const podText = JSON.stringify(pod);
    for (const needle of [token, audit, b64(token), b64(audit), k8s.token])
      expect(podText).not.toContain(needle);
    expect(pod.metadata.name).toBe(pod1);
    expect(pod.metadata.labels).toEqual(secret.metadata.labels);
    expect(pod.spec).toMatchObject({
      restartPolicy: "Never",
      automountServiceAccountToken: false,
      enableServiceLinks: false,
      hostNetwork: false,
      hostPID: false,
      securityContext: { runAsNonRoot: true, runAsUser: 10001, seccompProfile: { type: "RuntimeDefault" } },
      volumes: [{ name: "tmp", emptyDir: { sizeLimit: "64Mi" } }],
    });
    const [container] = pod.spec.containers;
    expect(container.image).toBe(PROXY_IMAGE);
    expect(container.command).toEqual(["bw-proxy"]);
    expect(container.securityContext).toEqual({
      runAsNonRoot: true,
      runAsUser: 10001,
      runAsGroup: 10001,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: true,
      capabilities: { drop: ["ALL"] },
    });
    expect(container.volumeMounts).toEqual([{ name: "tmp", mountPath: "/tmp" }]);
    const envOf = Object.fromEntries(container.env.map((e: Obj) => [e.name, e.value ?? e.valueFrom]));
    expect(envOf.BW_PROXY_TOKEN).toEqual({
      secretKeyRef: { name: secretName(proxyId), key: "BW_PROXY_TOKEN" },
    });
    expect(envOf.BW_AUDIT_KEY).toEqual({ secretKeyRef: { name: secretName(proxyId), key: "BW_AUDIT_KEY" } });
    expect(envOf.BW_CONTROL_PLANE_URL).toBe(PUBLIC_URL);
    expect(envOf.BW_RUN_ID).toBe(runId);
    expect(envOf.BW_SPOOL_DIR).toBe("/tmp/benchwright-spool");
    expect(envOf.BW_OWN_ADDRESSES).toBe(`$(BW_POD_IP),${info.address}`);

    // The exec is the pod: running, its log the output (offsets in bytes).
    const polled = await b.poll(proxyId, "proxy-1", {});
    const log = "bw-proxy (contract server): started\n";
    expect(polled).toMatchObject({ state: "running", stdout: log, stdoutEnd: log.length });
    expect((await b.poll(proxyId, "proxy-1", { stdoutFrom: log.length })).stdout).toBe("");
    // The same exec id again: that pod, nothing made.
    const before = (await recorded(ns)).length;
    expect((await b.exec(proxyId, { id: "proxy-1", argv: ["bw-proxy"], stage: "setup" })).state).toBe(
      "running",
    );
    expect((await recorded(ns)).slice(before).filter((r) => r.method !== "GET")).toEqual([]);

    // bw-proxy-view: a short synchronous Kubernetes exec in the proxy container.
    const view = await b.exec(proxyId, {
      id: "view_1",
      argv: ["bw-proxy-view"],
      stage: "setup",
      timeoutMs: 5000,
    });
    expect(view).toMatchObject({ state: "exited", exitCode: 0, stderr: "" });
    expect(JSON.parse(view.stdout)).toEqual({ contract: "bw-proxy-view", pod: pod1 });
    const execReq = (await recorded(ns)).find((r) => r.exec && r.path.endsWith(`/pods/${pod1}/exec`));
    expect(execReq?.exec).toMatchObject({
      protocol: "v5.channel.k8s.io",
      container: "proxy",
      command: ["bw-proxy-view"],
    });

    // The proxy exits: the exec has exited with its code, the log says why.
    await terminate(ns, pod1, 3, "bw-proxy: cannot reach the control plane\n");
    expect(await b.poll(proxyId, "proxy-1", { stdoutFrom: log.length })).toMatchObject({
      state: "exited",
      exitCode: 3,
      stdout: "bw-proxy: cannot reach the control plane\n",
    });

    // kill: the pod and the Secret go; a second kill finds nothing (the broker takes that as done).
    let mark = (await recorded(ns)).length;
    expect(await b.kill(proxyId, "proxy-1")).toMatchObject({ state: "exited", signal: "SIGKILL" });
    expect((await recorded(ns)).slice(mark).map(line)).toEqual([
      // The runner's way first: there is no work pod by that name, so it is a proxy.
      `GET ${api(ns, "pods", objectName(proxyId))}/exec 404`,
      `DELETE ${api(ns, "pods", pod1)} 200`,
      `DELETE ${api(ns, "secrets", secretName(proxyId))} 200`,
    ]);
    expect((await recorded(ns)).at(-2)?.query).toEqual({ gracePeriodSeconds: ["0"] });
    expect((await objects(ns)).secrets).toEqual([]);
    // Again while the pod is still terminating: the same answer; once it is gone, not_found
    // (which the broker takes as "nothing to kill").
    expect(await b.kill(proxyId, "proxy-1")).toMatchObject({ state: "exited", signal: "SIGKILL" });
    expect(await b.poll(proxyId, "proxy-1", {})).toMatchObject({ state: "exited", exitCode: 3 });
    await expectBackendError(b.poll(proxyId, "proxy-1", {}), "not_found");
    await expectBackendError(b.kill(proxyId, "proxy-1"), "not_found");

    // A relaunch: fresh credentials in a new Secret, a pod of its own.
    mark = (await recorded(ns)).length;
    const token2 = `bwp_canary_${crypto.randomUUID()}`;
    await b.exec(proxyId, {
      id: "proxy-2",
      argv: ["bw-proxy"],
      env: { ...PROXY_ENV, BW_RUN_ID: runId, BW_PROXY_TOKEN: token2, BW_AUDIT_KEY: audit },
      stage: "setup",
      timeoutMs: null,
    });
    const again = (await recorded(ns)).slice(mark);
    expect(again.map(line)).toEqual([
      `GET ${api(ns, "pods", proxyPodName(proxyId, "proxy-2"))} 404`,
      `GET ${api(ns, "services", objectName(proxyId))} 200`,
      `POST ${api(ns, "secrets")} 201`,
      `POST ${api(ns, "pods")} 201`,
    ]);
    expect((again[2]?.body as Obj)?.data.BW_PROXY_TOKEN).toBe(b64(token2));
  });

  it("freeze resizes the proxy's CPU in place and back (idempotent); a cluster without resize is refused", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const { proxyId } = await proxyOf(b, randomId("run_"));
    const pod1 = proxyPodName(proxyId, "proxy-1");
    let mark = (await recorded(ns)).length;
    await b.freeze(proxyId, true);
    await b.freeze(proxyId, true);
    const reqs = (await recorded(ns)).slice(mark);
    expect(reqs.map(line)).toEqual([
      // The runner's way first: there is no work pod by that name, so it is a proxy.
      `GET ${api(ns, "pods", objectName(proxyId))}/exec 404`,
      `GET ${api(ns, "pods")} 200`,
      `PATCH ${api(ns, "pods", pod1)}/resize 200`,
      `GET ${api(ns, "pods", objectName(proxyId))}/exec 404`,
      `GET ${api(ns, "pods")} 200`,
      `PATCH ${api(ns, "pods", pod1)}/resize 200`,
    ]);
    expect(reqs[2]?.contentType).toBe("application/strategic-merge-patch+json");
    expect(reqs[2]?.body).toEqual({
      spec: {
        containers: [{ name: "proxy", resources: { requests: { cpu: "10m" }, limits: { cpu: "10m" } } }],
      },
    });
    expect((await objects(ns)).pods[0].spec.containers[0].resources).toEqual({
      requests: { cpu: "10m", memory: "256Mi" },
      limits: { cpu: "10m", memory: "512Mi" },
    });
    mark = (await recorded(ns)).length;
    await b.freeze(proxyId, false);
    expect((await recorded(ns)).at(-1)?.body).toEqual({
      spec: {
        containers: [{ name: "proxy", resources: { requests: { cpu: "250m" }, limits: { cpu: "1" } } }],
      },
    });
    expect((await objects(ns)).pods[0].spec.containers[0].resources.requests.cpu).toBe("250m");

    await contractOptions({ namespace: ns, resize: false });
    const refused = await expectBackendError(b.freeze(proxyId, true), "sandbox_failed");
    expect(refused.message).toContain("resize");
    await expectBackendError(backendIn(ns).freeze(randomId("sbx_"), true), "not_found");
  });
});

describe("sandbox0 work, task and orchestrator pods", () => {
  it("are non-root without NET_ADMIN; only the catch-all init container has it; hosts and policy per routing", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId, info: proxy } = await proxyOf(b, runId);
    const mark = (await recorded(ns)).length;

    const catchAllId = randomId("sbx_");
    const catchAll = await b.create({
      kind: "work",
      id: catchAllId,
      runId,
      proxySandboxId: proxyId,
      routing: "catch-all",
      hostsFile: [],
    });
    const defaultId = randomId("sbx_");
    const defaulted = await b.create({
      kind: "task",
      id: defaultId,
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: ["api.example.com", "uploads.example.org"],
    });
    const orchestratorId = randomId("sbx_");
    await b.create({
      kind: "orchestrator",
      id: orchestratorId,
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: [],
    });
    const reqs = (await recorded(ns)).slice(mark);
    const proxyPod = (await objects(ns)).pods.find((p) => p.metadata.labels[LABEL.kind] === "proxy");
    expect(proxyPod.status.podIP).toMatch(/^10\.244\./);
    expect(reqs.slice(0, 5).map(line)).toEqual([
      `GET ${api(ns, "services", objectName(proxyId))} 200`,
      `GET ${api(ns, "pods")} 200`,
      `POST ${api(ns, "networkpolicies")} 201`,
      `POST ${api(ns, "pods")} 201`,
      `GET ${api(ns, "pods", objectName(catchAllId))} 200`,
    ]);
    expect(reqs[1]?.query.labelSelector).toEqual([
      `${LABEL.managedBy}=benchwright,${LABEL.sandbox}=${proxyId}`,
    ]);
    // Default routing needs no proxy pod address: the Service's.
    expect(reqs.slice(5, 9).map(line)).toEqual([
      `GET ${api(ns, "services", objectName(proxyId))} 200`,
      `POST ${api(ns, "networkpolicies")} 201`,
      `POST ${api(ns, "pods")} 201`,
      `GET ${api(ns, "pods", objectName(defaultId))} 200`,
    ]);

    const podBodies = reqs
      .filter((r) => r.method === "POST" && r.path.endsWith("/pods"))
      .map((r) => r.body as Obj);
    const [caPod, dfPod, orPod] = podBodies;
    for (const [pod, id, kind] of [
      [caPod, catchAllId, "work"],
      [dfPod, defaultId, "task"],
      [orPod, orchestratorId, "orchestrator"],
    ] as const) {
      expect(pod.metadata).toEqual({
        name: objectName(id),
        namespace: ns,
        labels: {
          [LABEL.managedBy]: "benchwright",
          [LABEL.run]: runId,
          [LABEL.sandbox]: id,
          [LABEL.kind]: kind,
        },
        annotations: { "benchwright.dev/routing": id === catchAllId ? "catch-all" : "default" },
      });
      expect(pod.spec).toMatchObject({
        restartPolicy: "Never",
        automountServiceAccountToken: false,
        enableServiceLinks: false,
        hostNetwork: false,
        hostPID: false,
        hostIPC: false,
        securityContext: {
          runAsNonRoot: true,
          runAsUser: 10001,
          runAsGroup: 10001,
          seccompProfile: { type: "RuntimeDefault" },
        },
      });
      const [main] = pod.spec.containers;
      // No setup stage asked for: no root setup container, only the sealer beside work.
      expect(pod.spec.containers.map((c: Obj) => c.name)).toEqual(["work", "bw-seal"]);
      expect(main.image).toBe(WORK_IMAGE);
      expect(main.command).toEqual(["/bw/tools/bin/bw-exec", "hold"]);
      expect(main.securityContext).toEqual({
        runAsNonRoot: true,
        runAsUser: 10001,
        runAsGroup: 10001,
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: false,
        capabilities: { drop: ["ALL"] },
      });
      expect(main.volumeMounts).toContainEqual({ name: "bw-tools", mountPath: "/bw/tools", readOnly: true });
      const tools = pod.spec.initContainers.find((c: Obj) => c.name === "bw-tools");
      expect(tools).toMatchObject({ image: PROXY_IMAGE, command: ["bw-init", "tools"] });
      expect(tools.securityContext).toEqual({ ...main.securityContext, readOnlyRootFilesystem: true });
    }
    // The containers that add a capability: the catch-all pod's redirect, and each sealer (KILL).
    const adders = podBodies.flatMap((p) =>
      [...(p.spec.initContainers ?? []), ...p.spec.containers]
        .filter((c: Obj) => (c.securityContext?.capabilities?.add ?? []).length > 0)
        .map((c: Obj) => `${p.metadata.name}/${c.name}:${c.securityContext.capabilities.add.join(",")}`),
    );
    expect(adders).toEqual([
      `${objectName(catchAllId)}/bw-redirect:NET_ADMIN`,
      `${objectName(catchAllId)}/bw-seal:KILL`,
      `${objectName(defaultId)}/bw-seal:KILL`,
      `${objectName(orchestratorId)}/bw-seal:KILL`,
    ]);
    const redirect = caPod.spec.initContainers[0];
    expect(caPod.spec.initContainers.map((c: Obj) => c.name)).toEqual(["bw-redirect", "bw-tools"]);
    expect(redirect).toMatchObject({
      image: PROXY_IMAGE,
      command: ["bw-init", "redirect", proxyPod.status.podIP],
      securityContext: {
        runAsUser: 0,
        allowPrivilegeEscalation: false,
        readOnlyRootFilesystem: true,
        capabilities: { drop: ["ALL"], add: ["NET_ADMIN"] },
      },
    });
    expect(redirect.volumeMounts).toBeUndefined();
    expect(dfPod.spec.initContainers.map((c: Obj) => c.name)).toEqual(["bw-tools"]);

    // Hosts: catch-all sends only the probe host to the proxy pod; default, the vault's hosts too,
    // to the proxy's Service.
    expect(caPod.spec.hostAliases).toEqual([
      { ip: proxyPod.status.podIP, hostnames: [PROBE_HOST, MODEL_HOST] },
    ]);
    expect(dfPod.spec.hostAliases).toEqual([
      { ip: proxy.address, hostnames: ["api.example.com", "uploads.example.org", PROBE_HOST, MODEL_HOST] },
    ]);
    const wiring = { hostsInstalled: true, caDir: "/bw/run/ca", caBundlePath: "/bw/run/ca/bundle.crt" };
    expect(catchAll).toMatchObject({
      id: catchAllId,
      runId,
      kind: "work",
      state: "ready",
      proxyAddress: proxyPod.status.podIP,
      controlPlaneUrl: null,
      routing: "catch-all",
      probeTarget: null,
      wiring,
    });
    expect(catchAll.address).toMatch(/^10\.244\./);
    expect(defaulted).toMatchObject({
      kind: "task",
      proxyAddress: proxy.address,
      routing: "default",
      wiring,
    });

    // Policies: no way in; out, catch-all only to the run's proxy, default also DNS and the
    // public internet (no private, CGNAT or link-local address).
    const policies = reqs
      .filter((r) => r.method === "POST" && r.path.endsWith("/networkpolicies"))
      .map((r) => r.body as Obj);
    const toProxy = {
      to: [{ podSelector: { matchLabels: { [LABEL.run]: runId, [LABEL.kind]: "proxy" } } }],
      ports: PROXY_PORTS,
    };
    expect(policies[0].spec).toEqual({
      podSelector: { matchLabels: { [LABEL.sandbox]: catchAllId } },
      policyTypes: ["Ingress", "Egress"],
      ingress: [],
      egress: [toProxy],
    });
    for (const policy of policies.slice(1)) {
      expect(policy.spec.ingress).toEqual([]);
      expect(policy.spec.egress[0]).toEqual(toProxy);
      expect(policy.spec.egress[1].ports).toEqual([
        { port: 53, protocol: "UDP" },
        { port: 53, protocol: "TCP" },
      ]);
      expect(policy.spec.egress[2].to[0].ipBlock.except).toEqual(expect.arrayContaining(PRIVATE_RANGES));
      expect(policy.spec.egress).toHaveLength(3);
    }

    // Everything this run made is in the configured namespace, with the run's labels.
    const all = await objects(ns);
    for (const o of [...all.pods, ...all.services, ...all.secrets, ...all.networkpolicies]) {
      expect(o.metadata.namespace).toBe(ns);
      expect(o.metadata.labels[LABEL.managedBy]).toBe("benchwright");
      expect(o.metadata.labels[LABEL.run]).toBe(runId);
    }
    expect(all.pods).toHaveLength(4);
    expect(all.networkpolicies).toHaveLength(4);

    // list() maps every labelled object back; a pod not ours is not listed.
    const foreign = await fetch(`${k8s.url}${api(ns, "pods")}`, {
      method: "POST",
      headers: { authorization: `Bearer ${k8s.token}`, "content-type": "application/json" },
      body: JSON.stringify({
        apiVersion: "v1",
        kind: "Pod",
        metadata: { name: "not-ours", labels: { [LABEL.sandbox]: "sbx_imposter" } },
        spec: { containers: [{ name: "c", image: "busybox" }] },
      }),
    });
    expect(foreign.status).toBe(201);
    const listed = await b.list();
    const byId = (a: { id: string }, c: { id: string }) => a.id.localeCompare(c.id);
    expect(listed.sort(byId)).toEqual(
      [
        { id: proxyId, runId, kind: "proxy" },
        { id: catchAllId, runId, kind: "work" },
        { id: defaultId, runId, kind: "task" },
        { id: orchestratorId, runId, kind: "orchestrator" },
      ].sort(byId),
    );
    const listReqs = (await recorded(ns)).slice(-2);
    expect(listReqs.map((r) => `${r.path}?${r.query.labelSelector}`)).toEqual([
      `${api(ns, "pods")}?${LABEL.managedBy}=benchwright`,
      `${api(ns, "services")}?${LABEL.managedBy}=benchwright`,
    ]);
  });

  it("a run's resources are the work container's limits in the pod spec", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    await b.create({
      kind: "work",
      id,
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: [],
      resources: { memoryMb: 3072, pids: 512, cpus: 2 },
    });
    const pod = (await objects(ns)).pods.find((p) => p.metadata.labels[LABEL.sandbox] === id);
    const work = pod.spec.containers.find((c: { name: string }) => c.name === "work");
    expect(work.resources).toEqual({
      requests: { cpu: "500m", memory: "1024Mi" },
      limits: { cpu: "2000m", memory: "3072Mi" },
    });
    // Pids: Kubernetes has no per-pod limit (the kubelet's podPidsLimit is per node): none is set.
    expect(JSON.stringify(pod.spec)).not.toMatch(/pids/i);
    const small = randomId("sbx_");
    await b.create({
      kind: "task",
      id: small,
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: [],
      resources: { memoryMb: 512, pids: 64, cpus: 0.25 },
    });
    const smallPod = (await objects(ns)).pods.find((p) => p.metadata.labels[LABEL.sandbox] === small);
    expect(smallPod.spec.containers[0].resources).toEqual({
      requests: { cpu: "250m", memory: "512Mi" },
      limits: { cpu: "250m", memory: "512Mi" },
    });
    await b.destroy(id);
    await b.destroy(small);
    await b.destroy(proxyId);
  });

  it("exec round trip under the runner: output, offsets, exit codes, stdin, env, idempotent ids, v4 fallback", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    await b.create({ kind: "work", id, runId, proxySandboxId: proxyId, routing: "default", hostsFile: [] });

    let mark = (await recorded(ns)).length;
    const first = await b.exec(id, {
      id: "e1",
      argv: ["sh", "-c", "printf 'out-\\316\\261'; printf err >&2; exit 3"],
      stage: "execute",
      timeoutMs: 10_000,
    });
    expect(first).toMatchObject({ execId: "e1", sandboxId: id });
    const start = (await recorded(ns))[mark] as RecordedRequest;
    expect(line(start)).toBe(`GET ${api(ns, "pods", objectName(id))}/exec 101`);
    expect(start.query).toMatchObject({
      command: ["/bw/tools/bin/bw-exec", "start", "e1"],
      container: ["work"],
      stdin: ["true"],
      stdout: ["true"],
      stderr: ["true"],
    });
    expect(start.exec).toMatchObject({ protocol: "v5.channel.k8s.io", closedStdin: true, exitCode: 0 });
    expect(JSON.parse(start.exec?.stdin ?? "")).toEqual({
      argv: ["sh", "-c", "printf 'out-\\316\\261'; printf err >&2; exit 3"],
      env: {},
      timeoutMs: 10_000,
    });

    const done = await waitExit(b, id, "e1");
    expect(done).toEqual({
      execId: "e1",
      sandboxId: id,
      state: "exited",
      exitCode: 3,
      signal: null,
      stdout: "out-α",
      stderr: "err",
      stdoutEnd: 6,
      stderrEnd: 3,
    });
    expect(await b.poll(id, "e1", { stdoutFrom: 4, stderrFrom: 3 })).toMatchObject({
      stdout: "α",
      stderr: "",
      stdoutEnd: 6,
      stderrEnd: 3,
    });
    const pollReq = (await recorded(ns)).at(-1);
    expect(pollReq?.query.command).toEqual(["/bw/tools/bin/bw-exec", "poll", "e1", "4", "3", "0"]);

    expect(
      (await run(b, id, { id: "e2", argv: ["cat"], stdin: "hello\nworld", stage: "execute" })).stdout,
    ).toBe("hello\nworld");
    expect(
      (
        await run(b, id, {
          id: "e3",
          argv: ["sh", "-c", 'printf %s "$FOO"'],
          env: { FOO: "bar" },
          stage: "setup",
        })
      ).stdout,
    ).toBe("bar");
    expect(await run(b, id, { id: "e0", argv: ["true"], stage: "execute" })).toMatchObject({ exitCode: 0 });

    // Replayed with the same id: the command ran once.
    await run(b, id, { id: "once", argv: ["sh", "-c", "echo ran >> once.txt"], stage: "execute" });
    await run(b, id, { id: "once", argv: ["sh", "-c", "echo ran >> once.txt"], stage: "execute" });
    expect((await run(b, id, { id: "count", argv: ["cat", "once.txt"], stage: "execute" })).stdout).toBe(
      "ran\n",
    );

    // An exec id the sandbox never saw: not_found (the runner's refusal, exit 3 in the Status).
    await expectBackendError(b.poll(id, "never", {}), "not_found");
    expect((await recorded(ns)).filter((r) => r.exec).at(-1)?.exec?.exitCode).toBe(3);

    // A cluster that speaks only v4 (no way to close stdin): the runner reads one line.
    await contractOptions({ namespace: ns, execProtocols: ["v4.channel.k8s.io"] });
    mark = (await recorded(ns)).length;
    expect((await run(b, id, { id: "v4", argv: ["cat"], stdin: "v4 stdin", stage: "execute" })).stdout).toBe(
      "v4 stdin",
    );
    expect((await recorded(ns))[mark]?.exec).toMatchObject({
      protocol: "v4.channel.k8s.io",
      closedStdin: false,
    });
  });

  it("kill and freeze: the command's session is killed, stopped and continued; each is idempotent", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    await b.create({ kind: "work", id, runId, proxySandboxId: proxyId, routing: "catch-all", hostsFile: [] });

    await b.exec(id, { id: "sleeper", argv: ["sleep", "30"], stage: "execute" });
    const killed = await b.kill(id, "sleeper");
    expect(killed).toMatchObject({ state: "exited", exitCode: null, signal: "SIGKILL" });
    expect(await b.kill(id, "sleeper")).toEqual(killed);
    await expectBackendError(b.kill(id, "nothing"), "not_found");

    await b.exec(id, {
      id: "loop",
      argv: ["sh", "-c", "while :; do sleep 0.05; done"],
      stage: "execute",
    });
    const states = async () => {
      const res = await fetch(`${k8s.url}/_contract/process-states?namespace=${ns}&pod=${objectName(id)}`);
      return (await res.json()) as Record<string, string | null>;
    };
    /** The state letter of an exec's command, once it is (or is not) stopped: a signal lands
     * at the process's next scheduling, so a few looks may be needed. */
    const settle = async (execId: string, stopped: boolean) => {
      let state: string | null | undefined;
      for (let i = 0; i < 100; i++) {
        state = (await states())[execId];
        if ((state === "T") === stopped) break;
      }
      return state;
    };
    // Running: R or S, or D for a moment (a loaded machine's disk wait while it forks `sleep`).
    expect(await settle("loop", false)).toMatch(/^[RSD]$/);
    await b.freeze(id, true);
    await b.freeze(id, true);
    expect(await settle("loop", true)).toBe("T");
    expect((await recorded(ns)).filter((r) => r.exec?.command[1] === "freeze")).toHaveLength(2);
    // A command started while the sandbox is frozen stops with it, and goes on when it thaws.
    await b.exec(id, { id: "late", argv: ["sh", "-c", "echo late"], stage: "execute" });
    expect(await settle("late", true)).toBe("T");
    await b.freeze(id, false);
    await b.freeze(id, false);
    expect(await settle("loop", false)).toMatch(/^[RSD]$/);
    expect(await waitExit(b, id, "late")).toMatchObject({ exitCode: 0, stdout: "late\n" });
    expect(await b.kill(id, "loop")).toMatchObject({ state: "exited", signal: "SIGKILL" });
  });

  it("destroy deletes the pod, waits for it to go, then its policy; a proxy also its Service and Secret; 404s are success", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    await b.create({ kind: "work", id, runId, proxySandboxId: proxyId, routing: "default", hostsFile: [] });

    let mark = (await recorded(ns)).length;
    await b.destroy(id);
    expect((await recorded(ns)).slice(mark).map(line)).toEqual([
      `GET ${api(ns, "pods")} 200`,
      `DELETE ${api(ns, "pods", objectName(id))} 200`,
      `GET ${api(ns, "pods", objectName(id))} 200`,
      `GET ${api(ns, "pods", objectName(id))} 404`,
      `DELETE ${api(ns, "networkpolicies", objectName(id))} 200`,
    ]);
    mark = (await recorded(ns)).length;
    await b.destroy(id);
    expect((await recorded(ns)).slice(mark).map(line)).toEqual([
      `GET ${api(ns, "pods")} 200`,
      `DELETE ${api(ns, "networkpolicies", objectName(id))} 404`,
      `DELETE ${api(ns, "secrets", secretName(id))} 404`,
      `DELETE ${api(ns, "services", objectName(id))} 404`,
    ]);
    await b.destroy(proxyId);
    await b.destroy(proxyId);
    expect(await objects(ns)).toEqual({ pods: [], services: [], secrets: [], networkpolicies: [] });
    expect(await b.list()).toEqual([]);
    await expectBackendError(b.poll(id, "e1", {}), "not_found");
  });
});

describe("sandbox0 bundles in, artifacts out", () => {
  async function workPodIn(ns: string) {
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    await b.create({ kind: "work", id, runId, proxySandboxId: proxyId, routing: "default", hostsFile: [] });
    // The pod's directory on this machine (the contract server runs the programs here).
    const pwd = await run(b, id, { argv: ["pwd"], stage: "execute", timeoutMs: 10_000 });
    return { b, id, proxyId, root: pwd.stdout.trim() };
  }
  const sh = (b: ComputeBackend, id: string, script: string) =>
    run(b, id, { argv: ["sh", "-c", script], stage: "execute", timeoutMs: 10_000 });

  it("putBundle streams the .tar.gz into bw-unpack on a v5 exec and closes stdin; the files are there; H1 refused", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, id, proxyId, root } = await workPodIn(ns);
    const dir = `${root}/sandbox`;
    // Big enough to take many stdin frames, and not text.
    const blob = new Uint8Array(300 * 1024).map((_, i) => (i * 7919) % 251);
    const bundle = await tarGz([
      { header: { name: "task_impl.py", size: 14, type: "file" }, body: "print('hello')" },
      { header: { name: "data/", type: "directory", size: 0 } },
      { header: { name: "data/blob.bin", size: blob.length, type: "file" }, body: blob },
    ]);
    let mark = (await recorded(ns)).length;
    expect(await b.putBundle(id, streamOf(bundle), dir)).toEqual({
      ok: true,
      files: 3,
      bytes: 14 + blob.length,
    });
    const [unpack] = (await recorded(ns)).slice(mark);
    expect(line(unpack as RecordedRequest)).toBe(`GET ${api(ns, "pods", objectName(id))}/exec 101`);
    expect(unpack?.query).toMatchObject({
      command: ["/bw/tools/bin/bw-unpack", dir, "--max-bytes", "536870912", "--max-files", "20000"],
      container: ["work"],
      stdin: ["true"],
    });
    expect(unpack?.exec).toMatchObject({
      protocol: "v5.channel.k8s.io",
      stdinBytes: bundle.length,
      closedStdin: true,
      exitCode: 0,
    });
    expect((await sh(b, id, `cat ${dir}/task_impl.py`)).stdout).toBe("print('hello')");
    const sizes = await sh(b, id, `wc -c < ${dir}/data/blob.bin`);
    expect(sizes.stdout.trim()).toBe(String(blob.length));

    // case H1: a bundle that escapes its directory is refused with its code; nothing is written.
    mark = (await recorded(ns)).length;
    const bad = await tarGz([file("../escaped.txt", "x")]);
    expect(await b.putBundle(id, streamOf(bad), dir)).toMatchObject({
      ok: false,
      code: "bundle_path_traversal",
    });
    expect((await recorded(ns))[mark]?.exec?.exitCode).toBe(2);
    expect((await sh(b, id, `test -e ${root}/escaped.txt; echo $?`)).stdout).toBe("1\n");
    // Not a gzip at all: refused too, as bundle_invalid.
    const junk = new TextEncoder().encode("not a tar.gz");
    expect(await b.putBundle(id, streamOf(junk), dir)).toMatchObject({ ok: false, code: "bundle_invalid" });
    // A proxy sandbox has no stages; an unknown sandbox is not found.
    await expectBackendError(b.putBundle(proxyId, streamOf(bad), "/tmp"), "invalid_request");
    await expectBackendError(b.putBundle(randomId("sbx_"), streamOf(bad), "/tmp"), "not_found");
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("putBundle over v4 only is refused before a byte is sent (v4 cannot close stdin)", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, id, proxyId, root } = await workPodIn(ns);
    await contractOptions({ namespace: ns, execProtocols: ["v4.channel.k8s.io"] });
    const mark = (await recorded(ns)).length;
    const bundle = await tarGz([file("a.txt", "a")]);
    const error = await expectBackendError(
      b.putBundle(id, streamOf(bundle), `${root}/sandbox`),
      "not_supported",
    );
    expect(error.message).toContain("v5.channel.k8s.io");
    const [attempt] = (await recorded(ns)).slice(mark);
    expect(attempt?.exec).toMatchObject({ protocol: "v4.channel.k8s.io", stdinBytes: 0, closedStdin: false });
    await contractOptions({ namespace: ns, execProtocols: ["v5.channel.k8s.io", "v4.channel.k8s.io"] });
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("collect returns bw-collect's archive from the exec's stdout: files/… then manifest.json; H4", {
    timeout: 60_000,
  }, async () => {
    // case H4
    const ns = newNs();
    const { b, id, proxyId, root } = await workPodIn(ns);
    const out = `${root}/out`;
    await sh(
      b,
      id,
      `mkdir -p ${out}/sub && printf 'result' > ${out}/result.txt && head -c 70000 /dev/urandom > ${out}/sub/r.bin && ln -s /etc/passwd ${out}/link`,
    );
    const bin = await sh(b, id, `od -An -tx1 -v ${out}/sub/r.bin | tr -d ' \n'`);
    const mark = (await recorded(ns)).length;
    const stream = await b.collect(id, { dir: out, maxBytes: 1024 * 1024, maxFiles: 100 });
    const [exec] = (await recorded(ns)).slice(mark);
    expect(exec?.query).toMatchObject({
      command: ["/bw/tools/bin/bw-collect", out, "--max-bytes", "1048576", "--max-files", "100"],
      container: ["work"],
    });
    expect(exec?.query.stdin).toBeUndefined();
    const names: string[] = [];
    const bodies: Record<string, Uint8Array> = {};
    for await (const { header, body } of tarGzEntries(stream, { maxTarBytes: 8 * 1024 * 1024 })) {
      names.push(header.name);
      bodies[header.name] = new Uint8Array(await new Response(body).arrayBuffer());
    }
    expect(names.slice(0, -1).sort()).toEqual(["files/result.txt", "files/sub/r.bin"]);
    expect(names.at(-1)).toBe("manifest.json");
    expect(new TextDecoder().decode(bodies["files/result.txt"])).toBe("result");
    const hex = [...(bodies["files/sub/r.bin"] as Uint8Array)]
      .map((x) => x.toString(16).padStart(2, "0"))
      .join("");
    expect(hex).toBe(bin.stdout);
    const manifest = CollectManifest.parse(JSON.parse(new TextDecoder().decode(bodies["manifest.json"])));
    expect(manifest.files.map((f) => f.path).sort()).toEqual(["result.txt", "sub/r.bin"]);
    expect(manifest.cut).toEqual([{ path: "link", reason: "symlink", size: null }]);
    expect(manifest.missing).toBe(false);

    // Nothing written: an archive that says so.
    const none = await b.collect(id, { dir: `${root}/nothing`, maxBytes: 1024, maxFiles: 10 });
    const entries: string[] = [];
    let last: Uint8Array | null = null;
    for await (const { header, body } of tarGzEntries(none, { maxTarBytes: 1024 * 1024 })) {
      entries.push(header.name);
      last = new Uint8Array(await new Response(body).arrayBuffer());
    }
    expect(entries).toEqual(["manifest.json"]);
    expect(CollectManifest.parse(JSON.parse(new TextDecoder().decode(last as Uint8Array))).missing).toBe(
      true,
    );
    await expectBackendError(
      b.collect(proxyId, { dir: "/tmp", maxBytes: 1, maxFiles: 1 }),
      "invalid_request",
    );
    await b.destroy(id);
    await b.destroy(proxyId);
  });
});

describe("sandbox0 setup stage: a root setup container, sealed from the pod's sealer", () => {
  const SETUP_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID"];
  async function podHosts(ns: string, pod: string): Promise<string> {
    const res = await fetch(`${k8s.url}/_contract/hosts?namespace=${ns}&pod=${pod}`);
    expect(res.status).toBe(200);
    return res.text();
  }
  async function tamperHosts(ns: string, pod: string, text: string): Promise<void> {
    const res = await fetch(`${k8s.url}/_contract/hosts?namespace=${ns}&pod=${pod}`, {
      method: "PUT",
      body: text,
    });
    expect(res.status).toBe(204);
  }
  const firstAddress = (hosts: string, name: string) =>
    hosts
      .split("\n")
      .map((l) => l.replace(/#.*$/, "").trim().split(/\s+/))
      .find(([, ...names]) => names.includes(name))?.[0] ?? null;
  async function setupPodIn(ns: string, routing: "default" | "catch-all", timing = {}) {
    const b = sandbox0Backend(Sandbox0Env.parse(envFor(ns)), timing);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    const hostsFile = routing === "default" ? ["api.example.com"] : [];
    const info = await b.create({
      kind: "work",
      id,
      runId,
      proxySandboxId: proxyId,
      routing,
      hostsFile,
      setup: true,
    });
    return { b, id, proxyId, info, hostsFile };
  }
  const execsOf = (reqs: RecordedRequest[]) => reqs.filter((r) => r.exec).map((r) => r.exec);

  it("the pod gets a root setup container with few capabilities, the run CA read-only, its own runner state", async () => {
    const ns = newNs();
    const { b, id, proxyId } = await setupPodIn(ns, "default");
    const pod = (await objects(ns)).pods.find((p) => p.metadata.name === objectName(id));
    expect(pod.spec.containers.map((c: Obj) => c.name)).toEqual(["work", "setup", "bw-seal"]);
    const [work, setup, sealer] = pod.spec.containers;
    for (const c of [work, setup]) {
      expect(c).toMatchObject({ command: ["/bw/tools/bin/bw-exec", "hold"], workingDir: "/home/sandbox" });
    }
    expect(setup.image).toBe(WORK_IMAGE);
    expect(setup.env).toEqual([{ name: "HOME", value: "/home/sandbox" }]);
    // The shared volume is where the coordinator unpacks, runs and collects.
    expect(POD_PATHS.home).toBe(WORK_DIR);
    expect(DEFAULT_OUT_DIR.startsWith(`${WORK_DIR}/`)).toBe(true);
    expect(setup.securityContext).toEqual({
      runAsNonRoot: false,
      runAsUser: 0,
      runAsGroup: 0,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: false,
      capabilities: { drop: ["ALL"], add: SETUP_CAPS },
    });
    // What setup shares with execute is the home volume; the tools and the run CA it only reads;
    // its runner state is its own volume, which the work container never mounts.
    expect(setup.volumeMounts).toEqual([
      { name: "bw-tools", mountPath: "/bw/tools", readOnly: true },
      { name: "bw-setup-run", mountPath: "/bw/run" },
      { name: "bw-run", mountPath: "/bw/run/ca", subPath: "ca", readOnly: true },
      { name: "home", mountPath: "/home/sandbox" },
    ]);
    expect(work.volumeMounts.map((m: Obj) => m.name)).not.toContain("bw-setup-run");
    expect(work.securityContext).toMatchObject({ runAsUser: 10001, capabilities: { drop: ["ALL"] } });
    // The sealer: our image, root with KILL alone (setup lacks KILL, so it cannot ptrace the sealer).
    expect(sealer).toMatchObject({ image: PROXY_IMAGE, command: ["bw-init", "sealer"] });
    expect(sealer.securityContext).toEqual({
      runAsNonRoot: false,
      runAsUser: 0,
      runAsGroup: 0,
      allowPrivilegeEscalation: false,
      readOnlyRootFilesystem: false,
      capabilities: { drop: ["ALL"], add: ["KILL"] },
    });
    expect(SETUP_CAPS).not.toContain("KILL");
    expect(sealer.volumeMounts).toBeUndefined();
    expect(pod.spec.volumes.map((v: Obj) => v.name)).toEqual(["bw-tools", "bw-run", "home", "bw-setup-run"]);
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("setup commands run in the setup container; seal kills what they left, ends it, rewrites hosts; then sealed", {
    timeout: 90_000,
  }, async () => {
    const ns = newNs();
    const { b, id, proxyId, info, hostsFile } = await setupPodIn(ns, "default");
    const pod = objectName(id);
    // The wiring is ours and needs no root: in work even in the setup stage.
    let mark = (await recorded(ns)).length;
    await b.exec(id, { id: "wire", argv: ["bw-wiring"], stage: "setup", timeoutMs: 10_000, stdin: "{}" });
    expect(execsOf((await recorded(ns)).slice(mark)).map((e) => e?.container)).toEqual(["work"]);

    // A setup command leaves a daemon behind; the pid goes where execute can see it (home).
    mark = (await recorded(ns)).length;
    const setup = await run(b, id, {
      id: "setup-1",
      argv: ["sh", "-c", 'sleep 300 >/dev/null 2>&1 & echo $! > "$HOME/daemon.pid"; echo set up'],
      stage: "setup",
      timeoutMs: 10_000,
    });
    expect(setup).toMatchObject({ exitCode: 0, stdout: "set up\n" });
    // Started in setup; polls find it there once work's runner says it knows no such exec.
    const execs = execsOf((await recorded(ns)).slice(mark));
    expect(execs[0]).toMatchObject({
      container: "setup",
      command: ["/bw/tools/bin/bw-exec", "start", "setup-1"],
    });
    expect(execs.at(-1)?.container).toBe("setup");
    expect(execs.some((e) => e?.container === "work" && e.exitCode === 3)).toBe(true);
    const alive = (stage: "execute") =>
      run(b, id, {
        // A zombie (killed, not yet reaped by whoever inherited it) is not alive.
        argv: [
          "sh",
          "-c",
          's=$(cut -d" " -f3 "/proc/$(cat "$HOME/daemon.pid")/stat") && [ "$s" != Z ] && echo alive',
        ],
        stage,
        timeoutMs: 10_000,
      });
    expect((await alive("execute")).stdout).toBe("alive\n");

    // Setup's root rewrote the hosts file: api.example.com elsewhere.
    const before = await podHosts(ns, pod);
    expect(firstAddress(before, "api.example.com")).toBe(info.proxyAddress);
    await tamperHosts(ns, pod, `6.6.6.6 api.example.com\n${before}`);

    mark = (await recorded(ns)).length;
    const sealed = await b.seal(id, { routing: "default", hostsFile, caCertPem: "ignored on sandbox0" });
    expect(sealed.killed).toBeGreaterThanOrEqual(1);
    const reqs = (await recorded(ns)).slice(mark);
    const podPath = api(ns, "pods", pod);
    expect(reqs.map(line)).toEqual([
      `GET ${podPath} 200`,
      `GET ${podPath}/exec 101`,
      `GET ${podPath} 200`,
      `GET ${podPath}/exec 101`,
    ]);
    const objs = await objects(ns);
    const status = objs.pods.find((p) => p.metadata.name === pod).status;
    const setupId = status.containerStatuses.find((c: Obj) => c.name === "setup").containerID.split("://")[1];
    expect(reqs[1]?.exec).toMatchObject({
      container: "bw-seal",
      command: ["bw-init", "seal", setupId],
      exitCode: 0,
    });
    expect(reqs[3]?.exec).toMatchObject({ container: "bw-seal", command: ["bw-init", "hosts"], exitCode: 0 });
    expect(JSON.parse(reqs[3]?.exec?.stdin ?? "")).toEqual({
      mode: "default",
      proxyAddress: info.proxyAddress,
      hostsFile: ["api.example.com"],
      caCertPem: null,
      hostsPath: "/etc/hosts",
      nsswitchPath: null,
    });
    expect(status.containerStatuses.find((c: Obj) => c.name === "setup").state.terminated).toBeDefined();

    // The daemon is gone; the hosts file sends the name to the proxy again; setup is refused.
    expect((await alive("execute")).exitCode).not.toBe(0);
    const after = await podHosts(ns, pod);
    expect(firstAddress(after, "api.example.com")).toBe(info.proxyAddress);
    expect(after).not.toContain("6.6.6.6");
    expect(after).toContain("# Kubernetes-managed hosts file.");
    await expectBackendError(b.exec(id, { argv: ["true"], stage: "setup", timeoutMs: 10_000 }), "sealed");
    // Execute still runs, in work.
    expect(
      await run(b, id, { argv: ["echo", "execute"], stage: "execute", timeoutMs: 10_000 }),
    ).toMatchObject({
      exitCode: 0,
      stdout: "execute\n",
    });

    // Idempotent: a second seal kills nothing and writes the hosts block again.
    mark = (await recorded(ns)).length;
    expect(await b.seal(id, { routing: "default", hostsFile, caCertPem: null })).toEqual({ killed: 0 });
    expect(execsOf((await recorded(ns)).slice(mark)).map((e) => e?.command.join(" "))).toEqual([
      "bw-init hosts",
    ]);
    // The wrong routing, a proxy sandbox, no sandbox: refused.
    await expectBackendError(
      b.seal(id, { routing: "catch-all", hostsFile: [], caCertPem: null }),
      "invalid_request",
    );
    await expectBackendError(
      b.seal(proxyId, { routing: "default", hostsFile, caCertPem: null }),
      "invalid_request",
    );
    await expectBackendError(
      b.seal(randomId("sbx_"), { routing: "default", hostsFile, caCertPem: null }),
      "not_found",
    );
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("a setup container that does not end after seal fails the seal: execute never starts beside it", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, id, proxyId } = await setupPodIn(ns, "catch-all", { setupEndMs: 1_500 });
    await contractOptions({ namespace: ns, setupSurvivesSeal: true });
    await run(b, id, { id: "s", argv: ["true"], stage: "setup", timeoutMs: 10_000 });
    const error = await expectBackendError(
      b.seal(id, { routing: "catch-all", hostsFile: [], caCertPem: null }),
      "sandbox_failed",
    );
    expect(error.message).toContain("the setup container did not end after seal");
    // The hosts were not touched: nothing after the failed wait.
    const execs = execsOf(await recorded(ns)).map((e) => `${e?.container} ${e?.command.join(" ")}`);
    expect(execs.filter((e) => e.startsWith("bw-seal"))).toEqual([
      expect.stringMatching(/^bw-seal bw-init seal [0-9a-f]+$/),
    ]);
    await b.destroy(id);
    await b.destroy(proxyId);
  });

  it("setHosts rewrites a default-routed pod's hosts block (a vault edit); catch-all needs none", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId, info: proxy } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    const caId = randomId("sbx_");
    await b.create({
      kind: "work",
      id,
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: ["a.example.com"],
    });
    await b.create({
      kind: "task",
      id: caId,
      runId,
      proxySandboxId: proxyId,
      routing: "catch-all",
      hostsFile: [],
    });
    await b.setHosts(id, ["b.example.com"]);
    const hosts = await podHosts(ns, objectName(id));
    expect(firstAddress(hosts, "b.example.com")).toBe(proxy.address);
    expect(firstAddress(hosts, PROBE_HOST)).toBe(proxy.address);
    expect(firstAddress(hosts, "a.example.com")).toBe(proxy.address); // hostAliases stay (kubelet's lines)
    const mark = (await recorded(ns)).length;
    await b.setHosts(caId, ["b.example.com"]);
    expect(execsOf((await recorded(ns)).slice(mark))).toEqual([]);
    await expectBackendError(b.setHosts(proxyId, []), "invalid_request");
    await b.destroy(id);
    await b.destroy(caId);
    await b.destroy(proxyId);
  });
});

describe("sandbox0 refusals", () => {
  it("a wrong token is backend_error without the token; an API that does not answer is retryable", async () => {
    const ns = newNs();
    const wrong = `wrong-token-canary-${crypto.randomUUID()}`;
    const e = await expectBackendError(
      backendIn(ns, { SANDBOX0_TOKEN: wrong }).create({
        kind: "proxy",
        id: randomId("sbx_"),
        runId: randomId("run_"),
      }),
      "backend_error",
    );
    expect(e.message).not.toContain(wrong);
    expect(e.message).toContain("401");
    expect((await recorded(ns)).map((r) => r.auth)).toEqual(["invalid"]);
    const down = await expectBackendError(
      backendIn(ns, { SANDBOX0_API_URL: "http://127.0.0.1:9" }).create({
        kind: "proxy",
        id: randomId("sbx_"),
        runId: randomId("run_"),
      }),
      "backend_unreachable",
    );
    expect(down.retryable).toBe(true);
  });

  it("PodSecurity that forbids NET_ADMIN: catch-all is cannot_isolate, default still runs", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    await contractOptions({ namespace: ns, podSecurity: "baseline" });
    const e = await expectBackendError(
      b.create({
        kind: "work",
        id: randomId("sbx_"),
        runId,
        proxySandboxId: proxyId,
        routing: "catch-all",
        hostsFile: [],
      }),
      "cannot_isolate",
    );
    expect(e.retryable).toBe(false);
    expect(e.message).toContain("NET_ADMIN");
    const ok = await b.create({
      kind: "work",
      id: randomId("sbx_"),
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: [],
    });
    expect(ok.state).toBe("ready");
  });

  it("a redirect that cannot be installed (init container fails) is sandbox_failed, saying which", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    await contractOptions({
      namespace: ns,
      initFailure: { container: "bw-redirect", exitCode: 1, message: "nft: Operation not supported" },
    });
    const e = await expectBackendError(
      b.create({
        kind: "work",
        id: randomId("sbx_"),
        runId,
        proxySandboxId: proxyId,
        routing: "catch-all",
        hostsFile: [],
      }),
      "sandbox_failed",
    );
    expect(e.message).toBe("init container bw-redirect failed (exit 1, Error: nft: Operation not supported)");
  });

  it("a work pod on another run's proxy is not made", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const { proxyId } = await proxyOf(b, randomId("run_"));
    const mark = (await recorded(ns)).length;
    await expectBackendError(
      b.create({
        kind: "work",
        id: randomId("sbx_"),
        runId: randomId("run_"),
        proxySandboxId: proxyId,
        routing: "default",
        hostsFile: [],
      }),
      "not_found",
    );
    expect((await recorded(ns)).slice(mark).map((r) => r.method)).toEqual(["GET"]);
  });
});

describe("sandbox0 through the broker", () => {
  it("keeps every credential out of work pods, and refuses another run's sandbox before any Kubernetes call", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const brokerEnv = { ...env, COMPUTE_BACKEND: "sandbox0", ...envFor(ns) };
    // An instance of its own: this test calls about two runs through one broker object.
    const stub = env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.newUniqueId());
    const broker = <T>(fn: (b: SandboxBroker) => Promise<T>) =>
      runInDurableObject(stub, (_instance, state) => fn(new SandboxBroker(state, brokerEnv)));

    const tenant = await newTenant();
    const vaultCanary = `vault-canary-${crypto.randomUUID()}`;
    expect(
      (await tenant.api("POST", "/v1/vault/secrets", { name: "CANARY", value: vaultCanary })).status,
    ).toBe(201);
    const [a, other] = [await newRun(tenant), await newRun(tenant)];
    for (const r of [a, other]) {
      await withDb((db) => db.update(runs).set({ backend: "sandbox0" }).where(eq(runs.id, r.id)));
    }
    const proxyA = randomId("sbx_");
    const proxyB = randomId("sbx_");
    expect(await broker((b) => b.create(a.id, { id: proxyA, kind: "proxy" }))).toMatchObject({ ok: true });
    expect(await broker((b) => b.create(other.id, { id: proxyB, kind: "proxy" }))).toMatchObject({
      ok: true,
    });
    const [row] = await withDb((db) => db.select().from(sandboxes).where(eq(sandboxes.id, proxyA)));
    expect(row).toMatchObject({ backend: "sandbox0", status: "ready" });
    await broker((b) =>
      b.exec(a.id, proxyA, {
        id: "proxy-1",
        argv: ["bw-proxy"],
        env: { ...PROXY_ENV, BW_RUN_ID: a.id, BW_PROXY_TOKEN: a.proxyToken, BW_AUDIT_KEY: a.auditKey },
        stage: "setup",
        timeoutMs: null,
      }),
    );
    const work = { kind: "work" as const, taskIndex: null, hostsFile: ["api.example.com"] };
    const made = await broker((b) =>
      b.create(a.id, { ...work, id: randomId("sbx_"), proxySandboxId: proxyA, routing: "catch-all" }),
    );
    expect(made).toMatchObject({
      ok: true,
      info: { routing: "catch-all", wiring: { hostsInstalled: true } },
    });
    await broker((b) =>
      b.create(a.id, {
        id: randomId("sbx_"),
        kind: "task",
        taskIndex: 0,
        hostsFile: [],
        proxySandboxId: proxyA,
        routing: "default",
      }),
    );

    // Another run's sandbox: refused by the broker, no request reaches Kubernetes.
    const mark = (await recorded(ns)).length;
    expect(
      await broker((b) =>
        b.create(a.id, { ...work, id: randomId("sbx_"), proxySandboxId: proxyB, routing: "default" }),
      ),
    ).toMatchObject({ ok: false, code: "not_found", retryable: false });
    await expectBackendError(
      broker((b) => b.exec(a.id, proxyB, { argv: ["bw-proxy-view"], stage: "setup" })),
      "not_found",
    );
    await expectBackendError(
      broker((b) => b.freeze(a.id, proxyB, true)),
      "not_found",
    );
    await expectBackendError(
      broker((b) => b.poll(a.id, proxyB, "proxy-1", {})),
      "not_found",
    );
    expect((await recorded(ns)).length).toBe(mark);

    // Every request carried the token in its header only; no credential is in any pod but the
    // proxy's Secret reference, and the Secret is the only place the proxy's credentials are.
    const reqs = await recorded(ns);
    expect(reqs.every((r) => r.auth === "ok")).toBe(true);
    const everything = JSON.stringify(reqs);
    expect(everything).not.toContain(k8s.token);
    expect(everything).not.toContain(vaultCanary);
    const pods = reqs
      .filter((r) => r.method === "POST" && r.path.endsWith("/pods"))
      .map((r) => r.body as Obj);
    expect(pods.map((p) => p.metadata.labels[LABEL.kind])).toEqual(["proxy", "work", "task"]);
    for (const pod of pods) {
      const text = JSON.stringify(pod);
      for (const needle of [a.proxyToken, a.auditKey, b64(a.proxyToken), b64(a.auditKey)]) {
        expect(text).not.toContain(needle);
      }
      const refersToSecret =
        text.includes("secretKeyRef") || text.includes('"secret":') || text.includes(secretName(proxyA));
      expect(refersToSecret).toBe(pod.metadata.labels[LABEL.kind] === "proxy");
    }
    const carriers = reqs.filter((r) => JSON.stringify(r.body ?? null).includes(b64(a.proxyToken)));
    expect(carriers.map(line)).toEqual([`POST ${api(ns, "secrets")} 201`]);

    // Teardown of run A touches run A's objects only.
    const before = (await recorded(ns)).length;
    // Four rows: the refused work sandbox's row was written before the refusal (rows come first).
    expect(await broker((b) => b.destroyRun(a.id))).toBe(4);
    const teardown = (await recorded(ns)).slice(before);
    expect(teardown.some((r) => r.path.includes(objectName(proxyB)))).toBe(false);
    const left = await objects(ns);
    expect(
      [...left.pods, ...left.services, ...left.secrets, ...left.networkpolicies].map(
        (o) => o.metadata.labels[LABEL.run],
      ),
    ).toEqual([other.id, other.id]);
  });
});
