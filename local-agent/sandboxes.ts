import { randomUUID } from "node:crypto";
import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import type { Readable } from "node:stream";
import type { z } from "zod";
import type { UnpackResult } from "../src/contract/bundle";
import {
  type AgentHealth,
  type CreateSandbox,
  DEFAULT_RESOURCES,
  type ExecInfo,
  type ExecRequest,
  type ListedSandbox,
  type Resources,
  type SandboxInfo,
  type Seal,
  type SealResult,
} from "../src/contract/local-agent";
import type { RoutingMode } from "../src/contract/policy";
import { type CgroupHost, removeParents, SandboxCgroup } from "./cgroups";
import { AgentError } from "./errors";
import { Exec } from "./exec";
import {
  applyNft,
  createRunNetwork,
  createWorkNetwork,
  destroyRunNetwork,
  destroyWorkNetwork,
  hostNameservers,
  hostService,
  installHost,
  killNetnsProcesses,
  linkExists,
  MAX_RUNS,
  MAX_WORK_PER_RUN,
  netnsExists,
  proxyNamespaces,
  proxyRuleset,
  type RunNet,
  readIpForward,
  removeHost,
  runNet,
  type WorkNet,
  workNet,
} from "./network";
import { type HostListener, startProbe, startRelay } from "./relay";
import {
  CA_BUNDLE,
  EXEC_BASE_ENV,
  envScript,
  IMAGE_MOUNT,
  NODE_MOUNT,
  SANDBOX_HOME,
  SandboxProcess,
} from "./sandbox";
import { execCgroup, type Sandbox, type WorkSandbox } from "./sandbox-record";
import { rewriteHostsOf, sealSandbox } from "./sealing";
import type { StateDir } from "./state-dir";
import { collectArtifacts, unpackBundle } from "./transfer";
import { BASE_HOSTS } from "./wiring-files";

// The sandboxes this agent made and the runs they belong to. Creation and destruction are
// serialized (one at a time: they share the run's network and its ruleset); execs are not.

type ParsedExec = z.output<typeof ExecRequest>;

export type AgentLog = (event: Record<string, unknown>) => void;

export interface RegistryOptions {
  nft: string;
  state: StateDir;
  controlPlane: URL;
  /** First host uid of sandboxes; each sandbox takes two (setup U, execute U+1). */
  uidBase: number;
  health: AgentHealth;
  log: AgentLog;
  /** Host directory with the image's programs (mounted read-only in every sandbox). */
  imageDir: string;
  /** The work image's exported files (rootfs.ts): every sandbox's overlay's lower layer. */
  rootfs: string | null;
  /** Where sandboxes' cgroups are made (cgroups.ts). */
  cgroups: CgroupHost | null;
  /** Private CIDRs default-routing sandboxes may reach directly (development and tests only). */
  directAllowCidrs: readonly string[];
  /**
   * Test-only settings added to the proxy's environment (BW_TEST_*): the suite's own upstream CA
   * and routes. Never set outside development and tests.
   */
  proxyTestEnv: Record<string, string>;
}

interface Listener {
  listener: HostListener;
  address: string;
}

interface Run {
  runId: string;
  net: RunNet;
  proxyId: string | null;
  networkUp: boolean;
  relay: Listener | null;
  probe: Listener | null;
  members: Set<string>;
  /** Work index i -> the work/task sandbox on that link. */
  slots: Map<number, { id: string; routing: RoutingMode }>;
}

/** How long a proxy gets, after SIGTERM, to flush its audit batch before its sandbox is killed. */
const PROXY_GRACE_MS = 5_000;
const UID_SPAN = 200_000;
/** Exited execs kept per sandbox (each keeps up to 2 MiB of output). */
const MAX_EXITED_EXECS = 256;

const message = (e: unknown) => (e instanceof Error ? e.message : String(e));

export class Registry {
  private readonly sandboxes = new Map<string, Sandbox>();
  private readonly runs = new Map<string, Run>();
  private nextUid: number;
  private ipForwardBefore: string | null = null;
  private queue: Promise<unknown> = Promise.resolve();
  private closing = false;
  /** The work image's CA bundle, as it was when this agent started (seal restores it). */
  private readonly imageBundle: string | null;

