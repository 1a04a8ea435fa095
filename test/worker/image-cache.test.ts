import { env } from "cloudflare:workers";
import { and, eq } from "drizzle-orm";
import { afterEach, describe, expect, inject, it, vi } from "vitest";
import { issueCapability, revokeCapability } from "../../src/compute/capability";
import { imageBuilds } from "../../src/db/schema";
import type { RecordedRequest } from "../contract/registry-contract";
import { type ApiResponse, callWith, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import { captureLogs, findNeedles, leakNeedles, scanDatabase } from "./leaks";
import { newRun, setRunStatus } from "./run-fixtures";

// The image build cache (issue 7): /compute/images with a run's capability, the broker's push
// tokens and digest checks, against the OCI registry CONTRACT SERVER of test/contract (a real
// registry cannot run here; the contract enforces token auth as distribution's specs say: the
// ES256 signature, issuer, audience, expiry and the per-repository access claim). Pushes are
// made by the test itself with the token the broker handed out, as a run's sandbox would.

const registry = inject("registry");
const PREFIX = "bw-cache";
const HOST = new URL(registry.url).host;

/** The Worker's bindings with the cache configured to talk to the contract registry. */
const cacheEnv: Env = {
  ...env,
  REGISTRY_URL: registry.url,
  REGISTRY_SIGNING_KEY: registry.signingKey,
  REGISTRY_SERVICE: registry.service,
  REGISTRY_ISSUER: registry.issuer,
  REGISTRY_REPOSITORY_PREFIX: PREFIX,
};

interface CapRun {
  runId: string;
  capId: string;
  capToken: string;
  /** POST /compute/images {contentHash}. */
  ask: (contentHash: string, bindings?: Env) => Promise<ApiResponse>;
  /** POST /compute/images/{hash}/pushed. */
  pushed: (contentHash: string, bindings?: Env) => Promise<ApiResponse>;
}

/** A run of `t` whose work sandbox holds a compute capability issued by the code under test. */
async function capRun(t: Tenant): Promise<CapRun> {
  const run = await newRun(t);
  const cap = await withDb((db) => issueCapability(db, run.id, "sbx_work_images"));
  return {
    runId: run.id,
    capId: cap.id,
    capToken: cap.token,
    ask: (contentHash, bindings = cacheEnv) =>
      callWith(bindings, cap.token, "POST", "/compute/images", { contentHash }),
    pushed: (contentHash, bindings = cacheEnv) =>
      callWith(bindings, cap.token, "POST", `/compute/images/${contentHash}/pushed`),
  };
}

const hex = (bytes: Uint8Array) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
const newHash = () => hex(crypto.getRandomValues(new Uint8Array(32)));
const sha256 = async (bytes: Uint8Array) =>
  `sha256:${hex(new Uint8Array(await crypto.subtle.digest("SHA-256", bytes)))}`;

function claimsOf(token: string) {
  const [h, p] = token.split(".") as [string, string];
  const decode = (s: string) => JSON.parse(atob(s.replaceAll("-", "+").replaceAll("_", "/")));
  return { header: decode(h), payload: decode(p) };
}

/** A request straight to the contract registry, as a sandbox's push tool would make it. */
function registryFetch(
  method: string,
  path: string,
  token: string | null,
  body?: Uint8Array | string,
  headers: Record<string, string> = {},
) {
  return fetch(`${registry.url}${path}`, {
    method,
    headers: { ...headers, ...(token ? { authorization: `Bearer ${token}` } : {}) },
    ...(body === undefined ? {} : { body }),
    redirect: "manual",
  });
}

async function uploadBlob(token: string, repository: string, bytes: Uint8Array): Promise<Response> {
  const digest = await sha256(bytes);
  const start = await registryFetch("POST", `/v2/${repository}/blobs/uploads/`, token);
  if (start.status !== 202) return start;
  const location = start.headers.get("location") ?? "";
  return registryFetch("PUT", `${location}?digest=${digest}`, token, bytes, {
    "content-type": "application/octet-stream",
  });
}

const OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json";

/**
 * Pushes a small OCI image (a config and one layer that name `label`) to repository:tag with
 * `token`; returns the manifest's digest, computed here from the bytes sent.
 */
async function pushImage(token: string, repository: string, tag: string, label: string) {
  const utf8 = (s: string) => new TextEncoder().encode(s);
  const config = utf8(
    JSON.stringify({ architecture: "amd64", os: "linux", rootfs: { type: "layers", diff_ids: [] }, label }),
  );
  const layer = utf8(`layer of ${label} ${crypto.randomUUID()}`);
  for (const blob of [config, layer]) {
    const res = await uploadBlob(token, repository, blob);
    expect(res.status, `blob upload to ${repository}: ${await res.clone().text()}`).toBe(201);
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
          mediaType: "application/vnd.oci.image.layer.v1.tar",
          digest: await sha256(layer),
          size: layer.length,
        },
      ],
    }),
  );
  const res = await registryFetch("PUT", `/v2/${repository}/manifests/${tag}`, token, manifest, {
    "content-type": OCI_MANIFEST,
  });
  expect(res.status, await res.clone().text()).toBe(201);
  const digest = await sha256(manifest);
  expect(res.headers.get("docker-content-digest")).toBe(digest);
  return { digest, manifest };
}

