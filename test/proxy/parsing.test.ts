import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import {
  createTestCa,
  echo,
  type RunningProxy,
  startPlainUpstream,
  startProxy,
  startTlsUpstream,
  type Upstream,
  vault,
} from "./harness";
import { exchange, type RawTarget, wire } from "./raw";

// Cases A1–A6 and A9: messages whose framing two parsers could read differently are answered
// 400 and never forwarded, on every way into the proxy (plain HTTP by Host, transparent TLS by
// SNI, and the explicit proxy port in absolute-form). Byte-exact, so raw sockets only.

const CANARY = "sk-canary-parsing-4b1d9e27";

let proxy: RunningProxy;
let api: Upstream;
let plain: Upstream;

beforeAll(async () => {
  const ca = await createTestCa();
  api = await startTlsUpstream({ ca, hosts: ["api.test"], address: "127.0.0.2" });
  plain = await startPlainUpstream({
    address: "127.0.0.3",
    handler: (req, res, body) => {
      if (req.url === "/slow") return void setTimeout(() => echo(req, res, body), 150);
      if (req.url === "/stream") {
        // Head and half the body now, the rest later: a response that is on the wire for a while.
        res.writeHead(200, { "content-type": "text/plain", "content-length": 20 });
        res.write("0123456789");
        return void setTimeout(() => res.end("abcdefghij"), 300);
      }
      echo(req, res, body);
    },
  });
  proxy = await startProxy({
    vault: vault({
      hosts: [
        { pattern: "api.test", action: "allow" },
        { pattern: "plain.test", action: "allow" },
      ],
      rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { API_KEY: CANARY },
    routes: { "api.test": api, "plain.test": plain },
    upstreamCa: ca,
  });
});

afterAll(async () => {
  // case B5: the canary never shows up in the proxy's log, whatever the tests above did.
  expect(JSON.stringify(proxy.logs)).not.toContain(CANARY);
  await proxy.close();
  await api.close();
  await plain.close();
});

interface Way {
  name: string;
  target: () => RawTarget;
  host: string;
  /** The request line for `method` and `path` on this way in. */
  line: (method: string, path: string) => string;
  upstream: () => Upstream;
}

const ways: Way[] = [
  {
    name: "plain HTTP listener",
    target: () => ({ port: proxy.httpPort }),
    host: "plain.test",
    line: (m, p) => `${m} ${p} HTTP/1.1`,
    upstream: () => plain,
  },
  {
    name: "transparent TLS listener",
    target: () => ({ port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } }),
    host: "api.test",
    line: (m, p) => `${m} ${p} HTTP/1.1`,
    upstream: () => api,
  },
  {
    name: "explicit proxy port (absolute-form)",
    target: () => ({ port: proxy.explicitPort }),
    host: "plain.test",
    line: (m, p) => `${m} http://plain.test${p} HTTP/1.1`,
    upstream: () => plain,
  },
];

/** A malformed message: built from the way's request line and Host. */
interface Case {
  id: string;
  name: string;
  build: (line: (m: string, p: string) => string, host: string) => string;
  /**
   * The fault sits in the body, after valid data. Bodies are streamed, so the upstream may get the
   * start of the request before the fault is parsed; it must never get a complete request.
   */
  inBody?: true;
}

const SMUGGLED = "GET /smuggled HTTP/1.1\r\nHost: plain.test\r\n\r\n";

const post = (headers: string[], body: string) => (line: Way["line"], host: string) =>
  wire(line("POST", "/upload"), [`Host: ${host}`, ...headers], body);

const cases: Case[] = [
  // case A1: Content-Length and Transfer-Encoding together, in both orders.
  {
    id: "A1",
    name: "CL then TE",
    build: post(["Content-Length: 6", "Transfer-Encoding: chunked"], `0\r\n\r\n${SMUGGLED}`),
  },
  {
    id: "A1",
    name: "TE then CL",
    build: post(["Transfer-Encoding: chunked", "Content-Length: 49"], `0\r\n\r\n${SMUGGLED}`),
  },
  {
    id: "A1",
    name: "CL 0 with TE",
    build: post(["Content-Length: 0", "Transfer-Encoding: chunked"], "0\r\n\r\n"),
  },
  // case A2: Content-Length that is duplicated, conflicting or not a plain decimal.
  { id: "A2", name: "duplicate CL", build: post(["Content-Length: 5", "Content-Length: 5"], "hello") },
  { id: "A2", name: "conflicting CL", build: post(["Content-Length: 5", "Content-Length: 6"], "hello!") },
  { id: "A2", name: "CL list", build: post(["Content-Length: 5, 5"], "hello") },
  { id: "A2", name: "empty CL", build: post(["Content-Length: "], "hello") },
  { id: "A2", name: "CL +1", build: post(["Content-Length: +1"], "h") },
  { id: "A2", name: "CL 0x10", build: post(["Content-Length: 0x10"], "0123456789abcdef") },
  { id: "A2", name: "CL 1Z", build: post(["Content-Length: 1Z"], "h") },
  { id: "A2", name: "CL 010", build: post(["Content-Length: 010"], "0123456789") },
  { id: "A2", name: "CL -1", build: post(["Content-Length: -1"], "h") },
  { id: "A2", name: "CL 5 5", build: post(["Content-Length: 5 5"], "hello") },
  // case A3: Transfer-Encoding in disguise.
  { id: "A3", name: "TE ,chunked", build: post(["Transfer-Encoding: ,chunked"], "0\r\n\r\n") },
  {
    id: "A3",
    name: "TE chunked, chunked",
    build: post(["Transfer-Encoding: chunked, chunked"], "0\r\n\r\n"),
  },
  {
    id: "A3",
    name: "TE doubled",
    build: post(["Transfer-Encoding: chunked", "Transfer-Encoding: chunked"], "0\r\n\r\n"),
  },
  {
    id: "A3",
    name: "TE identity then chunked",
    build: post(["Transfer-Encoding: identity", "Transfer-Encoding: chunked"], "0\r\n\r\n"),
  },
  { id: "A3", name: "TE gzip, chunked", build: post(["Transfer-Encoding: gzip, chunked"], "0\r\n\r\n") },
  { id: "A3", name: "TE xchunked", build: post(["Transfer-Encoding: xchunked"], "0\r\n\r\n") },
  { id: "A3", name: "TE obs-fold", build: post(["Transfer-Encoding:", " chunked"], "0\r\n\r\n") },
  {
    id: "A3",
    name: "TE obs-fold after a value",
    build: post(["Content-Length: 5", "X-Pad: a", " Transfer-Encoding: chunked"], "hello"),
  },
  { id: "A3", name: "TE space before colon", build: post(["Transfer-Encoding : chunked"], "0\r\n\r\n") },
  { id: "A3", name: "CL space before colon", build: post(["Content-Length : 5"], "hello") },
  { id: "A3", name: "TE tab before colon", build: post(["Transfer-Encoding\t: chunked"], "0\r\n\r\n") },
  // case A4: chunk framing.
  {
    id: "A4",
    name: "chunk size 0x3a",
    build: post(["Transfer-Encoding: chunked"], `0x3a\r\n${"a".repeat(58)}\r\n0\r\n\r\n`),
  },
  {
    id: "A4",
    name: "chunk size 0_2e",
    build: post(["Transfer-Encoding: chunked"], `0_2e\r\n${"a".repeat(46)}\r\n0\r\n\r\n`),
  },
  {
    id: "A4",
    name: "chunk size bare LF",
    build: post(["Transfer-Encoding: chunked"], "5\nhello\r\n0\r\n\r\n"),
  },
  {
    id: "A4",
    name: "chunk data bare LF",
    build: post(["Transfer-Encoding: chunked"], "5\r\nhello\n0\r\n\r\n"),
    inBody: true,
  },
  {
    id: "A4",
    name: "empty chunk size",
    build: post(["Transfer-Encoding: chunked"], "\r\nhello\r\n0\r\n\r\n"),
  },
  { id: "A4", name: "chunk size -1", build: post(["Transfer-Encoding: chunked"], "-1\r\nh\r\n0\r\n\r\n") },
  {
    id: "A4",
    name: "chunk size with space",
    build: post(["Transfer-Encoding: chunked"], " 5\r\nhello\r\n0\r\n\r\n"),
  },
  {
    id: "A4",
    name: "chunk size overflow",
    build: post(["Transfer-Encoding: chunked"], "10000000000000005\r\nhello\r\n0\r\n\r\n"),
  },
  {
    id: "A4",
    name: "chunk longer than its size",
    build: post(["Transfer-Encoding: chunked"], "3\r\nhello\r\n0\r\n\r\n"),
    inBody: true,
  },
  // case A5: NUL, CR and LF inside header values and names.
  {
    id: "A5",
    name: "NUL in Host",
    build: (line, host) => wire(line("GET", "/"), [`Host: ${host}\x00.evil`]),
  },
  {
    id: "A5",
    name: "NUL in a value",
    build: (line, host) => wire(line("GET", "/"), [`Host: ${host}`, "X-A: a\x00b"]),
  },
  {
    id: "A5",
    name: "bare CR in a value",
    build: (line, host) => wire(line("GET", "/"), [`Host: ${host}`, "X-A: a\rTransfer-Encoding: chunked"]),
  },
  {
    id: "A5",
    name: "bare LF in a value",
    build: (line, host) => wire(line("GET", "/"), [`Host: ${host}`, "X-A: a\nTransfer-Encoding: chunked"]),
  },
  {
    id: "A5",
    name: "bare LF ends the Host line",
    build: (line, host) => wire(line("GET", "/"), [`Host: ${host}\nX-B: 1`]),
  },
  {
    id: "A5",
    name: "NUL in a name",
    build: (line, host) => wire(line("GET", "/"), [`Host: ${host}`, "X-\x00A: b"]),
  },
  {
    id: "A5",
    name: "control character in a value (only a lenient parser takes it)",
    build: (line, host) => wire(line("GET", "/"), [`Host: ${host}`, "X-A: a\x01b"]),
  },
];

describe("cases A1–A5, control: well-formed messages go through on every way in", () => {
  for (const way of ways) {
    it(`POST with Content-Length and chunked POST are forwarded (${way.name})`, async () => {
      const up = way.upstream();
      const before = up.seen.length;
      const r = await exchange(
        way.target(),
        [
          wire(way.line("POST", "/cl"), [`Host: ${way.host}`, "Content-Length: 5"], "hello"),
          wire(
            way.line("POST", "/chunked"),
            [`Host: ${way.host}`, "Transfer-Encoding: chunked", "Connection: close"],
            "5\r\nhello\r\n0\r\n\r\n",
          ),
        ],
        { expect: 2 },
      );
      expect(r.responses.map((x) => x.status)).toEqual([200, 200]);
      expect(up.seen.slice(before).map((s) => [s.url, s.body])).toEqual([
        ["/cl", "hello"],
        ["/chunked", "hello"],
      ]);
    });
  }
});

describe("cases A1–A5: ambiguous framing is refused with 400 and never forwarded", () => {
  for (const way of ways) {
    for (const c of cases) {
      it(`case ${c.id}: ${c.name} (${way.name})`, async () => {
        const up = way.upstream();
        const seenBefore = up.seen.length;
        const requestsBefore = up.counts.requests;
        const r = await exchange(way.target(), [c.build(way.line, way.host)]);
        expect(r.responses[0]?.status).toBe(400);
        expect(r.responses).toHaveLength(1);
        expect(r.closedByPeer).toBe(true);
        expect(r.bytes.toString("latin1")).not.toContain(CANARY);
        expect(up.seen.length).toBe(seenBefore);
        if (!c.inBody) expect(up.counts.requests).toBe(requestsBefore);
      });
    }
  }
});

describe("case A6: lenient parsing is never on", () => {
  it("every listening HTTP server of the proxy has insecureHTTPParser explicitly false", () => {
    // Explicitly false (not undefined) also wins over a process-wide --insecure-http-parser.
    for (const server of [proxy.proxy.http, proxy.proxy.explicit]) {
      expect((server as unknown as { insecureHTTPParser: unknown }).insecureHTTPParser).toBe(false);
    }
  });

  it("a message only a lenient parser accepts is refused on every way in", async () => {
    const message = (line: Way["line"], host: string) =>
      wire(line("GET", "/lenient"), [`Host: ${host}`, "X-A: a\x01b", "Connection: close"]);
    // Control: the message really does split strict from lenient parsing.
    const verdict = async (insecureHTTPParser: boolean) => {
      const server: Server = createServer({ insecureHTTPParser }, (_q, s) => s.end("ok"));
      await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
      const { port } = server.address() as AddressInfo;
      const r = await exchange({ port }, [message((m, p) => `${m} ${p} HTTP/1.1`, "x.test")]);
      await new Promise((r2) => server.close(r2));
      return r.responses[0]?.status;
    };
    expect(await verdict(true)).toBe(200);
    expect(await verdict(false)).toBe(400);

    for (const way of ways) {
      const up = way.upstream();
      const before = up.counts.requests;
      const r = await exchange(way.target(), [message(way.line, way.host)]);
      expect(r.responses[0]?.status, way.name).toBe(400);
      expect(up.counts.requests, way.name).toBe(before);
    }
  });
});

describe("case A9: an absolute-form URI whose host differs from Host is refused with 400", () => {
  it("on the explicit proxy port", async () => {
    const before = plain.counts.requests;
    const r = await exchange({ port: proxy.explicitPort }, [
      wire("GET http://plain.test/ HTTP/1.1", ["Host: api.test"]),
    ]);
    expect(r.responses[0]?.status).toBe(400);
    expect(r.responses[0]?.body.toString()).toContain("disagree");
    expect(plain.counts.requests).toBe(before);
  });

  it("on the explicit proxy port, when only the port differs", async () => {
    const before = plain.counts.requests;
    const r = await exchange({ port: proxy.explicitPort }, [
      wire("GET http://plain.test:8080/ HTTP/1.1", ["Host: plain.test"]),
    ]);
    expect(r.responses[0]?.status).toBe(400);
    expect(plain.counts.requests).toBe(before);
  });

  it("on a TLS connection (the URI names another host than SNI and Host)", async () => {
    const before = api.counts.requests;
    const plainBefore = plain.counts.requests;
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } }, [
      wire("GET https://plain.test/ HTTP/1.1", ["Host: api.test"]),
    ]);
    expect(r.responses[0]?.status).toBe(400);
    expect(api.counts.requests).toBe(before);
    expect(plain.counts.requests).toBe(plainBefore);
  });

  it("on the plain listener", async () => {
    const before = plain.counts.requests;
    const r = await exchange({ port: proxy.httpPort }, [
      wire("GET http://api.test/ HTTP/1.1", ["Host: plain.test"]),
    ]);
    expect(r.responses[0]?.status).toBe(400);
    expect(plain.counts.requests).toBe(before);
  });

  it("control: absolute-form naming the same host is forwarded", async () => {
    const r = await exchange({ port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } }, [
      wire("GET https://api.test/same?q=1 HTTP/1.1", ["Host: api.test", "Connection: close"]),
    ]);
    expect(r.responses[0]?.status).toBe(200);
    expect(api.seen.at(-1)?.url).toBe("/same?q=1");
  });
});

