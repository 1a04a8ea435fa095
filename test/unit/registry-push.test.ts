import { execFile, execFileSync } from "node:child_process";
import { createHash } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { gunzipSync, gzipSync } from "node:zlib";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { pushSetupImage, type Sha256Sink, setupRepository } from "../../src/images/push";
import type { RegistrySettings } from "../../src/images/settings";
import { importSigningKey, mintRegistryToken, type RegistryAccess } from "../../src/images/token";
import { type RealRegistry, registryMissing, startRealRegistry } from "../setup/registry";

// The broker's own push of a setup image (src/images/push.ts) against the REAL registry:
// Debian's docker-registry (distribution 2.8) with token auth trusting the test key, started by
// test/setup/registry.ts. The base work image is pushed by skopeo from an OCI layout this test
// writes (as Docker v2 schema 2, so the OCI media-type mapping runs too); what push.ts made is
// read back with skopeo by digest, as a sandbox0 pod or an E2B template build would pull it.
//
// Needs docker-registry and skopeo (.ci/run installs both); skipped with a message elsewhere.

const SKIP_REASON = process.env.CI ? null : registryMissing(["docker-registry", "skopeo"]);
if (SKIP_REASON) console.warn(`registry push tests skipped: ${SKIP_REASON}`);

const PREFIX = "bw-cache";
const BASE_REPOSITORY = "bw-images/work";

/** A streaming SHA-256 over node:crypto (workerd has crypto.DigestStream; Node does not). */
function nodeSha256(): Sha256Sink {
  const hash = createHash("sha256");
  let resolve!: (digest: ArrayBuffer) => void;
  const digest = new Promise<ArrayBuffer>((r) => {
    resolve = r;
  });
  const sink = new WritableStream<Uint8Array>({
    write: (chunk) => {
      hash.update(chunk);
    },
    close: () => resolve(new Uint8Array(hash.digest()).buffer),
  });
  return Object.assign(sink, { digest });
}

const sha256 = (bytes: Uint8Array) => `sha256:${createHash("sha256").update(bytes).digest("hex")}`;
const randomHex = () => createHash("sha256").update(crypto.randomUUID()).digest("hex");
const environmentId = () => `env_${randomHex().slice(0, 20)}`;

