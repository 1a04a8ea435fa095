import { describe, expect, it } from "vitest";
import { sandbox0FromEnv } from "../../src/broker/sandbox0/backend";
import { randomId } from "../../src/crypto/api-keys";
import { expectBackendError, proxyOf } from "./backend-fixtures";
import { backendIn, contractOptions, envFor, newNs, proxyIn, recorded, workOn } from "./sandbox0-fixtures";

// What the sandbox0 backend refuses: a deployment's missing or unsafe settings (before any
// request), and what the Kubernetes contract server refuses (a wrong token, an API that does not
// answer, PodSecurity without NET_ADMIN, a failing init container, another run's proxy). Apart from
// the happy paths so each refusal's exact code and message is in one place.

describe("sandbox0 configuration", () => {
  it("names each missing setting, refuses a token over clear text, never echoes the token", () => {
    const missing = sandbox0FromEnv({});
    expect(typeof missing).toBe("string");
    for (const name of [
      "SANDBOX0_API_URL",
      "SANDBOX0_TOKEN",
      "SANDBOX0_NAMESPACE",
      "SANDBOX0_PROXY_IMAGE",
      "SANDBOX0_WORK_IMAGE",
      "PUBLIC_URL",
    ]) {
      expect(missing).toContain(`${name} is not set`);
    }
    const token = `tok-canary-${crypto.randomUUID()}`;
    const clear = sandbox0FromEnv(
      envFor("ns", { SANDBOX0_API_URL: "http://k8s.example.com", SANDBOX0_TOKEN: token }),
    );
    expect(clear).toBe("SANDBOX0_API_URL must be an https URL (http only on loopback)");
    expect(sandbox0FromEnv(envFor("Bad_NS"))).toBe("SANDBOX0_NAMESPACE is not a Kubernetes namespace name");
    const ok = sandbox0FromEnv(envFor("ns", { SANDBOX0_API_URL: "https://k8s.example.com" }));
    expect(typeof ok === "string" ? ok : ok.name).toBe("sandbox0");
  });
});

describe("sandbox0 refusals", () => {
  it("a wrong token is backend_error without the token; an API that does not answer is retryable", async () => {
    const ns = newNs();
    const wrong = `wrong-token-canary-${crypto.randomUUID()}`;
    const e = await expectBackendError(
      backendIn(ns, { SANDBOX0_TOKEN: wrong }).create({
        kind: "proxy",
        id: randomId("sbx_"),
        runId: randomId("run_"),
      }),
      "backend_error",
    );
    expect(e.message).not.toContain(wrong);
    expect(e.message).toContain("401");
    expect((await recorded(ns)).map((r) => r.auth)).toEqual(["invalid"]);
    const down = await expectBackendError(
      backendIn(ns, { SANDBOX0_API_URL: "http://127.0.0.1:9" }).create({
        kind: "proxy",
        id: randomId("sbx_"),
        runId: randomId("run_"),
      }),
      "backend_unreachable",
    );
    expect(down.retryable).toBe(true);
  });

  it("PodSecurity that forbids NET_ADMIN: catch-all is cannot_isolate, default still runs", async () => {
    const ns = newNs();
    const { b, runId, proxyId } = await proxyIn(ns);
    await contractOptions({ namespace: ns, podSecurity: "baseline" });
    const e = await expectBackendError(b.create(workOn(runId, proxyId, "catch-all")), "cannot_isolate");
    expect(e.retryable).toBe(false);
    expect(e.message).toContain("NET_ADMIN");
    const ok = await b.create(workOn(runId, proxyId, "default"));
    expect(ok.state).toBe("ready");
  });

  it("a redirect that cannot be installed (init container fails) is sandbox_failed, saying which", async () => {
    const ns = newNs();
    const { b, runId, proxyId } = await proxyIn(ns);
    await contractOptions({
      namespace: ns,
      initFailure: { container: "bw-redirect", exitCode: 1, message: "nft: Operation not supported" },
    });
    const e = await expectBackendError(b.create(workOn(runId, proxyId, "catch-all")), "sandbox_failed");
    expect(e.message).toBe("init container bw-redirect failed (exit 1, Error: nft: Operation not supported)");
  });

  it("a work pod on another run's proxy is not made", async () => {
    const ns = newNs();
    const b = backendIn(ns);
    const { proxyId } = await proxyOf(b, randomId("run_"));
    const mark = (await recorded(ns)).length;
    await expectBackendError(b.create(workOn(randomId("run_"), proxyId, "default")), "not_found");
    expect((await recorded(ns)).slice(mark).map((r) => r.method)).toEqual(["GET"]);
  });
});
