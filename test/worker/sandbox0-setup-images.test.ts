import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import { resourcesFor } from "@benchwright/shared/contract/run-spec";
import { and, eq } from "drizzle-orm";
import { createTarDecoder } from "modern-tar";
import { describe, expect, it } from "vitest";
import { HOME_INIT, objectName, pullSecretName } from "../../src/broker/kubernetes/manifests";
import { SandboxBroker } from "../../src/broker/sandbox-broker";
import { PROXY_ENV } from "../../src/coordinator/machine";
import { brokerValue } from "../../src/coordinator/ports";
import { randomId } from "../../src/crypto/api-keys";
import { runs, setupImages } from "../../src/db/schema";
import { pullPassword } from "../../src/images/pull-credential";
import { setupRepository } from "../../src/images/push";
import { registryClient } from "../../src/images/registry";
import type { RealRegistryInfo } from "../setup/registry-info";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import { callWith, newTenant, withDb } from "./harness";
import {
  BASE_REPOSITORY,
  PREFIX,
  pushBaseImage,
  realRegistry,
  registryEnv,
  registryFetch,
  registrySettings,
  testToken,
  uploadBlob,
} from "./registry-fixtures";
import { newRun } from "./run-fixtures";
import { backendIn, envFor, newNs, type Obj, objects, recorded, run } from "./sandbox0-fixtures";

// Setup images on sandbox0 (docs/sandbox0.md, *Setup images*): the Kubernetes contract server
// (test/contract/kubernetes-server.ts; the real bw-layer reads the pod's working directory) and
// the REAL registry (distribution 2.8 with token auth, test/setup/registry.ts). A build captures
// and pushes the layer and records the registry's manifest digest; a start names that digest and
// nothing else (case P3); a layer the registry no longer has is forgotten and built again (P6);
// the pull realm hands out pull-only tokens for the credential's own repository (P2, P3).

const info = realRegistry as RealRegistryInfo;
const registryVars = (i: RealRegistryInfo) => ({
  REGISTRY_URL: i.url,
  REGISTRY_SIGNING_KEY: i.signingKey,
  REGISTRY_SERVICE: i.service,
  REGISTRY_ISSUER: i.issuer,
  REGISTRY_REPOSITORY_PREFIX: PREFIX,
});
const basic = (user: string, password: string) => ({ authorization: `Basic ${btoa(`${user}:${password}`)}` });
const tokenPath = (scope: string, service = info.service) =>
  `/registry/token?service=${encodeURIComponent(service)}&scope=${encodeURIComponent(scope)}`;
const claims = (token: string) =>
  JSON.parse(atob((token.split(".")[1] as string).replaceAll("-", "+").replaceAll("_", "/"))) as {
    access: Array<{ name: string; actions: string[] }>;
  };
const SHA256_REF = /@sha256:[0-9a-f]{64}$/;

/** The entries of a gzip layer blob: name, mode, uid. */
async function layerEntries(blob: Uint8Array) {
  const entries = new Blob([blob])
    .stream()
    .pipeThrough(new DecompressionStream("gzip") as unknown as TransformStream<Uint8Array, Uint8Array>)
    .pipeThrough(createTarDecoder());
  const out: Array<{ name: string; mode: number; uid: number; body: string }> = [];
  for await (const { header, body } of entries as unknown as AsyncIterable<{
    header: { name: string; mode?: number; uid?: number };
    body: ReadableStream<Uint8Array>;
  }>) {
    out.push({
      name: header.name,
      mode: header.mode ?? 0,
      uid: header.uid ?? 0,
      body: await new Response(body).text(),
    });
  }
  return out;
}

