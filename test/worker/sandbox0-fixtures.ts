import type { ExecInfo, ExecRequest } from "@benchwright/shared/contract/local-agent";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { expect, inject } from "vitest";
import type { ComputeBackend, SandboxSpec } from "../../src/broker/backend";
import { sandbox0FromEnv } from "../../src/broker/sandbox0/backend";
import { randomId } from "../../src/crypto/api-keys";
import type { ContractOptions, RecordedRequest } from "../contract/kubernetes-contract";
import { proxyOf } from "./backend-fixtures";

// What the sandbox0 backend's tests (test/worker/sandbox0-*.test.ts) share: the deployment's
// settings, the Kubernetes contract server's control endpoints (test/contract/kubernetes-server.ts:
// what it recorded, what it holds, the knobs a test turns), and the few ways a test starts (a
// backend on a namespace of its own, a run's proxy in it, a work pod on that proxy). Each test has
// a namespace of its own, so the requests it asserts are exactly its own.

export const k8s = inject("kubernetes");
export const PROXY_IMAGE =
  "registry.contract.test/benchwright-proxy@sha256:1111111111111111111111111111111111111111111111111111111111111111";
export const WORK_IMAGE =
  "registry.contract.test/benchwright-work@sha256:2222222222222222222222222222222222222222222222222222222222222222";
export const PUBLIC_URL = "https://boundary.contract.test";
export const PROBE_HOST = "probe.benchwright.invalid";
export const MODEL_HOST = "model.benchwright.invalid";
export const PRIVATE_RANGES = [
  "10.0.0.0/8",
  "172.16.0.0/12",
  "192.168.0.0/16",
  "100.64.0.0/10",
  "169.254.0.0/16",
];
export const PROXY_PORTS = [
  { port: 8443, protocol: "TCP" },
  { port: 8080, protocol: "TCP" },
  { port: 3128, protocol: "TCP" },
  { port: 5353, protocol: "TCP" },
  { port: 5353, protocol: "UDP" },
];
export const LABEL = {
  managedBy: "app.kubernetes.io/managed-by",
  run: "benchwright.dev/run",
  sandbox: "benchwright.dev/sandbox",
  kind: "benchwright.dev/kind",
};

// biome-ignore lint/suspicious/noExplicitAny: Kubernetes objects are read field by field
export type Obj = any;

export const newNs = () => `t-${crypto.randomUUID().slice(0, 12)}`;

export function envFor(ns: string, over: Record<string, string> = {}) {
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

export function backendIn(ns: string, over: Record<string, string> = {}): ComputeBackend {
  const made = sandbox0FromEnv(envFor(ns, over));
  if (typeof made === "string") throw new Error(made);
  return made;
}

/** A backend on the namespace, with a run whose proxy is made and launched there. */
export async function proxyIn(ns: string) {
  const b = backendIn(ns);
  const runId = randomId("run_");
  return { b, runId, ...(await proxyOf(b, runId)) };
}

/** A work sandbox's create request on a run's proxy: a fresh id, no vault hosts. */
export const workOn = (runId: string, proxySandboxId: string, routing: RoutingMode): SandboxSpec => ({
  kind: "work",
  id: randomId("sbx_"),
  runId,
  proxySandboxId,
  routing,
  hostsFile: [],
});

/** A run's proxy and one work pod on it (no vault hosts), in the namespace. */
export async function proxyAndWorkIn(ns: string, routing: RoutingMode = "default") {
  const { b, runId, proxyId } = await proxyIn(ns);
  const spec = workOn(runId, proxyId, routing);
  await b.create(spec);
  return { b, runId, proxyId, id: spec.id };
}

export async function recorded(ns: string): Promise<RecordedRequest[]> {
  const res = await fetch(`${k8s.url}/_contract/requests?namespace=${ns}`);
  return (await res.json()) as RecordedRequest[];
}

export async function objects(
  ns: string,
): Promise<Record<"pods" | "services" | "secrets" | "networkpolicies", Obj[]>> {
  const res = await fetch(`${k8s.url}/_contract/objects?namespace=${ns}`);
  return (await res.json()) as Record<"pods" | "services" | "secrets" | "networkpolicies", Obj[]>;
}

export async function contractOptions(options: ContractOptions): Promise<void> {
  const res = await fetch(`${k8s.url}/_contract/options`, { method: "POST", body: JSON.stringify(options) });
  expect(res.status).toBe(204);
}

export async function terminate(ns: string, pod: string, exitCode: number, log: string): Promise<void> {
  const res = await fetch(`${k8s.url}/_contract/terminate`, {
    method: "POST",
    body: JSON.stringify({ namespace: ns, pod, exitCode, log }),
  });
  expect(res.status).toBe(204);
}

export const line = (r: RecordedRequest) => `${r.method} ${r.path}${r.status ? ` ${r.status}` : ""}`;
export const api = (ns: string, resource: string, name?: string) =>
  `${resource === "networkpolicies" ? "/apis/networking.k8s.io/v1" : "/api/v1"}/namespaces/${ns}/${resource}${name ? `/${name}` : ""}`;

export const b64 = (s: string) => btoa(s);

/** Polls an exec until it exits (real processes: each poll waits up to 2 s for the exit). */
export async function waitExit(b: ComputeBackend, sandboxId: string, execId: string): Promise<ExecInfo> {
  for (let i = 0; i < 20; i++) {
    const info = await b.poll(sandboxId, execId, { waitMs: 2000 });
    if (info.state === "exited") return info;
  }
  throw new Error(`exec ${execId} did not exit`);
}

export async function run(b: ComputeBackend, sandboxId: string, request: ExecRequest): Promise<ExecInfo> {
  const started = await b.exec(sandboxId, request);
  return waitExit(b, sandboxId, started.execId);
}
