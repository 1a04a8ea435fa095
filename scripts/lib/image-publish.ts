import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { buildah, tail } from "../../local-agent/buildah";

// A built image's size, and its push to a registry (`npm run images -- --push <registry>`):
// <registry>/<name>:sha256-<image id>, a tag named by the image's content (its config digest),
// so that a tag never moves to other content and pushing the same build again changes nothing;
// what to deploy is the reference by the manifest's digest that the registry now holds, which
// this returns (the Kubernetes objects and SANDBOX0_PROXY_IMAGE pin images that way). buildah
// pushes with the credentials of the usual containers auth file (REGISTRY_AUTH_FILE, else
// `buildah login`'s): none pass through here. Plain HTTP only to a loopback registry, as Docker
// allows; any other registry must speak TLS with a certificate this machine trusts.

// A registry host (name, IPv4 or [IPv6], optional port) and an optional repository path under it.
const HOST = String.raw`(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?(?:\.[a-z0-9](?:[a-z0-9-]*[a-z0-9])?)*|\[[0-9a-f:]+\])(?::\d{1,5})?`;
const PATH = String.raw`(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*`;
const REGISTRY = new RegExp(`^${HOST}${PATH}$`);
const LOOPBACK = /^(?:localhost|127(?:\.\d{1,3}){3}|\[::1\])(?::\d+)?$/;

/** `value` as a push destination, or why it is not one. */
export function parseRegistry(value: string): { registry: string } | { error: string } {
  const registry = value.replace(/\/+$/, "");
  if (!REGISTRY.test(registry)) {
    return {
      error: `not a registry: "${value}" (a host with an optional port and path, lower case, e.g. registry.example.com/benchwright or 127.0.0.1:5000)`,
    };
  }
  return { registry };
}

/** The repository a local image goes to: localhost/benchwright-proxy → <registry>/benchwright-proxy. */
export const repositoryFor = (registry: string, localTag: string) =>
  `${registry}/${localTag.replace(/^localhost\//, "")}`;

interface StoredImage {
  FromImageID?: string;
  Manifest?: string;
}

async function inspect(ref: string): Promise<StoredImage | null> {
  const r = await buildah(["inspect", "--type", "image", ref]);
  return r.code === 0 ? (JSON.parse(r.stdout) as StoredImage) : null;
}

/**
 * The image's size as the store holds it, in bytes: its layers uncompressed (what `buildah
 * images` shows, and what a node has on disk once it pulled the image). Null when absent.
 */
export async function imageBytes(ref: string): Promise<number | null> {
  const manifest = (await inspect(ref))?.Manifest;
  if (!manifest) return null;
  const { layers } = JSON.parse(manifest) as { layers?: Array<{ size: number }> };
  return (layers ?? []).reduce((sum, layer) => sum + layer.size, 0);
}

/** Bytes as `docker images` and `buildah images` print them: decimal megabytes. */
export const megabytes = (bytes: number) => `${(bytes / 1e6).toFixed(1)} MB`;

export type Push =
  | { ok: true; repository: string; tag: string; digest: string; reference: string }
  | { ok: false; error: string };

/** Pushes the local image `localTag` to its repository under `registry`, tagged by its content. */
export async function pushImage(localTag: string, registry: string): Promise<Push> {
  const id = (await inspect(localTag))?.FromImageID;
  if (!id || !/^[0-9a-f]{64}$/.test(id)) return { ok: false, error: `${localTag} is not in the image store` };
  const repository = repositoryFor(registry, localTag);
  const tag = `sha256-${id}`;
  const host = registry.split("/")[0] as string;
  const dir = mkdtempSync(join(tmpdir(), "bw-push-"));
  try {
    const digestFile = join(dir, "digest");
    const r = await buildah([
      "push",
      "--quiet",
      "--digestfile",
      digestFile,
      ...(LOOPBACK.test(host) ? ["--tls-verify=false"] : []),
      localTag,
      `docker://${repository}:${tag}`,
    ]);
    if (r.code !== 0) return { ok: false, error: tail(r) };
    const digest = readFileSync(digestFile, "utf8").trim();
    if (!/^sha256:[0-9a-f]{64}$/.test(digest))
      return { ok: false, error: `buildah push wrote no digest (${digest})` };
    return { ok: true, repository, tag, digest, reference: `${repository}@${digest}` };
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}