describe.skipIf(!realRegistry)("sandbox0 setup images", { timeout: 120_000 }, () => {
  it("builds (capture, push, row = the registry's digest), starts by digest only, and rebuilds a layer the registry lost", async () => {
    const settings = await registrySettings(info);
    const base = await pushBaseImage(info, settings, BASE_REPOSITORY, `s0-${randomId("t").slice(2, 12)}`);
    const ns = newNs();
    const brokerEnv = {
      ...env,
      COMPUTE_BACKEND: "sandbox0",
      ...envFor(ns, { SANDBOX0_WORK_IMAGE: base.reference }),
      ...registryVars(info),
    };
    const stub = env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.newUniqueId());
    const broker = <T>(fn: (b: SandboxBroker) => Promise<T>) =>
      runInDurableObject(stub, (_instance, state) => fn(new SandboxBroker(state, brokerEnv)));
    const backend = backendIn(ns, { SANDBOX0_WORK_IMAGE: base.reference, ...registryVars(info) });
    expect(await backend.baseImage()).toBe(base.digest);

    const tenant = await newTenant();
    const r = await newRun(tenant);
    await withDb((db) => db.update(runs).set({ backend: "sandbox0" }).where(eq(runs.id, r.id)));
    const repository = setupRepository(settings, tenant.environmentId);
    const proxyId = randomId("sbx_");
    await broker((b) => b.create(r.id, { id: proxyId, kind: "proxy" }).then(brokerValue));
    await broker((b) =>
      b
        .exec(r.id, proxyId, {
          id: "proxy-1",
          argv: ["bw-proxy"],
          env: { ...PROXY_ENV, BW_RUN_ID: r.id, BW_PROXY_TOKEN: r.proxyToken, BW_AUDIT_KEY: r.auditKey },
          stage: "setup",
          timeoutMs: null,
        })
        .then(brokerValue),
    );
    const request = {
      setup: ["python3 -m venv .venv"],
      bundle: null,
      resources: resourcesFor(undefined, "work"),
      mode: "use" as const,
    };
    const work = (id: string) => ({
      id,
      kind: "task" as const,
      taskIndex: 0,
      proxySandboxId: proxyId,
      routing: "default" as const,
      hostsFile: [],
    });

    // The build: setup writes the working directory (and $BW_OUT, which no layer keeps), seal, capture.
    const builder = randomId("sbx_");
    const claimed = await broker((b) => b.claimSetupImage(r.id, builder, request).then(brokerValue));
    expect(claimed.role).toBe("build");
    const key = (claimed as { key: string }).key;
    await broker((b) => b.create(r.id, { ...work(builder), setup: true, capture: true }).then(brokerValue));
    const setup = await run(backend, builder, {
      argv: [
        "sh",
        "-c",
        'mkdir -p "$HOME/.venv/bin" "$HOME/out" && printf "installed" > "$HOME/.venv/bin/tool" && chmod 4755 "$HOME/.venv/bin/tool" && echo run-only > "$HOME/out/result.txt"',
      ],
      stage: "setup",
      timeoutMs: 10_000,
    });
    expect(setup.exitCode, setup.stderr).toBe(0);
    // Before seal there is nothing to keep: the setup stage may still be writing.
    await expectBackendError(
      backend.captureLayer(builder, 1 << 26, { environmentId: tenant.environmentId, key, runCaPem: null }),
      "not_sealed",
    );
    await backend.seal(builder, { routing: "default", hostsFile: [], caCertPem: null });
    const kept = await broker((b) => b.captureSetupImage(r.id, builder, key).then(brokerValue));
    const [row] = await withDb((db) =>
      db
        .select()
        .from(setupImages)
        .where(and(eq(setupImages.environmentId, tenant.environmentId), eq(setupImages.key, key))),
    );
    expect(row).toMatchObject({ status: "built", digest: kept.digest, repository, backend: "sandbox0" });
    // The registry's tag (the key) names exactly the recorded manifest digest.
    const byTag = await registryClient(settings).manifest(repository, key);
    expect(byTag).toMatchObject({ ok: true, value: { found: true, digest: kept.digest } });
    const manifest = JSON.parse(
      new TextDecoder().decode((byTag as { value: { body: Uint8Array } }).value.body),
    );
    const layer = manifest.layers.at(-1) as { digest: string };
    const pull = await testToken(settings, [{ type: "repository", name: repository, actions: ["pull"] }]);
    const blob = await registryFetch(info, "GET", `/v2/${repository}/blobs/${layer.digest}`, pull);
    expect(blob.status).toBe(200);
    const entries = await layerEntries(new Uint8Array(await blob.arrayBuffer()));
    expect(entries.map((e) => e.name)).toEqual([
      "home/sandbox/",
      "home/sandbox/.wh..wh..opq",
      "home/sandbox/.venv/",
      "home/sandbox/.venv/bin/",
      "home/sandbox/.venv/bin/tool",
    ]);
    // The setuid bit is cleared; $BW_OUT is not there.
    expect(entries.find((e) => e.name.endsWith("tool"))).toMatchObject({ mode: 0o755, body: "installed" });

    // case P3: someone re-pushes the key's tag in the real registry; what starts is still the
    // digest the platform recorded.
    const moved = await pushBaseImage(info, settings, repository, key);
    expect(moved.digest).not.toBe(kept.digest);
    expect(await registryClient(settings).manifest(repository, key)).toMatchObject({
      ok: true,
      value: { digest: moved.digest },
    });

    // A start from it: the image by digest, the working directory from an init container, no setup.
    const user = randomId("sbx_");
    const use = await broker((b) => b.claimSetupImage(r.id, user, request).then(brokerValue));
    expect(use).toMatchObject({ role: "use", digest: kept.digest, builtByRunId: r.id });
    await broker((b) => b.create(r.id, { ...work(user), setupImage: { key } }).then(brokerValue));
    const now = await objects(ns);
    const pod = now.pods.find((p: Obj) => p.metadata.name === objectName(user));
    const image = `${info.host}/${repository}@${kept.digest}`;
    expect(pod.spec.containers.map((c: Obj) => c.name)).toEqual(["work", "bw-seal"]);
    expect(pod.spec.containers[0].image).toBe(image);
    const init = pod.spec.initContainers.find((c: Obj) => c.name === HOME_INIT);
    expect(init).toMatchObject({
      image,
      command: ["/bin/sh", "-c", "cp -a /home/sandbox/. /bw/home/"],
      securityContext: { runAsUser: 10001, runAsNonRoot: true, capabilities: { drop: ["ALL"] } },
      volumeMounts: [{ name: "home", mountPath: "/bw/home" }],
    });
    expect(pod.spec.imagePullSecrets).toEqual([{ name: pullSecretName(tenant.environmentId) }]);
    // case P3: every image every pod names is pinned by digest, and no repository of setup images
    // but this environment's appears in anything sent to Kubernetes.
    for (const p of now.pods) {
      for (const c of [...(p.spec.initContainers ?? []), ...p.spec.containers]) {
        expect(c.image, `${p.metadata.name}/${c.name}`).toMatch(SHA256_REF);
      }
    }
    const sent = JSON.stringify(await recorded(ns));
    expect(sent).not.toContain(moved.digest);
    const named = new Set(sent.match(new RegExp(`${PREFIX}/[a-z0-9_]+/setup`, "g")));
    expect([...named]).toEqual([repository]);

    // The pull Secret's credential is what the realm takes, for this repository, pull only.
    const secret = now.secrets.find((s: Obj) => s.metadata.name === pullSecretName(tenant.environmentId));
    expect(secret.type).toBe("kubernetes.io/dockerconfigjson");
    const auths = JSON.parse(atob(secret.data[".dockerconfigjson"])).auths;
    expect(Object.keys(auths)).toEqual([info.host]);
    const { username, password } = auths[info.host];
    expect(username).toBe(tenant.environmentId);
    const realm = await callWith(
      registryEnv(info),
      null,
      "GET",
      tokenPath(`repository:${repository}:pull`),
      undefined,
      basic(username, password),
    );
    expect(realm.status, realm.text).toBe(200);
    const byDigest = await registryFetch(
      info,
      "GET",
      `/v2/${repository}/manifests/${kept.digest}`,
      realm.json.token,
      undefined,
      {
        accept: "application/vnd.oci.image.manifest.v1+json",
      },
    );
    expect(byDigest.status).toBe(200);

    // The registry loses it (dropLayer deletes the manifest): the next start is refused
    // setup_image_missing, the row goes, and the key is built again (case P6).
    expect(await backend.dropLayer(kept.digest, repository)).toBe("dropped");
    expect(await registryClient(settings).manifest(repository, kept.digest)).toMatchObject({
      ok: true,
      value: { found: false },
    });
    const late = randomId("sbx_");
    expect(await broker((b) => b.claimSetupImage(r.id, late, request).then(brokerValue))).toMatchObject({
      role: "use",
    });
    expect(await broker((b) => b.create(r.id, { ...work(late), setupImage: { key } }))).toMatchObject({
      ok: false,
      code: "setup_image_missing",
    });
    const gone = await withDb((db) =>
      db
        .select()
        .from(setupImages)
        .where(and(eq(setupImages.environmentId, tenant.environmentId), eq(setupImages.key, key))),
    );
    expect(gone).toEqual([]);
    const again = randomId("sbx_");
    expect(await broker((b) => b.claimSetupImage(r.id, again, request).then(brokerValue))).toEqual({
      role: "build",
      key,
    });
  });

  it("refuses a layer holding the run's CA, and names why a base cannot be kept", async () => {
    const settings = await registrySettings(info);
    const base = await pushBaseImage(info, settings, BASE_REPOSITORY, `s0-${randomId("t").slice(2, 12)}`);
    const ns = newNs();
    const over = { SANDBOX0_WORK_IMAGE: base.reference, ...registryVars(info) };
    const b = backendIn(ns, over);
    const runId = randomId("run_");
    const { proxyId } = await proxyOf(b, runId);
    const id = randomId("sbx_");
    await b.create({
      kind: "work",
      id,
      runId,
      proxySandboxId: proxyId,
      routing: "default",
      hostsFile: [],
      setup: true,
      capture: true,
    });
    const ca = `-----BEGIN CERTIFICATE-----\n${"QUJD".repeat(20)}\n-----END CERTIFICATE-----\n`;
    await run(b, id, {
      argv: ["sh", "-c", `mkdir -p "$HOME/.config" && printf '%s' '${ca}' > "$HOME/.config/ca.pem"`],
      stage: "setup",
      timeoutMs: 10_000,
    });
    await b.seal(id, { routing: "default", hostsFile: [], caCertPem: null });
    const target = { environmentId: randomId("env_"), key: "a".repeat(64), runCaPem: ca };
    // case P4: a run's own CA never goes into a layer.
    await expectBackendError(b.captureLayer(id, 1 << 26, target), "setup_image_holds_run_files");
    expect(
      await registryClient(settings).manifest(setupRepository(settings, target.environmentId), target.key),
    ).toMatchObject({ ok: true, value: { found: false } });

    // Why a base cannot be kept, for the run's note.
    const tagged = backendIn(ns, { ...over, SANDBOX0_WORK_IMAGE: `${info.host}/${BASE_REPOSITORY}:latest` });
    expect(await tagged.baseImage()).toEqual({
      none: expect.stringMatching(/not pinned by a sha256 digest/),
    });
    const elsewhere = backendIn(ns, {
      ...over,
      SANDBOX0_WORK_IMAGE: `docker.io/library/debian@sha256:${"3".repeat(64)}`,
    });
    expect(await elsewhere.baseImage()).toEqual({
      none: expect.stringMatching(/not in REGISTRY_URL's registry/),
    });
    expect(await backendIn(ns, { SANDBOX0_WORK_IMAGE: base.reference }).baseImage()).toEqual({
      none: expect.stringMatching(/REGISTRY_URL is empty/),
    });
  });
});

