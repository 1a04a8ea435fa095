import { env } from "cloudflare:workers";
import { inject } from "vitest";
import { loadRegistrySettings } from "../../src/images/config";
import type { RegistrySettings } from "../../src/images/settings";
import { mintRegistryToken, type RegistryAccess } from "../../src/images/token";
import type { RealRegistryInfo } from "../setup/registry-info";

// The suite's real registry (test/setup/registry.ts: distribution 2.8 with token auth) as the
// workerd tests use it: the Worker's bindings pointing at it, tokens the test mints with the key
// it trusts, and a small base work image pushed by the test itself.

export const realRegistry = inject("realRegistry");
export const realRegistryMissing = inject("realRegistryMissing");
if (realRegistryMissing) console.warn(`real registry tests skipped: ${realRegistryMissing}`);

export const PREFIX = "bw-cache";
export const BASE_REPOSITORY = "bw-images/work";

/** The Worker's bindings with REGISTRY_* set for `info`. */
export function registryEnv(info: RealRegistryInfo): Env {
  return {
    ...env,
    REGISTRY_URL: info.url,
    REGISTRY_SIGNING_KEY: info.signingKey,
    REGISTRY_SERVICE: info.service,
    REGISTRY_ISSUER: info.issuer,
    REGISTRY_REPOSITORY_PREFIX: PREFIX,
  };
}

export async function registrySettings(info: RealRegistryInfo): Promise<RegistrySettings> {
  const settings = await loadRegistrySettings(registryEnv(info));
  if (!settings) throw new Error("REGISTRY_URL is set: settings expected");
  return settings;
}

/** A token as the registry's trusted issuer would mint it (the test's, never the broker's). */
export async function testToken(settings: RegistrySettings, access: RegistryAccess[]): Promise<string> {
  const minted = await mintRegistryToken(settings.signingKey, {
    issuer: settings.issuer,
    service: settings.service,
    subject: "registry-test",
    access,
    ttlSeconds: 120,
  });
  return minted.token;
}

/** The calls the realm recorder saw: none, when nothing asked the realm for a token. */
export async function realmCalls(info: RealRegistryInfo): Promise<unknown[]> {
  return (await fetch(info.realmCalls)).json();
}

export function registryFetch(
  info: RealRegistryInfo,
  method: string,
  path: string,
  token: string | null,
  body?: Uint8Array | string,
  headers: Record<string, string> = {},
): Promise<Response> {
  return fetch(new URL(path, info.url), {
    method,
    headers: { ...headers, ...(token ? { authorization: `Bearer ${token}` } : {}) },
    ...(body === undefined ? {} : { body }),
    redirect: "manual",
  });
}

const utf8 = (text: string) => new TextEncoder().encode(text);
const hex = (bytes: Uint8Array) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
export const sha256 = async (bytes: Uint8Array) =>
  `sha256:${hex(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)))}`;

export const OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json";

/** Uploads one blob (start, then a monolithic PUT): the registry's answer to the PUT. */
export async function uploadBlob(
  info: RealRegistryInfo,
  token: string | null,
  repository: string,
  bytes: Uint8Array,
): Promise<Response> {
  const start = await registryFetch(info, "POST", `/v2/${repository}/blobs/uploads/`, token);
  if (start.status !== 202) return start;
  await start.body?.cancel();
  const url = new URL(start.headers.get("location") ?? "", info.url);
  url.searchParams.set("digest", await sha256(bytes));
  return registryFetch(info, "PUT", url.href, token, bytes, { "content-type": "application/octet-stream" });
}

/**
 * Pushes a small base work image (a config naming one layer's diff_id, and that layer) to
 * `repository:tag` with a push token the test mints: `<host>/<repository>@<digest>`.
 */
export async function pushBaseImage(
  info: RealRegistryInfo,
  settings: RegistrySettings,
  repository = BASE_REPOSITORY,
  tag = "v1",
): Promise<{ reference: string; digest: string }> {
  const token = await testToken(settings, [
    { type: "repository", name: repository, actions: ["pull", "push"] },
  ]);
  // Not a real tar: the registry stores layers without reading them, and push.ts only mounts it.
  const layer = utf8(`base layer ${crypto.randomUUID()}`);
  const config = utf8(
    JSON.stringify({
      architecture: "amd64",
      os: "linux",
      config: { Env: ["PATH=/usr/bin:/bin"] },
      rootfs: { type: "layers", diff_ids: [await sha256(layer)] },
    }),
  );
  for (const blob of [config, layer]) {
    const res = await uploadBlob(info, token, repository, blob);
    if (res.status !== 201) throw new Error(`base blob upload: ${res.status} ${await res.text()}`);
  }
  const manifest = utf8(
    JSON.stringify({
      schemaVersion: 2,
      mediaType: OCI_MANIFEST,
      config: {
        mediaType: "application/vnd.oci.image.config.v1+json",
        digest: await sha256(config),
        size: config.length,
      },
      layers: [
        {
          mediaType: "application/vnd.oci.image.layer.v1.tar+gzip",
          digest: await sha256(layer),
          size: layer.length,
        },
      ],
    }),
  );
  const res = await registryFetch(info, "PUT", `/v2/${repository}/manifests/${tag}`, token, manifest, {
    "content-type": OCI_MANIFEST,
  });
  if (res.status !== 201) throw new Error(`base manifest: ${res.status} ${await res.text()}`);
  const digest = await sha256(manifest);
  return { reference: `${info.host}/${repository}@${digest}`, digest };
}
