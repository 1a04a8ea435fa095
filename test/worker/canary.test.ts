import { env } from "cloudflare:workers";
import { parseKeyRing } from "@benchwright/shared/contract/key-ring";
import { isTerminal } from "@benchwright/shared/contract/run-states";
import { eq } from "drizzle-orm";
import { afterEach, describe, expect, inject, it, vi } from "vitest";
import { decryptSecret, keyIdOf, type SecretAad } from "../../src/crypto/vault-crypto";
import { vaultSecrets } from "../../src/db/schema";
import { storeArtifacts } from "../../src/runs/artifacts";
import { collectArchive, file, tarGz, upload } from "./archives";
import { type ApiResponse, call, expectProblem, newTenant, type Tenant, withDb } from "./harness";
import {
  captureLogs,
  findNeedles,
  leakNeedles,
  newCanary,
  responseText,
  scanBucket,
  scanDatabase,
} from "./leaks";
import { driveUntil, newRun } from "./run-fixtures";

// Case B5: a canary secret appears 0 times in logs, response bodies and headers (error bodies
// included) and database plaintext, however the vault routes are driven; case B8 at the
// database level: a stored row decrypts only under its true owner and id.

afterEach(() => {
  vi.restoreAllMocks();
});

/** Calls the API and keeps every response for the final scan. */
function recorder(t: Tenant) {
  const responses: [string, ApiResponse][] = [];
  const api = async (
    method: string,
    path: string,
    body?: unknown,
    expected?: [number, string?],
    headers?: Record<string, string>,
  ) => {
    const res = await call(t.key, method, path, body, headers);
    responses.push([`${method} ${path}`, res]);
    if (expected) {
      const [status, code] = expected;
      if (code) expectProblem(res, status, code);
      else if (res.status !== status) {
        throw new Error(`${method} ${path}: expected ${status}, got ${res.status} ${res.text}`);
      }
    }
    return res;
  };
  return { api, responses };
}