describe.skipIf(SKIP_REASON !== null)("the broker's setup image push, on the real registry", () => {
  let registry: RealRegistry;
  let settings: RegistrySettings;
  let work: string;
  /** Every token push.ts sent, as the registry saw it. */
  const tokens: string[] = [];
  let base: { reference: string; digest: string; layerDigest: string; diffId: string };

  const recordingFetch: typeof fetch = (input, init) => {
    const auth = new Headers(init?.headers).get("authorization");
    if (auth?.startsWith("Bearer ")) tokens.push(auth.slice(7));
    return fetch(input, init);
  };

  /** A short pull token for the test's own requests (skopeo gets its own through the realm). */
  const token = async (access: RegistryAccess[]) =>
    (
      await mintRegistryToken(settings.signingKey, {
        issuer: settings.issuer,
        service: settings.service,
        subject: "registry-push-test",
        access,
        ttlSeconds: 120,
      })
    ).token;
  const pull = (name: string) => token([{ type: "repository", name, actions: ["pull"] }]);

  // Asynchronous: skopeo asks the realm, which runs in this process, for its tokens.
  const skopeo = (args: string[]) =>
    new Promise<string>((resolve, reject) =>
      execFile(
        "skopeo",
        args,
        { encoding: "utf8", env: { PATH: process.env.PATH } },
        (error, stdout, stderr) =>
          error ? reject(new Error(`skopeo ${args[0]}: ${stderr || error.message}`)) : resolve(stdout),
      ),
    );
  const inspect = async (repository: string, digest: string, what: "--raw" | "--config" | null = null) =>
    JSON.parse(
      await skopeo([
        "inspect",
        ...(what ? [what] : []),
        "--tls-verify=false",
        "--authfile",
        registry.authFile(work),
        `docker://${registry.info.host}/${repository}@${digest}`,
      ]),
    );

  /** An uncompressed layer tar of `files` (path → content), made by GNU tar as a capture would. */
  function layerTar(files: Record<string, string>): Uint8Array {
    const root = mkdtempSync(join(work, "tree-"));
    for (const [path, content] of Object.entries(files)) {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), content);
    }
    return new Uint8Array(
      execFileSync("tar", [
        "-c",
        "--format=pax",
        "--numeric-owner",
        "--owner=0",
        "--group=0",
        "-C",
        root,
        ".",
      ]),
    );
  }

  /** Copies the image by digest into an OCI layout and returns its last layer's file `path`. */
  async function fileOfLastLayer(repository: string, digest: string, path: string): Promise<string> {
    const dir = mkdtempSync(join(work, "copy-"));
    await skopeo([
      "copy",
      "-q",
      "--src-tls-verify=false",
      "--src-authfile",
      registry.authFile(work),
      `docker://${registry.info.host}/${repository}@${digest}`,
      `oci:${dir}:copied`,
    ]);
    const blob = (d: string) => readFileSync(join(dir, "blobs", "sha256", d.slice("sha256:".length)));
    const index = JSON.parse(readFileSync(join(dir, "index.json"), "utf8"));
    const manifest = JSON.parse(blob(index.manifests[0].digest).toString("utf8"));
    const layer = manifest.layers.at(-1);
    const tarPath = join(dir, "layer.tar");
    writeFileSync(tarPath, gunzipSync(blob(layer.digest)));
    return execFileSync("tar", ["-xOf", tarPath, `./${path}`], { encoding: "utf8" });
  }

  beforeAll(async () => {
    registry = await startRealRegistry();
    const info = registry.info;
    settings = {
      url: info.url,
      host: info.host,
      prefix: PREFIX,
      service: info.service,
      issuer: info.issuer,
      signingKey: await importSigningKey(info.signingKey),
    };
    work = mkdtempSync(join(tmpdir(), "bw-registry-push-"));

    // The base work image: one layer, written as an OCI layout, pushed by skopeo as Docker v2s2.
    const layer = layerTar({ "etc/base-release": "base v1\n" });
    const gz = gzipSync(layer);
    const config = Buffer.from(
      JSON.stringify({
        architecture: "amd64",
        os: "linux",
        config: { Env: ["PATH=/usr/bin:/bin"], User: "0" },
        rootfs: { type: "layers", diff_ids: [sha256(layer)] },
        history: [{ created_by: "registry-push-test base" }],
      }),
    );
    const manifest = Buffer.from(
      JSON.stringify({
        schemaVersion: 2,
        mediaType: "application/vnd.oci.image.manifest.v1+json",
        config: {
          mediaType: "application/vnd.oci.image.config.v1+json",
          digest: sha256(config),
          size: config.length,
        },
        layers: [
          { mediaType: "application/vnd.oci.image.layer.v1.tar+gzip", digest: sha256(gz), size: gz.length },
        ],
      }),
    );
    const layout = join(work, "base-oci");
    mkdirSync(join(layout, "blobs", "sha256"), { recursive: true });
    for (const blob of [gz, config, manifest]) {
      writeFileSync(join(layout, "blobs", "sha256", sha256(blob).slice(7)), blob);
    }
    writeFileSync(join(layout, "oci-layout"), '{"imageLayoutVersion":"1.0.0"}');
    writeFileSync(
      join(layout, "index.json"),
      JSON.stringify({
        schemaVersion: 2,
        manifests: [
          {
            mediaType: "application/vnd.oci.image.manifest.v1+json",
            digest: sha256(manifest),
            size: manifest.length,
            annotations: { "org.opencontainers.image.ref.name": "base" },
          },
        ],
      }),
    );
    const digestFile = join(work, "base.digest");
    await skopeo([
      "copy",
      "-q",
      "--format",
      "v2s2",
      "--dest-tls-verify=false",
      "--dest-authfile",
      registry.authFile(work),
      "--digestfile",
      digestFile,
      `oci:${layout}:base`,
      `docker://${info.host}/${BASE_REPOSITORY}:v1`,
    ]);
    const digest = readFileSync(digestFile, "utf8").trim();
    const pushed = await inspect(BASE_REPOSITORY, digest, "--raw");
    expect(pushed.mediaType).toBe("application/vnd.docker.distribution.manifest.v2+json");
    base = {
      reference: `${info.host}/${BASE_REPOSITORY}@${digest}`,
      digest,
      layerDigest: pushed.layers[0].digest,
      diffId: sha256(layer),
    };
  });

  afterAll(async () => {
    await registry?.stop();
    if (work) rmSync(work, { recursive: true, force: true });
  });

  it("pushes base + one layer to the environment's repository: skopeo reads it back by digest", async () => {
    const env = environmentId();
    const key = randomHex();
    const tar = layerTar({ "opt/setup/installed.txt": "setup ran once\n" });
    const res = await pushSetupImage(
      settings,
      {
        layer: { tar: new Blob([tar]).stream(), diffId: sha256(tar) },
        base: base.reference,
        environmentId: env,
        key,
      },
      { fetcher: recordingFetch, sha256: nodeSha256 },
    );
    if (!res.ok) throw new Error(JSON.stringify(res));
    const repository = `${PREFIX}/${env}/setup`;
    expect(res.value.repository).toBe(repository);
    expect(res.value.digest).toMatch(/^sha256:[0-9a-f]{64}$/);

    const rawText = await skopeo([
      "inspect",
      "--raw",
      "--tls-verify=false",
      "--authfile",
      registry.authFile(work),
      `docker://${registry.info.host}/${repository}@${res.value.digest}`,
    ]);
    expect(sha256(Buffer.from(rawText))).toBe(res.value.digest);
    const raw = JSON.parse(rawText);
    expect(raw.mediaType).toBe("application/vnd.oci.image.manifest.v1+json");
    expect(raw.layers.map((l: { digest: string }) => l.digest)).toEqual([
      base.layerDigest,
      res.value.layerDigest,
    ]);
    expect(raw.layers.map((l: { mediaType: string }) => l.mediaType)).toEqual([
      "application/vnd.oci.image.layer.v1.tar+gzip",
      "application/vnd.oci.image.layer.v1.tar+gzip",
    ]);
    expect(raw.layers[1].size).toBe(res.value.bytes);
    expect(raw.annotations["org.opencontainers.image.base.digest"]).toBe(base.digest);
    const config = await inspect(repository, res.value.digest, "--config");
    expect(config.rootfs.diff_ids).toEqual([base.diffId, sha256(tar)]);
    expect(config.config.Env).toEqual(["PATH=/usr/bin:/bin"]);
    expect(config.history.at(-1).created_by).toBe(`benchwright setup image ${key}`);
    // The tag is the key, and names the same manifest (nothing starts by it: case P3).
    const tagged = await inspect(repository, res.value.digest);
    expect(tagged.Digest).toBe(res.value.digest);

    expect(await fileOfLastLayer(repository, res.value.digest, "opt/setup/installed.txt")).toBe(
      "setup ran once\n",
    );
    // The broker never called the realm: it mints its own tokens.
    expect(registry.realmCalls()).toEqual([]);
  });

  it("a different image pushed later under the same tag changes nothing the recorded digest names", async () => {
    // case P3: what starts is the digest the platform recorded, never the tag.
    const env = environmentId();
    const key = randomHex();
    const push = async (content: string) => {
      const tar = layerTar({ "opt/setup/installed.txt": content });
      const res = await pushSetupImage(
        settings,
        { layer: { tar, diffId: sha256(tar) }, base: base.reference, environmentId: env, key },
        { fetcher: recordingFetch, sha256: nodeSha256 },
      );
      if (!res.ok) throw new Error(JSON.stringify(res));
      return res.value;
    };
    const recorded = await push("genuine\n");
    const later = await push("tampered\n");
    expect(later.digest).not.toBe(recorded.digest);
    const repository = setupRepository(settings, env);
    // The tag moved...
    expect((await inspect(repository, later.digest)).Digest).toBe(later.digest);
    // ...and the recorded digest still names exactly what was recorded.
    const raw = await inspect(repository, recorded.digest, "--raw");
    expect(raw.layers.at(-1).digest).toBe(recorded.layerDigest);
    expect(await fileOfLastLayer(repository, recorded.digest, "opt/setup/installed.txt")).toBe("genuine\n");
  });

  it("asks for push on its environment's repository and pull on the base only, never another environment's", async () => {
    // case P3: a token of one environment's push never names another environment's repository.
    const [mine, other] = [environmentId(), environmentId()];
    const tar = layerTar({ "opt/setup/installed.txt": "mine\n" });
    await pushSetupImage(
      settings,
      { layer: { tar, diffId: sha256(tar) }, base: base.reference, environmentId: other, key: randomHex() },
      { sha256: nodeSha256 },
    );
    tokens.length = 0;
    const res = await pushSetupImage(
      settings,
      { layer: { tar, diffId: sha256(tar) }, base: base.reference, environmentId: mine, key: randomHex() },
      { fetcher: recordingFetch, sha256: nodeSha256 },
    );
    expect(res.ok).toBe(true);
    expect(tokens.length).toBeGreaterThan(0);
    const scopes = tokens.flatMap((t) => {
      const payload = JSON.parse(Buffer.from(t.split(".")[1] as string, "base64url").toString("utf8"));
      return (payload.access as RegistryAccess[]).map((a) => `${a.name}:${[...a.actions].sort().join(",")}`);
    });
    expect(new Set(scopes)).toEqual(
      new Set([
        `${PREFIX}/${mine}/setup:pull,push`,
        `${BASE_REPOSITORY}:pull`,
        `${PREFIX}/${mine}/setup:pull`,
      ]),
    );
    expect(scopes.some((s) => s.includes(other))).toBe(false);

    // Another environment's setup image as the base is refused before any request is made.
    const theirs = await pushSetupImage(
      settings,
      {
        layer: { tar, diffId: sha256(tar) },
        base: `${settings.host}/${PREFIX}/${other}/setup@${base.digest}`,
        environmentId: mine,
        key: randomHex(),
      },
      { fetcher: () => Promise.reject(new Error("no request may be made")), sha256: nodeSha256 },
    );
    expect(theirs).toMatchObject({ ok: false, refusal: { why: "base_in_cache" } });
  });

  it("refuses a base outside REGISTRY_URL's registry or not pinned by digest, before any request", async () => {
    const tar = layerTar({ "a.txt": "a\n" });
    const noFetch: typeof fetch = () => Promise.reject(new Error("no request may be made"));
    const attempt = (reference: string) =>
      pushSetupImage(
        settings,
        {
          layer: { tar, diffId: sha256(tar) },
          base: reference,
          environmentId: environmentId(),
          key: randomHex(),
        },
        { fetcher: noFetch, sha256: nodeSha256 },
      );
    expect(await attempt(`registry.example.com/${BASE_REPOSITORY}@${base.digest}`)).toMatchObject({
      ok: false,
      refusal: { why: "base_not_in_registry" },
    });
    expect(await attempt(`${settings.host}/${BASE_REPOSITORY}:v1`)).toMatchObject({
      ok: false,
      refusal: { why: "base_not_pinned" },
    });
    expect(await attempt(`${BASE_REPOSITORY}@${base.digest}`)).toMatchObject({
      ok: false,
      refusal: { why: "base_not_in_registry" },
    });
    // A tag beside the digest is allowed (the digest is what is read).
    const tagged = await pushSetupImage(
      settings,
      {
        layer: { tar, diffId: sha256(tar) },
        base: `${settings.host}/${BASE_REPOSITORY}:v1@${base.digest}`,
        environmentId: environmentId(),
        key: randomHex(),
      },
      { sha256: nodeSha256 },
    );
    expect(tagged.ok).toBe(true);
  });

  it("a layer that is not the diff_id it came with is not kept; an untrusted key is registry_refused", async () => {
    const tar = layerTar({ "a.txt": "a\n" });
    const env = environmentId();
    const key = randomHex();
    const wrong = await pushSetupImage(
      settings,
      { layer: { tar, diffId: sha256(new Uint8Array([1])) }, base: base.reference, environmentId: env, key },
      { sha256: nodeSha256 },
    );
    expect(wrong).toMatchObject({ ok: false, error: { code: "internal_error" } });
    const pair = await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
      "sign",
      "verify",
    ]);
    const stranger = await importSigningKey(
      JSON.stringify(await crypto.subtle.exportKey("jwk", pair.privateKey)),
    );
    const refused = await pushSetupImage(
      { ...settings, signingKey: stranger },
      { layer: { tar, diffId: sha256(tar) }, base: base.reference, environmentId: env, key },
      { sha256: nodeSha256 },
    );
    expect(refused).toMatchObject({ ok: false, error: { code: "registry_refused" } });
    // Neither left a manifest under the key.
    const tags = await fetch(`${settings.url}/v2/${PREFIX}/${env}/setup/manifests/${key}`, {
      headers: { authorization: `Bearer ${await pull(`${PREFIX}/${env}/setup`)}` },
    });
    expect(tags.status).toBe(404);
  });
});
