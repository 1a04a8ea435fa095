import { startInlineArgs } from "@benchwright/shared/contract/exec-runner";
import type { ImageDigest } from "@benchwright/shared/contract/setup-image";
import { Sandbox, Template } from "e2b";
import { pullPassword } from "../../images/pull-credential";
import { BackendError, type KeptLayer, type LayerTarget } from "../backend";
import {
  checkLayerExit,
  checkRepository,
  READ_BOUND,
  registrySetupImages,
  type SetupRegistry,
} from "../registry-images";
import { type E2bEnv, META, TRANSFER_DEADLINE_MS } from "./config";
import type { e2bSandboxes } from "./sandboxes";
import { runnerCommand } from "./shell";

// Setup images on E2B (issue 34; docs/e2b.md, *Setup images*): the same OCI images in the
// deployment's registry as sandbox0's (registry-images.ts), and per image an E2B template built
// from it by digest, which a later sandbox starts from.
//
// - The base is E2B_WORK_IMAGE (the image the work template is built from), pinned by digest in
//   REGISTRY_URL's registry; anything else answers why, and every claim is `none`.
// - Capture: after seal, `bw-layer` (root, through the runner) writes the working directory
//   /home/sandbox as a tar to a root-only file, read back through envd's files API; then the
//   shared capture rules and push. Only the working directory is kept: what setup changed in the
//   root filesystem is not (docs/e2b.md says so).
// - The template is built at capture, before the capture answers, so a built row always has its
//   template: `fromImage(<host>/<environment's repository>@<digest>)` with the environment's own
//   pull credential (the realm gives it that repository's pull and nothing else), named for the
//   deployment, environment and digest (templateName), so nothing new is stored for it.
// - Start: the sandbox is created from that template by name; E2B not knowing it is
//   setup_image_missing (the broker forgets the row and it is built again: case P6).

/** The working directory of every backend, the layer's only content. */
const WORKDIR = "/home/sandbox";
/** Image uids kept as they are (root's files, the execute user's). */
const IMAGE_UIDS = { executeUid: null, uidBase: 0, uidCount: 65_536 };
/**
 * E2B's template build takes minutes; the capture waits for it up to this, which leaves the read
 * and the push room inside the builder's capture lease (broker/setup-images.ts CAPTURE_LEASE_MS).
 */
const BUILD_DEADLINE_MS = 10 * 60_000;
/** The prefix of every setup image template's name (listLayers' and an operator's filter). */
export const TEMPLATE_PREFIX = "bw-setup-";

// $1 dir, $2 max bytes, $3 max files, $4 the tar's name, in root's own directory: an earlier tar
// is removed first, so a sandbox keeps at most one.
const LAYER_SCRIPT =
  'd="$HOME/.bw-layer"; mkdir -p -m 0700 -- "$d" && rm -f -- "$d"/layer-*.tar && exec bw-layer "$1" --max-bytes "$2" --max-files "$3" > "$d/$4"';

/** The template of a setup image: one per deployment, environment and digest. */
export async function templateName(deployment: string, environmentId: string, digest: string) {
  const bytes = new TextEncoder().encode(`${deployment}\n${environmentId}\n${digest}`);
  const hash = new Uint8Array(await crypto.subtle.digest("SHA-256", bytes));
  return `${TEMPLATE_PREFIX}${[...hash.slice(0, 16)].map((b) => b.toString(16).padStart(2, "0")).join("")}`;
}