describe.skipIf(!realRegistry)("the registry's pull realm", { timeout: 60_000 }, () => {
  async function environmentImage() {
    const settings = await registrySettings(info);
    const environmentId = randomId("env_");
    const repository = setupRepository(settings, environmentId);
    const image = await pushBaseImage(info, settings, repository, "k");
    const password = await pullPassword(info.signingKey, environmentId);
    return { settings, environmentId, repository, image, password };
  }
  const realm = (scope: string, headers: Record<string, string>, service?: string) =>
    callWith(registryEnv(info), null, "GET", tokenPath(scope, service), undefined, headers);

  it("gives the environment's credential a token that pulls its repository from the real registry", async () => {
    const a = await environmentImage();
    const res = await realm(`repository:${a.repository}:pull`, basic(a.environmentId, a.password));
    expect(res.status, res.text).toBe(200);
    expect(res.headers.get("cache-control")).toBe("no-store");
    expect(res.json).toMatchObject({ expires_in: 300, access_token: res.json.token });
    expect(claims(res.json.token).access).toEqual([
      { type: "repository", name: a.repository, actions: ["pull"] },
    ]);
    const pulled = await registryFetch(
      info,
      "GET",
      `/v2/${a.repository}/manifests/${a.image.digest}`,
      res.json.token,
      undefined,
      {
        accept: "application/vnd.oci.image.manifest.v1+json",
      },
    );
    expect(pulled.status).toBe(200);
  });

  it("never grants push: a realm token's push is refused by the registry itself", async () => {
    // case P2
    const a = await environmentImage();
    const res = await realm(`repository:${a.repository}:pull,push`, basic(a.environmentId, a.password));
    expect(res.status, res.text).toBe(200);
    expect(claims(res.json.token).access).toEqual([
      { type: "repository", name: a.repository, actions: ["pull"] },
    ]);
    const push = await uploadBlob(info, res.json.token, a.repository, new TextEncoder().encode("planted"));
    expect(push.status).toBe(401);
    expect(await push.text()).toMatch(/UNAUTHORIZED|DENIED|insufficient_scope/);
  });

  it("refuses another environment's repository, a forged credential and another service", async () => {
    // case P3
    const a = await environmentImage();
    const b = await environmentImage();
    const other = await realm(`repository:${b.repository}:pull`, basic(a.environmentId, a.password));
    expect(other.status).toBe(401);
    expect(other.json.code).toBe("unauthorized");
    expect(other.text).not.toMatch(/eyJ/);
    // Nor with b's own credential renamed as a's, nor without any.
    for (const headers of [basic(a.environmentId, b.password), basic(b.environmentId, a.password), {}]) {
      const res = await realm(`repository:${a.repository}:pull`, headers);
      expect(res.status).toBe(401);
      expect(res.headers.get("www-authenticate")).toBe('Basic realm="benchwright registry"');
    }
    const service = await realm(
      `repository:${a.repository}:pull`,
      basic(a.environmentId, a.password),
      "other",
    );
    expect(service.status).toBe(400);
    expect(service.json.code).toBe("invalid_request");
    // The base image's repository, the catalog: not this credential's either.
    for (const scope of [`repository:${BASE_REPOSITORY}:pull`, "registry:catalog:*"]) {
      const res = await realm(scope, basic(a.environmentId, a.password));
      expect(res.status, scope).toBeGreaterThanOrEqual(400);
      expect(res.text).not.toMatch(/eyJ/);
    }
  });

  it("is not there without a registry", async () => {
    const a = await environmentImage();
    const res = await callWith(
      { ...env, REGISTRY_URL: "" },
      null,
      "GET",
      tokenPath(`repository:${a.repository}:pull`),
      undefined,
      basic(a.environmentId, a.password),
    );
    expect(res.status).toBe(404);
  });
});
