import { execFileSync } from "node:child_process";
import { copyFileSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { expect, it } from "vitest";
import { describeE2e, type E2eOptions, lastJson, newUser, stdoutOf, waitForEnd } from "./harness";

// Python through the boundary, in a real local sandbox (case N1): python-client.py is the run's
// bundle and runs on the work image's python3 with Debian's requests and httpx, nothing installed.
// It reads its key from the environment (the rule's placeholder, never the secret), sends it to
// the rule's host through both libraries, and calls the declared model's lane shaped as the
// official openai and anthropic Python SDKs send (POST {OPENAI_BASE_URL}/chat/completions with a
// Bearer key, plain and streamed; POST {ANTHROPIC_BASE_URL}/v1/messages with x-api-key and
// anthropic-version). The SDKs themselves cannot be installed here (no package index the suite
// may reach), so their requests are copied; the Node SDKs run for real in model-sdks.test.ts. TLS
// is trusted only through the variables the wiring sets: requests reads REQUESTS_CA_BUNDLE, then
// CURL_CA_BUNDLE; httpx reads SSL_CERT_FILE, then SSL_CERT_DIR (Debian bookworm's 2.28 and 0.23).
// The upstream (scripts/demo/upstream-server.mjs) expects the vault's canary as its key, both as
// the rule's host and as the model provider.

const RULE_HOST = "other.demo.test";
/** The host of another rule (another secret): the API_TOKEN placeholder is not its to swap. */
const OTHER_HOST = "api.demo.test";
const TEXT = "Hello world";
const CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt";

let dir: string;
let bundle: Buffer;

function start(): Promise<E2eOptions> {
  dir = mkdtempSync(join(tmpdir(), "bw-python-"));
  mkdirSync(join(dir, "bundle"));
  copyFileSync(join(import.meta.dirname, "python-client.py"), join(dir, "bundle", "python-client.py"));
  execFileSync("tar", ["-czf", join(dir, "bundle.tar.gz"), "-C", join(dir, "bundle"), "."]);
  bundle = readFileSync(join(dir, "bundle.tar.gz"));
  return Promise.resolve({ name: "bwt-e2y", index: 82 });
}

const after = () => rmSync(dir, { recursive: true, force: true });

describeE2e("Python's requests and httpx through the boundary", { start, after }, (e) => {
  // case N1
  it("case N1: the key read from the environment is a placeholder; requests and httpx reach the rule's host and the model lane", async () => {
    const api = await newUser(e.stack.apiUrl);
    const ok = (res: { status: number; text: string }, what: string) =>
      expect(res.status, `${what}: ${res.text}`).toBeLessThan(300);
    ok(await api.call("POST", "/v1/vault/secrets", { name: "API_TOKEN", value: e.canary }), "secret");
    ok(await api.call("POST", "/v1/vault/secrets", { name: "MODEL_KEY", value: e.canary }), "model secret");
    // Injected into a header the upstream ignores, so that the Authorization it checks is the
    // client's own: the secret arrives there only by the proxy's swap of the placeholder.
    ok(
      await api.call("POST", "/v1/vault/rules", {
        host: RULE_HOST,
        secret: "API_TOKEN",
        inject: { scheme: "raw", name: "x-bw-injected" },
      }),
      "rule",
    );
    ok(await api.call("POST", "/v1/vault/secrets", { name: "OTHER_KEY", value: "not-the-canary" }), "other");
    ok(
      await api.call("POST", "/v1/vault/rules", {
        host: OTHER_HOST,
        secret: "OTHER_KEY",
        inject: { scheme: "raw", name: "x-bw-injected" },
      }),
      "other rule",
    );
    ok(
      await api.call("POST", "/v1/vault/models", {
        name: "eval-model",
        provider: "openai",
        baseUrl: "https://api.demo.test/v1",
        upstreamModel: "demo-1",
        secret: "MODEL_KEY",
      }),
      "model",
    );
    const uploaded = await fetch(`${e.stack.apiUrl}/v1/bundles`, {
      method: "POST",
      headers: { authorization: `Bearer ${api.key}`, "content-type": "application/gzip" },
      body: new Uint8Array(bundle),
    });
    expect(uploaded.status).toBeLessThan(300);
    const sha = ((await uploaded.json()) as { sha256: string }).sha256;

    const launched = await api.call("POST", "/v1/runs", {
      model: "eval-model",
      bundle: sha,
      commands: [`python3 python-client.py ${RULE_HOST} ${OTHER_HOST}`],
    });
    expect(launched.status, launched.text).toBe(202);
    const run = await waitForEnd(api, launched.json.id, 120_000);
    expect(run, JSON.stringify(run.trace, null, 1).slice(0, 6000)).toMatchObject({
      status: "finished",
      reason: "completed",
    });
    const out = lastJson(run);

    // case N1: the secret's placeholder under its name (the compiler's default for a rule that
    // names none), never the secret.
    expect(out.token).toMatch(/^bw-placeholder-API_TOKEN-[a-z0-9]{20}$/);
    expect(out.token).not.toBe(e.canary);
    expect(out.tokenIsPlaceholder).toBe(true);

    // The run CA comes from the wiring's variables alone: each library picks its own.
    expect(out.ca).toEqual({
      REQUESTS_CA_BUNDLE: CA_BUNDLE,
      CURL_CA_BUNDLE: CA_BUNDLE,
      SSL_CERT_FILE: CA_BUNDLE,
      requests: CA_BUNDLE,
      httpx: CA_BUNDLE,
    });

    // TLS to the rule's host verified in both libraries; the Authorization the client built
    // arrived as the secret: the proxy's swap (case N2).
    for (const call of ["requestsRule", "httpxRule"]) {
      expect(out[call], call).toMatchObject({ status: 200, keyPresent: true });
      expect(out[call].keyMatches, `${call} (the proxy's swap)`).toBe(true);
    }
    // Sent to another rule's host, the placeholder leaves as it is: never the secret (N2's
    // stray; holds with or without the swap).
    expect(out.requestsOther).toMatchObject({ status: 200, keyPresent: true, keyMatches: false });

    // The model lane, in each SDK's shape, plain and streamed, with the lane's placeholder key.
    expect(out.openaiPlain).toEqual({ status: 200, text: TEXT });
    expect(out.openaiStream).toEqual({ status: 200, text: TEXT });
    expect(out.anthropicPlain).toEqual({ status: 200, text: TEXT });
    expect(out.anthropicStream).toEqual({ status: 200, text: TEXT });
    const lane = e.upstream.seen.filter((s) => s.model === "demo-1").slice(-4);
    expect(lane.map((s) => [s.endpoint, s.stream, s.keyMatches])).toEqual([
      ["chat.completions", false, true],
      ["chat.completions", true, true],
      ["chat.completions", false, true],
      ["chat.completions", true, true],
    ]);

    // The secret never reached the sandbox's output nor the run's record.
    expect(stdoutOf(run)).not.toContain(e.canary);
    expect(JSON.stringify(run)).not.toContain(e.canary);
  }, 180_000);
});
