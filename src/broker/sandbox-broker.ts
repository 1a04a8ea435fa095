import { DurableObject } from "cloudflare:workers";
import type { ArtifactSummary, UnpackResult } from "@benchwright/shared/contract/bundle";
import type {
  ExecInfo,
  ExecRequest,
  Resources,
  SandboxInfo,
  Seal,
  SealResult,
} from "@benchwright/shared/contract/local-agent";
import { consoleLog } from "@benchwright/shared/contract/log";
import { resourcesFor } from "@benchwright/shared/contract/run-spec";
import type { CapturedImage, SetupImageClaim, SetupImageKey } from "@benchwright/shared/contract/setup-image";
import { and, eq, inArray, ne } from "drizzle-orm";
import { bundleKey, findBundle } from "../bundles/rows";
import { loadConfig } from "../config";
import { openDb } from "../db/client";
import { runs, sandboxes } from "../db/schema";
import type { Db } from "../db/types";
import { ArtifactArchiveError, storeArtifacts } from "../runs/artifacts";
import * as setupImageRecords from "../setup-images/records";
import { BackendError, type BackendName, type ComputeBackend, type ExecPoll } from "./backend";
import { backendFor, configuredBackends } from "./backends";
import type {
  BrokerApi,
  BrokerFailed,
  BrokerResult,
  BundleRequest,
  CollectRequest,
  SandboxRequest,
  SetupImageRequest,
  SweepReport,
} from "./interface";
import * as setupImages from "./setup-images";

// The sandbox broker: the only code that holds compute-backend credentials and calls a backend.
// A run's coordinator asks it for sandboxes for that run only; every sandbox is recorded in
// Postgres *before* the backend is asked for it, so a crash between the two leaves a row the
// teardown (and the reaper) can find, never an orphan.
//
// Instances (issue 24): one per run, `brokerStub(env, runId)`, serves every call about that run's
// sandboxes (its coordinator's, and the reaper's teardown of it), so a busy or failed instance
// holds up one run, not the deployment. The deployment-wide `sweepUnowned` is about no run: it
// runs on an instance of its own, `sweepBrokerStub(env)`. Per run rather than per environment:
// the coordinator is already one per run, and an environment's runs (up to its active-run cap)
// would still share a hotspot. The broker keeps no record in its own storage (every record is in
// Postgres), so which instance serves a call changes nothing else; the credential stays in this
// class's env as before. The old shared instance ("broker") is no longer addressed. What it does
// keep is the id of the API request steering its run (issue 36), which its log lines name.
//
// Every call answers a BrokerResult (interface.ts): what a backend throws is turned into a failure
// with its code here, in `answer`, and nowhere else; a failure is logged there too.

export class SandboxBroker extends DurableObject<Env> implements BrokerApi {
  /**
   * A call's value as its answer, or what it threw as a failure (the one place either is made).
   * A failure is logged, with the request that steers the run, so an operator can follow a
   * request from the API through the coordinator to here.
   */
  private async answer<T>(
    call: string,
    runId: string | null,
    fn: () => Promise<T>,
  ): Promise<BrokerResult<T>> {
    try {
      return { ok: true, value: await fn() };
    } catch (error) {
      const result = failed(error);
      consoleLog(result.retryable ? "warn" : "error", {
        event: "broker_call_failed",
        call,
        runId,
        code: result.code,
        retryable: result.retryable,
        // The class only: a backend's message may name its internals.
        error: error instanceof Error ? error.name : "unknown",
        requestId: (await this.ctx.storage.get<string>(REQUEST_KEY).catch(() => undefined)) ?? null,
      });
      return result;
    }
  }

  /** Keeps the id of the request now steering this instance's run, for its log lines. */
  private async follow(requestId: string | undefined): Promise<void> {
    if (requestId) await this.ctx.storage.put(REQUEST_KEY, requestId);
  }

