import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { CreateSandbox, Resources } from "@benchwright/shared/contract/local-agent";
import { resourcesFor } from "@benchwright/shared/contract/run-spec";
import { type CgroupHost, SandboxCgroup } from "./cgroups";
import { AgentError, message } from "./errors";
import { hostNameservers, MAX_WORK_PER_RUN, netnsExists, workNet } from "./network";
import type { RegistryOptions } from "./registry-options";
import type { Run, Runs } from "./runs";
import { SandboxProcess } from "./sandbox";
import type { Sandbox } from "./sandbox-record";
import { BASE_HOSTS } from "./wiring-files";

// Making one sandbox (the registry, sandboxes.ts, serializes the calls): its block of host uids,
// its cgroup and processes (sandbox.ts), and the network of its kind: a proxy sandbox brings up
// its run's network, a work or task sandbox a work link of it (runs.ts). On a failure nothing of
// the sandbox is left.

const UID_SPAN = 200_000;

export class SandboxMaker {
  private nextUid: number;

  constructor(
    private readonly o: RegistryOptions,
    private readonly sandboxes: Map<string, Sandbox>,
    private readonly runs: Runs,
  ) {
    this.nextUid = o.uidBase;
  }

  /** A block of two host uids no live sandbox and no running process uses. */
  private allocateUid(): number {
    const busy = new Set<number>();
    for (const s of this.sandboxes.values()) busy.add(s.process.uid).add(s.process.uid + 1);
    for (const pid of readdirSync("/proc").filter((p) => /^\d+$/.test(p))) {
      try {
        const uid = /^Uid:\s+(\d+)/m.exec(readFileSync(`/proc/${pid}/status`, "utf8"))?.[1];
        if (uid !== undefined) busy.add(Number(uid));
      } catch {}
    }
    for (let n = 0; n < UID_SPAN / 2; n++) {
      const uid = this.nextUid;
      this.nextUid = uid + 2 >= this.o.uidBase + UID_SPAN ? this.o.uidBase : uid + 2;
      if (!busy.has(uid) && !busy.has(uid + 1)) return uid;
    }
    throw new AgentError("sandbox_failed", "no free sandbox uid");
  }

  private resolvConf(resolver: string[]): string {
    const lines = resolver.map((a) => `nameserver ${a}`);
    return `${lines.length > 0 ? lines.join("\n") : "# the host has no nameserver a sandbox can reach"}\n`;
  }

  /**
   * The sandbox's cgroup (written down in the state directory first) and its processes; on a
   * failure neither is left.
   */
  private async startProcess(
    request: CreateSandbox,
    netns: string,
    uid: number,
    resolvConf: string,
    layer: { capture: boolean; root: string | null } = { capture: false, root: null },
  ): Promise<{ process: SandboxProcess; resources: Resources }> {
    const resources = resourcesFor(request.resources, request.kind);
    const host = this.o.cgroups as CgroupHost;
    const name = `${this.o.state.tag}-${request.id}`;
    this.o.state.recordCgroup(
      request.id,
      [...new Set(Object.values(host.parents))].map((p) => join(p, name)),
    );
    let cgroup: SandboxCgroup | null = null;
    try {
      cgroup = SandboxCgroup.create(host, name, resources);
      const process = await SandboxProcess.start({
        kind: request.kind,
        netns,
        uid,
        dir: this.o.state.sandboxDir(request.id),
        files: { hosts: BASE_HOSTS, resolvConf },
        imageDir: this.o.imageDir,
        rootfs: this.o.rootfs as string,
        layerBytes: resources.memoryMb * 1024 * 1024,
        binDir: this.o.state.binDir(),
        cgroup,
        capture: layer.capture,
        layerRoot: layer.root,
      });
      return { process, resources };
    } catch (error) {
      if (cgroup) {
        await cgroup.kill("");
        cgroup.remove();
      }
      this.o.state.forgetCgroup(request.id);
      throw error;
    }
  }