async function recorded(repository?: string): Promise<RecordedRequest[]> {
  const q = repository ? `?repository=${encodeURIComponent(repository)}` : "";
  return (await fetch(`${registry.url}/_contract/requests${q}`)).json();
}

const rowOf = (environmentId: string, contentHash: string) =>
  withDb(async (db) => {
    const [row] = await db
      .select()
      .from(imageBuilds)
      .where(and(eq(imageBuilds.environmentId, environmentId), eq(imageBuilds.contentHash, contentHash)));
    return row;
  });

/** A built cache entry: `run` asked, pushed `label` with the token it got, and confirmed. */
async function built(t: Tenant, run: CapRun, contentHash: string, label = "v1") {
  const grant = (await run.ask(contentHash)).json;
  expect(grant.status).toBe("push");
  const pushed = await pushImage(grant.token, grant.repository, grant.tag, label);
  const confirm = await run.pushed(contentHash);
  expect(confirm.status, confirm.text).toBe(200);
  expect(confirm.json.digest).toBe(pushed.digest);
  return { grant, digest: pushed.digest, tenant: t };
}

afterEach(() => {
  vi.restoreAllMocks();
});

describe("push tokens", { timeout: 60_000 }, () => {
  it("are scoped to one repository per (environment, hash): the registry takes pushes there and refuses them anywhere else", async () => {
    const t = await newTenant();
    const run = await capRun(t);
    const hash = newHash();
    const res = await run.ask(hash);
    expect(res.status, res.text).toBe(200);
    expect(res.headers.get("cache-control")).toBe("no-store");
    const grant = res.json;
    const repository = `${PREFIX}/${t.environmentId}/${hash}`;
    expect(grant).toMatchObject({
      status: "push",
      reason: "new",
      contentHash: hash,
      registry: HOST,
      repository,
      tag: hash,
      image: `${HOST}/${repository}:${hash}`,
    });
    const { header, payload } = claimsOf(grant.token);
    expect(header).toMatchObject({ alg: "ES256", typ: "JWT" });
    expect(payload.access).toEqual([{ type: "repository", name: repository, actions: ["push", "pull"] }]);
    expect(payload).toMatchObject({ iss: registry.issuer, aud: registry.service, sub: `run:${run.runId}` });
    expect(payload.exp - payload.iat).toBe(600);
    expect(new Date(grant.expiresAt).getTime()).toBe(payload.exp * 1000);
    expect(payload.jti).toMatch(/^[A-Za-z0-9_-]{22}$/);

    // Its own repository: blobs and the manifest go in.
    const { digest } = await pushImage(grant.token, repository, hash, "own");

    // Any other repository, even the same environment's next hash: refused, nothing written.
    const other = `${PREFIX}/${t.environmentId}/${newHash()}`;
    const blob = await uploadBlob(grant.token, other, new TextEncoder().encode("elsewhere"));
    expect(blob.status).toBe(401);
    expect(blob.headers.get("www-authenticate")).toContain('error="insufficient_scope"');
    expect(blob.headers.get("www-authenticate")).toContain(`scope="repository:${other}:pull,push"`);
    expect(((await blob.json()) as { errors: { code: string }[] }).errors[0]?.code).toBe("DENIED");
    const read = await registryFetch("GET", `/v2/${other}/manifests/${hash}`, grant.token);
    expect(read.status).toBe(401);
    // The tag of its own repository is readable with it (pull), and holds what was pushed.
    const own = await registryFetch("HEAD", `/v2/${repository}/manifests/${hash}`, grant.token);
    expect(own.headers.get("docker-content-digest")).toBe(digest);

    // The registry checks the signature: the same claims naming another repository are refused.
    const [h, , s] = grant.token.split(".");
    const forgedClaims = btoa(JSON.stringify({ ...payload, access: [{ ...payload.access[0], name: other }] }))
      .replaceAll("+", "-")
      .replaceAll("/", "_")
      .replace(/=+$/, "");
    const forged = await uploadBlob(`${h}.${forgedClaims}.${s}`, other, new TextEncoder().encode("forged"));
    expect(forged.status).toBe(401);
    expect(forged.headers.get("www-authenticate")).toContain('error="invalid_token"');

    const seen = await recorded(other);
    expect(seen.map((r) => r.auth)).toEqual(["insufficient_scope", "insufficient_scope", "invalid_token"]);
    expect(seen.every((r) => r.status === 401)).toBe(true);
  });

  it("cannot write another environment's repository, nor mount its blobs", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const hash = newHash();
    const bRun = await capRun(b);
    const bBuilt = await built(b, bRun, hash, "b");
    const aGrant = (await (await capRun(a)).ask(hash)).json;
    expect(aGrant.repository).not.toBe(bBuilt.grant.repository);
    expect(aGrant.repository).toContain(a.environmentId);

    const bRepo = bBuilt.grant.repository;
    const overwrite = await registryFetch("PUT", `/v2/${bRepo}/manifests/${hash}`, aGrant.token, "{}", {
      "content-type": OCI_MANIFEST,
    });
    expect(overwrite.status).toBe(401);
    expect(overwrite.headers.get("www-authenticate")).toContain('error="insufficient_scope"');
    // A mount from B's repository needs pull there: the registry starts a plain upload instead.
    const layerDigest = JSON.parse(
      await (await registryFetch("GET", `/v2/${bRepo}/manifests/${hash}`, bBuilt.grant.token)).text(),
    ).layers[0].digest;
    const mount = await registryFetch(
      "POST",
      `/v2/${aGrant.repository}/blobs/uploads/?mount=${layerDigest}&from=${bRepo}`,
      aGrant.token,
    );
    expect(mount.status).toBe(202);
    // B's entry is untouched.
    expect((await bRun.ask(hash)).json).toMatchObject({ status: "built", digest: bBuilt.digest });
  });
});