  constructor(private readonly o: RegistryOptions) {
    this.nextUid = o.uidBase;
    this.imageBundle = o.rootfs ? readFileSync(join(o.rootfs, CA_BUNDLE), "utf8") : null;
  }

  private serial<T>(fn: () => Promise<T>): Promise<T> {
    const next = this.queue.then(fn, fn);
    this.queue = next.catch(() => {});
    return next;
  }

  create(request: CreateSandbox): Promise<{ info: SandboxInfo; created: boolean }> {
    return this.serial(async () => {
      if (!this.o.health.ok) {
        throw new AgentError(
          "cannot_isolate",
          `this machine cannot isolate a sandbox: ${this.o.health.problems.join("; ")}`,
        );
      }
      if (this.closing) throw new AgentError("sandbox_failed", "the agent is shutting down");
      const existing = this.sandboxes.get(request.id);
      if (existing) {
        const same =
          existing.kind === request.kind &&
          existing.runId === request.runId &&
          (request.kind === "proxy" ||
            (existing.proxySandboxId === request.proxySandboxId && existing.routing === request.routing));
        if (!same)
          throw new AgentError("invalid_request", `sandbox ${request.id} exists with other parameters`);
        return { info: this.info(existing), created: false };
      }
      const started = Date.now();
      try {
        const sandbox =
          request.kind === "proxy" ? await this.createProxy(request) : await this.createWork(request);
        this.watch(sandbox);
        this.o.log({
          event: "sandbox_created",
          id: sandbox.id,
          runId: sandbox.runId,
          kind: sandbox.kind,
          routing: sandbox.routing,
          netns: sandbox.netns,
          uid: sandbox.process.uid,
          resources: sandbox.resources,
          ms: Date.now() - started,
        });
        return { info: this.info(sandbox), created: true };
      } catch (error) {
        this.o.log({
          event: "sandbox_failed",
          id: request.id,
          runId: request.runId,
          kind: request.kind,
          reason: message(error),
        });
        throw error;
      }
    });
  }

  /** Every sandbox not yet destroyed by a DELETE (one whose init died is listed as destroyed). */
  list(runId?: string): ListedSandbox[] {
    return [...this.sandboxes.values()]
      .filter((s) => runId === undefined || s.runId === runId)
      .map((s) => ({ ...this.info(s), frozen: s.frozen }));
  }

  destroy(id: string): Promise<void> {
    return this.serial(() => this.destroyNow(id));
  }

  startExec(sandboxId: string, request: ParsedExec): { info: ExecInfo; created: boolean } {
    const sandbox = this.sandbox(sandboxId);
    const known = request.id === undefined ? undefined : sandbox.execs.get(request.id);
    if (known) return { info: known.info(0, 0), created: false };
    if (sandbox.state !== "ready" || !sandbox.process.isolated()) {
      throw new AgentError("sandbox_failed", `sandbox ${sandboxId} is destroyed`);
    }
    const texts = [...request.argv, ...Object.values(request.env), request.cwd ?? ""];
    if (texts.some((t) => t.includes("\0")))
      throw new AgentError("invalid_request", "NUL bytes are not allowed in argv, env or cwd");
    if (request.stage === "setup" && sandbox.sealed) {
      throw new AgentError("sealed", `sandbox ${sandboxId} is sealed: its setup stage has ended`);
    }
    const execId = request.id ?? randomUUID();
    const { argv, env } = this.program(sandbox, request.argv, request.env);
    let exec: Exec;
    try {
      const { rel, cgroup } = execCgroup(sandbox, request.stage, `e-${execId}`);
      exec = new Exec(execId, sandboxId, request.stage, {
        argv: sandbox.process.execArgv(request.stage, rel, request.cwd ?? SANDBOX_HOME, argv),
        env: EXEC_BASE_ENV,
        fd3: envScript(env),
        stdin: request.stdin,
        timeoutMs: request.timeoutMs,
        cgroup,
      });
    } catch (error) {
      // spawn refuses synchronously only what the request itself makes impossible (E2BIG).
      throw new AgentError("invalid_request", `could not start the command: ${message(error)}`);
    }
    sandbox.execs.set(execId, exec);
    this.prune(sandbox);
    return { info: exec.info(0, 0), created: true };
  }

