import { captureLayer, LayerRefusal } from "@benchwright/shared/archive/layer";
import { ImageDigest, LAYER_EXIT } from "@benchwright/shared/contract/setup-image";
import { ConfigError } from "../../config";
import { pinnedBase } from "../../images/base-image";
import { loadRegistrySettings } from "../../images/config";
import { pullPassword } from "../../images/pull-credential";
import { pushSetupImage, setupRepository } from "../../images/push";
import { hex, registryClient } from "../../images/registry";
import type { RegistrySettings } from "../../images/settings";
import { mintRegistryToken } from "../../images/token";
import { BackendError, type KeptLayer, type LayerTarget } from "../backend";
import {
  CAPTURE_ANNOTATION,
  CONTAINERS,
  objectName,
  POD_PATHS,
  pullSecret,
  pullSecretName,
} from "../kubernetes/manifests";
import type { Sandbox0Env } from "./config";
import { lastLine, type sandbox0Pods, TRANSFER_MS } from "./pods";

// Setup images on sandbox0 (issue 34; docs/sandbox0.md, *Setup images*): OCI images in the
// deployment's registry, the work image plus one layer, started by digest.
//
// - The base is SANDBOX0_WORK_IMAGE, pinned by digest in REGISTRY_URL's registry (pinnedBase);
//   anything else answers why, and every claim is `none`.
// - Capture: after seal, `bw-layer` in the pod's `work` container writes the working directory
//   (the one volume setup shares with the execute stage; setup's own root filesystem never reaches
//   execute here) as a tar. The broker runs it through the capture rules (shared/archive/layer.ts:
//   the same refusals, LAYER_EXCLUDED) under `home/sandbox/`, twice: once for the layer's sha256
//   (its diff_id) and size, once into the push (images/push.ts). The pod's tar is held in memory
//   meanwhile, so it is bounded here (READ_BOUND), whatever SETUP_IMAGE_MAX_LAYER_MB says.
// - Start: the pod's image is `<host>/<environment's repository>@<manifest digest>`, checked in
//   the registry first (gone: setup_image_missing, so the broker forgets it and it is rebuilt);
//   the kubelet pulls it with the environment's pull Secret through the realm
//   (routes/registry-token.ts), pull-only and for that repository alone.

/** What one capture reads from the pod into the broker's memory. */
export const READ_BOUND = { maxBytes: 40 * 1024 * 1024, maxFiles: 16_000 };
/** The tar of READ_BOUND: the files, and a header, pax record and padding each (≤ 2 KiB). */
const TAR_BOUND = READ_BOUND.maxBytes + READ_BOUND.maxFiles * 2048 + 1024 * 1024;
/** Image uids kept as they are (root's files, the pod's uid 10001's, any setup chowned to). */
const POD_UIDS = { executeUid: null, uidBase: 0, uidCount: 65_536 };
const MIB = 1024 * 1024;

