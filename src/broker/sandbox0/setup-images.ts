import type { ImageDigest } from "@benchwright/shared/contract/setup-image";
import { pullPassword } from "../../images/pull-credential";
import { setupRepository } from "../../images/push";
import { registryClient } from "../../images/registry";
import { BackendError, type KeptLayer, type LayerTarget } from "../backend";
import {
  CAPTURE_ANNOTATION,
  CONTAINERS,
  objectName,
  POD_PATHS,
  pullSecret,
  pullSecretName,
} from "../kubernetes/manifests";
import {
  checkLayerExit,
  READ_BOUND,
  registrySetupImages,
  type SetupRegistry,
  TAR_BOUND,
} from "../registry-images";
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

/** Image uids kept as they are (root's files, the pod's uid 10001's, any setup chowned to). */
const POD_UIDS = { executeUid: null, uidBase: 0, uidCount: 65_536 };

export function sandbox0SetupImages(
  config: Sandbox0Env,
  registry: SetupRegistry,
  cluster: ReturnType<typeof sandbox0Pods>,
) {
  const images = registrySetupImages(registry, "sandbox0", { at: POD_PATHS.home.slice(1), uids: POD_UIDS });

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
    checkLayerExit(res.exitCode, why, { backend: "sandbox0", sandboxId, bound, maxBytes });
    return res.stdout;
  }

  return {
    baseImage: () => images.baseImage("SANDBOX0_WORK_IMAGE", config.SANDBOX0_WORK_IMAGE),

    async captureLayer(sandboxId: string, maxBytes: number, target: LayerTarget): Promise<KeptLayer> {
      cluster.checkId(sandboxId);
      await images.settingsFor("keeping a setup image");
      const tar = await readTar(sandboxId, maxBytes);
      return images.keep(tar, maxBytes, target, config.SANDBOX0_WORK_IMAGE);
    },

    /**
     * What a pod started from a setup image needs: the image by digest in the environment's own
     * repository (checked there first), and the environment's pull Secret (made or rewritten).
     */
    async startFrom(layer: { digest: ImageDigest; environmentId: string }) {
      const settings = await images.settingsOr();
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
      await images.settingsFor("dropping a setup image");
      if (!repository) return "dropped"; // never pushed anywhere
      await images.dropManifest(digest, repository);
      return "dropped";
    },
  };
}