  /**
   * The image's programs by name, as a container image would have them on its PATH:
   * `bw-proxy` (proxy sandboxes only; the agent adds where the control plane is reachable from
   * the sandbox, and the test-only settings), `bw-proxy-view` (proxy sandboxes only: prints the
   * running proxy's view, reading nothing of the caller's environment but BW_VIEW_PORT) and
   * `bw-wiring` (work and task sandboxes only).
   */
  private program(
    sandbox: Sandbox,
    argv: readonly string[],
    env: Record<string, string>,
  ): { argv: string[]; env: Record<string, string> } {
    const [name, ...rest] = argv;
    const node = NODE_MOUNT;
    if (name === "bw-proxy") {
      if (sandbox.kind !== "proxy")
        throw new AgentError("invalid_request", "bw-proxy runs in a proxy sandbox only");
      const run = this.runs.get(sandbox.runId) as Run;
      return {
        argv: [node, `${IMAGE_MOUNT}/proxy.cjs`, ...rest],
        env: {
          ...this.o.proxyTestEnv,
          ...env,
          BW_CONTROL_PLANE_URL: sandbox.controlPlaneUrl as string,
          BW_OWN_ADDRESSES: run.net.upAddress,
        },
      };
    }
    if (name === "bw-proxy-view") {
      if (sandbox.kind !== "proxy")
        throw new AgentError("invalid_request", "bw-proxy-view runs in a proxy sandbox only");
      return {
        argv: [node, `${IMAGE_MOUNT}/proxy.cjs`, "view", ...rest],
        env: env.BW_VIEW_PORT === undefined ? {} : { BW_VIEW_PORT: env.BW_VIEW_PORT },
      };
    }
    if (name === "bw-wiring") {
      if (sandbox.kind === "proxy")
        throw new AgentError("invalid_request", "bw-wiring runs in a work or task sandbox");
      return { argv: [node, `${IMAGE_MOUNT}/wiring.cjs`, ...rest], env };
    }
    return { argv: [...argv], env };
  }

  /**
   * Stops (or continues) every process of a sandbox but its init: a work or task sandbox when its
   * run is halted for review, a proxy sandbox when its run lingers and nobody inspects it (the
   * coordinator pauses it, and resumes it for the next inspection). A frozen proxy answers nothing.
   */
  async freeze(sandboxId: string, frozen: boolean): Promise<void> {
    const sandbox = this.sandbox(sandboxId);
    if (sandbox.state !== "ready")
      throw new AgentError("sandbox_failed", `sandbox ${sandboxId} is destroyed`);
    await sandbox.process.freeze(frozen);
    sandbox.frozen = frozen;
    if (!frozen) for (const exec of sandbox.execs.values()) exec.continueHostSide();
    this.o.log({ event: frozen ? "sandbox_frozen" : "sandbox_thawed", id: sandboxId, runId: sandbox.runId });
  }

  exec(sandboxId: string, execId: string): Exec {
    const exec = this.sandbox(sandboxId).execs.get(execId);
    if (!exec) throw new AgentError("not_found", `sandbox ${sandboxId} has no exec ${execId}`);
    return exec;
  }

  /** A work or task sandbox that is ready, for the calls only those have. */
  private workSandbox(sandboxId: string, what: string): WorkSandbox {
    const sandbox = this.sandbox(sandboxId);
    if (sandbox.kind === "proxy" || sandbox.work === null)
      throw new AgentError("invalid_request", `${what} is for work, task and orchestrator sandboxes`);
    if (sandbox.state !== "ready" || !sandbox.process.isolated())
      throw new AgentError("sandbox_failed", `sandbox ${sandboxId} is destroyed`);
    return sandbox as WorkSandbox;
  }

