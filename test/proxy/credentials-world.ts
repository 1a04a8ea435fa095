import type { IncomingMessage, ServerResponse } from "node:http";
import { brotliCompressSync, deflateSync, gzipSync } from "node:zlib";
import { afterAll, beforeAll, expect } from "vitest";
import {
  createTestCa,
  curlTls,
  echo,
  type RunningProxy,
  selfSignedCert,
  startPlainUpstream,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";

// Cases B1–B7: a credential goes only to the hosts its rule names, only over verified TLS, never
// by following a redirect, and never comes back to the sandbox, whatever the upstream echoes.

export const CANARY = "sk-canary-cred-3f9a1c77d2";
export const BASIC_SECRET = "bw-user:sk-canary-basic-8e21";
export const QUERY_SECRET = "sk-canary-q+/=9f0b";
export const HDR_SECRET = "sk-canary-hdr-55aa01";
export const SECRETS = [CANARY, BASIC_SECRET, QUERY_SECRET, HDR_SECRET];
/** Every byte form in which one of the secrets could leak. */
export const LEAK_FORMS = [
  ...SECRETS,
  Buffer.from(BASIC_SECRET).toString("base64"),
  encodeURIComponent(QUERY_SECRET),
  new URLSearchParams([["k", QUERY_SECRET]]).toString().slice(2),
];

export function expectNoSecret(text: string | Buffer, where = "response"): void {
  const s = typeof text === "string" ? text : text.toString("latin1");
  for (const form of LEAK_FORMS) expect(s, `${where} leaks ${form.slice(0, 12)}…`).not.toContain(form);
}

export const BEARER_HOSTS = [
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
export const BAD_TLS_HOSTS = ["selfsigned.test", "wrongca.test", "wrongname.test", "selfsigned-free.test"];

/** Upstream for every rule host: behaviour chosen by Host. Records which connection carried what. */
export const connLog: Array<{ port: number; authorization: string | undefined }> = [];

export function ruleHostHandler(req: IncomingMessage, res: ServerResponse, body: string): void {
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

export let ca: TestCa;
export let rules: Upstream;
export let other: Upstream;
export let plainUp: Upstream;
export let plainRaw: Buffer[];
export const badTls: Upstream[] = [];
export let proxy: RunningProxy;

/** curl through the transparent TLS listener, as a work sandbox whose hosts file points at it. */
export const viaTls = (host: string, path = "/", extra: string[] = []) =>
  curlTls(proxy, `https://${host}${path}`, extra);

/** The file's upstreams and proxy (before all), and its closing checks (after all). */
export function useCredentialsWorld(): void {
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
        ...Object.fromEntries(
          [...BEARER_HOSTS, "basic.test", "query.test", "hdr.test"].map((h) => [h, rules]),
        ),
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
}