  /** A sandbox's backend: the one its row names (the run's), whatever the default is now. */
  private backendOf(name: string): ComputeBackend {
    return backendFor(this.env, name);
  }

  private async withDb<T>(fn: (db: Db) => Promise<T>): Promise<T> {
    const { db, close } = openDb(loadConfig(this.env));
    try {
      return await fn(db);
    } finally {
      await close().catch(() => {});
    }
  }

  /** The run's sandbox, or a refusal: a run can only ever address its own sandboxes. */
  private async own(db: Db, runId: string, sandboxId: string) {
    const [row] = await db
      .select()
      .from(sandboxes)
      .where(and(eq(sandboxes.id, sandboxId), eq(sandboxes.runId, runId)));
    if (!row || row.status === "destroyed") {
      throw new BackendError("not_found", `run ${runId} has no live sandbox ${sandboxId}`);
    }
    return row;
  }

  /**
   * A live work, task or orchestrator sandbox of the run (never its proxy sandbox: bundles, setup
   * and artifacts are the benchmark's), and, given an environment, only if the run is in it.
   */
  private async ownWork(db: Db, runId: string, sandboxId: string, environmentId?: string) {
    const row = await this.own(db, runId, sandboxId);
    if (row.kind === "proxy") throw new BackendError("not_found", `sandbox ${sandboxId} is the run's proxy`);
    if (environmentId !== undefined) {
      const [run] = await db
        .select({ environmentId: runs.environmentId })
        .from(runs)
        .where(eq(runs.id, runId));
      if (run?.environmentId !== environmentId) {
        throw new BackendError("not_found", `run ${runId} is not in environment ${environmentId}`);
      }
    }
    return row;
  }

  /** The run's row as the setup image calls need it. */
  private async runOf(db: Db, runId: string): Promise<setupImages.RunOf> {
    const [run] = await db
      .select({ id: runs.id, environmentId: runs.environmentId, backend: runs.backend })
      .from(runs)
      .where(eq(runs.id, runId));
    if (!run) throw new BackendError("not_found", `no run ${runId}`);
    return { ...run, backend: run.backend as BackendName };
  }

  /** The setup image a sandbox of the run starts from: the key and its environment's digest. */
  private async imageFor(db: Db, run: setupImages.RunOf, key: SetupImageKey, capture: true | undefined) {
    if (capture) {
      throw new BackendError(
        "invalid_request",
        "a sandbox started from a setup image has no setup to capture",
      );
    }
    return { key, ...(await setupImages.layerOf(db, run, key)) };
  }

  /**
   * Makes a sandbox for the run (idempotent by id). The coordinator must tell "cannot isolate
   * here" from "try again": the failure's code and retryable say which.
   */
  async create(
    runId: string,
    request: SandboxRequest & { resources?: Resources },
    requestId?: string,
  ): Promise<BrokerResult<SandboxInfo>> {
    await this.follow(requestId);
    return this.answer("create", runId, () => this.make(runId, request));
  }