describe("B5 canary secret never leaks", { timeout: 120_000 }, () => {
  it("drives every vault route, error paths included: 0 canaries in logs, responses and the database", async () => {
    const t = await newTenant();
    const tag = crypto.randomUUID().slice(0, 8);
    const { api, responses } = recorder(t);
    const logs = captureLogs();
    // Every value sent as a secret, accepted or refused: none may surface anywhere.
    const canaries: string[] = [];
    const canary = (label: string) => {
      const value = newCanary(label);
      canaries.push(value);
      return value;
    };
    const name = `CANARY_${tag}`;

    // Secrets: create, refused creates, replace, refused replaces.
    const created = await api("POST", "/v1/vault/secrets", { name, value: canary("first") }, [201]);
    const secretId: string = created.json.id;
    await api("POST", "/v1/vault/secrets", { name, value: canary("dup") }, [409, "secret_exists"]);
    await api("POST", "/v1/vault/secrets", { name: "1 bad name", value: canary("badname") }, [
      400,
      "invalid_request",
    ]);
    await api("POST", "/v1/vault/secrets", { name: "CRLF", value: `${canary("crlf")}\r\nX-Injected: 1` }, [
      400,
      "invalid_request",
    ]);
    await api("POST", "/v1/vault/secrets", { name: "SURROGATE", value: `${canary("surrogate")}\ud800` }, [
      400,
      "invalid_request",
    ]);
    await api("POST", "/v1/vault/secrets", { name: "LONG", value: canary("long").repeat(500) }, [
      400,
      "invalid_request",
    ]);
    await api("POST", "/v1/vault/secrets", { name: "EXTRA", value: canary("extra"), note: "x" }, [
      400,
      "unknown_field",
    ]);
    await api("POST", "/v1/vault/secrets", `{"name":"TRUNCATED","value":"${canary("truncated")}`, [
      400,
      "invalid_json",
    ]);
    await api(
      "POST",
      "/v1/vault/secrets",
      JSON.stringify({ name: "TEXT", value: canary("textplain") }),
      [400, "invalid_json"],
      { "content-type": "text/plain" },
    );
    await api("PUT", `/v1/vault/secrets/${secretId}`, { value: canary("second") }, [200]);
    await api("PUT", "/v1/vault/secrets/sec_nope", { value: canary("missing") }, [404, "not_found"]);
    await api("PUT", `/v1/vault/secrets/${secretId}`, { value: `${canary("nul")}\u0000` }, [
      400,
      "invalid_request",
    ]);
    await api("POST", "/v1/vault/secrets", { name: `BASIC_${tag}`, value: `svc:${canary("basic")}` }, [201]);
    const temp = await api(
      "POST",
      "/v1/vault/secrets",
      { name: `TEMP_${tag}`, value: canary("temp") },
      [201],
    );
    await api("DELETE", `/v1/vault/secrets/${temp.json.id}`, undefined, [204]);

    // Rules that use it, and refused rules.
    const rule = await api(
      "POST",
      "/v1/vault/rules",
      { host: `api.${tag}.example`, secret: name, inject: { scheme: "bearer" } },
      [201],
    );
    await api(
      "POST",
      "/v1/vault/rules",
      { host: `basic.${tag}.example`, secret: `BASIC_${tag}`, inject: { scheme: "basic" } },
      [201],
    );
    await api(
      "POST",
      "/v1/vault/rules",
      { host: `search.${tag}.example`, secret: name, inject: { scheme: "query", name: "key" }, position: 0 },
      [201],
    );
    await api("POST", "/v1/vault/rules", { host: "*.com", secret: name, inject: { scheme: "bearer" } }, [
      400,
      "invalid_host_pattern",
    ]);
    await api(
      "POST",
      "/v1/vault/rules",
      { host: `x.${tag}.example`, secret: "NO_SUCH_SECRET", inject: { scheme: "bearer" } },
      [400, "unknown_secret"],
    );
    await api(
      "POST",
      "/v1/vault/rules",
      { host: `x.${tag}.example`, secret: name, inject: { scheme: "raw" } },
      [400, "invalid_request"],
    );
    await api(
      "POST",
      "/v1/vault/rules",
      { host: `x.${tag}.example`, secret: name, inject: { scheme: "raw", name: "content-length" } },
      [400, "invalid_request"],
    );
    await api("POST", "/v1/vault/hosts", { pattern: `evil.${tag}.example`, action: "block" }, [200]);
    await api(
      "POST",
      "/v1/vault/rules",
      { host: `evil.${tag}.example`, secret: name, inject: { scheme: "bearer" } },
      [409, "rule_host_blocked"],
    );
    await api(
      "PATCH",
      `/v1/vault/rules/${rule.json.id}`,
      { inject: { scheme: "raw", name: "X-Api-Key" } },
      [200],
    );
    await api("PATCH", "/v1/vault/rules/rul_nope", { position: 0 }, [404, "not_found"]);
    await api("PUT", "/v1/vault/rules/order", { ids: [rule.json.id] }, [400, "invalid_order"]);
    const order = (await api("GET", "/v1/vault/rules", undefined, [200])).json.rules.map(
      (r: { id: string }) => r.id,
    );
    await api("PUT", "/v1/vault/rules/order", { ids: [...order].reverse() }, [200]);

    // Host entries and the default.
    await api("POST", "/v1/vault/hosts", { pattern: "*", action: "block" }, [400, "invalid_host_pattern"]);
    await api("POST", "/v1/vault/hosts", { pattern: `*.${tag}.example`, action: "block" }, [
      409,
      "rule_host_blocked",
    ]);
    const hosts = (await api("GET", "/v1/vault/hosts", undefined, [200])).json.hosts as {
      id: string;
      pattern: string;
    }[];
    const implicit = hosts.find((h) => h.pattern === `api.${tag}.example`);
    await api("DELETE", `/v1/vault/hosts/${implicit?.id}`, undefined, [409, "host_has_rule"]);
    await api("DELETE", `/v1/vault/secrets/${secretId}`, undefined, [409, "secret_in_use"]);
    const evil = hosts.find((h) => h.pattern === `evil.${tag}.example`);
    await api("PATCH", `/v1/vault/hosts/${evil?.id}`, { action: "allow" }, [200]);
    await api("DELETE", `/v1/vault/hosts/${evil?.id}`, undefined, [204]);
    await api("DELETE", "/v1/vault/hosts/hst_nope", undefined, [404, "not_found"]);
    const extra = await api(
      "POST",
      "/v1/vault/rules",
      { host: `extra.${tag}.example`, secret: name, inject: { scheme: "bearer" } },
      [201],
    );
    await api("DELETE", `/v1/vault/rules/${extra.json.id}`, undefined, [204]);
    await api("POST", "/v1/vault/hosts/from-blocked", { hosts: [`refused.${tag}.example`] }, [200]);
    await api("POST", "/v1/vault/hosts/from-blocked", { hosts: [`*.${tag}.example`] }, [
      400,
      "invalid_host_pattern",
    ]);
    await api("POST", "/v1/vault/hosts/starter-pack", undefined, [200]);
    await api("PUT", "/v1/vault/settings", { default: "block" }, [200]);

    // Models: one names the canary's secret (by name); refused bodies, two with a value in the URL.
    const modelName = `m-${tag}`;
    const modelBody = {
      name: modelName,
      provider: "openai",
      baseUrl: `https://llm.${tag}.example/v1`,
      secret: name,
    };
    const model = await api("POST", "/v1/vault/models", modelBody, [201]);
    await api("POST", "/v1/vault/models", modelBody, [409, "model_exists"]);
    await api(
      "POST",
      "/v1/vault/models",
      { ...modelBody, name: "x", baseUrl: `https://u:${canary("userinfo")}@llm.${tag}.example/v1` },
      [400, "invalid_base_url"],
    );
    await api(
      "POST",
      "/v1/vault/models",
      { ...modelBody, name: "x", baseUrl: `https://llm.${tag}.example/v1?key=${canary("query")}` },
      [400, "invalid_base_url"],
    );
    await api("POST", "/v1/vault/models", { ...modelBody, name: "y", secret: "NOPE" }, [
      400,
      "unknown_secret",
    ]);
    await api("PATCH", `/v1/vault/models/${model.json.id}`, { upstreamModel: "gpt-x" }, [200]);
    await api("PATCH", "/v1/vault/models/mdl_nope", { upstreamModel: "gpt-x" }, [404, "not_found"]);
    await api("GET", `/v1/vault/policy-preview?model=${modelName}`, undefined, [200]);
    await api("GET", "/v1/vault/policy-preview?model=nope", undefined, [400, "unknown_model"]);

    // Every read.
    for (const [path, key] of [
      ["/v1/vault/secrets", "secrets"],
      ["/v1/vault/rules", "rules"],
      ["/v1/vault/hosts", "hosts"],
      ["/v1/vault/models", "models"],
    ] as const) {
      const list = await api("GET", path, undefined, [200]);
      for (const item of list.json[key] as { id: string }[])
        await api("GET", `${path}/${item.id}`, undefined, [200]);
    }
    await api("GET", "/v1/vault/settings", undefined, [200]);
    await api("GET", "/v1/vault/policy-preview", undefined, [200]);
    await api("GET", "/v1/vault/policy-preview?egress=local", undefined, [200]);
    await api("GET", "/v1/me", undefined, [200]);

    // Runs: launched with this vault (the coordinator reads and decrypts it), read, listed,
    // cancelled; their audit reads too. None of it may carry a value.
    // It declares the model, so the run's envelope decrypts the canary for the model lane too.
    const launched = await api(
      "POST",
      "/v1/runs",
      { commands: ["echo canary-run"], model: modelName },
      [202],
    );
    const runId = launched.json.id as string;
    await api("POST", "/v1/runs", { commands: ["true"], model: "nope" }, [400, "unknown_model"]);
    await api("POST", "/v1/runs", { benchmark: "nope" }, [400, "unknown_benchmark"]);
    await api("GET", "/v1/runs", undefined, [200]);
    // Halt and resume on a run whose coordinator has not started (a row the test makes): the
    // launched one may already be tearing down (no compute backend here), which refuses both.
    const held = await newRun(t, { status: "running", spec: { commands: ["true"] } });
    await api("POST", `/v1/runs/${held.id}/halt`, undefined, [202]);
    await api("POST", `/v1/runs/${held.id}/resume`, undefined, [202]);
    await api("POST", `/v1/runs/${held.id}/egress-agent-token`, undefined, [201]);
    await api("POST", `/v1/runs/${runId}/linger`, { seconds: 90_000 }, [400, "linger_too_long"]);
    await api("POST", `/v1/runs/${runId}/cancel`, undefined, [202]);
    await api("GET", `/v1/runs/${runId}`, undefined, [200]);
    // Once it has ended (no compute backend here: it stops at its proxy), nothing lingers.
    await driveUntil(runId, async () =>
      isTerminal((await api("GET", `/v1/runs/${runId}`, undefined, [200])).json.status),
    );
    await api("POST", `/v1/runs/${runId}/linger`, { seconds: 60 }, [409, "run_ended"]);
    await api("GET", `/v1/runs/${runId}/proxy`, undefined, [409, "proxy_gone"]);
    await api("POST", `/v1/runs/${runId}/egress-agent-token`, undefined, [409, "run_ended"]);
    await api("GET", `/v1/runs/${runId}/blocked-hosts`, undefined, [200]);
    await api("GET", `/v1/runs/${runId}/egress-routes`, undefined, [200]);
    await api("GET", `/v1/runs/${runId}/limit-refusals`, undefined, [200]);
    await api("GET", `/v1/runs/${runId}/stray-placeholders`, undefined, [200]);
    await api("GET", `/v1/runs/${runId}/events?limit=5`, undefined, [200]);
    await api("GET", `/v1/runs/${runId}/events?after=nope`, undefined, [400, "invalid_cursor"]);
    await api("GET", `/v1/runs/${runId}/model-calls`, undefined, [200]);
    await api("GET", `/v1/blocked-hosts?runId=${runId}`, undefined, [200]);
    await api("GET", "/v1/blocked-hosts?runId=run_nope", undefined, [404, "not_found"]);
    // A dry run of that run against a draft that names the canary's secret (by name only).
    const dryRule = { host: `dry.${tag}.example`, secret: name, inject: { scheme: "bearer" } };
    await api("POST", "/v1/vault/dry-run", { runId, changes: { rules: { add: [dryRule] } } }, [200]);
    await api(
      "POST",
      "/v1/vault/dry-run",
      { runId, draft: { default: "block", hosts: [], rules: [dryRule] } },
      [200],
    );
    await api(
      "POST",
      "/v1/vault/dry-run",
      { runId, changes: { rules: { add: [{ ...dryRule, secret: "NOPE" }] } } },
      [400, "unknown_secret"],
    );
    // A bug report on that run (refused for a run that is not the caller's), its list, the trace.
    await api("POST", "/v1/bug-reports", { runId, title: "canary run", body: "what it did" }, [201]);
    await api("POST", "/v1/bug-reports", { runId: "run_nope", title: "t", body: "b" }, [404, "not_found"]);
    await api("GET", `/v1/runs/${runId}/bug-reports`, undefined, [200]);
    await api("GET", `/v1/runs/${runId}`, undefined, [200]);
    await api("DELETE", `/v1/vault/models/${model.json.id}`, undefined, [204]);

    // Webhooks: registered (its own secret is shown there, once), read, listed, rotated, revoked;
    // refused bodies. None of it may carry a vault value.
    const hook = await api(
      "POST",
      "/v1/webhooks",
      { name: `hook ${tag}`, run: { commands: ["true"] } },
      [201],
    );
    await api("POST", "/v1/webhooks", { name: "x", run: { commands: ["true"] }, secret: canary("hook") }, [
      400,
      "unknown_field",
    ]);
    await api("GET", "/v1/webhooks", undefined, [200]);
    await api("GET", `/v1/webhooks/${hook.json.id}`, undefined, [200]);
    await api("POST", `/v1/webhooks/${hook.json.id}/rotate-secret`, undefined, [200]);
    await api("DELETE", `/v1/webhooks/${hook.json.id}`, undefined, [204]);
    await api("GET", `/v1/webhooks/${hook.json.id}`, undefined, [404, "not_found"]);

    // Notification URLs (the suite's loopback receiver): registered (its secret is shown there,
    // once), read, listed, its deliveries, revoked; refused bodies.
    const ntfUrl = `${inject("notificationReceiver")}/hook/canary${tag}`;
    const ntf = await api("POST", "/v1/notifications", { url: ntfUrl }, [201]);
    await api("POST", "/v1/notifications", { url: ntfUrl, secret: canary("ntf") }, [400, "unknown_field"]);
    await api("POST", "/v1/notifications", { url: `https://localhost/${canary("ntfurl")}` }, [
      400,
      "invalid_notification_url",
    ]);
    await api("GET", "/v1/notifications", undefined, [200]);
    await api("GET", `/v1/notifications/${ntf.json.id}`, undefined, [200]);
    await api("GET", `/v1/notifications/${ntf.json.id}/deliveries`, undefined, [200]);
    await api("DELETE", `/v1/notifications/${ntf.json.id}`, undefined, [204]);

    // API keys: made (the new key is shown there, once; api-keys.test.ts checks it is nowhere
    // else), listed, revoked; a refused body. None of it may carry a vault value.
    const made = await api("POST", "/v1/api-keys", { name: `key ${tag}`, scope: "read" }, [201]);
    await api("POST", "/v1/api-keys", { name: "x", key: canary("apikey") }, [400, "unknown_field"]);
    await api("GET", "/v1/api-keys", undefined, [200]);
    await api("DELETE", `/v1/api-keys/${made.json.id}`, undefined, [204]);
    await api("DELETE", "/v1/api-keys/key_nope", undefined, [404, "not_found"]);

    // Bundles: an upload, a re-upload, refused ones, reads (case H3's 404 included). The bundle
    // holds no value; none may appear in what is stored of it either (the R2 walk below).
    const tarball = await tarGz([file("bench/run.sh", `echo canary-bundle ${tag}\n`)]);
    const uploaded = async (bytes: Uint8Array, expected: [number, string?], type?: string) => {
      const res = await upload(t.key, bytes, type ? { type } : {});
      responses.push(["POST /v1/bundles", res]);
      if (expected[1]) expectProblem(res, expected[0], expected[1]);
      else expect(res.status, res.text).toBe(expected[0]);
      return res;
    };
    const bundle = await uploaded(tarball, [201]);
    await uploaded(tarball, [200]);
    await uploaded(await tarGz([file("../escape", "x")]), [422, "bundle_path_traversal"]);
    await uploaded(tarball, [415, "unsupported_media_type"], "text/plain");
    await api("GET", `/v1/bundles/${bundle.json.sha256}`, undefined, [200]);
    await api("GET", `/v1/bundles/${"0".repeat(64)}`, undefined, [404, "bundle_not_found"]);
    await api("GET", "/v1/setup-images", undefined, [200]);
    await api("DELETE", `/v1/setup-images/${"0".repeat(64)}`, undefined, [404, "not_found"]);

    // Artifacts of the launched run (what its commands would leave in $BW_OUT, packed as
    // bw-collect packs them), listed and downloaded. Case H5: the walk below reads them too.
    const collected = await collectArchive(
      [
        { path: "results.json", body: `{"run":"${runId}","marker":"artifact-${tag}"}` },
        { path: "logs/out.txt", body: "canary-run\n" },
      ],
      { cut: [{ path: "link", reason: "symlink", size: null }] },
    );
    await withDb((db) =>
      storeArtifacts(env, db, {
        runId,
        environmentId: t.environmentId,
        sandboxId: `sbx_canary${tag}`,
        sandboxName: "work",
        archive: new Blob([collected]).stream(),
      }),
    );
    const listedArtifacts = await api("GET", `/v1/runs/${runId}/artifacts`, undefined, [200]);
    for (const a of listedArtifacts.json.artifacts as { id: string }[]) {
      await api("GET", `/v1/runs/${runId}/artifacts/${a.id}`, undefined, [200]);
    }
    await api("GET", `/v1/runs/${runId}/artifacts/art_nope`, undefined, [404, "not_found"]);

    // Internal errors whose messages quote the value (as a careless library's might): the
    // response and the log line carry only the error's class and the request id. The spies
    // fail only for the canary's bytes: the database driver signs with the same WebCrypto
    // (SCRAM), and its connection must go through.
    const boom = canary("boom");
    const bang = canary("bang");
    const subtle = crypto.subtle;
    const encrypt = subtle.encrypt.bind(subtle);
    const sign = subtle.sign.bind(subtle);
    const isValue = (data: BufferSource, value: string) => new TextDecoder().decode(data) === value;
    const encryptSpy = vi.spyOn(subtle, "encrypt").mockImplementation(async (algorithm, key, data) => {
      if (isValue(data, boom)) throw new Error(`cannot encrypt ${boom}`, { cause: new Error(boom) });
      return encrypt(algorithm, key, data);
    });
    const signSpy = vi.spyOn(subtle, "sign").mockImplementation(async (algorithm, key, data) => {
      if (isValue(data, bang)) throw new TypeError(`cannot sign ${bang}`);
      return sign(algorithm, key, data);
    });
    await api("POST", "/v1/vault/secrets", { name: `BOOM_${tag}`, value: boom }, [500, "internal_error"]);
    await api("PUT", `/v1/vault/secrets/${secretId}`, { value: bang }, [500, "internal_error"]);
    expect(encryptSpy).toHaveBeenCalled();
    expect(signSpy).toHaveBeenCalled();
    encryptSpy.mockRestore();
    signSpy.mockRestore();

    // Every operation of the OpenAPI document was driven at least once.
    const doc = (await call(null, "GET", "/v1/openapi.json")).json;
    const operations = Object.entries(doc.paths as Record<string, object>).flatMap(([path, item]) =>
      Object.keys(item)
        .filter((key) => ["get", "put", "post", "delete", "patch"].includes(key))
        .map((method) => `${method.toUpperCase()} ${path}`),
    );
    const driven = new Set(
      responses.map(([where]) =>
        where
          .split("?")[0]
          ?.replace(
            /\/(secrets|rules|hosts|models)\/(?!order$|starter-pack$|from-blocked$)[^/]+$/,
            "/$1/{id}",
          )
          .replace(/\/runs\/run_[^/]+/, "/runs/{id}")
          .replace(/\/artifacts\/[^/]+$/, "/artifacts/{artifactId}")
          .replace(/\/bundles\/[0-9a-f]{64}$/, "/bundles/{sha256}")
          .replace(/\/setup-images\/[0-9a-f]{64}$/, "/setup-images/{key}")
          .replace(/\/webhooks\/whk_[^/]+/, "/webhooks/{id}")
          .replace(/\/notifications\/ntf_[^/]+/, "/notifications/{id}")
          .replace(/\/api-keys\/key_[^/]+$/, "/api-keys/{id}"),
      ),
    );
    expect(operations.filter((op) => !driven.has(op))).toEqual([]);

    const needles = (await Promise.all(canaries.map(leakNeedles))).flat();

    // The log capture saw the Worker's own lines (else this test would pass vacuously).
    const internal = logs.filter((l) => l.includes('"event":"internal_error"'));
    expect(internal).toHaveLength(2);
    expect(logs.flatMap((line, i) => findNeedles(`log line ${i}`, line, needles))).toEqual([]);

    const leaks = responses.flatMap(([where, res]) => findNeedles(where, responseText(res), needles));
    expect(leaks).toEqual([]);

    const db = await scanDatabase(needles);
    expect(db.columns).toContain("public.vault_secrets.ciphertext");
    expect(db.columns).toContain("public.vault_secrets.name");
    expect(db.hits).toEqual([]);
    // The same scan does find what is stored in plaintext (the secret's name), so it works.
    const control = await scanDatabase([name]);
    expect(control.hits).toContainEqual({ where: "public.vault_secrets.name", needle: name });

    // case H5: every object runs and uploads left in R2 (artifacts as stored, bundles inflated)
    // holds no canary; the same walk does find what they do hold.
    const r2 = await scanBucket(env.FILES, needles);
    expect(r2.keys.some((k) => k.startsWith(`artifacts/${runId}/`))).toBe(true);
    expect(r2.keys).toContain(`bundles/${t.environmentId}/${bundle.json.sha256}`);
    expect(r2.hits).toEqual([]);
    const found = await scanBucket(env.FILES, [`artifact-${tag}`, `canary-bundle ${tag}`]);
    expect(found.hits.map((h) => h.needle).sort()).toEqual([`artifact-${tag}`, `canary-bundle ${tag}`]);
  });
});

