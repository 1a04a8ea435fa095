import type { Readable } from "node:stream";
import type { UnpackResult } from "@benchwright/shared/contract/bundle";
import type {
  CreateSandbox,
  ExecInfo,
  ExecRequest,
  LayerList,
  ListedSandbox,
  SandboxInfo,
  Seal,
  SealResult,
} from "@benchwright/shared/contract/local-agent";
import type { CapturedImage } from "@benchwright/shared/contract/setup-image";
import type { z } from "zod";
import { removeParents } from "./cgroups";
import { AgentError, message } from "./errors";
import type { Exec } from "./exec";
import { startExec } from "./exec-start";
import { captureSandbox } from "./layer-capture";
import type { RegistryOptions } from "./registry-options";
import { Runs } from "./runs";
import { CA_BUNDLE } from "./sandbox";
import { SandboxMaker } from "./sandbox-create";
import { destroySandbox } from "./sandbox-destroy";
import { refuseReading, refuseUnsealed, type Sandbox, type WorkSandbox } from "./sandbox-record";
import { rewriteHostsOf, sealSandbox } from "./sealing";
import { collectArtifacts, unpackBundle } from "./transfer";
import { type ImageFiles, readImageFiles } from "./wiring-files";

// The sandboxes this agent made and the runs they belong to. Creation and destruction are
// serialized (one at a time: they share the run's network and its ruleset); execs are not.
// This is the registry the server calls; the parts are apart: runs' networks (runs.ts), making a
// sandbox (sandbox-create.ts), starting execs (exec-start.ts), destroying (sandbox-destroy.ts).

type ParsedExec = z.output<typeof ExecRequest>;

export class Registry {
  private readonly sandboxes = new Map<string, Sandbox>();
  private readonly runs: Runs;
  private readonly maker: SandboxMaker;
  private queue: Promise<unknown> = Promise.resolve();
  private closing = false;
  /** The work image's CA bundle and nsswitch.conf, as when this agent started (seal restores them). */
  private readonly imageFiles: ImageFiles | null;

