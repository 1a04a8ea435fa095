import { gunzipSync } from "node:zlib";
import { Agent, request as undiciRequest } from "undici";
import { describe, expect, it } from "vitest";
import {
  CANARY,
  ca,
  connLog,
  expectNoSecret,
  plainUp,
  proxy,
  rules,
  useCredentialsWorld,
  viaTls,
} from "./credentials-world";
import { curl, startProxy, tlsArgs, vault } from "./harness";
import { exchange, openSocket, wire } from "./raw";

// Cases B5–B7 (B1–B4 are in credentials.test.ts, over the same world: credentials-world.ts):
// error bodies carry no secret, every keep-alive and pipelined follow-up is decided again, and
// nothing the upstream echoes hands the secret back to the sandbox.

useCredentialsWorld();

describe("case B5: error bodies never carry a secret", () => {
  it("403, 400, 421 and 502 bodies of rule-host requests", async () => {
    const bodies: Buffer[] = [];
    const tls = { port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } };
    for (const msg of [
      wire("GET / HTTP/1.1", ["Host: evil.test"]),
      wire("POST / HTTP/1.1", ["Host: api.test", "Content-Length: 010"], "0123456789"),
      wire("GET http://other.test/ HTTP/1.1", ["Host: api.test"]),
    ]) {
      bodies.push((await exchange(tls, [msg])).bytes);
    }
    bodies.push(
      (await exchange({ port: proxy.httpPort }, [wire("GET / HTTP/1.1", ["Host: evil.test"])])).bytes,
    );
    bodies.push(Buffer.from((await viaTls("wrongca.test")).body));
    expect(bodies.map((b) => /^HTTP\/1\.1 (\d{3})/.exec(b.toString())?.[1] ?? "502")).toEqual([
      "421",
      "400",
      "400",
      "403",
      "502",
    ]);
    for (const b of bodies) expectNoSecret(b);
  });
});

describe("case B6: keep-alive and pipelined follow-ups are checked again", () => {
  it("pipelined over one TLS connection: allowed, then a blocked Host → 200, 421", async () => {
    const before = rules.counts.requests;
    const r = await exchange(
      { port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } },
      [wire("GET /p1 HTTP/1.1", ["Host: api.test"]) + wire("GET /p2 HTTP/1.1", ["Host: evil.test"])],
      { expect: 2 },
    );
    expect(r.responses.map((x) => x.status)).toEqual([200, 421]);
    expect(rules.counts.requests).toBe(before + 1);
    expectNoSecret(r.bytes);
  });

  it("pipelined on the plain listener: allowed, blocked, allowed → 200, 403, then closed", async () => {
    const before = plainUp.counts.requests;
    const r = await exchange({ port: proxy.httpPort }, [
      wire("GET /a HTTP/1.1", ["Host: plainfree.test"]) +
        wire("GET /b HTTP/1.1", ["Host: evil.test"]) +
        wire("GET /c HTTP/1.1", ["Host: plainfree.test"]),
    ]);
    expect(r.responses.map((x) => x.status)).toEqual([200, 403]);
    expect(r.closedByPeer).toBe(true);
    expect(plainUp.counts.requests).toBe(before + 1);
    expect(proxy.audit.blocked).toContain("evil.test");
  });

  it("keep-alive on the explicit port: absolute-form to an allowed host, then to a blocked one", async () => {
    const socket = await openSocket({ port: proxy.explicitPort });
    const first = await exchange(
      socket,
      [wire("GET http://plainfree.test/k1 HTTP/1.1", ["Host: plainfree.test"])],
      {
        expect: 1,
        keepOpen: true,
      },
    );
    expect(first.responses[0]?.status).toBe(200);
    const second = await exchange(socket, [wire("GET http://evil.test/k2 HTTP/1.1", ["Host: evil.test"])]);
    expect(second.responses[0]?.status).toBe(403);
  });

  it("a policy change between two requests on one connection applies to the second", async () => {
    const socket = await openSocket({
      port: proxy.tlsPort,
      tls: { servername: "api.test", ca: proxy.caPem },
    });
    const first = await exchange(socket, [wire("GET /before HTTP/1.1", ["Host: api.test"])], {
      expect: 1,
      keepOpen: true,
    });
    expect(first.responses[0]?.status).toBe(200);
    const saved = proxy.policy.current();
    try {
      proxy.policy.setVault(vault({ version: 2, hosts: [{ pattern: "api.test", action: "block" }] }), {});
      const second = await exchange(socket, [wire("GET /after HTTP/1.1", ["Host: api.test"])]);
      expect(second.responses[0]?.status).toBe(403);
      expect(rules.seen.map((s) => s.url)).not.toContain("/after");
    } finally {
      proxy.policy.set(saved);
    }
  });

  it("two runs' proxies never share an upstream connection", async () => {
    const runB = await startProxy({
      vault: vault({
        rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
      }),
      secrets: { API_KEY: "run-b-secret-0000" },
      routes: { "api.test": rules },
      upstreamCa: ca,
    });
    try {
      const from = connLog.length;
      for (let i = 0; i < 4; i++) {
        for (const p of [proxy, runB]) {
          const res = await curl([...tlsArgs(p, "api.test"), `https://api.test/shared-${i}`]);
          expect(res.status).toBe(200);
        }
      }
      const byConnection = new Map<number, Set<string | undefined>>();
      for (const { port, authorization } of connLog.slice(from)) {
        byConnection.set(port, (byConnection.get(port) ?? new Set()).add(authorization));
      }
      expect(byConnection.size).toBeGreaterThanOrEqual(2);
      for (const auths of byConnection.values()) expect(auths.size).toBe(1);
    } finally {
      await runB.close();
    }
  });
});

