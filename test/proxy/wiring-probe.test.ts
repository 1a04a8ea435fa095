import { PROBE_HEADER, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  curl,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  tlsArgs,
  type Upstream,
  vault,
} from "./harness";

// The wiring probe host: the proxy answers it itself on every way in (403 + x-benchwright-probe:
// refused), whatever the policy says, with no audit row and no upstream dial. The wiring step in
// a work sandbox relies on exactly this answer to prove that the redirect and the CA trust work.

const PROBE = WIRING_PROBE_HOST;

/** The status line and headers curl printed with -i (the last response, after any CONNECT). */
function probeHeader(body: string): string | null {
  const heads = body.split(/\r?\n\r?\n/).filter((h) => /^HTTP\/1\.1 \d{3}/.test(h));
  const last = heads.at(-1) ?? "";
  const line = last.split(/\r?\n/).find((l) => l.toLowerCase().startsWith(`${PROBE_HEADER}:`));
  return line ? line.slice(PROBE_HEADER.length + 1).trim() : null;
}

describe("the wiring probe host", () => {
  let decoy: Upstream;
  let proxy: RunningProxy;

  beforeAll(async () => {
    const ca = await createTestCa();
    // A real upstream the probe host is routed to: it must never see a connection.
    decoy = await startTlsUpstream({ ca, hosts: [PROBE] });
    proxy = await startProxy({
      vault: vault({ hosts: [{ pattern: "evil.test", action: "block" }] }),
      routes: { [PROBE]: decoy },
      upstreamCa: ca,
    });
  });
  afterAll(async () => {
    await proxy.close();
    await decoy.close();
  });
  afterEach(() => {
    // Whatever the way in and the policy: no audit row, nothing dialled, nothing upstream.
    expect(proxy.audit.blocked).toEqual([]);
    expect(proxy.audit.routes).toEqual([]);
    expect(proxy.dials).toEqual([]);
    expect(decoy.counts).toEqual({ connections: 0, requests: 0 });
  });

  const ways: Array<[string, () => string[]]> = [
    ["the TLS listener (SNI)", () => ["-i", ...tlsArgs(proxy, PROBE), `https://${PROBE}/`]],
    [
      "the HTTP listener (Host)",
      () => ["-i", "--connect-to", `${PROBE}:80:127.0.0.1:${proxy.httpPort}`, `http://${PROBE}/`],
    ],
    [
      "the explicit proxy (CONNECT)",
      () => [
        "-i",
        "--cacert",
        proxy.caFile,
        "-x",
        `http://127.0.0.1:${proxy.explicitPort}`,
        `https://${PROBE}/`,
      ],
    ],
    [
      "the explicit proxy (absolute-form)",
      () => ["-i", "-x", `http://127.0.0.1:${proxy.explicitPort}`, `http://${PROBE}/x?y=1`],
    ],
  ];

  describe.each([
    ["an allow-default policy", () => proxy.policy.setVault(vault({}), {})],
    ["a block-default policy", () => proxy.policy.setVault(vault({ default: "block" }), {})],
    [
      "a policy blocking the probe host itself",
      () => proxy.policy.setVault(vault({ hosts: [{ pattern: PROBE, action: "block" }] }), {}),
    ],
    ["no policy at all", () => proxy.policy.set({ kind: "none" })],
    ["an invalid policy", () => proxy.policy.set({ kind: "invalid", reason: "test" })],
  ])("under %s", (_name, setPolicy) => {
    it.each(ways)("is refused with 403 and the probe header over %s", async (_way, args) => {
      setPolicy();
      const res = await curl(args());
      expect(res.stderr).toBe("");
      expect(res.status).toBe(403);
      expect(probeHeader(res.body)).toBe("refused");
      const decision = proxy.logs.at(-1) as { decision: string; reason: string; host: string };
      expect(decision).toMatchObject({ decision: "refuse", reason: "wiring probe", host: PROBE });
    });
  });

  it("is answered even while the audit spool is full (it is no egress)", async () => {
    proxy.policy.setVault(vault({}), {});
    proxy.audit.accepting = false;
    try {
      const res = await curl(["-i", ...tlsArgs(proxy, PROBE), `https://${PROBE}/`]);
      expect(res.status).toBe(403);
      expect(probeHeader(res.body)).toBe("refused");
    } finally {
      proxy.audit.accepting = true;
    }
  });

  it("a blocked host's refusal does not carry the probe header (only the probe host does)", async () => {
    proxy.policy.setVault(vault({ hosts: [{ pattern: "evil.test", action: "block" }] }), {});
    const res = await curlTls(proxy, "https://evil.test/", ["-i"]);
    expect(res.status).toBe(403);
    expect(probeHeader(res.body)).toBeNull();
    expect(proxy.audit.blocked).toEqual(["evil.test"]);
    // Leave the shared recorder clean for the after-each check.
    proxy.audit.blocked.length = 0;
    proxy.audit.routes.length = 0;
  });

  it("a Host header naming the probe host on another host's TLS connection is misdirected, not a probe", async () => {
    proxy.policy.setVault(vault({}), {});
    const res = await curl([
      "-i",
      ...tlsArgs(proxy, "api.test"),
      "-H",
      `Host: ${PROBE}`,
      "https://api.test/",
    ]);
    expect(res.status).toBe(421);
    expect(probeHeader(res.body)).toBeNull();
  });
});