  /** Ends a work or task sandbox's setup stage (sealing.ts). */
  async seal(sandboxId: string, body: Seal): Promise<SealResult> {
    const sandbox = this.workSandbox(sandboxId, "seal");
    const result = await sealSandbox(sandbox, body, this.imageBundle as string);
    this.o.log({ event: "sandbox_sealed", id: sandboxId, runId: sandbox.runId, killed: result.killed });
    return result;
  }

  /** Default routing: the hosts file's redirect rewritten from outside (a vault edit). */
  setHosts(sandboxId: string, hostsFile: readonly string[]): void {
    const sandbox = this.workSandbox(sandboxId, "a hosts rewrite");
    rewriteHostsOf(sandbox, hostsFile);
    this.o.log({ event: "sandbox_hosts", id: sandboxId, runId: sandbox.runId, hosts: hostsFile.length });
  }

  /** bw-unpack (the execute stage's uid) into `dir`, the body streamed to it (transfer.ts). */
  bundle(
    sandboxId: string,
    dir: string,
    body: Readable,
    bounds: { maxBytes: number; maxFiles: number; maxUploadBytes: number },
  ): Promise<UnpackResult> {
    return unpackBundle(this.workSandbox(sandboxId, "a bundle"), dir, body, bounds);
  }

  /** bw-collect (the execute stage's uid) of `dir`: the archive, streamed (transfer.ts). */
  artifacts(
    sandboxId: string,
    dir: string,
    bounds: { maxBytes: number; maxFiles: number },
  ): Promise<{ stream: Readable; abort: () => void }> {
    return collectArtifacts(this.workSandbox(sandboxId, "collecting artifacts"), dir, bounds);
  }

  /** Destroys every sandbox, then the host table (unless another agent's runs still need it). */
  close(): Promise<void> {
    this.closing = true;
    return this.serial(async () => {
      const order = [...this.sandboxes.values()].sort(
        (a, b) => Number(a.kind === "proxy") - Number(b.kind === "proxy"),
      );
      for (const s of order) await this.destroyNow(s.id);
      if (this.o.cgroups) removeParents(this.o.cgroups);
      if (this.ipForwardBefore !== null && proxyNamespaces().length === 0) {
        await removeHost(this.o.nft, this.ipForwardBefore);
        this.o.state.forgetHost();
        this.ipForwardBefore = null;
      }
    });
  }

  private sandbox(id: string): Sandbox {
    const sandbox = this.sandboxes.get(id);
    if (!sandbox) throw new AgentError("not_found", `no sandbox ${id}`);
    return sandbox;
  }

  private info(s: Sandbox): SandboxInfo {
    const run = this.runs.get(s.runId);
    const probe = s.kind !== "proxy" && run?.probe ? `${run.probe.address}:${run.probe.listener.port}` : null;
    return {
      id: s.id,
      runId: s.runId,
      kind: s.kind,
      state: s.state,
      address: s.address,
      proxyAddress: s.work?.proxyAddress ?? null,
      controlPlaneUrl: s.controlPlaneUrl,
      routing: s.routing,
      probeTarget: probe,
      wiring: null, // the setup stage is root of the sandbox: the wiring program does it all
    };
  }

  /** A sandbox whose PID 1 died (killed from outside) is marked destroyed; DELETE frees it. */
  private watch(sandbox: Sandbox): void {
    void sandbox.process.exited.then(() => {
      if (this.sandboxes.get(sandbox.id) !== sandbox || sandbox.state === "destroyed") return;
      sandbox.state = "destroyed";
      this.o.log({ event: "sandbox_died", id: sandbox.id, runId: sandbox.runId, kind: sandbox.kind });
    });
  }

  private prune(sandbox: Sandbox): void {
    const exited = [...sandbox.execs.values()].filter((e) => e.state === "exited");
    for (const e of exited.slice(0, Math.max(0, exited.length - MAX_EXITED_EXECS)))
      sandbox.execs.delete(e.execId);
  }

