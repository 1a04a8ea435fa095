import type { SandboxInfo } from "@benchwright/shared/contract/local-agent";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type AgentSuite, startAgentSuite, whyNot } from "./agent-suite";
import { type AgentClient, TestUpstream } from "./harness";

// Where a sandbox's traffic goes, on real namespaces and nftables: default routing's redirect of
// the proxy's address and its direct path to the upstream (I4), catch-all's every 80/443 and DNS
// to the proxy and nothing else (A17), and the control-plane relay reachable from the proxy
// sandbox only. Apart: the network's paths, not what the sandboxes' processes are.

function hostPort(target: string | null): { host: string; port: number } {
  const [h, p] = (target ?? "").split(":");
  return { host: h as string, port: Number(p) };
}

describe.skipIf(whyNot !== null)("local agent: sandboxes in namespaces", () => {
  let suite: AgentSuite;
  let api: AgentClient;
  let upstream: TestUpstream;
  let proxy: SandboxInfo;
  let work: SandboxInfo; // default routing
  let catchAll: SandboxInfo;

  beforeAll(async () => {
    suite = await startAgentSuite();
    ({ api, upstream, proxy, work, catchAll } = suite);
  }, 300_000);

  afterAll(() => suite?.close(), 30_000);

  it("redirects 80/443 on the proxy's address to the proxy (default routing)", async () => {
    const [tls, http] = await api.probe("wk1", [
      { host: work.proxyAddress as string, port: 443 },
      { host: work.proxyAddress as string, port: 80 },
    ]);
    expect([tls, http]).toEqual(["proxy:8443", "proxy:8080"]);
  });

  it("lets default routing reach the upstream directly, TCP and UDP, but 80/443 through the proxy (I4)", async () => {
    const results = await api.probe("wk1", [
      { host: TestUpstream.address, port: 443 },
      { host: TestUpstream.address, port: 80 },
      { host: TestUpstream.address, port: 9000 },
      { host: TestUpstream.address, port: 9001, udp: "from-default" },
      hostPort(work.probeTarget),
      // The direct listeners take only DNAT'd connections.
      { host: work.proxyAddress as string, port: 8444 },
      { host: work.proxyAddress as string, port: 8081 },
      { host: TestUpstream.address, port: 443, udp: "quic-default" },
    ]);
    expect(results.slice(0, 5)).toEqual([
      "proxy:8444",
      "proxy:8081",
      "upstream:9000",
      "reply:upstream-udp",
      "EOF",
    ]);
    expect(results[5]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results[6]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results[7]).toBe("noreply");
    expect(upstream.received(9001, "from-default")).toBe(true);
    expect(upstream.received(443, "quic-default")).toBe(false);
  });

  it("sends every 80/443 and DNS to the proxy under catch-all, and nothing else out (A17)", async () => {
    const results = await api.probe("tk1", [
      { host: TestUpstream.address, port: 443 },
      { host: TestUpstream.address, port: 80 },
      { host: TestUpstream.address, port: 9000 },
      hostPort(catchAll.probeTarget),
      { host: TestUpstream.address, port: 53, udp: "dns-question" },
      { host: TestUpstream.address, port: 9001, udp: "from-catch-all" },
      { host: TestUpstream.address, port: 443, udp: "quic" },
    ]);
    expect(results.slice(0, 2)).toEqual(["proxy:8443", "proxy:8080"]);
    expect(results[2]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results[3]).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    expect(results.slice(4)).toEqual(["reply:dns:dns-question", "noreply", "noreply"]);
    // A datagram sent after them over the open path arrives; the refused ones never did.
    await api.probe("wk1", [{ host: TestUpstream.address, port: 9001, udp: "after" }]);
    await upstream.waitFor((l) => l === "udp:9001:after");
    expect(upstream.received(9001, "from-catch-all")).toBe(false);
    expect(upstream.received(53, "dns-question")).toBe(false);
    expect(upstream.received(443, "quic")).toBe(false);
    const resolv = await api.sh(
      "tk1",
      "cat /etc/resolv.conf; cat /proc/sys/net/ipv6/conf/all/disable_ipv6; ip -6 addr",
    );
    expect(resolv.stdout).toBe(`nameserver ${catchAll.proxyAddress}\n1\n`);
  });

  it("keeps the control-plane relay out of a work sandbox's reach, in both modes", async () => {
    const relay = new URL(proxy.controlPlaneUrl as string);
    const target = { host: relay.hostname, port: Number(relay.port) };
    for (const id of ["wk1", "tk1"]) {
      const [r] = await api.probe(id, [target]);
      expect(r, id).toMatch(/^ERR E(HOSTUNREACH|CONNREFUSED)/);
    }
  });

  it("lets the proxy sandbox reach the control plane through controlPlaneUrl", async () => {
    const r = await api.run("px1", {
      argv: [
        "node",
        "-e",
        "fetch(process.argv[1]).then((r) => r.text()).then(console.log)",
        `${proxy.controlPlaneUrl}/ping`,
      ],
      stage: "setup",
    });
    expect(r.stdout.trim()).toBe("control-plane:/ping");
    // The proxy runs as `bw-proxy` (node /run/bw-image/proxy.cjs) in its setup identity.
    expect(
      (await api.run("px1", { argv: ["test", "-r", "/run/bw-image/proxy.cjs"], stage: "setup" })).exitCode,
    ).toBe(0);
  });
});
