import { ImageDigest, SetupImageKey } from "@benchwright/shared/contract/setup-image";
import { type Failure, fail, ok, type Result } from "../errors";
import {
  type BaseRefusal,
  baseManifest,
  type Descriptor,
  OCI_CONFIG,
  OCI_LAYER_GZIP,
  OCI_MANIFEST,
  pinnedBase,
} from "./base-image";
import { hex, registryClient } from "./registry";
import { PATH_COMPONENT, type RegistrySettings } from "./settings";
import { mintRegistryToken } from "./token";

// The broker's own push of a setup image (issue 34, case P2): the base work image plus one layer,
// to the environment's repository `<prefix>/<environmentId>/setup`, tagged with the key. Only
// the platform writes there: the push token is minted here, used here and never leaves the
// Worker (nothing returns, logs or stores it), and it names exactly two repositories, push and
// pull on the environment's own and pull on the base's (case P3: never another environment's).
// The base's layers are mounted across repositories (no bytes move), the new layer is gzipped
// as it streams, the config is the base's plus the layer's diff_id, and the manifest's digest is
// read back from the registry by digest: that digest, never the tag, is what sandboxes start.
// fetch, Web Streams and WebCrypto only: it runs in workerd and in Node (the tests).

/** One push of a layer of up to SETUP_IMAGE_MAX_LAYER_MB: the token outlives it, then is useless. */
const PUSH_TOKEN_TTL_SECONDS = 15 * 60;
const REQUEST_TIMEOUT_MS = 10_000;
const LAYER_TIMEOUT_MS = PUSH_TOKEN_TTL_SECONDS * 1000;
const MAX_CONFIG_BYTES = 4 * 1024 * 1024;

/** A streaming SHA-256: workerd's crypto.DigestStream, or anything shaped like it (the Node tests). */
export type Sha256Sink = WritableStream<Uint8Array> & { readonly digest: Promise<ArrayBuffer> };

export interface SetupLayer {
  /** The uncompressed OCI layer tar, as the capture wrote it. */
  tar: ReadableStream<Uint8Array> | Uint8Array;
  /** Its sha256 (the layer's diff_id); checked as it streams. */
  diffId: string;
}

export interface SetupImagePush {
  layer: SetupLayer;
  /** The work image, `<registry host>/<repository>@sha256:…` in REGISTRY_URL's registry. */
  base: string;
  environmentId: string;
  key: string;
}

export interface PushedSetupImage {
  /** The manifest's digest: what a sandbox starts from (`<host>/<repository>@<digest>`). */
  digest: string;
  repository: string;
  /** The new layer's blob (gzip) digest. */
  layerDigest: string;
  /** The new layer's size as stored (gzip). */
  bytes: number;
}

/** A refusal is about the base (role none for this key); a failure is about the registry. */
export type PushResult = Result<PushedSetupImage> | { ok: false; refusal: BaseRefusal };

export interface PushOptions {
  fetcher?: typeof fetch;
  sha256?: () => Sha256Sink;
}

/** `<prefix>/<environmentId>/setup`: one repository per environment, so one token scope per environment. */
export function setupRepository(settings: RegistrySettings, environmentId: string): string {
  // Environment ids are `env_` and random lowercase base32: already a path component.
  if (!PATH_COMPONENT.test(environmentId)) throw new Error("environment id is not a repository component");
  return `${settings.prefix}/${environmentId}/setup`;
}

