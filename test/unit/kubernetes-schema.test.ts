import { DaemonSet } from "kubernetes-models/apps/v1";
import { NetworkPolicy } from "kubernetes-models/networking.k8s.io/v1";
import { Role, RoleBinding } from "kubernetes-models/rbac.authorization.k8s.io/v1";
import { Namespace, Pod, Secret, Service, ServiceAccount } from "kubernetes-models/v1";
import { describe, expect, it } from "vitest";
import {
  proxyNetworkPolicy,
  proxyPod,
  proxyResize,
  proxySecret,
  proxyService,
  pullSecret,
  workNetworkPolicy,
  workPod,
} from "../../src/broker/kubernetes/manifests";
import { kustomizeVersion, type RenderedObject, renderBase } from "./kubernetes-render";

// Every object of deploy/kubernetes/ as kustomize renders it, and every object the sandbox0 broker
// sends (src/broker/kubernetes/manifests.ts), checked against the Kubernetes OpenAPI schema of
// the oldest version the backend supports, 1.33 (pods/resize): kubernetes-models 4.5.1 is
// generated from v1.33.0's schema (docs/sandbox0.md, "The cluster"). The schema catches wrong
// types, enum values, required fields and quantities; like the API server's schema it does not
// list which fields exist, so a misspelt field name is not caught here.

/** The schema's model of each kind used here, by `apiVersion kind`. */
const MODELS: Record<string, new (data: never) => { validate(): void }> = {
  "v1 Namespace": Namespace,
  "v1 ServiceAccount": ServiceAccount,
  "v1 Secret": Secret,
  "v1 Service": Service,
  "v1 Pod": Pod,
  "apps/v1 DaemonSet": DaemonSet,
  "rbac.authorization.k8s.io/v1 Role": Role,
  "rbac.authorization.k8s.io/v1 RoleBinding": RoleBinding,
  "networking.k8s.io/v1 NetworkPolicy": NetworkPolicy,
};

/** The schema's complaint about an object, or null when it is valid. */
function schemaErrors(object: { apiVersion: string; kind: string }): string | null {
  const Model = MODELS[`${object.apiVersion} ${object.kind}`];
  if (!Model) return `no schema model for ${object.apiVersion} ${object.kind} in this test`;
  try {
    new Model(object as never).validate();
    return null;
  } catch (e) {
    return (e as Error).message;
  }
}

/** Every `image:` anywhere in an object. */
function images(value: unknown): string[] {
  if (Array.isArray(value)) return value.flatMap(images);
  if (value === null || typeof value !== "object") return [];
  return Object.entries(value).flatMap(([k, v]) =>
    k === "image" && typeof v === "string" ? [v] : images(v),
  );
}

const DIGEST_REF = /^[^@\s]+@sha256:[0-9a-f]{64}$/;
const PROXY_IMAGE = `registry.example.com/benchwright/proxy@sha256:${"a".repeat(64)}`;
const WORK_IMAGE = `registry.example.com/benchwright/work@sha256:${"b".repeat(64)}`;