  /** The sandbox made; a failure thrown, for `answer` to turn into the call's answer. */
  private async make(
    runId: string,
    request: SandboxRequest & { resources?: Resources },
  ): Promise<SandboxInfo> {
    return this.withDb(async (db) => {
      const run = await this.runOf(db, runId);
      const backend = this.backendOf(run.backend);
      // A setup image is the run's own environment's, read here by key: the caller never names a
      // digest, and a key that environment has not built is refused before anything is made (P3).
      const image =
        request.kind === "proxy" || !request.setupImage
          ? null
          : await this.imageFor(db, run, request.setupImage.key, request.capture);
      await db
        .insert(sandboxes)
        .values({
          id: request.id,
          runId,
          kind: request.kind,
          taskIndex: request.kind === "proxy" ? null : request.taskIndex,
          routing: request.kind === "proxy" ? null : request.routing,
          backend: backend.name,
        })
        .onConflictDoNothing();
      // Another run's id, or a sandbox already torn down, is refused here.
      const row = await this.own(db, runId, request.id);
      // A work/task sandbox's network is its own run's proxy sandbox, never another run's.
      if (request.kind !== "proxy") await this.own(db, runId, request.proxySandboxId);
      try {
        // A sandbox always has limits: the run's, or its kind's defaults.
        const resources = resourcesFor(request.resources, request.kind);
        const info = await backend.create(
          request.kind === "proxy"
            ? { kind: "proxy", id: request.id, runId, resources }
            : {
                kind: request.kind,
                id: request.id,
                runId,
                resources,
                proxySandboxId: request.proxySandboxId,
                routing: request.routing,
                hostsFile: request.hostsFile,
                ...(request.setup ? { setup: true } : {}),
                ...(request.capture ? { capture: true } : {}),
                ...(image ? { layer: { digest: image.digest, environmentId: run.environmentId } } : {}),
              },
        );
        if (row.status !== "ready") {
          await db.update(sandboxes).set({ status: "ready" }).where(eq(sandboxes.id, request.id));
        }
        if (image) await setupImageRecords.touch(db, run.environmentId, image.key);
        return info;
      } catch (error) {
        // A layer the backend has not got, or whose bytes do not match: forget it, so that the
        // next claim builds it again; never start around it (case P6).
        if (image && LAYER_GONE.has(failed(error).code)) {
          await setupImageRecords.dropRow(db, { environmentId: run.environmentId, ...image });
        }
        if (failed(error).retryable) throw error;
        // Nothing of a failed sandbox may stay behind.
        await backend.destroy(request.id).catch(() => {});
        await db
          .update(sandboxes)
          .set({ status: "failed", destroyedAt: new Date() })
          .where(eq(sandboxes.id, request.id));
        throw error;
      }
    });
  }

  async exec(runId: string, sandboxId: string, request: ExecRequest): Promise<BrokerResult<ExecInfo>> {
    return this.answer("exec", runId, async () => {
      const row = await this.withDb((db) => this.own(db, runId, sandboxId));
      return this.backendOf(row.backend).exec(sandboxId, request);
    });
  }

  async poll(
    runId: string,
    sandboxId: string,
    execId: string,
    poll: ExecPoll,
  ): Promise<BrokerResult<ExecInfo>> {
    return this.answer("poll", runId, async () => {
      const row = await this.withDb((db) => this.own(db, runId, sandboxId));
      return this.backendOf(row.backend).poll(sandboxId, execId, poll);
    });
  }

  /** Stops an exec of the run's sandbox; an exec the backend never started is no error. */
  async kill(runId: string, sandboxId: string, execId: string): Promise<BrokerResult<null>> {
    return this.answer("kill", runId, async () => {
      const row = await this.withDb((db) => this.own(db, runId, sandboxId));
      try {
        await this.backendOf(row.backend).kill(sandboxId, execId);
      } catch (error) {
        if (!(error instanceof BackendError && error.code === "not_found")) throw error;
      }
      return null;
    });
  }

  /**
   * Unpacks the run's bundle into a work or task sandbox of the run. The broker reads the bytes
   * from R2 itself and streams them to the backend: the coordinator names the bundle, never holds
   * it. The bundle must be one of the run's own environment (case H3), whatever the caller says.
   */
  async putBundle(
    runId: string,
    sandboxId: string,
    bundle: BundleRequest,
  ): Promise<BrokerResult<UnpackResult>> {
    return this.answer("putBundle", runId, async () => {
      const row = await this.withDb(async (db) => {
        const row = await this.ownWork(db, runId, sandboxId, bundle.environmentId);
        if (!(await findBundle(db, bundle.environmentId, bundle.sha256))) {
          throw new BackendError("bundle_not_found", `no bundle ${bundle.sha256} in the run's environment`);
        }
        return row;
      });
      const object = await this.env.FILES.get(bundleKey(bundle.environmentId, bundle.sha256));
      if (!object) throw new BackendError("bundle_not_found", `bundle ${bundle.sha256} has no stored bytes`);
      return this.backendOf(row.backend).putBundle(sandboxId, object.body, bundle.dir);
    });
  }

