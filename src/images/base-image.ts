import { DIGEST, REPOSITORY } from "./registry";
import type { RegistrySettings } from "./settings";

// The base image a setup image sits on, as the broker's push (push.ts) may use it: in the
// deployment's own registry (its layers are mounted, never copied across registries), pinned by
// digest (a tag can move under a recorded image), outside the setup images' own repositories
// (a token of one environment's push never names another's: case P3), and a single-platform
// image manifest whose layers every runtime reads. Anything else is a refusal the broker turns
// into role `none`: that run's setup runs as before and nothing is kept. Pure: no I/O.

export const OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json";
export const OCI_CONFIG = "application/vnd.oci.image.config.v1+json";
export const OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip";
const DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json";

/** Layer media types a setup image keeps, each as its OCI name (Docker's gzip layer is the same bytes). */
const LAYER_TYPES: Record<string, string> = {
  "application/vnd.oci.image.layer.v1.tar": "application/vnd.oci.image.layer.v1.tar",
  [OCI_LAYER_GZIP]: OCI_LAYER_GZIP,
  "application/vnd.oci.image.layer.v1.tar+zstd": "application/vnd.oci.image.layer.v1.tar+zstd",
  "application/vnd.docker.image.rootfs.diff.tar.gzip": OCI_LAYER_GZIP,
};

export interface PinnedBase {
  repository: string;
  digest: string;
}

export interface BaseRefusal {
  why: "base_not_in_registry" | "base_not_pinned" | "base_in_cache" | "base_unsupported";
  detail: string;
}

export type BaseCheck = { ok: true; base: PinnedBase } | { ok: false; refusal: BaseRefusal };

const refuse = (why: BaseRefusal["why"], detail: string): BaseCheck => ({
  ok: false,
  refusal: { why, detail },
});

/**
 * Whether `reference` (e.g. registry.example.com/bw/work@sha256:…) can be a setup image's base.
 * The broker asks this at claim time (role none when not), and push() again before pushing.
 */
export function pinnedBase(settings: RegistrySettings, reference: string): BaseCheck {
  const slash = reference.indexOf("/");
  const host = slash > 0 ? reference.slice(0, slash) : "";
  if (host !== settings.host) {
    return refuse(
      "base_not_in_registry",
      `The work image is not in REGISTRY_URL's registry (${settings.host}): its layers cannot be mounted there.`,
    );
  }
  const [name = "", digest = "", extra] = reference.slice(slash + 1).split("@");
  if (extra !== undefined || !DIGEST.test(digest)) {
    return refuse("base_not_pinned", "The work image is not pinned by a sha256 digest (name@sha256:…).");
  }
  // A tag beside the digest says nothing a pull by digest reads.
  const repository = name.replace(/:[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/, "");
  if (!REPOSITORY.test(repository))
    return refuse("base_unsupported", "The work image's name is not a repository.");
  if (repository === settings.prefix || repository.startsWith(`${settings.prefix}/`)) {
    return refuse(
      "base_in_cache",
      `The work image is under REGISTRY_REPOSITORY_PREFIX (${settings.prefix}), where setup images live.`,
    );
  }
  return { ok: true, base: { repository, digest } };
}

export interface Descriptor {
  mediaType: string;
  digest: string;
  size: number;
}

export interface BaseManifest {
  config: Descriptor;
  /** The base's layers, media types as OCI names. */
  layers: Descriptor[];
}

export type ManifestCheck = { ok: true; manifest: BaseManifest } | { ok: false; refusal: BaseRefusal };

/** The base's manifest as a setup image reuses it: an OCI or Docker v2 image, plain layers only. */
export function baseManifest(mediaType: string, body: Uint8Array): ManifestCheck {
  const no = (detail: string): ManifestCheck => ({ ok: false, refusal: { why: "base_unsupported", detail } });
  let json: { mediaType?: unknown; config?: unknown; layers?: unknown };
  try {
    json = JSON.parse(new TextDecoder().decode(body));
  } catch {
    return no("The work image's manifest is not JSON.");
  }
  const type = typeof json.mediaType === "string" ? json.mediaType : mediaType;
  if (type !== OCI_MANIFEST && type !== DOCKER_MANIFEST) {
    return no(`The work image's manifest is ${JSON.stringify(type)}: pin one platform's image manifest.`);
  }
  const config = descriptor(json.config);
  const layers = Array.isArray(json.layers) ? json.layers.map(descriptor) : [];
  if (!config || layers.length === 0 || layers.some((l) => l === null)) {
    return no("The work image's manifest has no config or layers.");
  }
  const kept: Descriptor[] = [];
  for (const layer of layers as Descriptor[]) {
    const oci = LAYER_TYPES[layer.mediaType];
    if (!oci) return no(`The work image has a ${JSON.stringify(layer.mediaType)} layer.`);
    kept.push({ ...layer, mediaType: oci });
  }
  return { ok: true, manifest: { config, layers: kept } };
}

function descriptor(value: unknown): Descriptor | null {
  const d = value as { mediaType?: unknown; digest?: unknown; size?: unknown } | null;
  if (
    typeof d?.mediaType !== "string" ||
    typeof d.digest !== "string" ||
    !DIGEST.test(d.digest) ||
    typeof d.size !== "number" ||
    !Number.isSafeInteger(d.size) ||
    d.size < 0
  ) {
    return null;
  }
  return { mediaType: d.mediaType, digest: d.digest, size: d.size };
}