  constructor(private readonly o: RegistryOptions) {
    this.runs = new Runs(o);
    this.maker = new SandboxMaker(o, this.sandboxes, this.runs);
    this.imageFiles = o.rootfs ? readImageFiles(o.rootfs, CA_BUNDLE) : null;
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
            (existing.proxySandboxId === request.proxySandboxId &&
              existing.routing === request.routing &&
              existing.capture === (request.capture === true) &&
              existing.layer === (request.layer?.digest ?? null)));
        if (!same)
          throw new AgentError("invalid_request", `sandbox ${request.id} exists with other parameters`);
        return { info: this.info(existing), created: false };
      }
      const started = Date.now();
      try {
        const sandbox =
          request.kind === "proxy"
            ? await this.maker.createProxy(request)
            : await this.maker.createWork(request);
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
          ...(sandbox.capture ? { capture: true } : {}),
          ...(sandbox.layer ? { layer: sandbox.layer } : {}),
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
    return this.serial(() => destroySandbox(this.o, this.sandboxes, this.runs, id));
  }

  startExec(sandboxId: string, request: ParsedExec): { info: ExecInfo; created: boolean } {
    return startExec(this.o, this.runs, this.sandbox(sandboxId), request);
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
    refuseUnsealed(sandbox);
    return sandbox as WorkSandbox;
  }

  /** Ends a work or task sandbox's setup stage (sealing.ts). */
  async seal(sandboxId: string, body: Seal): Promise<SealResult> {
    const sandbox = this.workSandbox(sandboxId, "seal");
    refuseReading(sandbox);
    const result = await sealSandbox(sandbox, body, this.imageFiles as ImageFiles);
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
    return unpackBundle(this.running(sandboxId, "a bundle"), dir, body, bounds);
  }

  /** bw-collect (the execute stage's uid) of `dir`: the archive, streamed (transfer.ts). */
  artifacts(
    sandboxId: string,
    dir: string,
    bounds: { maxBytes: number; maxFiles: number },
  ): Promise<{ stream: Readable; abort: () => void }> {
    return collectArtifacts(this.running(sandboxId, "collecting artifacts"), dir, bounds);
  }

  /**
   * A work sandbox a program of the image is about to run in (execute stage): after the seal, that
   * is a command of the sandbox's own as far as a capture is concerned.
   */
  private running(sandboxId: string, what: string): WorkSandbox {
    const sandbox = this.workSandbox(sandboxId, what);
    refuseReading(sandbox);
    if (sandbox.sealed) sandbox.commandsRan = true;
    return sandbox;
  }

  /**
   * Keeps a setup image's builder's filesystem changes as a layer (layer-capture.ts): only one
   * made with `capture`, sealed, in which nothing but the re-proof has run in the execute stage.
   * Nothing else starts in it while its files are read. Repeated, it answers what it kept.
   */
  async capture(sandboxId: string, maxBytes: number): Promise<CapturedImage> {
    const sandbox = this.workSandbox(sandboxId, "a capture");
    if (!sandbox.capture) {
      throw new AgentError("capture_too_late", `sandbox ${sandboxId} was not made with capture`);
    }
    if (!sandbox.sealed) {
      throw new AgentError(
        "not_sealed",
        `sandbox ${sandboxId} is not sealed: its setup could still be writing`,
      );
    }
    if (!sandbox.capturing) {
      if (sandbox.commandsRan) {
        throw new AgentError(
          "capture_too_late",
          `sandbox ${sandboxId} already ran a command in its execute stage`,
        );
      }
      const started = Date.now();
      sandbox.reading = true;
      const capturing = captureSandbox(this.o.layers, sandbox, maxBytes).finally(() => {
        sandbox.reading = false;
      });
      sandbox.capturing = capturing;
      capturing.then(
        (image) =>
          this.o.log({
            event: "layer_captured",
            id: sandboxId,
            runId: sandbox.runId,
            ...image,
            ms: Date.now() - started,
          }),
        (error: unknown) => {
          if (sandbox.capturing === capturing) sandbox.capturing = null;
          this.o.log({ event: "layer_refused", id: sandboxId, runId: sandbox.runId, reason: message(error) });
        },
      );
    }
    const image = await sandbox.capturing;
    if (image.bytes > maxBytes) {
      throw new AgentError(
        "setup_image_too_large",
        `the setup layer is larger than the bound of ${maxBytes} bytes`,
      );
    }
    if (this.sandboxes.get(sandboxId) !== sandbox || sandbox.state !== "ready") {
      throw new AgentError("sandbox_failed", `sandbox ${sandboxId} was destroyed while it was captured`);
    }
    return image;
  }

  /** The setup layers this agent keeps, with how many live sandboxes start from each. */
  layers(): LayerList {
    return this.o.layers.list((digest) => this.layerUsers(digest));
  }

  /** Removes a stored layer; refused (in_use) while a sandbox not yet destroyed started from it. */
  deleteLayer(digest: string): Promise<void> {
    return this.serial(async () => {
      const users = this.layerUsers(digest);
      if (users > 0) throw new AgentError("in_use", `${users} sandbox(es) start from setup layer ${digest}`);
      this.o.layers.remove(digest);
      this.o.log({ event: "layer_removed", digest });
    });
  }

  private layerUsers(digest: string): number {
    return [...this.sandboxes.values()].filter((s) => s.layer === digest).length;
  }

  /** Destroys every sandbox, then the host table (unless another agent's runs still need it). */
  close(): Promise<void> {
    this.closing = true;
    return this.serial(async () => {
      const order = [...this.sandboxes.values()].sort(
        (a, b) => Number(a.kind === "proxy") - Number(b.kind === "proxy"),
      );
      for (const s of order) await destroySandbox(this.o, this.sandboxes, this.runs, s.id);
      if (this.o.cgroups) removeParents(this.o.cgroups);
      await this.runs.removeHostIfUnused();
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
}
