import { captureLayer, LayerRefusal } from "@benchwright/shared/archive/layer";
import { ImageDigest, LAYER_EXIT } from "@benchwright/shared/contract/setup-image";
import { ConfigError } from "../config";
import { pinnedBase } from "../images/base-image";
import { loadRegistrySettings } from "../images/config";
import { pushSetupImage } from "../images/push";
import { hex } from "../images/registry";
import type { RegistrySettings } from "../images/settings";
import { mintRegistryToken } from "../images/token";
import { BackendError, type KeptLayer, type LayerTarget } from "./backend";

// What the registry backends (sandbox0, e2b) share of setup images (docs/image-cache.md): the
// deployment's registry settings (or why there are none), the base as a pinned digest, a
// working directory's tar (bw-layer's, read from a sandbox) run through the capture rules
// (shared/archive/layer.ts) twice, once for the layer's sha256 (its diff_id) and size, once into
// the push to the environment's repository (images/push.ts), and the drop of a manifest.

/**
 * What one capture reads from a sandbox into the broker's memory (the tar is held there between
 * the two passes), whatever SETUP_IMAGE_MAX_LAYER_MB says.
 */
export const READ_BOUND = { maxBytes: 40 * 1024 * 1024, maxFiles: 16_000 };
/** The tar of READ_BOUND: the files, and a header, pax record and padding each (≤ 2 KiB). */
export const TAR_BOUND = READ_BOUND.maxBytes + READ_BOUND.maxFiles * 2048 + 1024 * 1024;

/**
 * bw-layer's exit code as the capture's answer: ok, or the BackendError it means. Past `bound`
 * below the deployment's maxBytes is the backend's own read bound, which no setting lifts.
 */
export function checkLayerExit(
  exitCode: number | null,
  why: string,
  o: { backend: string; sandboxId: string; bound: number; maxBytes: number },
): void {
  if (exitCode === LAYER_EXIT.tooLarge) {
    if (o.bound < o.maxBytes) {
      throw new BackendError(
        "setup_image_unsupported",
        `the working directory is over what the ${o.backend} backend reads in one piece (${READ_BOUND.maxBytes / 1024 / 1024} MiB of files, ${READ_BOUND.maxFiles} entries): ${why}`,
      );
    }
    throw new BackendError("setup_image_too_large", `sandbox ${o.sandboxId}: ${why}`);
  }
  if (exitCode === LAYER_EXIT.refused) {
    throw new BackendError("setup_image_unsupported", `sandbox ${o.sandboxId}: bw-layer: ${why}`);
  }
  if (exitCode !== LAYER_EXIT.ok) {
    throw new BackendError("sandbox_failed", `sandbox ${o.sandboxId}: bw-layer: ${why}`);
  }
}

/** What a registry backend needs of the registry: its settings, and the pull credentials' key. */
export interface SetupRegistry {
  settings(): Promise<RegistrySettings | null>;
  /** REGISTRY_SIGNING_KEY's text (images/pull-credential.ts derives the pull passwords from it). */
  signingKeyText: string;
}

/** The Worker's registry settings (images/config.ts parses them). */
export type RegistryEnv = Partial<
  Record<
    | "REGISTRY_URL"
    | "REGISTRY_SIGNING_KEY"
    | "REGISTRY_SERVICE"
    | "REGISTRY_ISSUER"
    | "REGISTRY_REPOSITORY_PREFIX",
    unknown
  >
>;

/** The registry as the Worker's env configures it (REGISTRY_URL empty: none). */
export function registryFromEnv(env: RegistryEnv): SetupRegistry {
  return {
    settings: () => (env.REGISTRY_URL ? loadRegistrySettings(env as never) : Promise.resolve(null)),
    signingKeyText: typeof env.REGISTRY_SIGNING_KEY === "string" ? env.REGISTRY_SIGNING_KEY : "",
  };
}

/** Where the working directory's tar goes in the layer, and the image uids kept as they are. */
export interface LayerPlace {
  /** The working directory, relative to the image's root (`home/sandbox`). */
  at: string;
  uids: { executeUid: number | null; uidBase: number; uidCount: number };
}