export function e2bSetupImages(
  config: E2bEnv,
  registry: SetupRegistry,
  box: ReturnType<typeof e2bSandboxes>,
) {
  const images = registrySetupImages(registry, "e2b", { at: WORKDIR.slice(1), uids: IMAGE_UIDS });
  const workImage = config.E2B_WORK_IMAGE ?? "";

  /**
   * Refused not_sealed while the setup stage may still write: the runner's own answer, a
   * setup-stage start of `true` it refuses once sealed (before seal the probe runs, harmlessly).
   */
  async function checkSealed(sandboxId: string): Promise<void> {
    const probe = startInlineArgs(
      `bw_seal_probe_${crypto.randomUUID().replaceAll("-", "")}`,
      ["true"],
      10_000,
      0,
      {
        setup: true,
      },
    );
    try {
      await box.runner(sandboxId, runnerCommand(probe), "check the setup stage is sealed", { user: "root" });
    } catch (e) {
      if (e instanceof BackendError && e.code === "sealed") return;
      throw e;
    }
    throw new BackendError("not_sealed", `sandbox ${sandboxId}: the setup stage has not been sealed`);
  }

  async function readTar(sandboxId: string, maxBytes: number): Promise<Uint8Array> {
    const h = await box.workSandbox(sandboxId, "a capture");
    if (h.meta[META.capture] !== "true") {
      throw new BackendError("invalid_request", `sandbox ${sandboxId} was not made to build a setup image`);
    }
    await checkSealed(sandboxId);
    const bound = Math.min(maxBytes, READ_BOUND.maxBytes);
    const name = `layer-${crypto.randomUUID()}.tar`;
    const argv = [
      "sh",
      "-c",
      LAYER_SCRIPT,
      "bw-layer",
      WORKDIR,
      String(bound),
      String(READ_BOUND.maxFiles),
      name,
    ];
    const done = await box.runToEnd(sandboxId, argv, "read the working directory", {
      user: "root",
      deadlineMs: TRANSFER_DEADLINE_MS,
    });
    const why = box.scrub(box.lastLine(done.stderr) || `exit ${done.exitCode ?? done.signal}`);
    checkLayerExit(done.exitCode, why, { backend: "e2b", sandboxId, bound, maxBytes });
    // Root's file, read as root (relative: root's home); it goes with the builder, or at the next capture.
    const file = `.bw-layer/${name}`;
    const tar = await box.call("read the working directory's tar", () =>
      box.withSandbox(sandboxId, (s) =>
        s.files.read(file, { format: "bytes", user: "root", requestTimeoutMs: TRANSFER_DEADLINE_MS }),
      ),
    );
    return tar;
  }

  /** Builds the image's template (the same size as the builder's) and waits until it is ready. */
  async function buildTemplate(
    kept: Required<KeptLayer>,
    environmentId: string,
    size: { cpuCount: number; memoryMB: number },
  ) {
    const settings = await images.settingsFor("building a setup image's template");
    const name = await templateName(box.deployment, environmentId, kept.digest);
    const password = await pullPassword(registry.signingKeyText, environmentId);
    box.hide([config.E2B_API_KEY, password]);
    // Named by digest in the environment's own repository, never by tag; the credential pulls
    // that repository only (routes/registry-token.ts). User and workdir as the work template ends.
    const template = Template({ fileContextPath: "." })
      .fromImage(`${settings.host}/${kept.repository}@${kept.digest}`, {
        username: environmentId,
        password,
      })
      .setUser("user")
      .setWorkdir("/home/user");
    await box.call("build the setup image's template", () =>
      Template.build(template, name, {
        ...box.opts,
        cpuCount: size.cpuCount,
        memoryMB: size.memoryMB,
        signal: AbortSignal.timeout(BUILD_DEADLINE_MS),
      }),
    );
  }

  return {
    baseImage: () => images.baseImage("E2B_WORK_IMAGE", workImage),

    async captureLayer(sandboxId: string, maxBytes: number, target: LayerTarget): Promise<KeptLayer> {
      await images.settingsFor("keeping a setup image");
      const tar = await readTar(sandboxId, maxBytes);
      const kept = await images.keep(tar, maxBytes, target, workImage);
      const h = await box.resolve(sandboxId);
      const info = await box.call("read the sandbox", () => Sandbox.getInfo(h.e2bId, box.opts));
      try {
        await buildTemplate(kept, target.environmentId, info);
      } catch (e) {
        // No row will name the pushed image: it goes with its template.
        await images.dropManifest(kept.digest, kept.repository).catch(() => {});
        throw e;
      }
      return kept;
    },

    /** The template a sandbox started from this image is created from. */
    startFrom: (layer: { digest: ImageDigest; environmentId: string }) =>
      templateName(box.deployment, layer.environmentId, layer.digest),

    /** Deletes the image's template, then its manifest. */
    async dropLayer(digest: string, repository?: string | null): Promise<"dropped"> {
      const settings = await images.settingsFor("dropping a setup image");
      if (!repository) return "dropped"; // never pushed anywhere
      const environmentId = checkRepository(settings, repository);
      const name = await templateName(box.deployment, environmentId, digest);
      // DELETE /templates/{templateID} (a name or an id), the SDK's one call of it being
      // deleteSnapshot (a snapshot is a template on E2B); false: already gone.
      await box.call("delete the setup image's template", () => Sandbox.deleteSnapshot(name, box.opts));
      await images.dropManifest(digest, repository);
      return "dropped";
    },
  };
}
