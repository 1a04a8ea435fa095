import {
  type CapturedImage,
  type ImageDigest,
  SETUP_IMAGE_FORMAT,
  type SetupImageClaim,
  type SetupImageInputs,
  type SetupImageKey,
  setupImageKey,
} from "@benchwright/shared/contract/setup-image";
import type { SetupImageSettings } from "../config";
import type { Db } from "../db/types";
import * as records from "../setup-images/records";
import { BackendError, type BackendName, type ComputeBackend, type KeptLayer } from "./backend";
import type { SetupImageRequest } from "./interface";

// The broker's side of setup images (shared/contract/setup-image.ts): it computes the key from
// what the coordinator says about a setup plus what only it knows (the backend, the work image's
// digest), lets the table arbitrate who builds (setup-images/records.ts), keeps a capture within
// the size bounds, and reads the digest a sandbox starts from itself, from the run's own
// environment's built row: no caller ever names a digest (case P3).

/** How long a build claim holds without being renewed (the coordinator renews it each step). */
export const CLAIM_LEASE_MS = 120_000;
/** The builder's lease while capturing: a large layer may take longer to read than a claim holds. */
export const CAPTURE_LEASE_MS = 15 * 60_000;
/**
 * A stored layer no row names is removed once this old: younger ones may be a capture's, stored
 * by the backend and not yet recorded.
 */
export const UNNAMED_LAYER_MS = 60 * 60_000;

/** The run as these calls need it (its row). */
export interface RunOf {
  id: string;
  environmentId: string;
  backend: BackendName;
}

const MIB = 1024 * 1024;
const mib = (bytes: number) => `${(bytes / MIB).toFixed(1).replace(/\.0$/, "")} MiB`;

/** The role of one sandbox for its setup (claimSetupImage). */
export async function claimSetupImage(
  db: Db,
  backend: ComputeBackend,
  settings: SetupImageSettings,
  run: RunOf,
  sandboxId: string,
  request: SetupImageRequest,
): Promise<SetupImageClaim> {
  if (request.setup.length === 0) return { role: "none", reason: "the sandbox has no setup commands" };
  const base = await backend.baseImage();
  if (typeof base !== "string") {
    return {
      role: "none",
      reason: base?.none ?? `the ${backend.name} backend keeps no setup images yet (no pinned work image)`,
    };
  }
  const inputs: SetupImageInputs = {
    format: SETUP_IMAGE_FORMAT,
    backend: backend.name,
    base,
    bundle: request.bundle,
    setup: request.setup,
    resources: { memoryMb: request.resources.memoryMb, pids: request.resources.pids },
  };
  const key = await setupImageKey(inputs);
  const kept = await records.environmentBytes(db, run.environmentId, key);
  if (kept >= settings.maxEnvironmentBytes) {
    const reason = `setup_images_full: the environment keeps ${mib(kept)} of setup images, its bound is ${mib(settings.maxEnvironmentBytes)} (SETUP_IMAGE_MAX_ENVIRONMENT_MB)`;
    return records.claimWithoutBuilding(
      db,
      run.environmentId,
      { key, runId: run.id, mode: request.mode },
      reason,
    );
  }
  return records.claim(db, {
    environmentId: run.environmentId,
    key,
    inputs,
    backend: backend.name,
    runId: run.id,
    sandboxId,
    mode: request.mode,
    leaseMs: CLAIM_LEASE_MS,
  });
}

/**
 * Keeps the builder's changes as the key's image, within the layer bound and the room the
 * environment has left; any failure gives the claim up (nothing is kept, and the key's waiters
 * may build it). The caller has checked the sandbox is the run's own live work sandbox.
 */
export async function captureSetupImage(
  db: Db,
  backend: ComputeBackend,
  settings: SetupImageSettings,
  run: RunOf,
  sandboxId: string,
  key: SetupImageKey,
  runCaPem: string | null = null,
): Promise<CapturedImage> {
  const held = { environmentId: run.environmentId, key, runId: run.id, sandboxId };
  if (!(await records.renew(db, { ...held, leaseMs: CAPTURE_LEASE_MS }))) {
    const repeated = await repeatedCapture(db, backend, settings, run, sandboxId, key);
    if (repeated) return repeated;
    throw new BackendError(
      "setup_image_not_found",
      `sandbox ${sandboxId} does not build setup image ${key} in the run's environment`,
    );
  }
  let captured: KeptLayer;
  try {
    const kept = await records.environmentBytes(db, run.environmentId, key);
    const room = settings.maxEnvironmentBytes - kept;
    if (room <= 0) throw fullError(settings, kept);
    try {
      captured = await backend.captureLayer(sandboxId, Math.min(settings.maxLayerBytes, room), {
        environmentId: run.environmentId,
        key,
        runCaPem,
      });
    } catch (error) {
      if (!(error instanceof BackendError && error.code === "setup_image_too_large")) throw error;
      // The agent stops at the bound it was given: say which bound that was.
      throw room < settings.maxLayerBytes
        ? fullError(settings, kept)
        : new BackendError(
            "setup_image_too_large",
            `the setup layer is larger than ${mib(settings.maxLayerBytes)} (SETUP_IMAGE_MAX_LAYER_MB); nothing was kept`,
          );
    }
  } catch (error) {
    await records.release(db, held);
    throw error;
  }
  const recorded = await records.markBuilt(db, {
    ...held,
    digest: captured.digest,
    repository: captured.repository ?? null,
    sizeBytes: captured.bytes,
    files: captured.files,
  });
  if (!recorded) {
    // Another sandbox took the key over meanwhile: this layer is nobody's (unless a row names
    // the same content), and goes now rather than at the sweep.
    const named = await records.namedDigests(db, backend.name, [captured.digest], { keptOnly: false });
    if (!named.has(captured.digest)) {
      await backend.dropLayer(captured.digest, captured.repository).catch(() => {});
    }
    throw new BackendError(
      "setup_image_not_found",
      `sandbox ${sandboxId} no longer builds setup image ${key}: another build of it was kept`,
    );
  }
  return { digest: captured.digest, bytes: captured.bytes, files: captured.files };
}