  private runFor(runId: string): Run {
    const known = this.runs.get(runId);
    if (known) return known;
    const taken = new Set([...this.runs.values()].map((r) => r.net.k));
    for (let k = 1; k <= MAX_RUNS; k++) {
      const net = runNet(k);
      if (taken.has(k) || netnsExists(net.proxyNetns) || linkExists(net.hostLink)) continue;
      const run: Run = {
        runId,
        net,
        proxyId: null,
        networkUp: false,
        relay: null,
        probe: null,
        members: new Set(),
        slots: new Map(),
      };
      this.runs.set(runId, run);
      return run;
    }
    throw new AgentError("sandbox_failed", `this machine already has ${MAX_RUNS} runs`);
  }

  private releaseRunIfEmpty(run: Run): void {
    if (run.members.size === 0 && run.proxyId === null && run.slots.size === 0) this.runs.delete(run.runId);
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

  private async ensureHost(): Promise<void> {
    if (this.ipForwardBefore !== null) return;
    const before = readIpForward();
    this.o.state.recordHost(before);
    await installHost(this.o.nft);
    this.ipForwardBefore = before;
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
  ): Promise<{ process: SandboxProcess; resources: Resources }> {
    const resources = request.resources ?? DEFAULT_RESOURCES[request.kind];
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

  private async createProxy(request: Extract<CreateSandbox, { kind: "proxy" }>): Promise<Sandbox> {
    const run = this.runFor(request.runId);
    if (run.proxyId !== null) {
      throw new AgentError(
        "invalid_request",
        `run ${request.runId} already has a proxy sandbox (${run.proxyId})`,
      );
    }
    const uid = this.allocateUid();
    run.proxyId = request.id;
    try {
      await this.ensureHost();
      this.o.state.recordNetns(run.net.proxyNetns);
      run.networkUp = true;
      await createRunNetwork(this.o.nft, run.net);
      const cp = this.o.controlPlane;
      const relay = await startRelay({
        host: run.net.hostAddress,
        allowFrom: run.net.upAddress,
        target: {
          host: cp.hostname.replace(/^\[(.*)\]$/, "$1"),
          port: Number(cp.port || (cp.protocol === "https:" ? 443 : 80)),
        },
      });
      run.relay = { listener: relay, address: run.net.hostAddress };
      run.probe = { listener: await startProbe(run.net.probeAddress), address: run.net.probeAddress };
      await hostService(this.o.nft, run.net.hostLink, this.hostServices(run), true);
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
      });
    } catch (error) {
      await this.dismantleRunNetwork(run);
      run.proxyId = null;
      this.o.state.removeSandboxDir(request.id);
      this.releaseRunIfEmpty(run);
      throw error instanceof AgentError
        ? error
        : new AgentError("sandbox_failed", `could not make the proxy sandbox: ${message(error)}`);
    }
  }

