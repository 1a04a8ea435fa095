import { runInDurableObject } from "cloudflare:test";
import { env } from "cloudflare:workers";
import type { ExecInfo } from "@benchwright/shared/contract/local-agent";
import { resourcesFor } from "@benchwright/shared/contract/run-spec";
import { and, eq } from "drizzle-orm";
import { createTarDecoder } from "modern-tar";
import { describe, expect, it } from "vitest";
import type { ComputeBackend } from "../../src/broker/backend";
import { templateName } from "../../src/broker/e2b/setup-images";
import { SandboxBroker } from "../../src/broker/sandbox-broker";
import { brokerValue } from "../../src/coordinator/ports";
import { randomId } from "../../src/crypto/api-keys";
import { runs, setupImages } from "../../src/db/schema";
import { pullPassword } from "../../src/images/pull-credential";
import { setupRepository } from "../../src/images/push";
import { registryClient } from "../../src/images/registry";
import type { ContractTemplateBuild, RecordedE2bRequest } from "../contract/e2b-contract";
import type { RealRegistryInfo } from "../setup/registry-info";
import { expectBackendError } from "./backend-fixtures";
import { contractSandboxes, e2b, e2bDeployment, starts } from "./e2b-fixtures";
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
} from "./registry-fixtures";
import { newRun } from "./run-fixtures";

// Setup images on E2B (docs/e2b.md, *Setup images*): the E2B contract server (its template build
// API, test/contract/e2b-builds.ts; the real runner and bw-layer read the sandbox's working
// directory) and the REAL registry. A build captures and pushes the layer, records the registry's
// manifest digest and builds the image's template from that digest in the environment's own
// repository (case P3); a start is a sandbox of that template with no setup stage; a template
// E2B lost is forgotten and built again (P6); the pull credential goes to the build only.

const info = realRegistry as RealRegistryInfo;
const PUBLIC_URL = "https://setup-images.contract.test";
const registryVars = (i: RealRegistryInfo) => ({
  REGISTRY_URL: i.url,
  REGISTRY_SIGNING_KEY: i.signingKey,
  REGISTRY_SERVICE: i.service,
  REGISTRY_ISSUER: i.issuer,
  REGISTRY_REPOSITORY_PREFIX: PREFIX,
});
const SHA256_REF = /@sha256:[0-9a-f]{64}$/;
const CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIBstandin\n-----END CERTIFICATE-----\n";

async function allRequests(since: number): Promise<RecordedE2bRequest[]> {
  return (await (await fetch(`${e2b.url}/_contract/requests?since=${since}`)).json()) as RecordedE2bRequest[];
}

async function builds(): Promise<ContractTemplateBuild[]> {
  return (
    (await (await fetch(`${e2b.url}/_contract/templates`)).json()) as { builds: ContractTemplateBuild[] }
  ).builds;
}

async function run(b: ComputeBackend, id: string, script: string, stage: "setup" | "execute") {
  const execId = randomId("x_");
  await b.exec(id, { id: execId, argv: ["sh", "-c", script], env: {}, stage, timeoutMs: 60_000 });
  for (let i = 0; i < 30; i++) {
    const done: ExecInfo = await b.poll(id, execId, { waitMs: 2_000 });
    if (done.state === "exited") return done;
  }
  throw new Error(`${script} did not end`);
}

