import { describe, expect, it } from "vitest";
import { objectName, secretName } from "../../src/broker/kubernetes/manifests";
import { randomId } from "../../src/crypto/api-keys";
import { expectBackendError } from "./backend-fixtures";
import {
  api,
  k8s,
  LABEL,
  line,
  MODEL_HOST,
  newNs,
  type Obj,
  objects,
  PRIVATE_RANGES,
  PROBE_HOST,
  PROXY_IMAGE,
  PROXY_PORTS,
  proxyAndWorkIn,
  proxyIn,
  recorded,
  WORK_IMAGE,
} from "./sandbox0-fixtures";

// What the sandbox0 backend's work, task and orchestrator pods are made of (non-root, capabilities,
// init containers, hostAliases, NetworkPolicies per routing, resources, list) and how they go
// (destroy). Their execs under the runner are in sandbox0-execs.test.ts.

describe("sandbox0 work, task and orchestrator pods", () => {
  it("are non-root without NET_ADMIN; only the catch-all init container has it; hosts and policy per routing", async () => {
    const ns = newNs();
    const { b, runId, proxyId, info: proxy } = await proxyIn(ns);
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
    const { b, runId, proxyId } = await proxyIn(ns);
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

  it("destroy deletes the pod, waits for it to go, then its policy; a proxy also its Service and Secret; 404s are success", {
    timeout: 60_000,
  }, async () => {
    const ns = newNs();
    const { b, proxyId, id } = await proxyAndWorkIn(ns);

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
