import { describe, expect, it } from "vitest";
import {
  BAD_TLS_HOSTS,
  BASIC_SECRET,
  badTls,
  CANARY,
  expectNoSecret,
  HDR_SECRET,
  other,
  plainRaw,
  plainUp,
  proxy,
  QUERY_SECRET,
  rules,
  useCredentialsWorld,
  viaTls,
} from "./credentials-world";
import { curl, curlTls, tlsArgs } from "./harness";
import { exchange, wire } from "./raw";

// Cases B1–B4 (B5–B7 are in credential-scrub.test.ts, over the same world: credentials-world.ts):
// a secret goes only to its rule's hosts, only over verified TLS, never by following a redirect,
// and run-internal headers are stripped both ways.

useCredentialsWorld();

describe("case B1: a secret is injected only for hosts its rule matches", () => {
  it("the rule host gets the vault's credential in place of the agent's", async () => {
    const res = await viaTls("api.test", "/v1/x", ["-H", "Authorization: Bearer agent-supplied"]);
    expect(res.status).toBe(200);
    expect(rules.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
    expectNoSecret(res.body);
  });

  it("the same request shape to another allowed host carries no secret", async () => {
    for (const extra of [[], ["-H", "Authorization: Bearer agent-supplied"]]) {
      const res = await viaTls("other.test", "/v1/x", extra);
      expect(res.status).toBe(200);
      const seen = other.seen.at(-1);
      expect(seen?.headers.authorization).toBe(extra.length ? "Bearer agent-supplied" : undefined);
      expectNoSecret(JSON.stringify(seen), "other.test request");
    }
  });

  it("each scheme lands in its own place, on its own host only", async () => {
    await viaTls("basic.test", "/b");
    expect(rules.seen.at(-1)?.headers.authorization).toBe(
      `Basic ${Buffer.from(BASIC_SECRET).toString("base64")}`,
    );
    await viaTls("query.test", "/q?key=agent&x=1");
    const url = new URL(rules.seen.at(-1)?.url ?? "", "https://query.test");
    expect(url.searchParams.getAll("key")).toEqual([QUERY_SECRET]);
    expect(url.searchParams.get("x")).toBe("1");
    await viaTls("hdr.test", "/h", ["-H", "X-Api-Key: agent"]);
    expect(rules.seen.at(-1)?.headers["x-api-key"]).toBe(HDR_SECRET);
    expect(rules.seen.at(-1)?.headers.authorization).toBeUndefined();
  });

  it("over the plain listener and the explicit port too (upgraded to TLS for the rule host)", async () => {
    const plain = await exchange({ port: proxy.httpPort }, [
      wire("GET /via-plain HTTP/1.1", ["Host: api.test", "Connection: close"]),
    ]);
    expect(plain.responses[0]?.status).toBe(200);
    expect(rules.seen.at(-1)).toMatchObject({
      url: "/via-plain",
      headers: { authorization: `Bearer ${CANARY}` },
    });
    const explicit = await curl([
      "-x",
      `http://127.0.0.1:${proxy.explicitPort}`,
      "http://other.test/via-explicit",
    ]);
    expect(explicit.status).toBe(502); // other.test is TLS-only; plain http to it is not upgraded
    expectNoSecret(explicit.body);
  });
});

describe("case B2: a redirect is passed back, never followed with the credential", () => {
  it("302 to another origin reaches the client as is; the second host sees nothing", async () => {
    const before = other.counts.requests;
    const res = await curlTls(proxy, "https://redirect.test/start", ["-D", "-"]);
    expect(res.status).toBe(302);
    expect(res.body).toMatch(/^location: https:\/\/other\.test\/landing\r?$/im);
    expect(other.counts.requests).toBe(before);
    expect(rules.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
  });

  it("a client that follows it reaches the second host without the credential", async () => {
    const res = await curl([
      ...tlsArgs(proxy, "redirect.test"),
      "--connect-to",
      `other.test:443:127.0.0.1:${proxy.tlsPort}`,
      "-L",
      "https://redirect.test/start",
    ]);
    expect(res.status).toBe(200);
    const seen = other.seen.at(-1);
    expect(seen?.url).toBe("/landing");
    expect(seen?.headers.authorization).toBeUndefined();
    expectNoSecret(res.body);
  });
});

describe("case B3: a credential only travels over verified TLS", () => {
  for (const host of BAD_TLS_HOSTS) {
    it(`${host}: 502, and the upstream received no request`, async () => {
      const up = badTls;
      const before = up.map((u) => u.counts.requests);
      const res = await viaTls(host, "/secret-path");
      expect(res.status).toBe(502);
      expect(res.body).toBe("Upstream request failed.\n");
      expectNoSecret(res.body);
      expect(up.map((u) => u.counts.requests)).toEqual(before);
      expect(proxy.logs.at(-1)).toMatchObject({ host, status: 502, decision: "error" });
    });
  }

  it("a plain-http request to a rule host is upgraded, never sent in clear", async () => {
    const before = plainUp.counts.requests;
    for (const attempt of [
      () =>
        exchange({ port: proxy.httpPort }, [
          wire("GET /clear HTTP/1.1", ["Host: plainrule.test", "Connection: close"]),
        ]),
      () =>
        exchange({ port: proxy.explicitPort }, [
          wire("GET http://plainrule.test/clear HTTP/1.1", ["Host: plainrule.test", "Connection: close"]),
        ]),
    ]) {
      const r = await attempt();
      // The upstream speaks only plain HTTP, so the upgraded (TLS) attempt fails: 502.
      expect(r.responses[0]?.status).toBe(502);
      expectNoSecret(r.bytes);
    }
    expect(plainUp.counts.requests).toBe(before);
    expectNoSecret(Buffer.concat(plainRaw), "plain upstream's raw bytes");
  });

  it("control: plain http to a host without a rule stays plain http", async () => {
    const r = await exchange({ port: proxy.httpPort }, [
      wire("GET /free HTTP/1.1", ["Host: plainfree.test", "Connection: close"]),
    ]);
    expect(r.responses[0]?.status).toBe(200);
    expect(plainUp.seen.at(-1)?.url).toBe("/free");
  });
});

describe("case B4: proxy and run-internal headers are stripped both ways", () => {
  it("request side", async () => {
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } }, [
      wire("GET /hop HTTP/1.1", [
        "Host: api.test",
        "X-Benchwright-Run: run_123",
        "x-benchwright-token: tok",
        "Proxy-Authorization: Basic Zm9vOmJhcg==",
        "Proxy-Connection: keep-alive",
        "Connection: close, X-Drop-Me",
        "X-Drop-Me: 1",
        "Keep-Alive: timeout=5",
        "TE: trailers",
        "Upgrade: websocket",
        "X-Keep-Me: 1",
      ]),
    ]);
    expect(r.responses[0]?.status).toBe(200);
    const headers = rules.seen.at(-1)?.headers ?? {};
    for (const gone of [
      "x-benchwright-run",
      "x-benchwright-token",
      "proxy-authorization",
      "proxy-connection",
      "x-drop-me",
      "keep-alive",
      "te",
      "upgrade",
    ]) {
      expect(headers[gone], gone).toBeUndefined();
    }
    expect(headers.connection).not.toMatch(/x-drop-me/i);
    expect(headers["x-keep-me"]).toBe("1");
    expect(headers.authorization).toBe(`Bearer ${CANARY}`);
  });

  it("a Connection-listed authorization header still gets the vault's credential", async () => {
    await exchange({ port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } }, [
      wire("GET /listed HTTP/1.1", [
        "Host: api.test",
        "Connection: close, authorization",
        "Authorization: x",
      ]),
    ]);
    expect(rules.seen.at(-1)?.headers.authorization).toBe(`Bearer ${CANARY}`);
  });

  it("response side", async () => {
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "hop.test", ca: proxy.caPem } }, [
      wire("GET / HTTP/1.1", ["Host: hop.test", "Connection: close"]),
    ]);
    const res = r.responses[0];
    expect(res?.status).toBe(200);
    const names = (res?.headers ?? []).map(([k]) => k);
    for (const gone of [
      "x-benchwright-internal",
      "x-benchwright-policy",
      "x-resp-drop",
      "proxy-authenticate",
      "upgrade",
    ]) {
      expect(names, gone).not.toContain(gone);
    }
    const header = (n: string) => res?.headers.find(([k]) => k === n)?.[1];
    expect(header("connection")).toBe("close");
    expect(header("keep-alive")).toBeUndefined();
    expect(header("x-resp-keep")).toBe("1");
  });
});