/**
 * A capture asked again after it was kept (a coordinator step replayed after a crash): the
 * builder's claim is gone, so the answer is the kept one when this run built the key and the
 * backend's repeat of this sandbox's capture (which it answers without reading again) names the
 * recorded digest; anything else is no repeat.
 */
async function repeatedCapture(
  db: Db,
  backend: ComputeBackend,
  settings: SetupImageSettings,
  run: RunOf,
  sandboxId: string,
  key: SetupImageKey,
): Promise<CapturedImage | null> {
  const built = await records.builtDigest(db, run.environmentId, key);
  if (!built || built.builtByRunId !== run.id || built.backend !== backend.name) return null;
  // No CA to check here: only a digest equal to the recorded one (checked when kept) counts.
  const target = { environmentId: run.environmentId, key, runCaPem: null };
  const again = await backend.captureLayer(sandboxId, settings.maxLayerBytes, target).catch(() => null);
  return again?.digest === built.digest ? again : null;
}

function fullError(settings: SetupImageSettings, kept: number): BackendError {
  return new BackendError(
    "setup_images_full",
    `the environment keeps ${mib(kept)} of setup images and this layer would pass its bound of ${mib(settings.maxEnvironmentBytes)} (SETUP_IMAGE_MAX_ENVIRONMENT_MB); nothing was kept`,
  );
}

/**
 * The digest a sandbox of the run starts from for the key: the run's own environment's built
 * image on the run's backend, or setup_image_not_found (another environment's, unbuilt, dropped).
 */
export async function layerOf(db: Db, run: RunOf, key: SetupImageKey): Promise<{ digest: ImageDigest }> {
  const built = await records.builtDigest(db, run.environmentId, key);
  if (!built || built.backend !== run.backend) {
    throw new BackendError("setup_image_not_found", `the run's environment has no setup image ${key}`);
  }
  return { digest: built.digest };
}

/** Setup images the reaper drops (their rows `dropping`): the backends' artifacts removed. */
export async function dropSetupImages(
  db: Db,
  backendOf: (name: string) => ComputeBackend,
  images: Array<{ backend: string; digest: string; repository?: string | null }>,
): Promise<{ dropped: string[]; inUse: string[] }> {
  const result = { dropped: [] as string[], inUse: [] as string[] };
  for (const name of new Set(images.map((i) => i.backend))) {
    const digests = [...new Set(images.filter((i) => i.backend === name).map((i) => i.digest))];
    // A registry image is in the repository its row names (local layers have none).
    const repositoryOf = (digest: string) =>
      images.find((i) => i.backend === name && i.digest === digest)?.repository ?? null;
    // Layers are stored by content: one another row still keeps stays, and its row may go.
    const kept = await records.namedDigests(db, name, digests, { keptOnly: true });
    let backend: ComputeBackend | null = null;
    for (const digest of digests) {
      if (kept.has(digest)) {
        result.dropped.push(digest);
        continue;
      }
      try {
        backend ??= backendOf(name);
        const done = await backend.dropLayer(digest, repositoryOf(digest));
        (done === "dropped" ? result.dropped : result.inUse).push(digest);
      } catch {
        // Neither: the row stays `dropping` and the reaper asks again next round.
      }
    }
  }
  return result;
}

/**
 * Removes the backend's stored layers that no row names and that are older than
 * UNNAMED_LAYER_MS (a capture whose recording lost, a rebuilt image's old layer, a crash between
 * storing and recording). Layers a live sandbox starts from stay.
 */
export async function sweepLayers(
  db: Db,
  backend: ComputeBackend,
  now: number,
): Promise<{ dropped: string[]; errors: string[] }> {
  const result = { dropped: [] as string[], errors: [] as string[] };
  let layers: Awaited<ReturnType<ComputeBackend["listLayers"]>>;
  try {
    layers = await backend.listLayers();
  } catch {
    return { dropped: [], errors: [`${backend.name}: layer list failed`] };
  }
  const named = await records.namedDigests(
    db,
    backend.name,
    layers.map((l) => l.digest),
    { keptOnly: false },
  );
  for (const layer of layers) {
    const old = now - Date.parse(layer.createdAt) >= UNNAMED_LAYER_MS;
    if (named.has(layer.digest) || layer.inUse > 0 || !old) continue;
    try {
      if ((await backend.dropLayer(layer.digest)) === "dropped") result.dropped.push(layer.digest);
    } catch {
      result.errors.push(layer.digest);
    }
  }
  return result;
}