describe("built entries", { timeout: 60_000 }, () => {
  it("after the pushing run confirms, another run of the environment gets the image by its exact digest", async () => {
    const t = await newTenant();
    const [first, second] = [await capRun(t), await capRun(t)];
    const hash = newHash();
    const grant = (await first.ask(hash)).json;
    const { digest } = await pushImage(grant.token, grant.repository, grant.tag, "v1");

    const confirm = await first.pushed(hash);
    expect(confirm.status, confirm.text).toBe(200);
    const expected = {
      status: "built",
      contentHash: hash,
      digest,
      image: `${HOST}/${grant.repository}@${digest}`,
      repository: grant.repository,
      tag: hash,
    };
    expect(confirm.json).toMatchObject(expected);
    // Idempotent for the pushing run.
    expect((await first.pushed(hash)).json).toEqual(confirm.json);

    const again = await second.ask(hash);
    expect(again.status, again.text).toBe(200);
    expect(again.json).toMatchObject(expected);
    expect(again.json.token).toBeUndefined();
    const row = await rowOf(t.environmentId, hash);
    expect(row).toMatchObject({
      status: "built",
      digest,
      pushRunId: first.runId,
      repository: grant.repository,
    });

    // The broker read the tag with a pull token it minted after the registry's challenge, for
    // that repository only, and never went to the challenge's realm.
    const reads = (await recorded(grant.repository)).filter((r) => r.path.endsWith(`/manifests/${hash}`));
    const brokerReads = reads.filter((r) => r.subject === "benchwright-broker");
    expect(brokerReads.length).toBeGreaterThanOrEqual(3);
    expect(brokerReads.every((r) => r.auth === "ok" && r.status === 200 && r.method === "GET")).toBe(true);
    expect(reads.filter((r) => r.auth === "none").length).toBe(brokerReads.length);
    expect((await recorded()).filter((r) => r.path === "/token")).toEqual([]);
  });

  it("a tag pushed again with a still-valid token is not accepted: the broker asks for a rebuild", async () => {
    const t = await newTenant();
    const [first, second, third] = [await capRun(t), await capRun(t), await capRun(t)];
    const hash = newHash();
    const { grant, digest } = await built(t, first, hash, "genuine");

    // The first run's token is still valid for 10 minutes: it pushes something else to the tag.
    const tampered = await pushImage(grant.token, grant.repository, grant.tag, "tampered");
    expect(tampered.digest).not.toBe(digest);

    // The pusher cannot have the new digest recorded...
    expectProblem(await first.pushed(hash), 409, "image_tag_changed");
    expect(await rowOf(t.environmentId, hash)).toMatchObject({ status: "built", digest });
    // ...and the next run is not handed either digest: it is asked to rebuild.
    const next = await second.ask(hash);
    expect(next.status, next.text).toBe(200);
    expect(next.json).toMatchObject({ status: "push", reason: "tag_changed", repository: grant.repository });
    expect(next.text).not.toContain(digest);
    expect(next.text).not.toContain(tampered.digest);
    expect(await rowOf(t.environmentId, hash)).toMatchObject({
      status: "pending",
      digest: null,
      builtAt: null,
      pushRunId: second.runId,
    });
    // The push is the second run's now: the first cannot confirm anything.
    expectProblem(await first.pushed(hash), 404, "not_found");

    const rebuilt = await pushImage(next.json.token, next.json.repository, next.json.tag, "rebuilt");
    expect((await second.pushed(hash)).json).toMatchObject({ status: "built", digest: rebuilt.digest });
    expect((await third.ask(hash)).json).toMatchObject({
      status: "built",
      digest: rebuilt.digest,
      image: `${HOST}/${grant.repository}@${rebuilt.digest}`,
    });
  });

  it("the pending push belongs to the run that asked last; confirming before pushing is image_not_pushed", async () => {
    const t = await newTenant();
    const [first, second] = [await capRun(t), await capRun(t)];
    const hash = newHash();
    const firstGrant = (await first.ask(hash)).json;
    expectProblem(await first.pushed(hash), 409, "image_not_pushed");
    const secondGrant = (await second.ask(hash)).json;
    expect(secondGrant).toMatchObject({
      status: "push",
      reason: "pending",
      repository: firstGrant.repository,
    });
    expect(secondGrant.token).not.toBe(firstGrant.token);
    await pushImage(firstGrant.token, firstGrant.repository, firstGrant.tag, "first");
    expectProblem(await first.pushed(hash), 404, "not_found");
    expect((await rowOf(t.environmentId, hash))?.status).toBe("pending");
    expect((await second.pushed(hash)).json.status).toBe("built");
  });
});

