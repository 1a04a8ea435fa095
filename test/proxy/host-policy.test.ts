import { Client } from "undici";
import { describe, expect, it } from "vitest";
import { curl, curlTls } from "./harness";
import {
  api,
  CANARY,
  ca,
  get,
  other,
  proxy,
  quiet,
  tlsTarget,
  useHostPolicyWorld,
  viaTunnel,
} from "./host-policy-world";
import { connectTunnel, exchange, openSocket, tlsOver, wire } from "./raw";

// Cases A7–A11 (A12–A17 and E3 are in host-policy-targets.test.ts, over the same world:
// host-policy-world.ts): SNI, CONNECT target and Host must name one host; loopback spellings.

useHostPolicyWorld();

describe("case A7: CONNECT to an allowed host, then a Host for another", () => {
  it("control: CONNECT api.test, Host api.test is forwarded with the credential", async () => {
    const r = await viaTunnel("api.test:443", "api.test", get("api.test", "/ok"));
    expect(r.responses[0]?.status).toBe(200);
    expect(api.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
  });

  for (const host of ["evil.test", "other.test", "10.0.0.1", "127.0.0.1", "[::1]", "169.254.169.254"]) {
    it(`inner Host ${host} → 421, nothing forwarded`, async () => {
      const nothing = quiet();
      const r = await viaTunnel("api.test:443", "api.test", get(host));
      expect(r.responses[0]?.status).toBe(421);
      expect(r.bytes.toString()).not.toContain(CANARY);
      nothing();
    });
  }

  it("inner SNI for a blocked host inside a tunnel to an allowed one → 421", async () => {
    const nothing = quiet();
    const r = await viaTunnel("api.test:443", "evil.test", get("evil.test"));
    expect(r.responses[0]?.status).toBe(421);
    expect(proxy.logs.at(-1)).toMatchObject({ status: 421, reason: "SNI differs from the CONNECT target" });
    nothing();
  });

  it("with curl as the client (CONNECT api.test, then Host: evil.test)", async () => {
    const nothing = quiet();
    const res = await curl([
      "-x",
      `http://127.0.0.1:${proxy.explicitPort}`,
      "--cacert",
      proxy.caFile,
      "-H",
      "Host: evil.test",
      "https://api.test/",
    ]);
    expect(res.status).toBe(421);
    nothing();
  });

  it("a second request on the same tunnel with another Host is refused (B6)", async () => {
    const t = await connectTunnel(proxy.explicitPort, "api.test:443");
    const inner = await tlsOver(t.socket, { servername: "api.test", ca: proxy.caPem });
    const before = api.counts.requests;
    const r = await exchange(
      inner,
      [wire("GET /one HTTP/1.1", ["Host: api.test"]), wire("GET /two HTTP/1.1", ["Host: evil.test"])],
      { expect: 2 },
    );
    expect(r.responses.map((x) => x.status)).toEqual([200, 421]);
    expect(api.counts.requests).toBe(before + 1);
  });

  it("CONNECT to the blocked host itself → 403 and an audit row", async () => {
    const t = await connectTunnel(proxy.explicitPort, "evil.test:443");
    t.socket.destroy();
    expect(t.status).toBe(403);
    expect(proxy.audit.blocked).toContain("evil.test");
  });
});

describe("case A8: TLS SNI differs from Host (domain fronting) → 421, in the decision log", () => {
  it("SNI api.test, Host other.test (both allowed)", async () => {
    const nothing = quiet();
    const r = await exchange(tlsTarget("api.test"), [get("other.test")]);
    expect(r.responses[0]?.status).toBe(421);
    expect(proxy.logs.at(-1)).toMatchObject({
      event: "decision",
      listener: "tls",
      decision: "refuse",
      status: 421,
      reason: "Host header differs from the connection's host",
    });
    nothing();
  });

  it("SNI other.test (no rule), Host api.test (the rule host): no credential anywhere", async () => {
    // Catch-all routing (the wildcard rule) splices other.test (case I3): the proxy never reads
    // the Host header, other.test's own server answers it, and no credential is added.
    const before = other.seen.length;
    const from = proxy.logs.length;
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "other.test", ca: ca.certPem } }, [
      get("api.test"),
    ]);
    expect(r.responses[0]?.status).toBe(200);
    expect(other.seen.length).toBe(before + 1);
    expect(other.seen.at(-1)?.headers.host).toBe("api.test");
    expect(other.seen.at(-1)?.headers.authorization).toBeUndefined();
    expect(r.bytes.toString()).not.toContain(CANARY);
    const spliced = await proxy.waitForLog((l) => l.mode === "splice", from);
    expect(spliced).toMatchObject({ host: "other.test", mode: "splice", rule: null, route: "direct" });
  });

  it("with curl as the client", async () => {
    const nothing = quiet();
    const res = await curlTls(proxy, "https://api.test/", ["-H", "Host: other.test"]);
    expect(res.status).toBe(421);
    expect(res.body).not.toContain(CANARY);
    nothing();
  });

  it("through a CONNECT tunnel: SNI other.test inside CONNECT api.test", async () => {
    const nothing = quiet();
    const r = await viaTunnel("api.test:443", "other.test", get("other.test"));
    expect(r.responses[0]?.status).toBe(421);
    nothing();
  });
});