  async createProxy(request: Extract<CreateSandbox, { kind: "proxy" }>): Promise<Sandbox> {
    const run = this.runs.for(request.runId);
    if (run.proxyId !== null) {
      throw new AgentError(
        "invalid_request",
        `run ${request.runId} already has a proxy sandbox (${run.proxyId})`,
      );
    }
    const uid = this.allocateUid();
    run.proxyId = request.id;
    try {
      const relay = await this.runs.openRunNetwork(run);
      const cp = this.o.controlPlane;
      const resolvConf = this.resolvConf(hostNameservers());
      const { process, resources } = await this.startProcess(request, run.net.proxyNetns, uid, resolvConf);
      const path = cp.pathname === "/" ? "" : cp.pathname.replace(/\/$/, "");
      return this.register(run, {
        id: request.id,
        runId: request.runId,
        kind: "proxy",
        routing: null,
        proxySandboxId: null,
        netns: run.net.proxyNetns,
        work: null,
        address: run.net.upAddress,
        controlPlaneUrl: `${cp.protocol}//${run.net.hostAddress}:${relay.port}${path}`,
        process,
        resources,
        resolvConf,
        capture: false,
        layer: null,
      });
    } catch (error) {
      await this.runs.dismantleRunNetwork(run);
      run.proxyId = null;
      this.o.state.removeSandboxDir(request.id);
      this.runs.releaseIfEmpty(run);
      throw error instanceof AgentError
        ? error
        : new AgentError("sandbox_failed", `could not make the proxy sandbox: ${message(error)}`);
    }
  }

  async createWork(
    request: Extract<CreateSandbox, { kind: "work" | "task" | "orchestrator" }>,
  ): Promise<Sandbox> {
    const proxy = this.sandboxes.get(request.proxySandboxId);
    if (proxy?.kind !== "proxy") {
      throw new AgentError("not_found", `no proxy sandbox ${request.proxySandboxId}`);
    }
    if (proxy.runId !== request.runId) {
      throw new AgentError(
        "invalid_request",
        `proxy sandbox ${request.proxySandboxId} belongs to another run`,
      );
    }
    const run = this.runs.for(request.runId);
    if (proxy.state !== "ready" || !run.networkUp) {
      throw new AgentError("sandbox_failed", `proxy sandbox ${request.proxySandboxId} is destroyed`);
    }
    let i = 0;
    while (i < MAX_WORK_PER_RUN && (run.slots.has(i) || netnsExists(workNet(run.net.k, i).netns))) i++;
    if (i === MAX_WORK_PER_RUN) {
      throw new AgentError(
        "sandbox_failed",
        `run ${request.runId} already has ${MAX_WORK_PER_RUN} work/task sandboxes`,
      );
    }
    // A layer is checked against its digest before anything of the sandbox is made: a missing or
    // mismatching one is refused with its own code (the broker then has it built again), never
    // started around.
    const layerRoot = request.layer ? await this.o.layers.verify(request.layer.digest) : null;
    const net = workNet(run.net.k, i);
    const uid = this.allocateUid();
    run.slots.set(i, { id: request.id, routing: request.routing });
    try {
      await this.runs.openWorkLink(run, net);
      const resolvConf = this.resolvConf(
        request.routing === "catch-all" ? [net.proxyAddress] : hostNameservers(),
      );
      const { process, resources } = await this.startProcess(request, net.netns, uid, resolvConf, {
        capture: request.capture === true,
        root: layerRoot,
      });
      return this.register(run, {
        id: request.id,
        runId: request.runId,
        kind: request.kind,
        routing: request.routing,
        proxySandboxId: request.proxySandboxId,
        netns: net.netns,
        work: net,
        address: net.address,
        controlPlaneUrl: null,
        process,
        resources,
        resolvConf,
        capture: request.capture === true,
        layer: request.layer?.digest ?? null,
      });
    } catch (error) {
      run.slots.delete(i);
      await this.runs.dismantleWorkNetwork(run, net);
      this.o.state.removeSandboxDir(request.id);
      throw new AgentError("sandbox_failed", message(error));
    }
  }

  /** A new sandbox of `run`, ready, not frozen or sealed, with no execs yet. */
  private register(
    run: Run,
    s: Omit<
      Sandbox,
      | "state"
      | "frozen"
      | "execs"
      | "sealed"
      | "sealKilled"
      | "notSealed"
      | "commandsRan"
      | "caCertPem"
      | "capturing"
      | "reading"
    >,
  ): Sandbox {
    const sandbox: Sandbox = {
      ...s,
      state: "ready",
      frozen: false,
      execs: new Map(),
      sealed: false,
      sealKilled: 0,
      notSealed: null,
      commandsRan: false,
      caCertPem: null,
      capturing: null,
      reading: false,
    };
    this.sandboxes.set(sandbox.id, sandbox);
    run.members.add(sandbox.id);
    return sandbox;
  }
}