describe("environments", { timeout: 60_000 }, () => {
  it("never see another environment's entry, built or pending", async () => {
    const [a, b] = [await newTenant(), await newTenant()];
    const hash = newHash();
    const aRun = await capRun(a);
    const aBuilt = await built(a, aRun, hash, "a");

    const bRun = await capRun(b);
    expectProblem(await bRun.pushed(hash), 404, "not_found");
    const bGrant = await bRun.ask(hash);
    expect(bGrant.json).toMatchObject({ status: "push", reason: "new" });
    expect(bGrant.json.repository).toBe(`${PREFIX}/${b.environmentId}/${hash}`);
    expect(bGrant.text).not.toContain(a.environmentId);
    expect(bGrant.text).not.toContain(aBuilt.digest);
    // B's token cannot even read A's entry.
    const peek = await registryFetch(
      "GET",
      `/v2/${aBuilt.grant.repository}/manifests/${hash}`,
      bGrant.json.token,
    );
    expect(peek.status).toBe(401);
    // A's entry is A's still; B's pending push is not A's to confirm (A's call answers A's entry).
    expect((await aRun.ask(hash)).json).toMatchObject({ status: "built", digest: aBuilt.digest });
    expect((await aRun.pushed(hash)).json.repository).toBe(aBuilt.grant.repository);
    expect(await rowOf(b.environmentId, hash)).toMatchObject({ status: "pending", pushRunId: bRun.runId });
  });
});

