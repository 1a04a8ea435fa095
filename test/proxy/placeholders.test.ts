import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import type { IncomingMessage } from "node:http";
import { type ClientHttp2Session, connect as h2connect } from "node:http2";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { Duplex } from "node:stream";
import { connect as tlsConnect } from "node:tls";
import { MAX_PLACEHOLDER_BODY_BYTES, placeholderValue } from "@benchwright/shared/contract/placeholder";
import type { StrayPlaceholderRow } from "@benchwright/shared/contract/proxy-wire";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { type ClientOptions, WebSocket, WebSocketServer } from "ws";
import { runProxy } from "../../proxy-image/src/proxy/run";
import { until } from "../until";
import { FakeControlPlane } from "./control-plane";
import {
  createTestCa,
  curl,
  curlTls,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  tlsArgs,
  type Upstream,
  vault,
} from "./harness";

// Case N2: a rule's placeholder sent to its rule's host is swapped for the secret (any header,
// a client-built Bearer or Basic credential, the query; the body where the rule opts in), sent
// anywhere else it goes out as it is and is counted in the audit (strayPlaceholders), and an echo
// of the swapped secret is masked. The proxy as it runs (run.ts: BW_PLACEHOLDER_NONCE, the policy
// from the control plane, signed audit batches), real TLS, real curl and an HTTP/2 client.

const RUN = "run_placeholders";
const NONCE = "phnonce0123456789abcd";
/** With `+ / =`, so the query swap must encode it. */
const API_KEY = "sk-canary-ph-api+/=7f3a";
const BODY_KEY = "sk-canary-ph-body-91c2";
const API_PH = placeholderValue("API_KEY", NONCE);
const BODY_PH = placeholderValue("BODY_KEY", NONCE);
const b64 = (s: string) => Buffer.from(s, "latin1").toString("base64");
/** Every form of a secret that must never reach the sandbox or a log. */
const LEAKS = [API_KEY, BODY_KEY, encodeURIComponent(API_KEY), b64(`user:${API_KEY}`), b64(`${API_KEY}:x`)];

function expectNoSecret(text: string, where: string): void {
  for (const form of LEAKS) expect(text, `${where} leaks ${form.slice(0, 14)}…`).not.toContain(form);
}

