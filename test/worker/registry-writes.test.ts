import { env } from "cloudflare:workers";
import { afterEach, describe, expect, it, vi } from "vitest";
import { issueCapability } from "../../src/compute/capability";
import { encodeBase64Url } from "../../src/crypto/api-keys";
import { pushSetupImage, setupRepository } from "../../src/images/push";
import { registryClient } from "../../src/images/registry";
import { type ApiResponse, callWith, newTenant, withDb } from "./harness";
import { captureLogs, findNeedles, leakNeedles, responseText, scanDatabase } from "./leaks";
import {
  OCI_MANIFEST,
  pushBaseImage,
  realmCalls,
  realRegistry,
  registryEnv,
  registryFetch,
  registrySettings,
  sha256,
  testToken,
  uploadBlob,
} from "./registry-fixtures";
import { newRun } from "./run-fixtures";

// Case P2: only the platform writes the setup images. A run's compute capability reaches no
// push token (the /compute/images routes are gone), the REAL registry (distribution 2.8 with
// token auth, test/setup/registry.ts) refuses a push without the broker's push token by itself,
// and the token the broker mints for its own push appears in no answer, log line or database
// column.

afterEach(() => {
  vi.restoreAllMocks();
});

const hex = (bytes: Uint8Array) => [...bytes].map((b) => b.toString(16).padStart(2, "0")).join("");
const newKey = () => hex(crypto.getRandomValues(new Uint8Array(32)));

/** A run of a new tenant whose work sandbox holds a live compute capability. */
async function runWithCapability() {
  const t = await newTenant();
  const run = await newRun(t);
  const cap = await withDb((db) => issueCapability(db, run.id, "sbx_work_p2"));
  return { t, run, cap };
}

describe("the run capability", { timeout: 60_000 }, () => {
  it("reaches no image push: POST /compute/images and /compute/images/{hash}/pushed are 404", async () => {
    // case P2
    const { cap } = await runWithCapability();
    const bindings = realRegistry ? registryEnv(realRegistry) : env;
    const live = await callWith(bindings, cap.token, "GET", "/compute/capability");
    expect(live.status, live.text).toBe(200);
    const key = newKey();
    for (const [method, path, body] of [
      ["POST", "/compute/images", { contentHash: key }],
      ["POST", `/compute/images/${key}/pushed`, undefined],
      ["GET", `/compute/images/${key}`, undefined],
    ] as const) {
      const res = await callWith(bindings, cap.token, method, path, body);
      expect(res.status, `${method} ${path}: ${res.text}`).toBe(404);
      expect(res.json.code).toBe("route_not_found");
      expect(res.text).not.toMatch(/eyJ/);
    }
  });
});

