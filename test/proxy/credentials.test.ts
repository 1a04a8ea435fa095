import type { IncomingMessage, ServerResponse } from "node:http";
import { brotliCompressSync, deflateSync, gunzipSync, gzipSync } from "node:zlib";
import { Agent, request as undiciRequest } from "undici";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  curl,
  echo,
  type RunningProxy,
  selfSignedCert,
  startPlainUpstream,
  startProxy,
  startTlsUpstream,
  type TestCa,
  tlsArgs,
  type Upstream,
  vault,
} from "./harness";
import { exchange, openSocket, wire } from "./raw";

// Cases B1–B7: a credential goes only to the hosts its rule names, only over verified TLS, never
// by following a redirect, and never comes back to the sandbox, whatever the upstream echoes.

const CANARY = "sk-canary-cred-3f9a1c77d2";
const BASIC_SECRET = "bw-user:sk-canary-basic-8e21";
const QUERY_SECRET = "sk-canary-q+/=9f0b";
const HDR_SECRET = "sk-canary-hdr-55aa01";
const SECRETS = [CANARY, BASIC_SECRET, QUERY_SECRET, HDR_SECRET];
/** Every byte form in which one of the secrets could leak. */
const LEAK_FORMS = [
  ...SECRETS,
  Buffer.from(BASIC_SECRET).toString("base64"),
  encodeURIComponent(QUERY_SECRET),
  new URLSearchParams([["k", QUERY_SECRET]]).toString().slice(2),
];

function expectNoSecret(text: string | Buffer, where = "response"): void {
  const s = typeof text === "string" ? text : text.toString("latin1");
  for (const form of LEAK_FORMS) expect(s, `${where} leaks ${form.slice(0, 12)}…`).not.toContain(form);
}

const BEARER_HOSTS = [
  "api.test",
  "gzip.test",
  "gzip2.test",
  "badgzip.test",
  "custom-enc.test",
  "br.test",
  "deflate.test",
  "reflect.test",
  "split.test",
  "trailer.test",
  "redirect.test",
  "hop.test",
];
const BAD_TLS_HOSTS = ["selfsigned.test", "wrongca.test", "wrongname.test", "selfsigned-free.test"];

/** Upstream for every rule host: behaviour chosen by Host. Records which connection carried what. */
const connLog: Array<{ port: number; authorization: string | undefined }> = [];

function ruleHostHandler(req: IncomingMessage, res: ServerResponse, body: string): void {
  connLog.push({ port: req.socket.remotePort ?? 0, authorization: req.headers.authorization });
  const host = req.headers.host ?? "";
  const echoed = JSON.stringify({ url: req.url, headers: req.headers, body });
  switch (host) {
    case "redirect.test":
      res.writeHead(302, { location: "https://other.test/landing", "content-length": 0 });
      return void res.end();
    case "gzip.test": {
      // Compresses whatever the proxy asked for (it asks for identity).
      const z = gzipSync(echoed);
      res.writeHead(200, { "content-encoding": "gzip", "content-length": z.length });
      return void res.end(z);
    }
    case "gzip2.test": {
      const z = gzipSync(gzipSync(echoed));
      res.writeHead(200, { "content-encoding": "gzip, gzip", "content-length": z.length });
      return void res.end(z);
    }
    case "badgzip.test": {
      const junk = Buffer.from("this is not gzip at all");
      res.writeHead(200, { "content-encoding": "gzip", "content-length": junk.length });
      return void res.end(junk);
    }
    case "custom-enc.test": {
      const z = Buffer.from(echoed).reverse();
      res.writeHead(200, { "content-encoding": "x-reversed", "content-length": z.length });
      return void res.end(z);
    }
    case "br.test": {
      const z = brotliCompressSync(echoed);
      res.writeHead(200, { "content-encoding": "br", "content-length": z.length });
      return void res.end(z);
    }
    case "deflate.test": {
      const z = deflateSync(echoed);
      res.writeHead(200, { "content-encoding": "deflate", "content-length": z.length });
      return void res.end(z);
    }
    case "reflect.test": {
      const auth = req.headers.authorization ?? "";
      res.writeHead(200, {
        "x-echo-auth": auth,
        "set-cookie": `token=${auth.replace("Bearer ", "")}; Path=/`,
        "content-type": "text/plain",
      });
      return void res.end(`you sent ${auth}`);
    }
    case "split.test": {
      // One byte per write, so the secret straddles every chunk boundary there is.
      res.writeHead(200, { "content-type": "text/plain" });
      const bytes = Buffer.from(`auth=${req.headers.authorization}`);
      let i = 0;
      const next = () => {
        if (i >= bytes.length) return void res.end();
        res.write(bytes.subarray(i, ++i));
        setImmediate(next);
      };
      next();
      return;
    }
    case "trailer.test":
      res.writeHead(200, { "content-type": "text/plain", trailer: "x-echo-auth" });
      res.write("body without the secret");
      res.addTrailers({ "x-echo-auth": req.headers.authorization ?? "" });
      return void res.end();
    case "hop.test":
      res.writeHead(200, {
        "x-benchwright-internal": "run-internal",
        "X-BenchWright-Policy": "v9",
        connection: "x-resp-drop",
        "x-resp-drop": "1",
        "proxy-authenticate": "Basic realm=up",
        "keep-alive": "timeout=99",
        upgrade: "h2c",
        "x-resp-keep": "1",
        "content-type": "application/json",
      });
      return void res.end(echoed);
    default:
      echo(req, res, body);
  }
}