describe("deploy/kubernetes", () => {
  const objects = renderBase();
  const find = (kind: string) => objects.filter((o) => o.kind === kind);

  it("renders with kustomize 5 into valid objects, all in the benchwright namespace", () => {
    expect(kustomizeVersion()).toMatch(/^v([5-9]|[1-9][0-9])\./);
    expect(objects.map((o) => o.kind).sort()).toEqual(
      ["DaemonSet", "Namespace", "NetworkPolicy", "Role", "RoleBinding", "Secret", "ServiceAccount"].sort(),
    );
    for (const o of objects) {
      expect(schemaErrors(o), `${o.kind} ${o.metadata.name}`).toBeNull();
      if (o.kind !== "Namespace")
        expect(o.metadata.namespace, `${o.kind} ${o.metadata.name}`).toBe("benchwright");
    }
  });

  it("labels the namespace for Pod Security: privileged enforced, restricted warned and audited", () => {
    const [ns] = find("Namespace") as [RenderedObject];
    expect(ns.metadata.name).toBe("benchwright");
    expect(ns.metadata.labels).toMatchObject({
      "pod-security.kubernetes.io/enforce": "privileged",
      "pod-security.kubernetes.io/warn": "restricted",
      "pod-security.kubernetes.io/audit": "restricted",
    });
  });

  it("denies every pod's traffic unless a policy of the broker's opens it", () => {
    const [deny] = find("NetworkPolicy") as [RenderedObject];
    expect(deny.spec).toEqual({ podSelector: {}, policyTypes: ["Ingress", "Egress"] });
  });

  it("binds the Role to the broker's account, whose token Secret the Worker reads", () => {
    const [binding] = find("RoleBinding") as [RenderedObject];
    expect(binding).toMatchObject({
      roleRef: { kind: "Role", name: "benchwright-broker" },
      subjects: [{ kind: "ServiceAccount", name: "benchwright-broker", namespace: "benchwright" }],
    });
    const [token] = find("Secret") as [
      RenderedObject & { metadata: { annotations?: Record<string, string> } },
    ];
    expect(token).toMatchObject({ type: "kubernetes.io/service-account-token" });
    expect(token.metadata.annotations?.["kubernetes.io/service-account.name"]).toBe("benchwright-broker");
  });

  it("names every image by digest, never by tag", () => {
    const all = objects.flatMap(images);
    expect(all.length).toBeGreaterThan(0);
    for (const image of all) expect(image).toMatch(DIGEST_REF);
  });

  it("refuses what the schema refuses (the check can fail)", () => {
    const [daemonSet] = find("DaemonSet") as [RenderedObject & { spec: { template: { spec: object } } }];
    const broken = structuredClone(daemonSet);
    (broken.spec.template.spec as { restartPolicy?: string }).restartPolicy = "Sometimes";
    expect(schemaErrors(broken)).toMatch(/restartPolicy/);
  });
});

describe("the broker's own objects", () => {
  const ns = "benchwright";
  const run = "run_1";
  const sandbox = "sbx_1";
  const work = {
    ns,
    runId: run,
    sandboxId: sandbox,
    kind: "work" as const,
    proxyImage: PROXY_IMAGE,
    workImage: WORK_IMAGE,
    proxyAddress: "10.96.0.10",
    hostsFile: ["api.example.com"],
  };
  // The resize subresource's patch, read as the Pod it is merged into.
  const resizedPod = { apiVersion: "v1", kind: "Pod", metadata: { name: "p" }, ...proxyResize(true) };
  const objects: Array<[string, { apiVersion: string; kind: string }]> = [
    ["proxy Service", proxyService(ns, run, sandbox)],
    ["proxy NetworkPolicy", proxyNetworkPolicy(ns, run, sandbox)],
    ["proxy Secret", proxySecret(ns, run, sandbox, { BW_PROXY_TOKEN: "canary" })],
    [
      "proxy Pod",
      proxyPod({
        ns,
        runId: run,
        sandboxId: sandbox,
        execId: "exec_1",
        image: PROXY_IMAGE,
        argv: ["bw-proxy"],
        plainEnv: { BW_RUN_ID: run },
        secretKeys: ["BW_PROXY_TOKEN"],
        serviceIp: "10.96.0.10",
      }),
    ],
    ["proxy resize", resizedPod],
    [
      "pull Secret",
      pullSecret({ ns, environmentId: "env_1", registryHost: "registry.example.com", password: "canary" }),
    ],
    ["work NetworkPolicy, default", workNetworkPolicy({ ...work, routing: "default" })],
    ["work NetworkPolicy, catch-all", workNetworkPolicy({ ...work, routing: "catch-all" })],
    ["work Pod, default", workPod({ ...work, routing: "default" })],
    [
      "work Pod, catch-all with setup and limits",
      workPod({
        ...work,
        routing: "catch-all",
        setup: true,
        capture: true,
        resources: { cpus: 2, memoryMb: 2048, pids: 1024 },
      }),
    ],
    [
      "work Pod from a setup image",
      workPod({
        ...work,
        routing: "default",
        layer: { image: `registry.example.com/env_1@sha256:${"c".repeat(64)}`, pullSecret: "bw-pull-env" },
      }),
    ],
    ["task Pod", workPod({ ...work, kind: "task", routing: "catch-all" })],
  ];

  it.each(objects)("%s is valid under the schema", (_label, object) => {
    expect(schemaErrors(object)).toBeNull();
  });

  it("name every image by digest when given digests", () => {
    for (const [label, object] of objects) {
      for (const image of images(object)) expect(image, label).toMatch(DIGEST_REF);
    }
  });
});