describe("capability and input", { timeout: 60_000 }, () => {
  it("an expired, revoked, ended-run, malformed or missing capability is 401 on both routes, and writes nothing", async () => {
    const t = await newTenant();
    const hash = newHash();
    const run = await newRun(t);
    const expired = await withDb((db) =>
      issueCapability(db, run.id, "sbx_old", new Date(Date.now() - 16 * 60_000)),
    );
    const revoked = await withDb((db) => issueCapability(db, run.id, "sbx_revoked"));
    await withDb((db) => revokeCapability(db, revoked.id));
    const ended = await newRun(t);
    const endedCap = await withDb((db) => issueCapability(db, ended.id, "sbx_ended"));
    await setRunStatus(ended.id, "finished");
    for (const token of [expired.token, revoked.token, endedCap.token, "bwc_nope", null]) {
      expectProblem(
        await callWith(cacheEnv, token, "POST", "/compute/images", { contentHash: hash }),
        401,
        "unauthorized",
      );
      expectProblem(
        await callWith(cacheEnv, token, "POST", `/compute/images/${hash}/pushed`),
        401,
        "unauthorized",
      );
    }
    // An API key is not a capability either.
    expectProblem(
      await callWith(cacheEnv, t.key, "POST", "/compute/images", { contentHash: hash }),
      401,
      "unauthorized",
    );
    expect(await rowOf(t.environmentId, hash)).toBeUndefined();
  });

  it("a bad content hash is 400 invalid_content_hash; other bad bodies their own codes", async () => {
    const t = await newTenant();
    const run = await capRun(t);
    const post = (body: unknown, headers?: Record<string, string>) =>
      callWith(cacheEnv, run.capToken, "POST", "/compute/images", body, headers);
    const good = newHash();
    for (const bad of [good.toUpperCase(), good.slice(1), `${good}0`, `g${good.slice(1)}`, "", 42, null]) {
      expectProblem(await post({ contentHash: bad }), 400, "invalid_content_hash");
    }
    expectProblem(await post({}), 400, "invalid_content_hash");
    for (const bad of [good.toUpperCase(), good.slice(1), "zz", `sha256:${good}`]) {
      const res = await callWith(
        cacheEnv,
        run.capToken,
        "POST",
        `/compute/images/${encodeURIComponent(bad)}/pushed`,
      );
      expectProblem(res, 400, "invalid_content_hash");
    }
    expectProblem(await post({ contentHash: good, environmentId: "env_other" }), 400, "unknown_field");
    expectProblem(await post("not json"), 400, "invalid_json");
    expectProblem(await post({ contentHash: good }, { "content-type": "text/plain" }), 400, "invalid_json");
    expectProblem(await post({ contentHash: good, pad: "x".repeat(5000) }), 413, "payload_too_large");
    expect(await rowOf(t.environmentId, good)).toBeUndefined();
  });
});