let ca: TestCa;
let rules: Upstream;
let other: Upstream;
let plainUp: Upstream;
let plainRaw: Buffer[];
const badTls: Upstream[] = [];
let proxy: RunningProxy;

beforeAll(async () => {
  ca = await createTestCa();
  rules = await startTlsUpstream({
    ca,
    hosts: [...BEARER_HOSTS, "basic.test", "query.test", "hdr.test"],
    address: "127.0.0.2",
    handler: ruleHostHandler,
  });
  other = await startTlsUpstream({ ca, hosts: ["other.test"], address: "127.0.0.3" });
  plainUp = await startPlainUpstream({ address: "127.0.0.3" });
  plainRaw = [];
  plainUp.server.on("connection", (s) => s.on("data", (d: Buffer) => plainRaw.push(d)));
  const otherCa = await createTestCa("Someone else's CA");
  const selfsigned = await startTlsUpstream({
    ca,
    hosts: [],
    address: "127.0.0.4",
    cert: await selfSignedCert(["selfsigned.test", "selfsigned-free.test"]),
  });
  const wrongca = await startTlsUpstream({ ca: otherCa, hosts: ["wrongca.test"], address: "127.0.0.4" });
  const wrongname = await startTlsUpstream({ ca, hosts: ["someone-else.test"], address: "127.0.0.4" });
  badTls.push(selfsigned, wrongca, wrongname);

  const bearer = (host: string) => ({
    host,
    secret: "API_KEY",
    inject: { scheme: "bearer" as const, name: "authorization" },
  });
  proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "other.test", action: "allow" },
        { pattern: "evil.test", action: "block" },
      ],
      rules: [
        ...[...BEARER_HOSTS, "selfsigned.test", "wrongca.test", "wrongname.test", "plainrule.test"].map(
          bearer,
        ),
        { host: "basic.test", secret: "BASIC", inject: { scheme: "basic", name: "authorization" } },
        { host: "query.test", secret: "QUERY", inject: { scheme: "query", name: "key" } },
        { host: "hdr.test", secret: "HDR", inject: { scheme: "raw", name: "x-api-key" } },
      ],
    }),
    secrets: { API_KEY: CANARY, BASIC: BASIC_SECRET, QUERY: QUERY_SECRET, HDR: HDR_SECRET },
    routes: {
      ...Object.fromEntries([...BEARER_HOSTS, "basic.test", "query.test", "hdr.test"].map((h) => [h, rules])),
      "other.test": other,
      "selfsigned.test": selfsigned,
      "selfsigned-free.test": selfsigned,
      "wrongca.test": wrongca,
      "wrongname.test": wrongname,
      "plainrule.test": plainUp,
      "plainfree.test": plainUp,
    },
    upstreamCa: ca,
  });
});

afterAll(async () => {
  // case B5: across every test of this file, no secret in the decision log or audit rows.
  expectNoSecret(JSON.stringify(proxy.logs), "decision log");
  expectNoSecret(JSON.stringify(proxy.audit), "audit rows");
  // case B1: hosts without a rule never saw a secret, in any request of any test.
  expectNoSecret(JSON.stringify(other.seen), "other.test upstream");
  expectNoSecret(JSON.stringify(plainUp.seen), "plain upstream");
  expectNoSecret(Buffer.concat(plainRaw), "plain upstream's raw bytes");
  await proxy.close();
  await Promise.all([rules.close(), other.close(), plainUp.close(), ...badTls.map((u) => u.close())]);
});

/** curl through the transparent TLS listener, as a work sandbox whose hosts file points at it. */
const viaTls = (host: string, path = "/", extra: string[] = []) =>
  curl([...tlsArgs(proxy, host), ...extra, `https://${host}${path}`]);

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
    const res = await curl([...tlsArgs(proxy, "redirect.test"), "-D", "-", "https://redirect.test/start"]);
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
