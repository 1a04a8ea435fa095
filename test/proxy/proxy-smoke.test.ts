import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  curl,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type Upstream,
  vault,
} from "./harness";

const CANARY = "sk-canary-0f9e8d7c6b5a";

describe("proxy smoke: transparent TLS, injection, block", () => {
  let api: Upstream;
  let proxy: RunningProxy;
  beforeAll(async () => {
    const ca = await createTestCa();
    api = await startTlsUpstream({ ca, hosts: ["api.test"] });
    proxy = await startProxy({
      vault: vault({
        hosts: [
          { pattern: "api.test", action: "allow" },
          { pattern: "evil.test", action: "block" },
        ],
        rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
      }),
      secrets: { API_KEY: CANARY },
      routes: { "api.test": api },
      upstreamCa: ca,
    });
  });
  afterAll(async () => {
    await proxy.close();
    await api.close();
  });

  it("injects the credential upstream and never shows it to the client", async () => {
    const res = await curlTls(proxy, "https://api.test/v1/models?x=1");
    expect(res.stderr).toBe("");
    expect(res.status).toBe(200);
    expect(api.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
    expect(res.body).not.toContain(CANARY);
    expect(JSON.parse(res.body).headers.authorization).toBe(`Bearer ${"*".repeat(CANARY.length)}`);
  });

  it("refuses a blocked host with 403 and records it", async () => {
    const res = await curlTls(proxy, "https://evil.test/");
    expect(res.status).toBe(403);
    expect(res.body).toContain("evil.test");
    expect(proxy.audit.blocked).toContain("evil.test");
  });

  it("a client that does not trust the run CA refuses the leaf", async () => {
    const res = await curl(["--connect-to", `api.test:443:127.0.0.1:${proxy.tlsPort}`, "https://api.test/"]);
    expect(res.code).not.toBe(0);
    expect(res.stderr).toMatch(/certificate/i);
  });
});