describe("case B7: what the upstream echoes never hands the secret to the client", () => {
  it("echoed request headers and body (bearer)", async () => {
    const res = await viaTls("api.test", "/echo", ["-d", "payload"]);
    expect(res.status).toBe(200);
    const echoed = JSON.parse(res.body);
    expect(echoed.headers.authorization).toBe(`Bearer ${"*".repeat(CANARY.length)}`);
    expect(echoed.body).toBe("payload");
    expectNoSecret(res.body);
  });

  it("echoed basic credential (base64 form)", async () => {
    const res = await viaTls("basic.test", "/echo");
    expect(res.status).toBe(200);
    expectNoSecret(res.body);
    expect(JSON.parse(res.body).headers.authorization).toMatch(/^Basic \*+$/);
  });

  it("echoed query credential (URL-encoded form)", async () => {
    const res = await viaTls("query.test", "/echo?key=mine&x=1");
    expect(res.status).toBe(200);
    expectNoSecret(res.body);
  });

  it("echoed raw header credential", async () => {
    const res = await viaTls("hdr.test", "/echo");
    expect(res.status).toBe(200);
    expectNoSecret(res.body);
  });

  for (const host of ["gzip.test", "gzip2.test", "br.test", "deflate.test"]) {
    it(`an upstream that compresses anyway (${host})`, async () => {
      // Read the raw bytes and undo whatever encoding they claim, as any client could.
      const r = await exchange({ port: proxy.tlsPort, tls: { servername: host, ca: proxy.caPem } }, [
        wire("GET /echo HTTP/1.1", [
          `Host: ${host}`,
          "Accept-Encoding: gzip, br, deflate",
          "Connection: close",
        ]),
      ]);
      const res = r.responses[0];
      expect(res).toBeDefined();
      expectNoSecret(r.bytes);
      const encoding = res?.headers.find(([k]) => k === "content-encoding")?.[1] ?? "";
      let body = res?.body ?? Buffer.alloc(0);
      for (const coding of encoding
        .split(",")
        .map((c) => c.trim())
        .filter(Boolean)
        .reverse()) {
        if (coding === "gzip") body = gunzipSync(body);
      }
      expectNoSecret(body, "decoded body");
      expect([200, 502]).toContain(res?.status);
      if (res?.status === 200)
        expect(JSON.parse(body.toString()).headers.authorization).toMatch(/^Bearer \*+$/);
    });
  }

  it("an encoding the scrubber cannot read → 502, not passed through", async () => {
    const res = await viaTls("custom-enc.test", "/echo");
    expect(res.status).toBe(502);
    expect(res.body).toBe("Upstream request failed.\n");
    expect(proxy.logs.at(-1)).toMatchObject({
      host: "custom-enc.test",
      reason: "response encoding cannot be scrubbed",
    });
  });

  it("a corrupt gzip body ends that response and leaves the proxy serving", async () => {
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "badgzip.test", ca: proxy.caPem } }, [
      wire("GET / HTTP/1.1", ["Host: badgzip.test", "Connection: close"]),
    ]);
    expect(r.closedByPeer).toBe(true);
    expect(r.responses.filter((x) => x.status === 200)).toHaveLength(0);
    const after = await viaTls("api.test", "/still-up");
    expect(after.status).toBe(200);
  });

  it("the upstream asked for identity encoding when a credential was injected", () => {
    const seen = rules.seen.filter((s) => s.headers.host === "gzip.test").at(-1);
    expect(seen?.headers["accept-encoding"]).toBe("identity");
  });

  it("reflected into response headers (x-echo-auth, set-cookie)", async () => {
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "reflect.test", ca: proxy.caPem } }, [
      wire("GET / HTTP/1.1", ["Host: reflect.test", "Connection: close"]),
    ]);
    expect(r.responses[0]?.status).toBe(200);
    expectNoSecret(r.bytes);
    expect(r.responses[0]?.headers).toContainEqual(["x-echo-auth", `Bearer ${"*".repeat(CANARY.length)}`]);
  });

  it("split one byte per chunk", async () => {
    const res = await viaTls("split.test", "/");
    expect(res.status).toBe(200);
    expect(res.body).toBe(`auth=Bearer ${"*".repeat(CANARY.length)}`);
  });

  it("in a trailer", async () => {
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "trailer.test", ca: proxy.caPem } }, [
      wire("GET / HTTP/1.1", ["Host: trailer.test", "TE: trailers", "Connection: close"]),
    ]);
    expect(r.bytes.toString()).toContain("body without the secret");
    expectNoSecret(r.bytes);
  });

  it("with undici as the client", async () => {
    const { statusCode, headers, body } = await undiciRequest(`https://127.0.0.1:${proxy.tlsPort}/undici`, {
      headers: { host: "api.test" },
      dispatcher: new Agent({ connect: { servername: "api.test", ca: proxy.caPem } }),
    });
    const text = await body.text();
    expect(statusCode).toBe(200);
    expectNoSecret(text);
    expectNoSecret(JSON.stringify(headers));
  });
});