describe.skipIf(!realRegistry)("e2b setup images", { timeout: 180_000 }, () => {
  it("builds (capture, push, template by digest), starts from the template, rebuilds a lost one", async () => {
    const settings = await registrySettings(info);
    const base = await pushBaseImage(info, settings, BASE_REPOSITORY, `e2b-${randomId("t").slice(2, 12)}`);
    const deployment = e2bDeployment(PUBLIC_URL);
    const over = { E2B_WORK_IMAGE: base.reference, ...registryVars(info) };
    const backend = deployment.backend(over);
    expect(await backend.baseImage()).toBe(base.digest);
    // Without a pinned image in the registry, every claim is none, and says why.
    expect(await deployment.backend({ ...over, E2B_WORK_IMAGE: "" }).baseImage()).toMatchObject({
      none: expect.stringContaining("E2B_WORK_IMAGE"),
    });

    const brokerEnv = { ...env, ...deployment.ENV, ...over, COMPUTE_BACKEND: "e2b" };
    const stub = env.SANDBOX_BROKER.get(env.SANDBOX_BROKER.newUniqueId());
    const broker = <T>(fn: (b: SandboxBroker) => Promise<T>) =>
      runInDurableObject(stub, (_instance, state) => fn(new SandboxBroker(state, brokerEnv as Env)));

    const tenant = await newTenant();
    const r = await newRun(tenant);
    await withDb((db) => db.update(runs).set({ backend: "e2b" }).where(eq(runs.id, r.id)));
    const repository = setupRepository(settings, tenant.environmentId);
    const password = await pullPassword(info.signingKey, tenant.environmentId);
    const proxyId = randomId("sbx_");
    await broker((b) => b.create(r.id, { id: proxyId, kind: "proxy" }).then(brokerValue));
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
    const since = (await allRequests(0)).at(-1)?.seq ?? 0;

    // The build: setup writes the working directory (and $BW_OUT, which no layer keeps), seal, capture.
    const builder = randomId("sbx_");
    const claimed = await broker((b) => b.claimSetupImage(r.id, builder, request).then(brokerValue));
    expect(claimed.role).toBe("build");
    const key = (claimed as { key: string }).key;
    await broker((b) => b.create(r.id, { ...work(builder), setup: true, capture: true }).then(brokerValue));
    const setup = await run(
      backend,
      builder,
      'd="$HOME/sandbox"; mkdir -p "$d/.venv/bin" "$d/out" && printf installed > "$d/.venv/bin/tool" && chmod 4755 "$d/.venv/bin/tool" && echo run-only > "$d/out/result.txt"',
      "setup",
    );
    expect(setup.exitCode, setup.stderr).toBe(0);
    // Before seal there is nothing to keep: the setup stage may still be writing.
    await expectBackendError(
      backend.captureLayer(builder, 1 << 26, { environmentId: tenant.environmentId, key, runCaPem: null }),
      "not_sealed",
    );
    await backend.seal(builder, { routing: "default", hostsFile: [], caCertPem: CA_PEM });
    const kept = await broker((b) => b.captureSetupImage(r.id, builder, key).then(brokerValue));
    const [row] = await withDb((db) =>
      db
        .select()
        .from(setupImages)
        .where(and(eq(setupImages.environmentId, tenant.environmentId), eq(setupImages.key, key))),
    );
    expect(row).toMatchObject({ status: "built", digest: kept.digest, repository, backend: "e2b" });
    // The registry's tag (the key) names exactly the recorded manifest digest.
    expect(await registryClient(settings).manifest(repository, key)).toMatchObject({
      ok: true,
      value: { found: true, digest: kept.digest },
    });

    // The layer is the working directory under home/sandbox/, without $BW_OUT, setuid cleared.
    const byTag = await registryClient(settings).manifest(repository, kept.digest);
    const manifest = JSON.parse(
      new TextDecoder().decode((byTag as { value: { body: Uint8Array } }).value.body),
    );
    const pull = await testToken(settings, [{ type: "repository", name: repository, actions: ["pull"] }]);
    const blob = await registryFetch(
      info,
      "GET",
      `/v2/${repository}/blobs/${manifest.layers.at(-1).digest}`,
      pull,
    );
    const entries = new Blob([await blob.arrayBuffer()])
      .stream()
      .pipeThrough(new DecompressionStream("gzip") as unknown as TransformStream<Uint8Array, Uint8Array>)
      .pipeThrough(createTarDecoder());
    const names: Array<[string, number]> = [];
    for await (const { header, body } of entries as unknown as AsyncIterable<{
      header: { name: string; mode?: number };
      body: ReadableStream<Uint8Array>;
    }>) {
      names.push([header.name, header.mode ?? 0]);
      await body.cancel();
    }
    expect(names.map(([n]) => n)).toEqual([
      "home/sandbox/",
      "home/sandbox/.wh..wh..opq",
      "home/sandbox/.venv/",
      "home/sandbox/.venv/bin/",
      "home/sandbox/.venv/bin/tool",
    ]);
    expect(names.at(-1)?.[1]).toBe(0o755);

    // case P3: the template is built from the recorded digest in the environment's own
    // repository, never a tag, with the environment's own pull credential, which the realm takes
    // for that repository's pull.
    const name = await templateName(PUBLIC_URL, tenant.environmentId, kept.digest);
    const build = (await builds()).find((b) => b.name === name);
    expect(build?.status).toBe("ready");
    expect(build?.start?.fromImage).toBe(`${info.host}/${repository}@${kept.digest}`);
    expect(build?.start?.fromImage).toMatch(SHA256_REF);
    expect(build?.start?.fromImageRegistry).toEqual({
      type: "registry",
      username: tenant.environmentId,
      password,
    });
    const realm = await callWith(
      registryEnv(info),
      null,
      "GET",
      `/registry/token?service=${encodeURIComponent(info.service)}&scope=${encodeURIComponent(`repository:${repository}:pull`)}`,
      undefined,
      { authorization: `Basic ${btoa(`${tenant.environmentId}:${password}`)}` },
    );
    expect(realm.status, realm.text).toBe(200);

    // A start from it: a sandbox of that template, and no setup-stage command in it.
    const user = randomId("sbx_");
    const use = await broker((b) => b.claimSetupImage(r.id, user, request).then(brokerValue));
    expect(use).toMatchObject({ role: "use", digest: kept.digest, builtByRunId: r.id });
    await broker((b) => b.create(r.id, { ...work(user), setupImage: { key } }).then(brokerValue));
    const started = (await contractSandboxes(r.id)).find((s) => s.metadata["bw-sandbox"] === user);
    expect(started?.alias).toBe(name);
    const sent = await allRequests(since);
    const commands = starts(sent, started?.sandboxID ?? "").map((s) => JSON.stringify(s.body));
    expect(commands.some((c) => c.includes("--setup"))).toBe(false);
    // The pull credential went to the template build only: in no create, in no sandbox.
    const carrying = sent.filter((s) => JSON.stringify(s.body ?? "").includes(password));
    expect(carrying.map((s) => `${s.method} ${s.path}`)).toEqual([
      `POST /v2/templates/${build?.templateID}/builds/${build?.buildID}`,
    ]);
    const creates = sent.filter((s) => s.method === "POST" && s.path === "/v2/sandboxes");
    expect(creates.length).toBe(2); // the builder and the start

    // case P6: E2B loses the template; the next start is refused setup_image_missing, the row
    // goes, and the key is built again.
    const deleted = await fetch(`${e2b.url}/templates/${name}`, {
      method: "DELETE",
      headers: { "x-api-key": e2b.apiKey },
    });
    expect(deleted.status).toBe(204);
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
    expect(await broker((b) => b.claimSetupImage(r.id, randomId("sbx_"), request).then(brokerValue))).toEqual(
      {
        role: "build",
        key,
      },
    );

    // dropLayer: the template (already gone here) and the manifest.
    expect(await backend.dropLayer(kept.digest, repository)).toBe("dropped");
    expect(await registryClient(settings).manifest(repository, kept.digest)).toMatchObject({
      ok: true,
      value: { found: false },
    });
  });
});