describe("registry configuration", { timeout: 60_000 }, () => {
  it("no registry → 503 registry_not_configured; a malformed key → config_invalid without its value", async () => {
    const run = await capRun(await newTenant());
    const hash = newHash();
    expectProblem(await run.ask(hash, { ...env, REGISTRY_URL: "" }), 503, "registry_not_configured");
    const badKey = "not-a-jwk-0f9e8d7c";
    const res = expectProblem(
      await run.ask(hash, { ...cacheEnv, REGISTRY_SIGNING_KEY: badKey }),
      500,
      "config_invalid",
    );
    expect(res.json.detail).toContain("REGISTRY_SIGNING_KEY");
    expect(res.text).not.toContain(badKey);
    const http = await run.ask(hash, { ...cacheEnv, REGISTRY_URL: "http://registry.example.com" });
    expectProblem(http, 500, "config_invalid");
  });

  it("a registry that does not trust the broker's key → 502 registry_refused, never 'built'; unreachable → 503", async () => {
    const t = await newTenant();
    const run = await capRun(t);
    const hash = newHash();
    await built(t, run, hash);
    const pair = (await crypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
      "sign",
      "verify",
    ])) as CryptoKeyPair;
    const stranger = JSON.stringify(await crypto.subtle.exportKey("jwk", pair.privateKey));
    expectProblem(
      await run.ask(hash, { ...cacheEnv, REGISTRY_SIGNING_KEY: stranger }),
      502,
      "registry_refused",
    );
    expectProblem(
      await run.ask(hash, { ...cacheEnv, REGISTRY_SERVICE: "other.service" }),
      502,
      "registry_refused",
    );
    // Port 1 on loopback: nothing listens there.
    expectProblem(
      await run.ask(hash, { ...cacheEnv, REGISTRY_URL: "http://127.0.0.1:1" }),
      503,
      "registry_unreachable",
    );
    // None of it changed the entry.
    expect((await run.ask(hash)).json.status).toBe("built");
  });
});

describe("the push token's secrecy", { timeout: 120_000 }, () => {
  it("is in no database column and no log line, through new, refreshed, rebuilt and confirmed pushes", async () => {
    const logs = captureLogs();
    const t = await newTenant();
    const [first, second] = [await capRun(t), await capRun(t)];
    const hash = newHash();
    const tokens: string[] = [];
    const g1 = (await first.ask(hash)).json;
    const g2 = (await first.ask(hash)).json;
    tokens.push(g1.token, g2.token);
    await pushImage(g2.token, g2.repository, g2.tag, "one");
    await first.pushed(hash);
    await pushImage(g2.token, g2.repository, g2.tag, "two");
    const g3 = (await second.ask(hash)).json;
    expect(g3.reason).toBe("tag_changed");
    tokens.push(g3.token);
    await pushImage(g3.token, g3.repository, g3.tag, "three");
    expect((await second.pushed(hash)).status).toBe(200);

    // The log does tell what happened, by the tokens' ids.
    const issuedLines = logs.filter((l) => l.includes('"event":"image_push_issued"'));
    expect(issuedLines).toHaveLength(3);
    for (const g of [g1, g2, g3]) {
      expect(issuedLines.some((l) => l.includes(claimsOf(g.token).payload.jti))).toBe(true);
    }
    expect(logs.some((l) => l.includes('"event":"image_tag_changed"'))).toBe(true);
    expect(logs.some((l) => l.includes('"event":"image_built"'))).toBe(true);

    const needles = [
      ...new Set([
        ...tokens,
        ...tokens.map((tk) => tk.split(".")[2] as string),
        ...(await Promise.all(tokens.map(leakNeedles))).flat(),
      ]),
    ];
    expect(logs.flatMap((line, i) => findNeedles(`log line ${i}`, line, needles))).toEqual([]);
    const scan = await scanDatabase(needles);
    expect(scan.columns).toContain("public.image_builds.repository");
    expect(scan.hits).toEqual([]);
    // The same scan finds what the row does store (its repository), so it would find a token.
    const control = await scanDatabase([g3.repository]);
    expect(control.hits).toContainEqual({ where: "public.image_builds.repository", needle: g3.repository });
  });
});