export async function pushSetupImage(
  settings: RegistrySettings,
  push: SetupImagePush,
  options: PushOptions = {},
): Promise<PushResult> {
  const fetcher = options.fetcher ?? fetch;
  const sha256 = options.sha256 ?? workerdSha256;
  const key = SetupImageKey.parse(push.key);
  const diffId = ImageDigest.parse(push.layer.diffId);
  const checked = pinnedBase(settings, push.base);
  if (!checked.ok) return checked;
  const { base } = checked;
  const repository = setupRepository(settings, push.environmentId);
  const reader = registryClient(settings, fetcher);

  const seen = await reader.manifest(base.repository, base.digest);
  if (!seen.ok) return seen;
  if (!seen.value.found || seen.value.digest !== base.digest) {
    return {
      ok: false,
      refusal: { why: "base_unsupported", detail: "The work image's digest is not in the registry." },
    };
  }
  const parsed = baseManifest(seen.value.mediaType, seen.value.body);
  if (!parsed.ok) return parsed;
  const manifest = parsed.manifest;

  const { token } = await mintRegistryToken(settings.signingKey, {
    issuer: settings.issuer,
    service: settings.service,
    subject: "benchwright-broker",
    access: [
      { type: "repository", name: repository, actions: ["pull", "push"] },
      { type: "repository", name: base.repository, actions: ["pull"] },
    ],
    ttlSeconds: PUSH_TOKEN_TTL_SECONDS,
  });
  const registry = session(settings, token, fetcher);
  try {
    const config = await registry.baseConfig(base.repository, manifest.config);
    if (!config.ok) return config;
    const diffIds = config.value.rootfs?.diff_ids;
    if (!Array.isArray(diffIds) || diffIds.length !== manifest.layers.length) {
      const detail = "The work image's config does not list one diff_id per layer.";
      return { ok: false, refusal: { why: "base_unsupported", detail } };
    }
    for (const layer of manifest.layers) {
      const mounted = await registry.mount(repository, layer.digest, base.repository);
      if (!mounted.ok) return mounted;
    }
    const layer = await registry.uploadLayer(repository, push.layer.tar, diffId, sha256);
    if (!layer.ok) return layer;

    const imageConfig = utf8(
      JSON.stringify({
        ...config.value,
        rootfs: { type: "layers", diff_ids: [...diffIds, diffId] },
        ...(Array.isArray(config.value.history)
          ? { history: [...config.value.history, { created_by: `benchwright setup image ${key}` }] }
          : {}),
      }),
    );
    const configDigest = await digestOf(imageConfig);
    const storedConfig = await registry.uploadBlob(repository, imageConfig, configDigest);
    if (!storedConfig.ok) return storedConfig;

    const body = utf8(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: OCI_MANIFEST,
        config: { mediaType: OCI_CONFIG, digest: configDigest, size: imageConfig.byteLength },
        layers: [...manifest.layers, layer.value],
        annotations: {
          "org.opencontainers.image.base.name": `${settings.host}/${base.repository}`,
          "org.opencontainers.image.base.digest": base.digest,
        },
      }),
    );
    const put = await registry.putManifest(repository, key, body);
    if (!put.ok) return put;

    // What starts is the digest, so it is read back by digest: the registry serves these bytes.
    const digest = await digestOf(body);
    const back = await reader.manifest(repository, digest);
    if (!back.ok) return back;
    if (!back.value.found || back.value.digest !== digest) {
      return fail("registry_refused", "The registry does not serve the pushed manifest by its digest.");
    }
    return ok({ digest, repository, layerDigest: layer.value.digest, bytes: layer.value.size });
  } catch (e) {
    const name = (e as Error)?.name ?? "Error";
    return fail("registry_unreachable", `The registry did not answer (${name}).`);
  }
}

type ImageConfig = { rootfs?: { diff_ids?: unknown }; history?: unknown[] } & Record<string, unknown>;

