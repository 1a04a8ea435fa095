import { fail, ok, type Result } from "../errors";
import type { RegistrySettings } from "./settings";
import { mintRegistryToken } from "./token";

// The broker's registry reader: fetch only (it runs in workerd and Node), and only what setup
// images need, reading the manifest a tag or digest names (push.ts reads a base image through it
// and reads its own push back). Requests go out without credentials; a 401 with a
// Bearer challenge is answered once with a pull token the broker mints for itself, for the one
// repository it is reading, whatever scope the challenge asks for. The challenge's realm is never
// called: the broker is the token issuer, and sending anything to a URL a registry names would
// let a misconfigured (or hostile) registry point the broker elsewhere.

/** The manifest media types a registry image can have here: OCI and Docker v2 images and indexes. */
export const MANIFEST_MEDIA_TYPES = [
  "application/vnd.oci.image.index.v1+json",
  "application/vnd.oci.image.manifest.v1+json",
  "application/vnd.docker.distribution.manifest.list.v2+json",
  "application/vnd.docker.distribution.manifest.v2+json",
] as const;

/** The broker's own pull tokens live just long enough for one request and its retry. */
const PULL_TOKEN_TTL_SECONDS = 60;
const REQUEST_TIMEOUT_MS = 10_000;
/** distribution's own limit for a manifest body. */
const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;

export const REPOSITORY =
  /^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:\/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$/;
const TAG = /^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$/;
export const DIGEST = /^sha256:[a-f0-9]{64}$/;

export type ManifestLookup =
  | { found: true; digest: string; mediaType: string; size: number; body: Uint8Array }
  | { found: false };

export interface RegistryClient {
  /** Which manifest `reference` (a tag or digest) of `repository` names now, by its sha256 digest. */
  manifest(repository: string, reference: string): Promise<Result<ManifestLookup>>;
}

export function registryClient(settings: RegistrySettings, fetcher: typeof fetch = fetch): RegistryClient {
  const get = (repository: string, reference: string, token: string | null) =>
    fetcher(`${settings.url}/v2/${repository}/manifests/${reference}`, {
      method: "GET",
      headers: {
        accept: MANIFEST_MEDIA_TYPES.join(", "),
        ...(token ? { authorization: `Bearer ${token}` } : {}),
      },
      // A redirect would carry the bearer token to wherever the registry pointed.
      redirect: "manual",
      signal: AbortSignal.timeout(REQUEST_TIMEOUT_MS),
    });

  return {
    async manifest(repository, reference) {
      // Both go into the URL as they are: only names the broker made or checked itself are read.
      if (!REPOSITORY.test(repository) || !(TAG.test(reference) || DIGEST.test(reference))) {
        return fail("internal_error", "Not a repository name and tag or digest.");
      }
      let res: Response;
      try {
        res = await get(repository, reference, null);
        if (res.status === 401) {
          await res.body?.cancel();
          const challenge = parseChallenge(res.headers.get("www-authenticate"));
          if (!challenge) {
            return fail("registry_refused", "The registry asked for credentials without a Bearer challenge.");
          }
          // A token for another audience would be refused anyway, and minting one would sign
          // whatever service name the registry chose to ask for.
          if (challenge.service !== settings.service) {
            return fail(
              "registry_refused",
              `The registry's token service is ${JSON.stringify(challenge.service ?? "")}, not REGISTRY_SERVICE.`,
            );
          }
          const { token } = await mintRegistryToken(settings.signingKey, {
            issuer: settings.issuer,
            service: settings.service,
            subject: "benchwright-broker",
            access: [{ type: "repository", name: repository, actions: ["pull"] }],
            ttlSeconds: PULL_TOKEN_TTL_SECONDS,
          });
          res = await get(repository, reference, token);
        }
      } catch (e) {
        const name = (e as Error)?.name ?? "Error";
        return fail("registry_unreachable", `The registry did not answer (${name}).`);
      }
      return readManifest(res);
    },
  };
}

async function readManifest(res: Response): Promise<Result<ManifestLookup>> {
  if (res.status === 404) {
    await res.body?.cancel();
    return ok({ found: false });
  }
  if (res.status === 401 || res.status === 403) {
    await res.body?.cancel();
    return fail(
      "registry_refused",
      "The registry did not accept the broker's token: does its token auth trust REGISTRY_SIGNING_KEY's public key, REGISTRY_ISSUER and REGISTRY_SERVICE?",
    );
  }
  if (res.status !== 200) {
    await res.body?.cancel();
    return fail("registry_refused", `The registry answered ${res.status} to a manifest read.`);
  }
  const declared = Number(res.headers.get("content-length") ?? "0");
  if (declared > MAX_MANIFEST_BYTES) {
    await res.body?.cancel();
    return fail("registry_refused", "The manifest is larger than 4 MiB.");
  }
  const body = new Uint8Array(await res.arrayBuffer());
  if (body.byteLength > MAX_MANIFEST_BYTES)
    return fail("registry_refused", "The manifest is larger than 4 MiB.");
  // The digest is computed from the bytes, not taken from the header: it is what a pull by digest
  // will check, so it is what the platform records.
  const digest = `sha256:${hex(new Uint8Array(await crypto.subtle.digest("SHA-256", body)))}`;
  const header = res.headers.get("docker-content-digest");
  if (header?.startsWith("sha256:") && header !== digest) {
    return fail(
      "registry_refused",
      "The registry's Docker-Content-Digest does not match the manifest it sent.",
    );
  }
  const mediaType = (res.headers.get("content-type") ?? "").split(";")[0]?.trim() ?? "";
  return ok({ found: true, digest, mediaType, size: body.byteLength, body });
}

/** The parameters of a `Bearer` challenge (RFC 6750 §3), or null for any other scheme. */
export function parseChallenge(header: string | null): Record<string, string> | null {
  const match = /^\s*Bearer\s+(.*)$/i.exec(header ?? "");
  if (!match) return null;
  const params: Record<string, string> = {};
  for (const m of (match[1] ?? "").matchAll(/([A-Za-z_]+)="((?:[^"\\]|\\.)*)"/g)) {
    params[(m[1] ?? "").toLowerCase()] = (m[2] ?? "").replace(/\\(.)/g, "$1");
  }
  return params;
}

export const hex = (bytes: Uint8Array) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