/** What the backend needs of the registry: its settings, and the pull credentials' key. */
export interface Sandbox0Registry {
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
export function registryFromEnv(env: RegistryEnv): Sandbox0Registry {
  return {
    settings: () => (env.REGISTRY_URL ? loadRegistrySettings(env as never) : Promise.resolve(null)),
    signingKeyText: typeof env.REGISTRY_SIGNING_KEY === "string" ? env.REGISTRY_SIGNING_KEY : "",
  };
}

export function sandbox0SetupImages(
  config: Sandbox0Env,
  registry: Sandbox0Registry,
  cluster: ReturnType<typeof sandbox0Pods>,
) {
  /** The registry's settings, or why this deployment keeps no setup images on sandbox0. */
  async function settingsOr(): Promise<RegistrySettings | { none: string }> {
    try {
      const settings = await registry.settings();
      if (settings) return settings;
      return { none: "REGISTRY_URL is empty: sandbox0 keeps setup images in the deployment's registry" };
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

  /** The work pod's working directory as the capture rules keep it; its sha256 is the diff_id. */
  function layerOf(tar: Uint8Array, runCaPem: string | null) {
    return captureLayer([{ at: POD_PATHS.home.slice(1), tar: new Blob([tar]).stream() }], {
      ...POD_UIDS,
      runCaPem,
    });
  }

  async function readTar(sandboxId: string, maxBytes: number): Promise<Uint8Array> {
    const pod = await cluster.workPodOf(sandboxId);
    if (pod.metadata?.annotations?.[CAPTURE_ANNOTATION] !== "true") {
      throw new BackendError("invalid_request", `sandbox ${sandboxId} was not made to build a setup image`);
    }
    if (!cluster.containerOf(pod, CONTAINERS.setup)?.state?.terminated) {
      throw new BackendError("not_sealed", `sandbox ${sandboxId}: the setup stage has not been sealed`);
    }
    const bound = Math.min(maxBytes, READ_BOUND.maxBytes);
    const res = await cluster.kube.execBytes(
      objectName(sandboxId),
      CONTAINERS.work,
      [
        POD_PATHS.layer,
        POD_PATHS.home,
        "--max-bytes",
        String(bound),
        "--max-files",
        String(READ_BOUND.maxFiles),
      ],
      { timeoutMs: TRANSFER_MS, maxStdoutBytes: TAR_BOUND },
      { what: "read the working directory", notFound: "not_found" },
    );
    const why = (lastLine(res.stderr) || `exit ${res.exitCode}`).slice(0, 400);
    if (res.exitCode === LAYER_EXIT.tooLarge) {
      if (bound < maxBytes) {
        // The backend's own bound, not the deployment's: a setting cannot lift it.
        throw new BackendError(
          "setup_image_unsupported",
          `the working directory is over what the sandbox0 backend reads in one piece (${READ_BOUND.maxBytes / MIB} MiB of files, ${READ_BOUND.maxFiles} entries): ${why}`,
        );
      }
      throw new BackendError("setup_image_too_large", `sandbox ${sandboxId}: ${why}`);
    }
    if (res.exitCode === LAYER_EXIT.refused) {
      throw new BackendError("setup_image_unsupported", `sandbox ${sandboxId}: bw-layer: ${why}`);
    }
    if (res.exitCode !== LAYER_EXIT.ok) {
      throw new BackendError("sandbox_failed", `sandbox ${sandboxId}: bw-layer: ${why}`);
    }
    return res.stdout;
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
    async baseImage(): Promise<string | { none: string }> {
      const settings = await settingsOr();
      if ("none" in settings) return settings;
      const checked = pinnedBase(settings, config.SANDBOX0_WORK_IMAGE);
      if (!checked.ok) return { none: `SANDBOX0_WORK_IMAGE: ${checked.refusal.detail}` };
      return checked.base.digest;
    },

    async captureLayer(sandboxId: string, maxBytes: number, target: LayerTarget): Promise<KeptLayer> {
      cluster.checkId(sandboxId);
      const settings = await settingsFor("keeping a setup image");
      const tar = await readTar(sandboxId, maxBytes);
      const { diffId, bytes, files } = await measure(tar, target.runCaPem, maxBytes);
      const pushed = await pushSetupImage(settings, {
        // The same tar through the same rules: the same bytes, which the push checks against diffId.
        layer: { tar: layerOf(tar, target.runCaPem).layer, diffId },
        base: config.SANDBOX0_WORK_IMAGE,
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

    /**
     * What a pod started from a setup image needs: the image by digest in the environment's own
     * repository (checked there first), and the environment's pull Secret (made or rewritten).
     */
    async startFrom(layer: { digest: ImageDigest; environmentId: string }) {
      const settings = await settingsOr();
      if ("none" in settings) {
        throw new BackendError("setup_image_missing", `setup image ${layer.digest}: ${settings.none}`);
      }
      const repository = setupRepository(settings, layer.environmentId);
      const seen = await registryClient(settings).manifest(repository, layer.digest);
      if (!seen.ok) {
        const unreachable = seen.error.code === "registry_unreachable";
        throw new BackendError(
          unreachable ? "backend_unreachable" : "backend_error",
          `reading setup image ${layer.digest}: ${seen.error.detail}`,
          unreachable,
        );
      }
      if (!seen.value.found) {
        throw new BackendError("setup_image_missing", `the registry has no setup image ${layer.digest}`);
      }
      if (seen.value.digest !== layer.digest) {
        throw new BackendError("setup_image_mismatch", `the registry's ${layer.digest} is other bytes`);
      }
      const secret = pullSecret({
        ns: cluster.ns,
        environmentId: layer.environmentId,
        registryHost: settings.host,
        password: await pullPassword(registry.signingKeyText, layer.environmentId),
      });
      const meaning = { what: "store the environment's pull credential" };
      // Rewritten when it exists: a rotated REGISTRY_SIGNING_KEY changes the password.
      if ((await cluster.kube.create("secrets", secret, meaning)) === null) {
        await cluster.kube.replace("secrets", secret.metadata.name, secret, meaning);
      }
      return {
        image: `${settings.host}/${repository}@${layer.digest}`,
        pullSecret: pullSecretName(layer.environmentId),
      };
    },

    /** Deletes the image's manifest by digest (its blobs go at the registry's garbage collection). */
    async dropLayer(digest: string, repository?: string | null): Promise<"dropped"> {
      const settings = await settingsFor("dropping a setup image");
      if (!repository) return "dropped"; // never pushed anywhere
      if (!repository.startsWith(`${settings.prefix}/`) || !repository.endsWith("/setup")) {
        throw new BackendError("invalid_request", `${repository} is not a setup images repository`);
      }
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
      if (res.status === 202 || res.status === 404) return "dropped";
      throw new BackendError("backend_error", `the registry answered ${res.status} to deleting ${digest}`);
    },
  };
}