describe.skipIf(!realRegistry)("the real registry", { timeout: 60_000 }, () => {
  const info = realRegistry as NonNullable<typeof realRegistry>;

  it("refuses an anonymous push and a push with a pull-only token by itself; the broker's image is unchanged", async () => {
    // case P2
    const settings = await registrySettings(info);
    const base = await pushBaseImage(info, settings);
    const { t } = await runWithCapability();
    const key = newKey();
    const tar = new TextEncoder().encode(`setup layer ${crypto.randomUUID()}`);
    const pushed = await pushSetupImage(settings, {
      layer: { tar, diffId: await sha256(tar) },
      base: base.reference,
      environmentId: t.environmentId,
      key,
    });
    if (!pushed.ok) throw new Error(JSON.stringify(pushed));
    const repository = setupRepository(settings, t.environmentId);
    const pullOnly = await testToken(settings, [{ type: "repository", name: repository, actions: ["pull"] }]);
    const forged = new TextEncoder().encode(
      JSON.stringify({ schemaVersion: 2, mediaType: OCI_MANIFEST, config: {}, layers: [] }),
    );

    for (const [who, token] of [
      ["anonymous", null],
      ["pull-only", pullOnly],
    ] as const) {
      const blob = await uploadBlob(info, token, repository, new TextEncoder().encode(`not mine ${who}`));
      expect(blob.status, who).toBe(401);
      const tag = await registryFetch(info, "PUT", `/v2/${repository}/manifests/${key}`, token, forged, {
        "content-type": OCI_MANIFEST,
      });
      expect(tag.status, who).toBe(401);
      const challenge = tag.headers.get("www-authenticate") ?? "";
      expect(challenge).toContain(`service="${info.service}"`);
      // distribution lists the actions in no fixed order.
      expect(challenge).toMatch(
        new RegExp(`scope="repository:${repository.replaceAll("/", "\\/")}:(pull,push|push,pull)"`),
      );
      if (token) expect(challenge).toContain('error="insufficient_scope"');
      const errors = ((await tag.json()) as { errors: { code: string }[] }).errors;
      expect(errors[0]?.code).toBe("UNAUTHORIZED");
    }
    // The tag still names the broker's push.
    const now = await registryClient(settings).manifest(repository, key);
    expect(now).toMatchObject({ ok: true, value: { found: true, digest: pushed.value.digest } });
    expect(await realmCalls(info)).toEqual([]);
  });

  it("the broker's push token is in no answer, log line or database column of a run", async () => {
    // case P2
    const logs = captureLogs();
    const settings = await registrySettings(info);
    const base = await pushBaseImage(info, settings);
    const { t, run, cap } = await runWithCapability();
    const bindings = registryEnv(info);
    const answers: [string, ApiResponse][] = [];
    const ask = async (what: string, res: Promise<ApiResponse>) => answers.push([what, await res]);

    // The broker's push, in workerd (crypto.DigestStream, CompressionStream), recording its tokens.
    const tokens: string[] = [];
    const recording: typeof fetch = (input, init) => {
      const auth = new Headers(init?.headers).get("authorization");
      if (auth?.startsWith("Bearer ")) tokens.push(auth.slice(7));
      return fetch(input, init);
    };
    const tar = new TextEncoder().encode(`setup layer ${crypto.randomUUID()}`.repeat(100));
    const pushed = await pushSetupImage(
      settings,
      {
        layer: { tar: new Blob([tar]).stream(), diffId: await sha256(tar) },
        base: base.reference,
        environmentId: t.environmentId,
        key: newKey(),
      },
      { fetcher: recording },
    );
    expect(pushed.ok, JSON.stringify(pushed)).toBe(true);
    expect(tokens.length).toBeGreaterThan(0);

    await ask("capability", callWith(bindings, cap.token, "GET", "/compute/capability"));
    await ask("images", callWith(bindings, cap.token, "POST", "/compute/images", { contentHash: newKey() }));
    await ask("renew", callWith(bindings, cap.token, "POST", "/compute/capability/renew"));
    await ask("run", t.api("GET", `/v1/runs/${run.id}`));
    await ask("runs", t.api("GET", "/v1/runs"));

    // Every token this key signs starts with the same header (alg, typ and the key's kid): a
    // needle for registry tokens not seen here too.
    const header = encodeBase64Url(
      new TextEncoder().encode(JSON.stringify({ typ: "JWT", alg: "ES256", kid: settings.signingKey.kid })),
    );
    expect(tokens.every((tk) => tk.startsWith(`${header}.`))).toBe(true);
    const needles = [
      ...new Set([
        header,
        ...tokens,
        ...tokens.map((tk) => tk.split(".")[2] as string),
        ...(await Promise.all(tokens.map(leakNeedles))).flat(),
      ]),
    ];
    expect(answers.flatMap(([what, res]) => findNeedles(what, responseText(res), needles))).toEqual([]);
    expect(logs.flatMap((line, i) => findNeedles(`log line ${i}`, line, needles))).toEqual([]);
    const scan = await scanDatabase(needles);
    expect(scan.hits).toEqual([]);
    // The same scan finds what the database does hold (the run's id), so it would find a token.
    const control = await scanDatabase([run.id]);
    expect(control.hits.length).toBeGreaterThan(0);
  });
});