  /** Ends the setup stage of a work or task sandbox of the run (idempotent). */
  async seal(runId: string, sandboxId: string, seal: Seal): Promise<BrokerResult<SealResult>> {
    return this.answer("seal", runId, async () => {
      const row = await this.withDb((db) => this.ownWork(db, runId, sandboxId));
      return this.backendOf(row.backend).seal(sandboxId, seal);
    });
  }

  /** Rewrites the hosts-file redirect of a default-routing sandbox of the run (a vault edit). */
  async setHosts(runId: string, sandboxId: string, hostsFile: string[]): Promise<BrokerResult<null>> {
    return this.answer("setHosts", runId, async () => {
      const row = await this.withDb((db) => this.ownWork(db, runId, sandboxId));
      await this.backendOf(row.backend).setHosts(sandboxId, hostsFile);
      return null;
    });
  }

  /**
   * Collects a work or task sandbox's artifacts: the backend packs `dir` (bw-collect, within the
   * bounds), and the archive is parsed and stored here (R2 objects and run_artifacts rows, the
   * cut entries included) without passing through the coordinator. Idempotent per sandbox.
   */
  async collect(
    runId: string,
    sandboxId: string,
    options: CollectRequest,
  ): Promise<BrokerResult<ArtifactSummary>> {
    return this.answer("collect", runId, () =>
      this.withDb(async (db) => {
        const row = await this.ownWork(db, runId, sandboxId, options.environmentId);
        const limits = { maxBytes: options.maxBytes, maxFiles: options.maxFiles };
        const archive = await this.backendOf(row.backend).collect(sandboxId, { dir: options.dir, ...limits });
        return storeArtifacts(this.env, db, {
          runId,
          environmentId: options.environmentId,
          sandboxId,
          sandboxName: options.sandboxName,
          archive,
          limits,
        });
      }),
    );
  }

  /** Halts (or resumes) the processes of the run's sandbox. */
  async freeze(runId: string, sandboxId: string, frozen: boolean): Promise<BrokerResult<null>> {
    return this.answer("freeze", runId, async () => {
      const row = await this.withDb((db) => this.own(db, runId, sandboxId));
      await this.backendOf(row.backend).freeze(sandboxId, frozen);
      return null;
    });
  }

  /**
   * The backend's sandboxes that no live record owns: no row at all (its run was deleted with its
   * user), or a row already marked destroyed or failed (a teardown that lost its backend call).
   * Each is destroyed. Rows are written before the backend is asked, so a sandbox being made
   * always has its row: this never touches a live one.
   */
  async sweepUnowned(): Promise<BrokerResult<SweepReport>> {
    return this.answer("sweepUnowned", null, () => this.sweep());
  }

  /**
   * What to do about a sandbox's setup (contract/setup-image.ts): the key from the run's backend
   * and work image plus the request, arbitrated by the environment's setup_images rows.
   */
  async claimSetupImage(
    runId: string,
    sandboxId: string,
    request: SetupImageRequest,
  ): Promise<BrokerResult<SetupImageClaim>> {
    return this.answer("claimSetupImage", runId, () =>
      this.withDb(async (db) => {
        const run = await this.runOf(db, runId);
        // Claimed before the sandbox is made: an id already recorded must be the run's, and live.
        const [row] = await db.select().from(sandboxes).where(eq(sandboxes.id, sandboxId));
        if (row && (row.runId !== runId || row.status === "destroyed" || row.status === "failed")) {
          throw new BackendError("not_found", `run ${runId} has no live sandbox ${sandboxId}`);
        }
        const settings = loadConfig(this.env).setupImages;
        return setupImages.claimSetupImage(
          db,
          this.backendOf(run.backend),
          settings,
          run,
          sandboxId,
          request,
        );
      }),
    );
  }