export function registrySetupImages(registry: SetupRegistry, backend: string, place: LayerPlace) {
  /** The registry's settings, or why this deployment keeps no setup images on this backend. */
  async function settingsOr(): Promise<RegistrySettings | { none: string }> {
    try {
      const settings = await registry.settings();
      if (settings) return settings;
      return { none: `REGISTRY_URL is empty: ${backend} keeps setup images in the deployment's registry` };
    } catch (e) {
      if (e instanceof ConfigError) return { none: `the registry settings are invalid: ${e.message}` };
      throw e;
    }
  }

  async function settingsFor(what: string): Promise<RegistrySettings> {
    const settings = await settingsOr();
    if ("none" in settings) throw new BackendError("not_supported", `${what}: ${settings.none}`);
    return settings;
  }

  /** The working directory as the capture rules keep it; its sha256 is the diff_id. */
  function layerOf(tar: Uint8Array, runCaPem: string | null) {
    return captureLayer([{ at: place.at, tar: new Blob([tar]).stream() }], { ...place.uids, runCaPem });
  }

  /** The layer's sha256, size and entries: the first of the two passes. */
  async function measure(tar: Uint8Array, runCaPem: string | null, maxBytes: number) {
    const made = layerOf(tar, runCaPem);
    const sink = new crypto.DigestStream("SHA-256");
    const writer = sink.getWriter();
    let bytes = 0;
    try {
      const reader = made.layer.getReader();
      for (let next = await reader.read(); !next.done; next = await reader.read()) {
        bytes += next.value.byteLength;
        if (bytes > maxBytes) {
          await reader.cancel();
          throw new BackendError(
            "setup_image_too_large",
            `the setup layer is larger than ${maxBytes} bytes; nothing was kept`,
          );
        }
        await writer.write(next.value);
      }
    } catch (e) {
      if (e instanceof LayerRefusal) throw new BackendError(e.code, e.message);
      throw e;
    }
    await writer.close();
    const diffId = ImageDigest.parse(`sha256:${hex(new Uint8Array(await sink.digest))}`);
    return { diffId, bytes, files: made.files() };
  }

  return {
    settingsOr,
    settingsFor,

    /** The base's digest: `workImage` (the setting `name`) pinned in REGISTRY_URL's registry. */
    async baseImage(name: string, workImage: string): Promise<string | { none: string }> {
      const settings = await settingsOr();
      if ("none" in settings) return settings;
      const checked = pinnedBase(settings, workImage);
      if (!checked.ok) return { none: `${name}: ${checked.refusal.detail}` };
      return checked.base.digest;
    },

    /** The working directory's tar, through the capture rules, pushed onto `base` (tag = key). */
    async keep(
      tar: Uint8Array,
      maxBytes: number,
      target: LayerTarget,
      base: string,
    ): Promise<Required<KeptLayer>> {
      const settings = await settingsFor("keeping a setup image");
      const { diffId, bytes, files } = await measure(tar, target.runCaPem, maxBytes);
      const pushed = await pushSetupImage(settings, {
        // The same tar through the same rules: the same bytes, which the push checks against diffId.
        layer: { tar: layerOf(tar, target.runCaPem).layer, diffId },
        base,
        environmentId: target.environmentId,
        key: target.key,
      });
      if (!pushed.ok) {
        if ("refusal" in pushed) {
          throw new BackendError("setup_image_unsupported", `the work image: ${pushed.refusal.detail}`);
        }
        const unreachable = pushed.error.code === "registry_unreachable";
        throw new BackendError(
          unreachable ? "backend_unreachable" : "backend_error",
          `pushing the setup image: ${pushed.error.detail}`,
          unreachable,
        );
      }
      return {
        digest: ImageDigest.parse(pushed.value.digest),
        bytes,
        files,
        repository: pushed.value.repository,
      };
    },

    /** Deletes the image's manifest by digest (its blobs go at the registry's garbage collection). */
    async dropManifest(digest: string, repository: string): Promise<void> {
      const settings = await settingsFor("dropping a setup image");
      checkRepository(settings, repository);
      ImageDigest.parse(digest);
      const { token } = await mintRegistryToken(settings.signingKey, {
        issuer: settings.issuer,
        service: settings.service,
        subject: "benchwright-broker",
        access: [{ type: "repository", name: repository, actions: ["delete"] }],
        ttlSeconds: 60,
      });
      let res: Response;
      try {
        res = await fetch(`${settings.url}/v2/${repository}/manifests/${digest}`, {
          method: "DELETE",
          headers: { authorization: `Bearer ${token}` },
          redirect: "manual",
          signal: AbortSignal.timeout(10_000),
        });
      } catch {
        throw new BackendError("backend_unreachable", "the registry did not answer a delete", true);
      }
      await res.body?.cancel();
      if (res.status === 202 || res.status === 404) return;
      throw new BackendError("backend_error", `the registry answered ${res.status} to deleting ${digest}`);
    },
  };
}

/** The environment a setup images repository (`<prefix>/<environmentId>/setup`) belongs to. */
export function checkRepository(settings: RegistrySettings, repository: string): string {
  const environmentId = repository.startsWith(`${settings.prefix}/`)
    ? repository.slice(settings.prefix.length + 1, -"/setup".length)
    : "";
  if (!repository.endsWith("/setup") || environmentId === "" || environmentId.includes("/")) {
    throw new BackendError("invalid_request", `${repository} is not a setup images repository`);
  }
  return environmentId;
}