  private async createWork(
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
    const run = this.runFor(request.runId);
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
    const net = workNet(run.net.k, i);
    const uid = this.allocateUid();
    run.slots.set(i, { id: request.id, routing: request.routing });
    try {
      this.o.state.recordNetns(net.netns);
      await createWorkNetwork(net, run.net.proxyNetns);
      try {
        await this.applyRunRules(run);
      } catch (error) {
        throw new Error(`could not install the redirect: ${message(error)}`);
      }
      const resolvConf = this.resolvConf(
        request.routing === "catch-all" ? [net.proxyAddress] : hostNameservers(),
      );
      const { process, resources } = await this.startProcess(request, net.netns, uid, resolvConf);
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
      });
    } catch (error) {
      run.slots.delete(i);
      await this.dismantleWorkNetwork(run, net);
      this.o.state.removeSandboxDir(request.id);
      throw new AgentError("sandbox_failed", message(error));
    }
  }

  /** A new sandbox of `run`, ready, not frozen or sealed, with no execs yet. */
  private register(
    run: Run,
    s: Omit<Sandbox, "state" | "frozen" | "execs" | "sealed" | "sealKilled">,
  ): Sandbox {
    const sandbox: Sandbox = {
      ...s,
      state: "ready",
      frozen: false,
      execs: new Map(),
      sealed: false,
      sealKilled: 0,
    };
    this.sandboxes.set(sandbox.id, sandbox);
    run.members.add(sandbox.id);
    return sandbox;
  }

  private hostServices(run: Run): Array<{ address: string; port: number }> {
    return [run.relay, run.probe].flatMap((l) => (l ? [{ address: l.address, port: l.listener.port }] : []));
  }

  private applyRunRules(run: Run): Promise<string> {
    const links = [...run.slots].map(([i, s]) => ({ i, routing: s.routing }));
    return applyNft(
      this.o.nft,
      run.net.proxyNetns,
      proxyRuleset(run.net.k, links, { allowCidrs: this.o.directAllowCidrs, nameservers: hostNameservers() }),
    );
  }

  private async dismantleWorkNetwork(run: Run, net: WorkNet): Promise<void> {
    await killNetnsProcesses(net.netns);
    await destroyWorkNetwork(net, run.net.proxyNetns);
    this.o.state.forgetNetns(net.netns);
    // The link is gone, so its rules match nothing; still, keep the ruleset exact.
    if (run.networkUp) await this.applyRunRules(run).catch(() => {});
  }

  private async dismantleRunNetwork(run: Run): Promise<void> {
    const services = this.hostServices(run);
    if (services.length > 0) await hostService(this.o.nft, run.net.hostLink, services, false);
    for (const l of [run.relay, run.probe]) await l?.listener.close();
    run.relay = null;
    run.probe = null;
    if (!run.networkUp) return;
    await killNetnsProcesses(run.net.proxyNetns);
    await destroyRunNetwork(run.net);
    this.o.state.forgetNetns(run.net.proxyNetns);
    run.networkUp = false;
  }

  private async destroyNow(id: string): Promise<void> {
    const sandbox = this.sandboxes.get(id);
    if (!sandbox) return;
    sandbox.state = "destroyed";
    if (sandbox.kind === "proxy" && [...sandbox.execs.values()].some((e) => e.state === "running")) {
      // Let the proxy flush its last audit batch (it exits on SIGTERM), for a few seconds at most.
      // A paused proxy is continued first: stopped, it cannot act on the SIGTERM, and would sit out
      // the grace without flushing.
      if (sandbox.frozen) {
        await sandbox.process.freeze(false);
        for (const exec of sandbox.execs.values()) exec.continueHostSide();
        sandbox.frozen = false;
      }
      await sandbox.process.terminate();
      const running = [...sandbox.execs.values()].filter((e) => e.state === "running").map((e) => e.done);
      await Promise.race([Promise.all(running), new Promise((r) => setTimeout(r, PROXY_GRACE_MS))]);
    }
    if (sandbox.frozen) {
      // A halted sandbox is never continued: its processes die stopped. The execs' host-side
      // nsenters stopped with them, and the namespace's PID 1 cannot finish dying until they have
      // reaped their children: continue them once nothing in the sandbox can run again.
      await sandbox.process.killAll();
      for (const exec of sandbox.execs.values()) exec.continueHostSide();
    }
    await sandbox.process.kill();
    await Promise.all([...sandbox.execs.values()].map((e) => e.kill()));
    await sandbox.process.cgroup.kill("");
    sandbox.process.cgroup.remove();
    this.o.state.forgetCgroup(id);
    const run = this.runs.get(sandbox.runId) as Run;
    if (sandbox.kind === "proxy") {
      await this.dismantleRunNetwork(run);
      run.proxyId = null;
    } else if (sandbox.work) {
      run.slots.delete(sandbox.work.i);
      await this.dismantleWorkNetwork(run, sandbox.work);
    }
    this.o.state.removeSandboxDir(id);
    this.sandboxes.delete(id);
    run.members.delete(id);
    this.releaseRunIfEmpty(run);
    this.o.log({ event: "sandbox_destroyed", id, runId: sandbox.runId, kind: sandbox.kind });
  }
}