  /** Keeps the builder's changes as the key's image (it must hold the key in the run's environment). */
  async captureSetupImage(
    runId: string,
    sandboxId: string,
    key: SetupImageKey,
  ): Promise<BrokerResult<CapturedImage>> {
    return this.answer("captureSetupImage", runId, () =>
      this.withDb(async (db) => {
        const run = await this.runOf(db, runId);
        const row = await this.ownWork(db, runId, sandboxId);
        const settings = loadConfig(this.env).setupImages;
        // The run CA no kept file may hold (the local agent has it from the seal; others do not).
        const [ca] = await db.select({ pem: runs.caCertPem }).from(runs).where(eq(runs.id, runId));
        const backend = this.backendOf(row.backend);
        return setupImages.captureSetupImage(db, backend, settings, run, sandboxId, key, ca?.pem ?? null);
      }),
    );
  }

  /** Gives up this sandbox's build of the key (its setup failed). Idempotent. */
  async releaseSetupImage(runId: string, sandboxId: string, key: SetupImageKey): Promise<BrokerResult<null>> {
    return this.answer("releaseSetupImage", runId, () =>
      this.withDb(async (db) => {
        const run = await this.runOf(db, runId);
        await setupImageRecords.release(db, { environmentId: run.environmentId, key, runId, sandboxId });
        return null;
      }),
    );
  }

  /** Removes dropped setup images' artifacts (the sweep's own instance; the reaper asks). */
  async dropSetupImages(
    images: Array<{ backend: string; digest: string; repository: string | null }>,
  ): Promise<BrokerResult<{ dropped: string[]; inUse: string[] }>> {
    return this.answer("dropSetupImages", null, () =>
      this.withDb((db) => setupImages.dropSetupImages(db, (name) => this.backendOf(name), images)),
    );
  }

  private async sweep(): Promise<SweepReport> {
    const backends = configuredBackends(this.env);
    if (backends.length === 0) return { skipped: "backend_not_configured" }; // nothing to sweep
    const result = { destroyed: [] as string[], errors: [] as string[], droppedLayers: [] as string[] };
    for (const backend of backends) {
      const swept = await this.sweepSandboxes(backend);
      const layers = await this.withDb((db) => setupImages.sweepLayers(db, backend, Date.now()));
      result.destroyed.push(...swept.destroyed);
      result.droppedLayers.push(...layers.dropped);
      result.errors.push(...swept.errors, ...layers.errors);
    }
    return result;
  }

  /** The backend's sandboxes no live record owns, destroyed. */
  private async sweepSandboxes(backend: ComputeBackend): Promise<{ destroyed: string[]; errors: string[] }> {
    const result = { destroyed: [] as string[], errors: [] as string[] };
    let listed: Awaited<ReturnType<ComputeBackend["list"]>>;
    try {
      listed = await backend.list();
    } catch {
      return { destroyed: [], errors: [`${backend.name}: list failed`] };
    }
    if (listed.length === 0) return result;
    const rows = await this.withDb((db) =>
      db
        .select({ id: sandboxes.id, status: sandboxes.status })
        .from(sandboxes)
        .where(
          inArray(
            sandboxes.id,
            listed.map((l) => l.id),
          ),
        ),
    );
    const live = new Set(
      rows.filter((r) => r.status === "creating" || r.status === "ready").map((r) => r.id),
    );
    const unowned = listed.filter((l) => !live.has(l.id)).sort(proxyLast);
    for (const l of unowned) {
      try {
        await backend.destroy(l.id);
        result.destroyed.push(l.id);
      } catch {
        result.errors.push(l.id);
      }
    }
    return result;
  }

