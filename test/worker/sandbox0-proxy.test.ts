import { describe, expect, it } from "vitest";
import { objectName, proxyPodName, secretName } from "../../src/broker/kubernetes/manifests";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { randomId } from "../../src/crypto/api-keys";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import {
  api,
  b64,
  backendIn,
  contractOptions,
  k8s,
  LABEL,
  line,
  newNs,
  type Obj,
  objects,
  PRIVATE_RANGES,
  PROXY_IMAGE,
  PROXY_PORTS,
  PUBLIC_URL,
  recorded,
  terminate,
} from "./sandbox0-fixtures";

// The sandbox0 backend's proxy sandbox against the Kubernetes contract server: its NetworkPolicy
// and Service, the bw-proxy exec as a Secret and a pod (poll, view, exit, kill, relaunch), and
// freeze as an in-place CPU resize. Apart from the work pods: a proxy runs no exec runner.

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