describe("pipelining around a refusal (cases A2, B6)", () => {
  it("a valid request pipelined behind a refused one is not processed (RFC 9112 §9.6)", async () => {
    const before = plain.counts.requests;
    const r = await exchange({ port: proxy.httpPort }, [
      // llhttp reads `010` as ten; the proxy refuses it, and must not act on what follows either.
      wire("POST /first HTTP/1.1", ["Host: plain.test", "Content-Length: 010"], "0123456789"),
      wire("GET /after HTTP/1.1", ["Host: plain.test", "Connection: close"]),
    ]);
    expect(r.responses.map((x) => x.status)).toEqual([400]);
    expect(plain.counts.requests).toBe(before);
  });

  it("a valid request pipelined behind one with no Host is not processed, on both ways in", async () => {
    // Found by the fuzz bench on Node 24: Node's own Host check (requireHostHeader) answered 400
    // but let the request behind it reach the handler; the proxy now refuses a missing Host itself.
    const plainBefore = plain.counts.requests;
    const r = await exchange({ port: proxy.httpPort }, [
      wire("GET /first HTTP/1.1", ["9ost: plain.test"]) + wire("GET /after HTTP/1.1", ["Host: plain.test"]),
    ]);
    expect(r.responses.map((x) => x.status)).toEqual([400]);
    expect(plain.counts.requests).toBe(plainBefore);
    const tls = await exchange({ port: proxy.tlsPort, tls: { servername: "api.test", ca: proxy.caPem } }, [
      wire("GET /first HTTP/1.1", ["HHost: evil.test"]) + wire("GET /after HTTP/1.1", ["Host: api.test"]),
    ]);
    expect(tls.responses.map((x) => x.status)).toEqual([400]);
    expect(api.seen.map((x) => x.url)).not.toContain("/after");
  });

  it("a parse error behind a pending request does not answer 400 in that request's place", async () => {
    const r = await exchange({ port: proxy.httpPort }, [
      wire("GET /slow HTTP/1.1", ["Host: plain.test"]),
      wire("POST /bad HTTP/1.1", ["Host: plain.test", "Content-Length: 1Z"], "x"),
    ]);
    // Whatever the client gets, it is not a 400 that it would take as the answer to /slow.
    expect(r.responses.map((x) => x.status)).not.toContain(400);
    expect(plain.seen.map((x) => x.url)).not.toContain("/bad");
  });

  it("a parse error while a response is streaming never writes into that response", async () => {
    const r = await exchange(
      { port: proxy.httpPort },
      [
        wire("GET /stream HTTP/1.1", ["Host: plain.test"]),
        wire("POST /bad HTTP/1.1", ["Host: plain.test", "Content-Length: +1"], "x"),
      ],
      { gapMs: 100 },
    );
    const text = r.bytes.toString("latin1");
    expect(text.startsWith("HTTP/1.1 200")).toBe(true);
    expect(text).not.toContain("HTTP/1.1 400");
    expect(plain.seen.map((x) => x.url)).not.toContain("/bad");
  });
});