describe("case A10: a connection redirected for one host carrying a Host for another", () => {
  it("keep-alive: after a request for api.test, the next one on the connection names other.test → 421", async () => {
    const socket = await openSocket(tlsTarget("api.test"));
    const first = await exchange(socket, [wire("GET /first HTTP/1.1", ["Host: api.test"])], {
      expect: 1,
      keepOpen: true,
    });
    expect(first.responses[0]?.status).toBe(200);
    expect(first.closedByPeer).toBe(false);
    const nothing = quiet();
    const second = await exchange(socket, [get("other.test", "/second")]);
    expect(second.responses[0]?.status).toBe(421);
    expect(second.bytes.toString()).not.toContain(CANARY);
    nothing();
  });

  it("undici with a Host for another name opens a new connection with that SNI (never reuses this one)", async () => {
    // So the refusal above is what a raw client meets; a library client is routed honestly.
    const client = new Client(`https://127.0.0.1:${proxy.tlsPort}`, {
      // The second connection, for other.test (no rule), is spliced (case I3): other.test's own CA.
      connect: { servername: "api.test", ca: [proxy.caPem, ca.certPem] },
    });
    try {
      const first = await client.request({ path: "/first", method: "GET", headers: { host: "api.test" } });
      await first.body.text();
      expect(first.statusCode).toBe(200);
      const before = other.seen.length;
      const second = await client.request({
        path: "/second",
        method: "GET",
        headers: { host: "other.test" },
      });
      const text = await second.body.text();
      expect(second.statusCode).toBe(200);
      expect(other.seen.length).toBe(before + 1);
      expect(other.seen.at(-1)?.headers.authorization).toBeUndefined();
      expect(text).not.toContain(CANARY);
    } finally {
      await client.close();
    }
  });
});

const LOOPBACK_SPELLINGS = [
  "127.1",
  "0177.0.0.1",
  "0x7f.1",
  "2130706433",
  "[::ffff:7f00:1]",
  "[0:0:0:0:0:0:0:1]",
  "127.0.0.1",
  "[::1]",
  "0x7f000001",
  "127.000.000.001",
];

describe("case A11: loopback spellings are refused with 403, nothing forwarded", () => {
  for (const h of LOOPBACK_SPELLINGS) {
    it(`absolute-form http://${h}/ on the explicit port`, async () => {
      const nothing = quiet();
      const r = await exchange({ port: proxy.explicitPort }, [
        wire(`GET http://${h}/ HTTP/1.1`, [`Host: ${h}`, "Connection: close"]),
      ]);
      expect(r.responses[0]?.status).toBe(403);
      expect(r.responses[0]?.body.toString()).toContain("private or reserved address");
      nothing();
    });

    it(`Host: ${h} on the plain listener`, async () => {
      const nothing = quiet();
      const r = await exchange({ port: proxy.httpPort }, [get(h)]);
      expect(r.responses[0]?.status).toBe(403);
      nothing();
    });
  }

  it("the refusal is audited under the canonical address", () => {
    expect(proxy.audit.blocked).toContain("127.0.0.1");
    expect(proxy.audit.blocked).toContain("[::1]");
  });

  it("with curl as an explicit-proxy client", async () => {
    const nothing = quiet();
    for (const url of [
      "http://127.1/",
      "http://0x7f.1/",
      "http://[::ffff:7f00:1]/",
      "http://2130706433:8080/",
    ]) {
      const res = await curl(["-x", `http://127.0.0.1:${proxy.explicitPort}`, url]);
      expect(res.status, url).toBe(403);
    }
    nothing();
  });
});