describe("B8 a stored secret decrypts only under its true owner and id", { timeout: 60_000 }, () => {
  it("the row decrypts with its owner's AAD; another owner's, another id's, a copied or flipped blob fail", async () => {
    const ring = parseKeyRing(env.VAULT_KEK);
    const [a, b] = [await newTenant(), await newTenant()];
    const aValue = newCanary("owner-a");
    const bValue = newCanary("owner-b");
    const aId = expectCreated(await a.api("POST", "/v1/vault/secrets", { name: "OWNED", value: aValue }));
    const aTwin = expectCreated(await a.api("POST", "/v1/vault/secrets", { name: "TWIN", value: aValue }));
    const bId = expectCreated(await b.api("POST", "/v1/vault/secrets", { name: "OWNED", value: bValue }));
    const row = (id: string) =>
      withDb(async (db) => {
        const [r] = await db.select().from(vaultSecrets).where(eq(vaultSecrets.id, id));
        if (!r) throw new Error(`no row ${id}`);
        return r;
      });
    const [aRow, twinRow, bRow] = [await row(aId), await row(aTwin), await row(bId)];
    const aad = (t: Tenant, secretId: string): SecretAad => ({
      userId: t.userId,
      environmentId: t.environmentId,
      secretId,
    });
    const refused = { name: "VaultDecryptError", reason: "authentication_failed" };

    // New values are sealed under the ring's current key, and the row says so.
    expect(aRow.keyId).toBe(ring.currentKeyId);
    expect(keyIdOf(aRow.ciphertext)).toBe(aRow.keyId);
    expect(await decryptSecret(ring, aad(a, aId), aRow.ciphertext)).toBe(aValue);
    expect(await decryptSecret(ring, aad(b, bId), bRow.ciphertext)).toBe(bValue);

    // The wrong owner, or half of the right one, or another of the owner's secrets: refused.
    await expect(decryptSecret(ring, aad(b, aId), aRow.ciphertext)).rejects.toMatchObject(refused);
    await expect(
      decryptSecret(
        ring,
        { userId: a.userId, environmentId: b.environmentId, secretId: aId },
        aRow.ciphertext,
      ),
    ).rejects.toMatchObject(refused);
    await expect(
      decryptSecret(
        ring,
        { userId: b.userId, environmentId: a.environmentId, secretId: aId },
        aRow.ciphertext,
      ),
    ).rejects.toMatchObject(refused);
    await expect(decryptSecret(ring, aad(a, aTwin), aRow.ciphertext)).rejects.toMatchObject(refused);

    // A's ciphertext copied into B's row does not decrypt there.
    await withDb((db) =>
      db.update(vaultSecrets).set({ ciphertext: aRow.ciphertext }).where(eq(vaultSecrets.id, bId)),
    );
    const copied = await row(bId);
    expect(copied.ciphertext).toBe(aRow.ciphertext);
    await expect(decryptSecret(ring, aad(b, bId), copied.ciphertext)).rejects.toMatchObject(refused);

    // One flipped character of the sealed value fails too.
    const parts = aRow.ciphertext.split(".");
    const last = parts[5] as string;
    parts[5] = `${last.slice(0, 4)}${last[4] === "A" ? "B" : "A"}${last.slice(5)}`;
    await expect(decryptSecret(ring, aad(a, aId), parts.join("."))).rejects.toMatchObject({
      name: "VaultDecryptError",
    });

    // The same value twice: fresh nonces and data keys, so nothing in the rows repeats but the
    // keyed fingerprint (which is what the API shows).
    const [, , aWrapIv, aWrapped, aIv, aBody] = aRow.ciphertext.split(".");
    const [, , tWrapIv, tWrapped, tIv, tBody] = twinRow.ciphertext.split(".");
    expect(new Set([aWrapIv, tWrapIv]).size).toBe(2);
    expect(new Set([aIv, tIv]).size).toBe(2);
    expect(aWrapped).not.toBe(tWrapped);
    expect(aBody).not.toBe(tBody);
    expect(twinRow.fingerprint).toBe(aRow.fingerprint);
    expect(await decryptSecret(ring, aad(a, aTwin), twinRow.ciphertext)).toBe(aValue);
  });
});

function expectCreated(res: ApiResponse): string {
  if (res.status !== 201) throw new Error(`expected 201, got ${res.status} ${res.text}`);
  return res.json.id;
}
