import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  curl,
  type RunningProxy,
  startPlainUpstream,
  startProxy,
  tlsArgs,
  type Upstream,
  vault,
} from "./harness";
import {
  api,
  CANARY,
  get,
  proxy,
  quiet,
  tlsTarget,
  upstreamCaFile,
  useHostPolicyWorld,
  viaTunnel,
  WILD_SECRET,
  wild,
} from "./host-policy-world";
import { connectTunnel, exchange, type RawResult, wire } from "./raw";

// Cases A12–A17 and E3 (A7–A11 are in host-policy.test.ts, over the same world:
// host-policy-world.ts): the resolved address is checked and dialled exactly, canonical and
// wildcard names, CONNECT's port, and a full audit spool pausing egress.

useHostPolicyWorld();

describe("cases A12 and A13: the resolved address is checked, and dialled exactly", () => {
  // A resolver the test controls (the upstream's test-only `lookup`); every call is recorded.
  const answers = new Map<string, string[] | (() => string[])>();
  const lookups: string[] = [];
  let resolving: RunningProxy;
  let good: Upstream;
  let internal: Upstream;

  const TABLE: Array<[string, string[], RegExp]> = [
    ["private.resolve.test", ["10.0.0.1"], /private/],
    ["private172.resolve.test", ["172.16.0.1"], /private/],
    ["private192.resolve.test", ["192.168.1.1"], /private/],
    ["cgnat.resolve.test", ["100.64.0.1"], /carrier-grade NAT/],
    ["loopback.resolve.test", ["127.0.0.1"], /loopback/],
    ["metadata.resolve.test", ["169.254.169.254"], /link-local/],
    ["multicast.resolve.test", ["224.0.0.1"], /multicast/],
    ["broadcast.resolve.test", ["255.255.255.255"], /broadcast/],
    ["thisnet.resolve.test", ["0.0.0.0"], /this network/],
    ["ula.resolve.test", ["fc00::1"], /unique local/],
    ["ula-fd.resolve.test", ["fd12:3456::1"], /unique local/],
    ["linklocal6.resolve.test", ["fe80::1"], /link-local/],
    ["loopback6.resolve.test", ["::1"], /.+/],
    ["mapped.resolve.test", ["::ffff:127.0.0.1"], /embeds 127\.0\.0\.1: loopback/],
    ["nat64.resolve.test", ["64:ff9b::7f00:1"], /embeds 127\.0\.0\.1: loopback/],
    ["nat64-metadata.resolve.test", ["64:ff9b::a9fe:a9fe"], /embeds 169\.254\.169\.254/],
    ["6to4.resolve.test", ["2002:7f00:1::"], /embeds 127\.0\.0\.1: loopback/],
    ["teredo.resolve.test", ["2001::1"], /Teredo/],
    ["multicast6.resolve.test", ["ff02::1"], /multicast/],
    ["own.resolve.test", ["127.0.0.6"], /the proxy's own address/],
    // A13: every answer is checked, not just the first.
    ["mixed.resolve.test", ["127.0.0.4", "127.0.0.1"], /loopback/],
    ["mixed-reversed.resolve.test", ["127.0.0.1", "127.0.0.4"], /loopback/],
    ["mixed-metadata.resolve.test", ["127.0.0.4", "169.254.169.254"], /link-local/],
  ];

  beforeAll(async () => {
    // The "internal service" a rebinding attack aims at: loopback, on the same port as `good`
    // (that port may be taken on 127.0.0.1; then try another).
    for (let attempt = 0; ; attempt++) {
      good = await startPlainUpstream({ address: "127.0.0.4" });
      try {
        internal = await startPlainUpstream({ address: "127.0.0.1", port: good.port });
        break;
      } catch (e) {
        await good.close();
        if (attempt === 9) throw e;
      }
    }
    for (const [name, a] of TABLE) answers.set(name, a);
    answers.set("ok.resolve.test", ["127.0.0.4"]);
    resolving = await startProxy({
      vault: vault({ hosts: [{ pattern: "blocked.resolve.test", action: "block" }] }),
      // 127.0.0.4–7 are the suite's test hosts (test-only setting); 127.0.0.6 plays the proxy.
      testAllowCidrs: ["127.0.0.4/30"],
      ownAddresses: ["127.0.0.6"],
      // Plain http leaves for port 80 only (I6): the dial of 80 goes to the upstreams' port.
      dialPorts: { 80: good.port },
      upstream: {
        lookup: async (host) => {
          lookups.push(host);
          const a = answers.get(host);
          if (a === undefined) throw new Error(`no answer for ${host}`);
          return typeof a === "function" ? a() : a;
        },
      },
    });
  });

  afterAll(async () => {
    await resolving.close();
    await Promise.all([good.close(), internal.close()]);
  });

  it("control: a name that resolves to an allowed test address is forwarded to that address", async () => {
    const r = await exchange({ port: resolving.explicitPort }, [
      wire(`GET http://ok.resolve.test/ok HTTP/1.1`, ["Host: ok.resolve.test", "Connection: close"]),
    ]);
    expect(r.responses[0]?.status).toBe(200);
    expect(good.seen.at(-1)?.url).toBe("/ok");
    expect(resolving.dials.at(-1)).toMatchObject({ host: "ok.resolve.test", address: "127.0.0.4", port: 80 });
  });

  for (const [name, addrs, why] of TABLE) {
    it(`${name} → ${addrs.join(", ")}: 403, audited, nothing dialled (case ${name.startsWith("mixed") ? "A13" : "A12"})`, async () => {
      const dials = resolving.dials.length;
      const r = await exchange({ port: resolving.httpPort }, [get(name)]);
      expect(r.responses[0]?.status).toBe(403);
      expect(resolving.dials.length).toBe(dials);
      expect(resolving.audit.blocked).toContain(name);
      expect(resolving.audit.routes).toContainEqual([name, "refused"]);
      const record = resolving.logs.at(-1) as { status: number; reason: string; host: string };
      expect(record).toMatchObject({ status: 403, host: name, decision: "refuse" });
      expect(record.reason).toMatch(why);
      expect(internal.counts.connections).toBe(0);
    });
  }

  it("127.0.0.1 stays denied although 127.0.0.4–7 are allowed for the suite", async () => {
    const r = await exchange({ port: resolving.explicitPort }, [
      wire(`GET http://loopback.resolve.test/ HTTP/1.1`, [
        "Host: loopback.resolve.test",
        "Connection: close",
      ]),
    ]);
    expect(r.responses[0]?.status).toBe(403);
    expect(resolving.logs.at(-1)).toMatchObject({
      host: "loopback.resolve.test",
      reason: expect.stringMatching(/loopback/),
    });
    expect(internal.counts.connections).toBe(0);
  });

  it("case A13: a resolver that answers differently on each call — the dial goes to the checked address", async () => {
    // First answer: the allowed test host; then the loopback "internal" service; then back.
    const sequence = [["127.0.0.4"], ["127.0.0.1"], ["127.0.0.4"]];
    let call = 0;
    answers.set("rebind.resolve.test", () => sequence[Math.min(call++, sequence.length - 1)] ?? []);
    const request = (path: string) =>
      exchange({ port: resolving.explicitPort }, [
        wire(`GET http://rebind.resolve.test${path} HTTP/1.1`, [
          "Host: rebind.resolve.test",
          "Connection: close",
        ]),
      ]);
    const lookupsBefore = lookups.filter((h) => h === "rebind.resolve.test").length;
    const dialsBefore = resolving.dials.length;

    const first = await request("/first");
    expect(first.responses[0]?.status).toBe(200);
    const second = await request("/second");
    expect(second.responses[0]?.status).toBe(403);
    const third = await request("/third");
    expect(third.responses[0]?.status).toBe(200);

    // One resolution per request, and the dials name the checked address only.
    expect(lookups.filter((h) => h === "rebind.resolve.test").length - lookupsBefore).toBe(3);
    expect(resolving.dials.slice(dialsBefore).map((d) => d.address)).toEqual(["127.0.0.4", "127.0.0.4"]);
    expect(good.seen.map((s) => s.url)).toEqual(expect.arrayContaining(["/first", "/third"]));
    expect(good.seen.map((s) => s.url)).not.toContain("/second");
    // Nothing ever reached the loopback service, neither by the proxy nor by a re-resolving client.
    expect(internal.counts.connections).toBe(0);
  });

  it("host policy is decided before any resolution: a blocked name is never looked up", async () => {
    const before = lookups.length;
    const r = await exchange({ port: resolving.httpPort }, [get("blocked.resolve.test")]);
    expect(r.responses[0]?.status).toBe(403);
    expect(lookups.length).toBe(before);
  });

  it("case E5: a name that does not resolve → 502, audited as refused, nothing dialled", async () => {
    const dials = resolving.dials.length;
    const r = await exchange({ port: resolving.httpPort }, [get("nxdomain.resolve.test")]);
    expect(r.responses[0]?.status).toBe(502);
    expect(resolving.audit.routes).toContainEqual(["nxdomain.resolve.test", "refused"]);
    expect(resolving.dials.length).toBe(dials);
  });
});

describe("case A14: canonical names in SNI, Host and CONNECT match the rule for api.test", () => {
  const ways: Array<[string, () => Promise<RawResult>]> = [
    [
      "SNI API.TEST., Host API.TEST.:443",
      () => exchange(tlsTarget("API.TEST.", true), [get("API.TEST.:443")]),
    ],
    ["SNI api.test, Host Api.Test", () => exchange(tlsTarget("api.test"), [get("Api.Test")])],
    ["SNI api.test., Host api.test:443", () => exchange(tlsTarget("api.test.", true), [get("api.test:443")])],
    ["plain listener, Host API.TEST.:80", () => exchange({ port: proxy.httpPort }, [get("API.TEST.:80")])],
    [
      "explicit port, absolute-form http://API.TEST./",
      () =>
        exchange({ port: proxy.explicitPort }, [
          wire("GET http://API.TEST./ HTTP/1.1", ["Host: api.test", "Connection: close"]),
        ]),
    ],
    [
      "CONNECT API.TEST.:443, SNI api.test",
      () => viaTunnel("API.TEST.:443", "api.test", get("api.test:443")),
    ],
  ];
  for (const [name, run] of ways) {
    it(name, async () => {
      const before = api.seen.length;
      const r = await run();
      expect(r.responses[0]?.status).toBe(200);
      expect(api.seen.length).toBe(before + 1);
      expect(api.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
      expect(api.seen.at(-1)?.headers.host).toBe("api.test");
      expect(r.bytes.toString()).not.toContain(CANARY);
    });
  }

  it("a Host port other than the connection's → 421", async () => {
    const nothing = quiet();
    const r = await exchange(tlsTarget("api.test"), [get("api.test:8443")]);
    expect(r.responses[0]?.status).toBe(421);
    nothing();
  });

  for (const bad of ["api..test", "api.test:", "api.test:0", "api test", "api.test@evil.test"]) {
    it(`a Host that is not a host (${JSON.stringify(bad)}) → 400`, async () => {
      const nothing = quiet();
      const r = await exchange(tlsTarget("api.test"), [get(bad)]);
      expect(r.responses[0]?.status).toBe(400);
      nothing();
    });
  }
});

describe("case A15: *.example.test injects for its subdomains only", () => {
  const expected: Record<string, boolean> = {
    "a.example.test": true,
    "deep.a.example.test": true,
    "example.test": false,
    "evil-example.test": false,
    "example.test.evil.test": false,
  };
  for (const [host, injected] of Object.entries(expected)) {
    it(`${host}: ${injected ? "injected" : "no credential"}`, async () => {
      // A name the rule does not cover is spliced under this catch-all vault (case I3): the
      // client meets the upstream's own certificate, so it trusts the upstream's CA there.
      const trust = injected
        ? tlsArgs(proxy, host)
        : ["--cacert", upstreamCaFile, "--connect-to", `${host}:443:127.0.0.1:${proxy.tlsPort}`];
      const from = proxy.logs.length;
      const res = await curl([...trust, `https://${host}/wild`]);
      expect(res.status).toBe(200);
      const seen = wild.seen.at(-1);
      expect(seen?.headers.host).toBe(host);
      expect(seen?.headers["x-api-key"]).toBe(injected ? WILD_SECRET : undefined);
      expect(res.body).not.toContain(WILD_SECRET);
      // Its one record, written when the connection closes: terminated and injected, or spliced.
      const decided = await proxy.waitForLog((l) => l.event === "decision" && l.host === host, from);
      expect(decided).toMatchObject(
        injected ? { mode: "terminate", rule: 1 } : { mode: "splice", rule: null },
      );
    });
  }
});

describe("case A17 (proxy side): CONNECT leaves only to port 443", () => {
  for (const port of [80, 22, 25, 8443, 6443]) {
    it(`CONNECT api.test:${port} → 403`, async () => {
      const nothing = quiet();
      const t = await connectTunnel(proxy.explicitPort, `api.test:${port}`);
      t.socket.destroy();
      expect(t.status).toBe(403);
      expect(proxy.logs.at(-1)).toMatchObject({ method: "CONNECT", status: 403, port });
      nothing();
    });
  }

  for (const authority of ["api.test", "api.test:0", "api.test:99999", "api.test:443x"]) {
    it(`CONNECT ${authority} → 400`, async () => {
      const nothing = quiet();
      const t = await connectTunnel(proxy.explicitPort, authority);
      t.socket.destroy();
      expect(t.status).toBe(400);
      nothing();
    });
  }

  it("curl through the explicit proxy to https://api.test:8443/ fails at CONNECT", async () => {
    const nothing = quiet();
    const res = await curl([
      "-x",
      `http://127.0.0.1:${proxy.explicitPort}`,
      "--cacert",
      proxy.caFile,
      "https://api.test:8443/",
    ]);
    expect(res.code).not.toBe(0);
    expect(res.stderr).toMatch(/403/);
    nothing();
  });
});

// case E3, the proxy's half (the reporter's is in audit.test.ts): while the audit spool is full,
// the proxy refuses new egress with 503 rather than let traffic go unrecorded; nothing is dialled
// and no credential leaves. It goes on once the spool has room again.
describe("case E3: a full audit spool pauses egress", () => {
  it("refuses an allowed, injected request with 503 and dials nothing; serves it again after", async () => {
    const nothing = quiet();
    proxy.audit.accepting = false;
    try {
      for (const target of [tlsTarget("api.test"), tlsTarget("other.test")]) {
        const host = target.tls.servername;
        const r = await exchange(target, [get(host, "/paused")]);
        expect(r.responses[0]?.status, host).toBe(503);
        expect(r.responses[0]?.body.toString()).toContain("audit log cannot be delivered");
        expect(r.bytes.toString()).not.toContain(CANARY);
      }
      const plain = await exchange({ port: proxy.httpPort }, [get("other.test", "/paused")]);
      expect(plain.responses[0]?.status).toBe(503);
      nothing();
    } finally {
      proxy.audit.accepting = true;
    }
    const again = await exchange(tlsTarget("api.test"), [get("api.test", "/resumed")]);
    expect(again.responses[0]?.status).toBe(200);
    expect(api.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
  });
});