/** The registry calls of one push, all with its token, every Location kept on the registry's origin. */
function session(settings: RegistrySettings, token: string, fetcher: typeof fetch) {
  const call = (url: string, init: RequestInit & { duplex?: "half" }, timeoutMs = REQUEST_TIMEOUT_MS) =>
    fetcher(url, {
      ...init,
      headers: { ...(init.headers as Record<string, string>), authorization: `Bearer ${token}` },
      // A redirect would carry the token to wherever the registry pointed.
      redirect: "manual",
      signal: AbortSignal.timeout(timeoutMs),
    });
  const v2 = (path: string) => `${settings.url}/v2/${path}`;

  /** The upload URL a 202 names, if it is on the registry's own origin. */
  const uploadUrl = (res: Response): URL | null => {
    const location = res.headers.get("location");
    if (!location) return null;
    const url = new URL(location, settings.url);
    return url.origin === settings.url ? url : null;
  };

  const refused = async (res: Response, what: string): Promise<{ ok: false; error: Failure }> => {
    await res.body?.cancel();
    if (res.status === 401 || res.status === 403) {
      return fail(
        "registry_refused",
        `The registry did not accept the broker's push token for ${what}: does its token auth trust REGISTRY_SIGNING_KEY's public key, REGISTRY_ISSUER and REGISTRY_SERVICE?`,
      );
    }
    return fail("registry_refused", `The registry answered ${res.status} to ${what}.`);
  };

  const startUpload = async (repository: string): Promise<Result<URL>> => {
    const res = await call(v2(`${repository}/blobs/uploads/`), { method: "POST" });
    if (res.status !== 202) return refused(res, "a blob upload");
    await res.body?.cancel();
    const url = uploadUrl(res);
    return url
      ? ok(url)
      : fail("registry_refused", "The registry's upload Location is not on its own origin.");
  };

  const finish = async (url: URL, digest: string, what: string): Promise<Result<null>> => {
    url.searchParams.set("digest", digest);
    const res = await call(url.href, { method: "PUT" });
    if (res.status !== 201) return refused(res, what);
    await res.body?.cancel();
    return ok(null);
  };

  return {
    async baseConfig(repository: string, config: Descriptor): Promise<Result<ImageConfig>> {
      if (config.size > MAX_CONFIG_BYTES)
        return fail("registry_refused", "The work image's config is over 4 MiB.");
      let res = await call(v2(`${repository}/blobs/${config.digest}`), { method: "GET" });
      // Registries on object storage redirect blob reads: followed once, without the token (the
      // bytes are checked against their digest, so where they come from does not matter).
      const location = res.headers.get("location");
      if (res.status >= 300 && res.status < 400 && location) {
        await res.body?.cancel();
        res = await fetcher(new URL(location, settings.url).href, {
          redirect: "manual",
          signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
        });
      }
      if (res.status !== 200) return refused(res, "the work image's config");
      const bytes = new Uint8Array(await res.arrayBuffer());
      if (bytes.byteLength > MAX_CONFIG_BYTES || (await digestOf(bytes)) !== config.digest) {
        return fail("registry_refused", "The work image's config does not match its digest.");
      }
      try {
        const json = JSON.parse(new TextDecoder().decode(bytes));
        if (json && typeof json === "object" && !Array.isArray(json)) return ok(json as ImageConfig);
      } catch {}
      return fail("registry_refused", "The work image's config is not a JSON object.");
    },

    /** Cross-repository mount: the base's layer appears in `repository` without moving a byte. */
    async mount(repository: string, digest: string, from: string): Promise<Result<null>> {
      const query = new URLSearchParams({ mount: digest, from });
      const res = await call(v2(`${repository}/blobs/uploads/?${query}`), { method: "POST" });
      if (res.status === 201) {
        await res.body?.cancel();
        return ok(null);
      }
      if (res.status === 202) {
        // The registry started an upload instead (it could not mount): drop it, and say so.
        await res.body?.cancel();
        const url = uploadUrl(res);
        if (url) await (await call(url.href, { method: "DELETE" })).body?.cancel();
        return fail("registry_refused", `The registry would not mount the work image's layer ${digest}.`);
      }
      return refused(res, "a layer mount");
    },

    async uploadBlob(repository: string, bytes: Uint8Array, digest: string): Promise<Result<null>> {
      const started = await startUpload(repository);
      if (!started.ok) return started;
      started.value.searchParams.set("digest", digest);
      const res = await call(started.value.href, {
        method: "PUT",
        headers: { "content-type": "application/octet-stream" },
        body: bytes,
      });
      if (res.status !== 201) return refused(res, "the image config");
      await res.body?.cancel();
      return ok(null);
    },

    /** Streams the tar through gzip into one PATCH, hashing both sides on the way. */
    async uploadLayer(
      repository: string,
      tar: SetupLayer["tar"],
      diffId: string,
      sha256: () => Sha256Sink,
    ): Promise<Result<Descriptor>> {
      const started = await startUpload(repository);
      if (!started.ok) return started;
      const plain = sha256();
      const packed = sha256();
      let size = 0;
      const body = (tar instanceof Uint8Array ? new Blob([tar]).stream() : tar)
        .pipeThrough(tap(plain))
        .pipeThrough(new CompressionStream("gzip") as unknown as TransformStream<Uint8Array, Uint8Array>)
        .pipeThrough(tap(packed, (n) => (size += n)));
      const res = await call(
        started.value.href,
        { method: "PATCH", headers: { "content-type": "application/octet-stream" }, body, duplex: "half" },
        LAYER_TIMEOUT_MS,
      );
      if (res.status !== 202) return refused(res, "the layer upload");
      await res.body?.cancel();
      const next = uploadUrl(res);
      if (!next) return fail("registry_refused", "The registry's upload Location is not on its own origin.");
      if (`sha256:${hex(new Uint8Array(await plain.digest))}` !== diffId) {
        await (await call(next.href, { method: "DELETE" })).body?.cancel();
        return fail("internal_error", "The layer's sha256 is not the diff_id it came with.");
      }
      const digest = `sha256:${hex(new Uint8Array(await packed.digest))}`;
      const done = await finish(next, digest, "the layer upload");
      if (!done.ok) return done;
      return ok({ mediaType: OCI_LAYER_GZIP, digest, size });
    },

    async putManifest(repository: string, tag: string, body: Uint8Array): Promise<Result<null>> {
      const res = await call(v2(`${repository}/manifests/${tag}`), {
        method: "PUT",
        headers: { "content-type": OCI_MANIFEST },
        body,
      });
      if (res.status !== 201) return refused(res, "the manifest");
      await res.body?.cancel();
      return ok(null);
    },
  };
}

/** Passes chunks through unchanged, writing each to `sink` too (and closing it at the end). */
function tap(sink: Sha256Sink, count?: (bytes: number) => void): TransformStream<Uint8Array, Uint8Array> {
  const writer = sink.getWriter();
  return new TransformStream({
    async transform(chunk, controller) {
      await writer.write(chunk);
      count?.(chunk.byteLength);
      controller.enqueue(chunk);
    },
    flush: () => writer.close(),
  });
}

function workerdSha256(): Sha256Sink {
  const DigestStream = (crypto as unknown as { DigestStream?: new (algorithm: string) => Sha256Sink })
    .DigestStream;
  if (!DigestStream) throw new Error("no crypto.DigestStream here: pass PushOptions.sha256");
  return new DigestStream("SHA-256");
}

const utf8 = (text: string) => new TextEncoder().encode(text);
const digestOf = async (bytes: Uint8Array) =>
  `sha256:${hex(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)))}`;