describe("case N2: placeholders swapped on their rule's host, counted elsewhere", () => {
  const cp = new FakeControlPlane(
    RUN,
    vault({
      // The wildcard block makes the run catch-all: under default routing the run CA is
      // name-constrained to the hosts file (N5) and could not terminate other.test.
      hosts: [
        { pattern: "other.test", action: "allow" },
        { pattern: "*.evil.test", action: "block" },
      ],
      rules: [
        { host: "api.test", secret: "API_KEY", inject: { scheme: "raw", name: "x-api-key" } },
        {
          host: "body.test",
          secret: "BODY_KEY",
          inject: { scheme: "raw", name: "x-api-key" },
          placeholderIn: ["body"],
        },
      ],
    }),
    { API_KEY, BODY_KEY },
  );
  let up: Upstream;
  let proxy: Awaited<ReturnType<typeof runProxy>>;
  let dir: string;
  let caFile: string;
  const logs: string[] = [];
  const handshakes: IncomingMessage["headers"][] = [];
  const realOut = process.stdout.write.bind(process.stdout);
  const realErr = process.stderr.write.bind(process.stderr);

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "bw-placeholders-"));
    const testCa = await createTestCa();
    writeFileSync(join(dir, "upstream-ca.pem"), testCa.certPem);
    up = await startTlsUpstream({ ca: testCa, hosts: ["api.test", "body.test", "other.test"] });
    // WebSocket handshakes: recorded, and the token echoed in the 101's headers (masked on the way back).
    const wss = new WebSocketServer({ noServer: true });
    wss.on("headers", (headers, req) => headers.push(`X-Echo-Token: ${req.headers["x-token"] ?? ""}`));
    up.server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
      handshakes.push(req.headers);
      wss.handleUpgrade(req, socket, head, (ws) => ws.close());
    });
    await cp.start();
    // The decision log (stdout) and the proxy's own messages (stderr), for case B5 below.
    const capture =
      (real: typeof process.stdout.write) =>
      (chunk: string | Uint8Array, ...rest: unknown[]) => {
        logs.push(String(chunk));
        return (real as (c: string | Uint8Array, ...r: unknown[]) => boolean)(chunk, ...rest);
      };
    process.stdout.write = capture(realOut) as typeof process.stdout.write;
    process.stderr.write = capture(realErr) as typeof process.stderr.write;
    const route = `${up.address}:${up.port}`;
    proxy = await runProxy(
      {
        ...cp.proxyEnv(join(dir, "spool")),
        BW_PLACEHOLDER_NONCE: NONCE,
        // other.test is allowed without a rule: terminated, not spliced, so its request is seen.
        BW_SPLICE: "off",
        BW_POLICY_INTERVAL_MS: "200",
        BW_TEST_EXTRA_CA_FILE: join(dir, "upstream-ca.pem"),
        BW_TEST_ROUTES: `api.test=${route},body.test=${route},other.test=${route}`,
        BW_TEST_ALLOW_CIDRS: "127.0.0.2/32",
      },
      [],
    );
    caFile = join(dir, "run-ca.pem");
    writeFileSync(caFile, proxy.ca.certPem);
  });

  afterAll(async () => {
    process.stdout.write = realOut;
    process.stderr.write = realErr;
    await proxy?.shutdown();
    await up?.close();
    await cp.close();
    rmSync(dir, { recursive: true, force: true });
  });

  const via = (host: string, path: string, extra: string[] = []) =>
    curl([...extra, ...tlsArgs({ caFile, tlsPort: proxy.listeners.tls }, host), `https://${host}${path}`]);
  const last = () => up.seen.at(-1);

  it("swaps the placeholder in any header, and in a Bearer the client built", async () => {
    const res = await via("api.test", "/h", [
      "-H",
      `authorization: Bearer ${API_PH}`,
      "-H",
      `x-custom: token ${API_PH}`,
    ]);
    expect(res.status).toBe(200);
    expect(last()?.headers.authorization).toBe(`Bearer ${API_KEY}`);
    expect(last()?.headers["x-custom"]).toBe(`token ${API_KEY}`);
    // The rule's own injection still happens.
    expect(last()?.headers["x-api-key"]).toBe(API_KEY);
    // The upstream echoed the swapped secret: masked, as an injected one is (B7).
    expectNoSecret(res.body, "the echo");
    expect(res.body).toContain(`Bearer ${"*".repeat(API_KEY.length)}`);
  });

  it("swaps it inside a Basic credential the client built, either side of the colon", async () => {
    const user = await via("api.test", "/b", ["-H", `authorization: Basic ${b64(`user:${API_PH}`)}`]);
    expect(user.status).toBe(200);
    const sent = String(last()?.headers.authorization);
    expect(Buffer.from(sent.replace(/^Basic /, ""), "base64").toString()).toBe(`user:${API_KEY}`);
    // curl builds this one itself (-u).
    const password = await via("api.test", "/b", ["-u", `${API_PH}:x`]);
    expect(password.status).toBe(200);
    expect(last()?.headers.authorization).toBe(`Basic ${b64(`${API_KEY}:x`)}`);
    // The echoed re-encoded credential is masked too.
    expectNoSecret(user.body + password.body, "the echo");
  });

  it("swaps it in the query, URL-encoded", async () => {
    const res = await via("api.test", `/q?key=${API_PH}&a=1`);
    expect(res.status).toBe(200);
    const url = new URL(String(last()?.url), "https://api.test");
    expect(url.searchParams.get("key")).toBe(API_KEY);
    expect(url.searchParams.get("a")).toBe("1");
    expectNoSecret(res.body, "the echo");
  });

  it("swaps it in the body where the rule opts in, with the right Content-Length", async () => {
    const body = JSON.stringify({ token: BODY_PH, again: BODY_PH });
    const res = await via("body.test", "/p", ["--data-binary", body, "-H", "content-type: application/json"]);
    expect(res.status).toBe(200);
    const seen = last();
    expect(seen?.body).toBe(JSON.stringify({ token: BODY_KEY, again: BODY_KEY }));
    expect(seen?.headers["content-length"]).toBe(String(seen?.bytes));
    expectNoSecret(res.body, "the echo");
    // A chunked upload arrives whole, with its length.
    const chunked = await via("body.test", "/p", ["--data-binary", body, "-H", "transfer-encoding: chunked"]);
    expect(chunked.status).toBe(200);
    expect(last()?.body).toBe(JSON.stringify({ token: BODY_KEY, again: BODY_KEY }));
    expect(last()?.headers["content-length"]).toBe(String(last()?.bytes));
    expect(last()?.headers["transfer-encoding"]).toBeUndefined();
  });

  it("leaves the body alone where the rule does not opt in", async () => {
    const body = `token=${API_PH}`;
    const res = await via("api.test", "/p", ["--data-binary", body]);
    expect(res.status).toBe(200);
    expect(last()?.body).toBe(body);
  });

  it("refuses a body past the bound, or compressed, readably and without forwarding it", async () => {
    const before = up.counts.requests;
    const big = join(dir, "big.bin");
    writeFileSync(big, Buffer.alloc(MAX_PLACEHOLDER_BODY_BYTES + 1, 0x61));
    const tooBig = await via("body.test", "/p", ["--data-binary", `@${big}`]);
    expect(tooBig.status).toBe(413);
    expect(tooBig.body).toContain(`up to ${MAX_PLACEHOLDER_BODY_BYTES} bytes`);
    const chunked = await via("body.test", "/p", [
      "--data-binary",
      `@${big}`,
      "-H",
      "transfer-encoding: chunked",
    ]);
    expect(chunked.status).toBe(413);
    const gz = await via("body.test", "/p", ["--data-binary", "xx", "-H", "content-encoding: gzip"]);
    expect(gz.status).toBe(415);
    expect(gz.body).toContain("Content-Encoding (gzip)");
    expect(up.counts.requests).toBe(before);
  });

  it("sends a placeholder to another host unswapped, and the delivered audit counts it", async () => {
    const other = await via("other.test", "/s", ["-H", `authorization: Bearer ${API_PH}`]);
    expect(other.status).toBe(200);
    expect(last()?.headers.authorization).toBe(`Bearer ${API_PH}`);
    // A rule host, but another rule's placeholder: not swapped either.
    const wrong = await via("body.test", `/s?k=${API_PH}`);
    expect(wrong.status).toBe(200);
    expect(new URL(String(last()?.url), "https://x").searchParams.get("k")).toBe(API_PH);
    const rows = () => [...cp.batches.values()].flatMap((b) => b.strayPlaceholders) as StrayPlaceholderRow[];
    const count = (host: string) =>
      rows()
        .filter((r) => r.host === host && r.secret === "API_KEY")
        .reduce((n, r) => n + r.count, 0);
    await until("the stray rows", () => count("other.test") >= 1 && count("body.test") >= 1);
    expect(count("other.test")).toBe(1);
    expect(count("body.test")).toBe(1);
    // Swapped placeholders are not strays.
    expect(rows().filter((r) => r.host === "api.test")).toEqual([]);
  });

  it("swaps it on an HTTP/2 stream, in headers, query and an opted-in body", async () => {
    const session = (sni: string) =>
      new Promise<ClientHttp2Session>((resolve, reject) => {
        const s = h2connect(`https://${sni}`, {
          createConnection: () =>
            tlsConnect({
              host: "127.0.0.1",
              port: proxy.listeners.tls,
              servername: sni,
              ca: proxy.ca.certPem,
              ALPNProtocols: ["h2"],
            }),
        });
        s.once("connect", () => resolve(s));
        s.once("error", reject);
      });
    const request = (s: ClientHttp2Session, headers: Record<string, string>, body?: string) =>
      new Promise<{ status: number; body: string }>((resolve, reject) => {
        const stream = s.request(headers, { endStream: body === undefined });
        let status = 0;
        const chunks: Buffer[] = [];
        stream.on("response", (h) => {
          status = Number(h[":status"]);
        });
        stream.on("data", (c: Buffer) => chunks.push(c));
        stream.on("end", () => resolve({ status, body: Buffer.concat(chunks).toString() }));
        stream.on("error", reject);
        if (body !== undefined) stream.end(body);
      });
    const api = await session("api.test");
    const res = await request(api, {
      ":path": `/h2?key=${API_PH}`,
      authorization: `Bearer ${API_PH}`,
    });
    api.close();
    expect(api.alpnProtocol).toBe("h2");
    expect(res.status).toBe(200);
    expect(last()?.headers.authorization).toBe(`Bearer ${API_KEY}`);
    expect(new URL(String(last()?.url), "https://x").searchParams.get("key")).toBe(API_KEY);
    expectNoSecret(res.body, "the h2 echo");

    const payload = `{"t":"${BODY_PH}"}`;
    const withBody = await session("body.test");
    const posted = await request(
      withBody,
      { ":method": "POST", ":path": "/p", "content-length": String(payload.length) },
      payload,
    );
    withBody.close();
    expect(posted.status).toBe(200);
    expect(last()?.body).toBe(`{"t":"${BODY_KEY}"}`);
    expect(last()?.headers["content-length"]).toBe(String(last()?.bytes));
  });

  it("swaps it in a WebSocket handshake, and masks its echo in the 101", async () => {
    // `servername` reaches tls.connect (ws passes its options on); its typings omit it.
    const options: ClientOptions & { servername: string } = {
      headers: { host: "api.test", "x-token": API_PH },
      servername: "api.test",
      ca: proxy.ca.certPem,
    };
    const ws = new WebSocket(`wss://127.0.0.1:${proxy.listeners.tls}/ws`, options);
    const echoed = await new Promise<string>((resolve, reject) => {
      ws.once("upgrade", (res) => resolve(String(res.headers["x-echo-token"])));
      ws.once("error", reject);
    });
    ws.terminate();
    expect(handshakes.at(-1)?.["x-token"]).toBe(API_KEY);
    expect(echoed).toBe("*".repeat(API_KEY.length));
  });

  it("never writes a secret (or a placeholder) to its logs or its view (case B5)", async () => {
    const view = await (await fetch(`http://127.0.0.1:${proxy.view.port}/view`)).text();
    expectNoSecret(view, "the view");
    // Let the batched log lines of the last requests out.
    await new Promise((r) => setImmediate(r));
    const text = logs.join("");
    expect(text).toContain('"event":"decision"');
    expectNoSecret(text, "the proxy's logs");
    expect(text).not.toContain(NONCE);
  });
});

describe("case N2: without a nonce nothing is swapped or counted", () => {
  let ca: TestCa;
  let up: Upstream;
  let proxy: RunningProxy;

  beforeAll(async () => {
    ca = await createTestCa();
    up = await startTlsUpstream({ ca, hosts: ["api.test"] });
    proxy = await startProxy({
      vault: vault({
        rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "raw", name: "x-api-key" } }],
      }),
      secrets: { API_KEY },
      routes: { "api.test": up },
      upstreamCa: ca,
    });
  });

  afterAll(async () => {
    await proxy.close();
    await up.close();
  });

  it("sends the placeholder as it came and records no stray", async () => {
    const res = await curlTls(proxy, "https://api.test/h", ["-H", `authorization: Bearer ${API_PH}`]);
    expect(res.status).toBe(200);
    expect(up.seen.at(-1)?.headers.authorization).toBe(`Bearer ${API_PH}`);
    expect(proxy.audit.strays).toEqual([]);
  });
});
