import { DEFAULT_OUT_DIR } from "@benchwright/shared/contract/bundle";
import { describe, expect, it } from "vitest";
import { objectName, POD_PATHS } from "../../src/broker/kubernetes/manifests";
import { sandbox0Backend } from "../../src/broker/sandbox0/backend";
import { Sandbox0Env } from "../../src/broker/sandbox0/config";
import { WORK_DIR } from "../../src/coordinator/steps/stages";
import { randomId } from "../../src/crypto/api-keys";
import type { RecordedRequest } from "../contract/kubernetes-contract";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import {
  api,
  contractOptions,
  envFor,
  k8s,
  line,
  newNs,
  type Obj,
  objects,
  PROBE_HOST,
  PROXY_IMAGE,
  proxyIn,
  recorded,
  run,
  WORK_IMAGE,
} from "./sandbox0-fixtures";

// The sandbox0 setup stage: a root setup container with few capabilities, sealed from the pod's
// sealer (what setup left killed, the container ended, /etc/hosts rewritten), and setHosts (a
// vault edit mid-run). Apart because it is the one place a pod has root.

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
    const { b, runId, proxyId, info: proxy } = await proxyIn(ns);
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
