import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, expect } from "vitest";
import {
  createTestCa,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";
import { connectTunnel, exchange, type RawResult, tlsOver, wire } from "./raw";

// Cases A7–A17 (proxy side): which host a request is for, and whether it may go there. The host
// that decides is the CONNECT target / TLS SNI; a Host header that disagrees is refused; names
// are compared in canonical form; IP spellings and resolved addresses are checked after
// canonicalisation and resolution, and the connection goes to exactly the address checked.

export const CANARY = "sk-canary-hostpolicy-71c0aa9e";
export const WILD_SECRET = "wild-canary-5e6f7a8b9c";

export const WILD_NAMES = [
  "a.example.test",
  "deep.a.example.test",
  "example.test",
  "evil-example.test",
  "example.test.evil.test",
];

export let ca: TestCa;
export let api: Upstream;
export let other: Upstream;
export let wild: Upstream;
export let proxy: RunningProxy;
export let upstreamCaFile: string;

export const tlsTarget = (servername: string, skipIdentityCheck = false) => ({
  port: proxy.tlsPort,
  tls: { servername, ca: proxy.caPem, skipIdentityCheck },
});

/** One request through a CONNECT tunnel to `authority`, TLS inside with `sni`. */
export async function viaTunnel(authority: string, sni: string, request: string): Promise<RawResult> {
  const t = await connectTunnel(proxy.explicitPort, authority);
  expect(t.status).toBe(200);
  const inner = await tlsOver(t.socket, { servername: sni, ca: proxy.caPem, skipIdentityCheck: true });
  return exchange(inner, [request]);
}

export const get = (host: string, path = "/") =>
  wire(`GET ${path} HTTP/1.1`, [`Host: ${host}`, "Connection: close"]);

/** Snapshot of everything upstream-side, to assert "nothing reached anyone". */
export function quiet() {
  const before = {
    api: api.counts.requests,
    other: other.counts.requests,
    wild: wild.counts.requests,
    dials: proxy.dials.length,
  };
  return () =>
    expect({
      api: api.counts.requests,
      other: other.counts.requests,
      wild: wild.counts.requests,
      dials: proxy.dials.length,
    }).toEqual(before);
}

/** The file's upstreams and proxy (before all), and its closing checks (after all). */
export function useHostPolicyWorld(): void {
  beforeAll(async () => {
    ca = await createTestCa();
    upstreamCaFile = join(mkdtempSync(join(tmpdir(), "bw-host-policy-")), "upstream-ca.pem");
    writeFileSync(upstreamCaFile, ca.certPem);
    api = await startTlsUpstream({ ca, hosts: ["api.test"], address: "127.0.0.2" });
    other = await startTlsUpstream({ ca, hosts: ["other.test"], address: "127.0.0.3" });
    wild = await startTlsUpstream({ ca, hosts: WILD_NAMES, address: "127.0.0.2" });
    proxy = await startProxy({
      vault: vault({
        hosts: [
          { pattern: "api.test", action: "allow" },
          { pattern: "other.test", action: "allow" },
          { pattern: "evil.test", action: "block" },
        ],
        rules: [
          { host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } },
          { host: "*.example.test", secret: "WILD", inject: { scheme: "raw", name: "x-api-key" } },
        ],
      }),
      secrets: { API_KEY: CANARY, WILD: WILD_SECRET },
      routes: {
        "api.test": api,
        "other.test": other,
        ...Object.fromEntries(WILD_NAMES.map((n) => [n, wild])),
      },
      upstreamCa: ca,
    });
  });

  afterAll(async () => {
    // case B5: no secret in the decision log, whatever the tests did.
    const logs = JSON.stringify(proxy.logs);
    expect(logs).not.toContain(CANARY);
    expect(logs).not.toContain(WILD_SECRET);
    await proxy.close();
    await Promise.all([api.close(), other.close(), wild.close()]);
  });
}