  /** Destroys one sandbox of the run (a task that is done); idempotent. */
  async destroySandbox(runId: string, sandboxId: string): Promise<BrokerResult<null>> {
    return this.answer("destroySandbox", runId, () =>
      this.withDb(async (db) => {
        const [row] = await db
          .select()
          .from(sandboxes)
          .where(and(eq(sandboxes.id, sandboxId), eq(sandboxes.runId, runId)));
        if (!row) throw new BackendError("not_found", `run ${runId} has no sandbox ${sandboxId}`);
        // A sandbox that goes can never capture: a build it held is given up.
        await setupImageRecords.releaseSandbox(db, sandboxId);
        if (row.status === "destroyed") return null;
        await this.backendOf(row.backend).destroy(sandboxId);
        await db
          .update(sandboxes)
          .set({ status: "destroyed", destroyedAt: new Date() })
          .where(eq(sandboxes.id, sandboxId));
        return null;
      }),
    );
  }

  /**
   * Destroys every sandbox of the run (idempotent); with keepProxy, all but its proxy sandbox
   * (a lingering run keeps its proxy).
   */
  async destroyRun(
    runId: string,
    options: { keepProxy?: boolean; requestId?: string } = {},
  ): Promise<BrokerResult<number>> {
    await this.follow(options.requestId);
    return this.answer("destroyRun", runId, () =>
      this.withDb(async (db) => {
        // Whatever the run was still building is given up: a failed setup is never cached.
        await setupImageRecords.releaseRun(db, runId);
        const live = await db
          .select({ id: sandboxes.id, kind: sandboxes.kind, backend: sandboxes.backend })
          .from(sandboxes)
          .where(
            and(
              eq(sandboxes.runId, runId),
              ne(sandboxes.status, "destroyed"),
              options.keepProxy ? ne(sandboxes.kind, "proxy") : undefined,
            ),
          );
        if (live.length === 0) return 0;
        live.sort(proxyLast);
        for (const s of live) {
          await this.backendOf(s.backend).destroy(s.id);
          await db
            .update(sandboxes)
            .set({ status: "destroyed", destroyedAt: new Date() })
            .where(eq(sandboxes.id, s.id));
        }
        return live.length;
      }),
    );
  }
}

/** Where an instance keeps the id of the request steering its run: the one thing it stores. */
const REQUEST_KEY = "request";

/** What a backend answers for a setup image's layer it cannot start from (its row is dropped). */
const LAYER_GONE: ReadonlySet<string> = new Set(["setup_image_missing", "setup_image_mismatch"]);

/** Work and task sandboxes before the proxy sandbox: the proxy sandbox is their network. */
const proxyLast = (a: { kind: string }, b: { kind: string }) =>
  Number(a.kind === "proxy") - Number(b.kind === "proxy");

/** What a backend (or the broker itself) threw, as a failure with its code. */
function failed(error: unknown): BrokerFailed {
  if (error instanceof BackendError) {
    return { ok: false, code: error.code, message: error.message, retryable: error.retryable };
  }
  if (error instanceof ArtifactArchiveError) {
    return { ok: false, code: error.code, message: error.message, retryable: false };
  }
  return { ok: false, code: "backend_error", message: "the backend call failed", retryable: true };
}

/** The instance name of a run's broker: prefixed, so no run id can name the sweep's. */
export const runBrokerName = (runId: string) => `run:${runId}`;
/** The instance that sweeps the backends for sandboxes no live record owns. */
export const SWEEP_BROKER_NAME = "sweep";

/** The run's broker: every call about the run's sandboxes goes to this one instance. */
export function brokerStub(env: Env, runId: string): DurableObjectStub<SandboxBroker> {
  return env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.idFromName(runBrokerName(runId)));
}

/** The broker instance for the deployment-wide sweep (the reaper's `sweepUnowned`). */
export function sweepBrokerStub(env: Env): DurableObjectStub<SandboxBroker> {
  return env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.idFromName(SWEEP_BROKER_NAME));
}
