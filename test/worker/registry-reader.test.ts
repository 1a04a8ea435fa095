import { env } from "cloudflare:workers";
import { describe, expect, inject, it } from "vitest";
import { ConfigError } from "../../src/config";
import { loadRegistrySettings } from "../../src/images/config";
import { registryClient } from "../../src/images/registry";
import type { RegistrySettings } from "../../src/images/settings";
import { importSigningKey } from "../../src/images/token";
import type { MisbehaviourName, RecordedRequest } from "../contract/registry-contract";
import {
  BASE_REPOSITORY,
  pushBaseImage,
  realmCalls,
  realRegistry,
  registryEnv,
  registrySettings,
} from "./registry-fixtures";

// The broker's registry reader (src/images/registry.ts) and token minting (token.ts) in workerd:
// against the REAL registry (distribution 2.8, test/setup/registry.ts) for everything a registry
// does right, and against the misbehaving CONTRACT server (test/contract/registry-server.ts) only
// for the answers a real registry will not give.

const claimsOf = (token: string) => {
  const [h, p] = token.split(".") as [string, string];
  const decode = (s: string) => JSON.parse(atob(s.replaceAll("-", "+").replaceAll("_", "/")));
  return { header: decode(h), payload: decode(p) };
};

/** fetch, keeping each request's bearer token (or null) in `seen`. */
function recording(seen: (string | null)[]): typeof fetch {
  return (input, init) => {
    const auth = new Headers(init?.headers).get("authorization");
    seen.push(auth?.startsWith("Bearer ") ? auth.slice(7) : null);
    return fetch(input, init);
  };
}

describe.skipIf(!realRegistry)("the registry reader on the real registry", { timeout: 60_000 }, () => {
  const info = realRegistry as NonNullable<typeof realRegistry>;

  it("reads a tag and a digest challenge-first, with a pull token for that one repository; never calls the realm", async () => {
    const settings = await registrySettings(info);
    const repository = `${BASE_REPOSITORY}-${crypto.randomUUID().slice(0, 8)}`;
    const { digest } = await pushBaseImage(info, settings, repository);
    const seen: (string | null)[] = [];
    const reader = registryClient(settings, recording(seen));

    const byTag = await reader.manifest(repository, "v1");
    expect(byTag).toMatchObject({
      ok: true,
      value: { found: true, digest, mediaType: "application/vnd.oci.image.manifest.v1+json" },
    });
    expect(await reader.manifest(repository, digest)).toMatchObject({
      ok: true,
      value: { found: true, digest },
    });
    expect(await reader.manifest(repository, "missing")).toEqual({ ok: true, value: { found: false } });

    // Each read: first without credentials, then once with a token the broker minted itself.
    expect(seen.filter((t) => t === null)).toHaveLength(3);
    const tokens = seen.filter((t): t is string => t !== null);
    expect(tokens).toHaveLength(3);
    for (const token of tokens) {
      const { header, payload } = claimsOf(token);
      expect(header).toEqual({ typ: "JWT", alg: "ES256", kid: settings.signingKey.kid });
      expect(payload).toMatchObject({ iss: info.issuer, aud: info.service, sub: "benchwright-broker" });
      expect(payload.access).toEqual([{ type: "repository", name: repository, actions: ["pull"] }]);
      expect(payload.exp - payload.iat).toBe(60);
      expect(payload.jti).toMatch(/^[A-Za-z0-9_-]{22}$/);
    }
    // The kid is the key's libtrust fingerprint, which is how distribution names the key of the
    // certificate it was given (the registry accepting the tokens above is the proof).
    expect(settings.signingKey.kid).toMatch(/^([A-Z2-7]{4}:){11}[A-Z2-7]{4}$/);
    expect(await realmCalls(info)).toEqual([]);
  });

  it("a key the registry does not trust, or another service name, is registry_refused; nothing listening is registry_unreachable", async () => {
    const settings = await registrySettings(info);
    const { digest } = await pushBaseImage(info, settings);
    const pair = (await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
      "sign",
      "verify",
    ])) as CryptoKeyPair;
    const stranger: RegistrySettings = {
      ...settings,
      signingKey: await importSigningKey(
        JSON.stringify(await crypto.subtle.exportKey("jwk", pair.privateKey)),
      ),
    };
    const untrusted = await registryClient(stranger).manifest(BASE_REPOSITORY, digest);
    expect(untrusted).toMatchObject({ ok: false, error: { code: "registry_refused" } });
    // The registry's challenge names its own service: the broker will not sign for another.
    const otherService = await registryClient({ ...settings, service: "other.service" }).manifest(
      BASE_REPOSITORY,
      digest,
    );
    expect(otherService).toMatchObject({ ok: false, error: { code: "registry_refused" } });
    if (!otherService.ok) expect(otherService.error.detail).toContain(`"${info.service}"`);
    // Port 1 on loopback: nothing listens there.
    const nobody = await registryClient({ ...settings, url: "http://127.0.0.1:1" }).manifest(
      BASE_REPOSITORY,
      digest,
    );
    expect(nobody).toMatchObject({ ok: false, error: { code: "registry_unreachable" } });
  });

  it("settings: none without REGISTRY_URL; a malformed key or a plain-http remote URL is a ConfigError without the value", async () => {
    expect(await loadRegistrySettings({ ...env, REGISTRY_URL: "" })).toBeNull();
    const badKey = "not-a-jwk-0f9e8d7c";
    const failure = await loadRegistrySettings({ ...registryEnv(info), REGISTRY_SIGNING_KEY: badKey }).catch(
      (e: unknown) => e,
    );
    expect(failure).toBeInstanceOf(ConfigError);
    expect((failure as Error).message).toContain("REGISTRY_SIGNING_KEY");
    expect((failure as Error).message).not.toContain(badKey);
    await expect(
      loadRegistrySettings({ ...registryEnv(info), REGISTRY_URL: "http://registry.example.com" }),
    ).rejects.toBeInstanceOf(ConfigError);
  });
});

describe("the registry reader against the misbehaving contract registry", { timeout: 60_000 }, () => {
  const contract = inject("registryContract");

  async function settingsFor(): Promise<RegistrySettings> {
    const pair = (await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
      "sign",
      "verify",
    ])) as CryptoKeyPair;
    return {
      url: contract.url,
      host: new URL(contract.url).host,
      prefix: "bw-cache",
      service: contract.service,
      issuer: "benchwright-broker",
      signingKey: await importSigningKey(
        JSON.stringify(await crypto.subtle.exportKey("jwk", pair.privateKey)),
      ),
    };
  }

  const requests = async (): Promise<RecordedRequest[]> =>
    (await fetch(`${contract.url}/_contract/requests`)).json();

  const cases: [MisbehaviourName, string][] = [
    ["digest-mismatch", "Docker-Content-Digest does not match"],
    ["oversized-declared", "larger than 4 MiB"],
    ["oversized-streamed", "larger than 4 MiB"],
    ["redirect", "answered 307"],
    ["basic-challenge", "without a Bearer challenge"],
    ["server-error", "answered 500"],
  ];

  it.each(cases)("%s → registry_refused (%s)", async (behaviour, detail) => {
    const settings = await settingsFor();
    const res = await registryClient(settings).manifest(`contract/${behaviour}`, "v1");
    expect(res).toMatchObject({ ok: false, error: { code: "registry_refused" } });
    if (!res.ok) expect(res.error.detail).toContain(detail);
  });

  it("never follows a redirect (the token would go with it) and never calls the realm", async () => {
    await registryClient(await settingsFor()).manifest("contract/redirect", "v1");
    const seen = await requests();
    expect(seen.filter((r) => r.path === "/elsewhere")).toEqual([]);
    expect(seen.filter((r) => r.path === "/token")).toEqual([]);
    // The misbehaving answers were given to a bearer token: the challenge was answered first.
    expect(seen.some((r) => r.path === "/v2/contract/redirect/manifests/v1" && r.authorized)).toBe(true);
  });
});
