import "reflect-metadata";
import { execFile } from "node:child_process";
import { X509Certificate } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { Agent, createServer as createHttpsServer, request, type Server } from "node:https";
import { type AddressInfo, createServer as createNetServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { connect, type PeerCertificate, TLSSocket } from "node:tls";
import { PLATFORM_HOSTS, PROBE_HEADER, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import { buildPolicyIndex, compilePolicy } from "@benchwright/shared/policy/compile";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { createRunCa, type RunCa } from "../../proxy-image/src/proxy/ca";
import { terminableNames } from "../../proxy-image/src/proxy/name-constraints";
import { runProxy } from "../../proxy-image/src/proxy/run";
import { until } from "../until";
import { FakeControlPlane } from "./control-plane";
import {
  createTestCa,
  curl,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  tlsArgs,
  type Upstream,
  vault,
} from "./harness";

// Case N5 with real TLS and real clients: the run CA's leaves live hours and are minted again
// while connections made with the old one go on; under default routing the CA (made by run.ts
// after the first policy read) is name-constrained to the names the proxy may terminate, and
// Node, openssl, curl and Python refuse a leaf the same CA signs for any other name.

const HOUR = 3_600_000;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

function run(cmd: string, args: string[], input = ""): Promise<Run> {
  return new Promise((resolve) => {
    const child = execFile(cmd, args, { encoding: "utf8", timeout: 20_000 }, (err, stdout, stderr) =>
      resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
    );
    child.stdin?.end(input);
  });
}

/** A handshake with Node's TLS, verifying against `caPem` for `servername`. */
function nodeHandshake(
  port: number,
  servername: string,
  caPem: string,
): Promise<{ ok: true; cert: PeerCertificate } | { ok: false; error: string }> {
  return new Promise((resolve) => {
    const socket = connect({ host: "127.0.0.1", port, servername, ca: caPem, ALPNProtocols: ["http/1.1"] });
    socket.once("secureConnect", () => {
      resolve({ ok: true, cert: socket.getPeerCertificate() });
      socket.destroy();
    });
    socket.once("error", (e: Error & { code?: string }) =>
      resolve({ ok: false, error: `${e.code}: ${e.message}` }),
    );
  });
}

/** The leaf a server presents for `servername`, as PEM, not verified (for `openssl verify`). */
function leafPem(port: number, servername: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect({ host: "127.0.0.1", port, servername, rejectUnauthorized: false });
    socket.once("secureConnect", () => {
      const b64 = socket.getPeerCertificate().raw.toString("base64");
      socket.destroy();
      resolve(`-----BEGIN CERTIFICATE-----\n${b64.replace(/.{64}/g, "$&\n")}\n-----END CERTIFICATE-----\n`);
    });
    socket.once("error", reject);
  });
}

function opensslClient(port: number, servername: string, caFile: string): Promise<Run> {
  return run(
    "openssl",
    [
      "s_client",
      "-connect",
      `127.0.0.1:${port}`,
      "-servername",
      servername,
      "-CAfile",
      caFile,
      "-verify_return_error",
      "-verify_hostname",
      servername,
      "-brief",
    ],
    "",
  );
}

// `host`:443 resolves to 127.0.0.1:`port` inside Python (as the hosts file would send it to the
// proxy), so requests and httpx dial the server under test with the URL a sandbox would use.
// Prints "ok" or the exception.
const PYTHON = `
import socket, ssl, sys
client, cafile, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
real = socket.getaddrinfo
def lookup(h, p, *a, **k):
    return real("127.0.0.1", port, *a, **k) if h == host else real(h, p, *a, **k)
socket.getaddrinfo = lookup
def plain():
    ctx = ssl.create_default_context(cafile=cafile)
    with socket.create_connection((host, 443)) as s:
        with ctx.wrap_socket(s, server_hostname=host):
            pass
def with_requests():
    import requests
    requests.get("https://" + host + "/", verify=cafile, timeout=10)
def with_httpx():
    import httpx
    httpx.get("https://" + host + "/", verify=cafile, timeout=10)
try:
    {"ssl": plain, "requests": with_requests, "httpx": with_httpx}[client]()
    print("ok")
except Exception as e:
    print(type(e).__name__ + ": " + str(e))
`;

type PythonClient = "ssl" | "requests" | "httpx";

/** The python3 to use: the one on PATH, or Debian's when only that one has requests and httpx. */
async function pickPython(): Promise<{ bin: string; has: Record<PythonClient, boolean> }> {
  const can = async (bin: string, module: string) => (await run(bin, ["-c", `import ${module}`])).code === 0;
  for (const bin of ["python3", "/usr/bin/python3"]) {
    if (await can(bin, "requests, httpx")) return { bin, has: { ssl: true, requests: true, httpx: true } };
  }
  return { bin: "python3", has: { ssl: true, requests: await can("python3", "requests"), httpx: false } };
}

// Picked when the file is collected, so a missing library shows as a skipped test, not a pass.
const py = await pickPython();

async function python(client: PythonClient, caFile: string, host: string, port: number): Promise<string> {
  const res = await run(py.bin, ["-c", PYTHON, client, caFile, host, String(port)]);
  expect(res.code, res.stderr).toBe(0);
  return res.stdout.trim();
}

describe("short-lived leaves, renewed without dropping connections (case N5)", () => {
  let upstream: Upstream;
  let proxy: RunningProxy;
  const LIFETIME_MS = 4_000;

  beforeAll(async () => {
    const testCa = await createTestCa();
    upstream = await startTlsUpstream({ ca: testCa, hosts: ["api.test"] });
    proxy = await startProxy({
      vault: vault({}),
      routes: { "api.test": upstream },
      upstreamCa: testCa,
      ca: await createRunCa({ runId: "run_leaves", leafLifetimeMs: LIFETIME_MS }),
      // The first connection idles past its leaf's end while the test waits: keep it open.
      limits: { keepAliveTimeoutMs: 60_000 },
    });
  });

  afterAll(async () => {
    await proxy?.close();
    await upstream?.close();
  });

  it("renews a leaf past half its life for new handshakes; an open connection goes on", async () => {
    // case N5
    const get = (agent: Agent) =>
      new Promise<{ status: number; socket: TLSSocket }>((resolve, reject) => {
        const req = request(
          {
            host: "127.0.0.1",
            port: proxy.tlsPort,
            servername: "api.test",
            headers: { host: "api.test" },
            path: "/",
            agent,
          },
          (res) => {
            // Taken now: once the body is read, a kept-alive socket goes back to the agent.
            const socket = res.socket as TLSSocket;
            res.resume();
            res.on("end", () => resolve({ status: res.statusCode ?? 0, socket }));
          },
        );
        req.on("error", reject);
        req.end();
      });
    const held = new Agent({ keepAlive: true, maxSockets: 1, ca: proxy.caPem });
    const fresh = new Agent({ keepAlive: false, ca: proxy.caPem });
    try {
      const started = Date.now();
      const first = await get(held);
      expect(first.status).toBe(200);
      const oldLeaf = first.socket.getPeerCertificate();
      expect(Date.parse(oldLeaf.valid_to) - Date.now()).toBeLessThanOrEqual(LIFETIME_MS);
      // Within half its life the cached leaf is the one presented (checked only when this machine
      // was quick enough to stay within it: nothing here asserts time).
      const early = await nodeHandshake(proxy.tlsPort, "api.test", proxy.caPem);
      if (Date.now() - started < LIFETIME_MS / 2) {
        expect(early.ok && early.cert.serialNumber).toBe(oldLeaf.serialNumber);
      }
      // The point is time passing: wait until the first leaf has expired (second precision).
      await until(
        "the first leaf to expire",
        () => Date.now() > Date.parse(oldLeaf.valid_to) + 1_000,
        10_000,
      );
      const renewed = await get(fresh);
      expect(renewed.status).toBe(200);
      const newLeaf = renewed.socket.getPeerCertificate();
      expect(newLeaf.serialNumber).not.toBe(oldLeaf.serialNumber);
      // The leaf key is replaced with the leaves: a leaked one ends with the leaves it is in.
      expect(newLeaf.pubkey?.toString("hex")).not.toBe(oldLeaf.pubkey?.toString("hex"));
      expect(newLeaf.pubkey?.length).toBeGreaterThan(0);
      expect(Date.parse(newLeaf.valid_to)).toBeGreaterThan(Date.now());
      // The connection made with the old, now expired, leaf still carries requests.
      const again = await get(held);
      expect(again.status).toBe(200);
      expect(again.socket).toBe(first.socket);
      expect(again.socket.getPeerCertificate().serialNumber).toBe(oldLeaf.serialNumber);
      expect(upstream.seen.length).toBeGreaterThanOrEqual(3);
    } finally {
      held.destroy();
      fresh.destroy();
    }
  });
});

describe("the run CA is name-constrained under default routing (case N5)", () => {
  const RUN = "run_n5";
  const cp = new FakeControlPlane(RUN, vault({}));
  let api: Upstream;
  let proxy: Awaited<ReturnType<typeof runProxy>>;
  let dir: string;
  let caFile: string;
  // The same run CA signing for any name, as a stolen key would: a server presenting its leaves.
  let anyName: Server;
  let anyNamePort: number;
  const logs: string[] = [];
  const realWrite = process.stdout.write.bind(process.stdout);

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), "bw-leaves-test-"));
    const testCa = await createTestCa();
    writeFileSync(join(dir, "upstream-ca.pem"), testCa.certPem);
    api = await startTlsUpstream({ ca: testCa, hosts: ["api.test"] });
    // Default routing: a rule host and an exact block, both in the hosts file.
    cp.vault = vault({
      version: 7,
      hosts: [{ pattern: "evil.test", action: "block" }],
      rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "raw", name: "x-api-key" } }],
    });
    cp.secrets = { API_KEY: "sk-n5-canary" };
    await cp.start();
    process.stdout.write = ((chunk: string | Uint8Array, ...rest: unknown[]) => {
      logs.push(String(chunk));
      return (realWrite as (c: string | Uint8Array, ...r: unknown[]) => boolean)(chunk, ...rest);
    }) as typeof process.stdout.write;
    proxy = await runProxy(
      {
        ...cp.proxyEnv(join(dir, "spool")),
        BW_POLICY_INTERVAL_MS: "200",
        BW_TEST_EXTRA_CA_FILE: join(dir, "upstream-ca.pem"),
        BW_TEST_ROUTES: `api.test=${api.address}:${api.port}`,
        BW_TEST_ALLOW_CIDRS: "127.0.0.2/32",
      },
      [],
    );
    caFile = join(dir, "run-ca.pem");
    writeFileSync(caFile, proxy.ca.certPem);
    const ca = proxy.ca;
    anyName = createHttpsServer(
      { SNICallback: (name, cb) => void ca.contextFor(name).then((c) => cb(null, c), cb) },
      (_req, res) => res.end("signed by the run CA"),
    );
    await new Promise<void>((r) => anyName.listen(0, "127.0.0.1", r));
    anyNamePort = (anyName.address() as AddressInfo).port;
  });

  afterAll(async () => {
    process.stdout.write = realWrite;
    anyName?.close();
    await proxy?.shutdown();
    await api?.close();
    await cp.close();
    rmSync(dir, { recursive: true, force: true });
  });

  it("presents leaves that expire within hours, not with the CA's days", async () => {
    // case N5
    const hs = await nodeHandshake(proxy.listeners.tls, "api.test", proxy.ca.certPem);
    if (!hs.ok) throw new Error(hs.error);
    const notAfter = Date.parse(hs.cert.valid_to);
    const notBefore = Date.parse(hs.cert.valid_from);
    expect(notAfter - Date.now()).toBeLessThanOrEqual(6 * HOUR);
    expect(notAfter - Date.now()).toBeGreaterThan(5 * HOUR);
    // A little in the past, for a sandbox whose clock is slightly behind.
    expect(Date.now() - notBefore).toBeGreaterThan(0);
    expect(Date.now() - notBefore).toBeLessThan(HOUR);
    // The CA itself still spans the run.
    expect(Date.parse(new X509Certificate(proxy.ca.certPem).validTo) - Date.now()).toBeGreaterThan(
      2 * 24 * HOUR,
    );
  });

  it("permits exactly the hosts file's names and the platform's, with pathlen 0, critical", async () => {
    // case N5
    expect(proxy.ca.permittedNames).toEqual(["api.test", "evil.test", ...PLATFORM_HOSTS].sort());
    expect(cp.ready?.caCertPem).toBe(proxy.ca.certPem);
    const text = await run("openssl", ["x509", "-noout", "-text", "-in", caFile]);
    expect(text.stdout).toMatch(/X509v3 Basic Constraints: critical\s+CA:TRUE, pathlen:0/);
    const constraints = text.stdout
      .split("X509v3 Name Constraints: critical")[1]
      ?.split("Signature Algorithm")[0];
    expect(constraints?.match(/DNS:\S+/g)?.sort()).toEqual(
      ["api.test", "evil.test", ...PLATFORM_HOSTS].map((h) => `DNS:${h}`).sort(),
    );
    expect(constraints).toMatch(
      /Excluded:\s+IP:0\.0\.0\.0\/0\.0\.0\.0\s+IP:0:0:0:0:0:0:0:0\/0:0:0:0:0:0:0:0\s*$/,
    );
  });

  it("a permitted name verifies with every client, through the proxy", async () => {
    // case N5
    const port = proxy.listeners.tls;
    expect((await nodeHandshake(port, "api.test", proxy.ca.certPem)).ok).toBe(true);
    const ossl = await opensslClient(port, "api.test", caFile);
    expect(ossl.code, ossl.stderr).toBe(0);
    const verified = await run("openssl", ["verify", "-CAfile", caFile], await leafPem(port, "api.test"));
    expect(verified.stdout).toContain("OK");
    const viaCurl = await curl([...tlsArgs({ caFile, tlsPort: port }, "api.test"), "https://api.test/v1"]);
    expect(viaCurl.status).toBe(200);
    expect(api.seen.at(-1)?.headers["x-api-key"]).toBe("sk-n5-canary");
    // The blocked name's readable 403 and the wiring probe still get their certificates.
    expect(
      (await curl([...tlsArgs({ caFile, tlsPort: port }, "evil.test"), "https://evil.test/"])).status,
    ).toBe(403);
    const probe = await curl([
      "-i",
      ...tlsArgs({ caFile, tlsPort: port }, WIRING_PROBE_HOST),
      `https://${WIRING_PROBE_HOST}/`,
    ]);
    expect(probe.body.toLowerCase()).toContain(`${PROBE_HEADER}: refused`);
  });

  it("a leaf the same CA signs for another name is refused by Node, openssl, curl and Python", async () => {
    // case N5
    const port = anyNamePort;
    // The same server and CA serve a permitted name fine: only the name differs.
    expect((await nodeHandshake(port, "api.test", proxy.ca.certPem)).ok).toBe(true);
    const outside = "outside.test";
    const node = await nodeHandshake(port, outside, proxy.ca.certPem);
    expect(node.ok).toBe(false);
    expect(!node.ok && node.error).toContain("permitted subtree violation");
    const ossl = await opensslClient(port, outside, caFile);
    expect(ossl.code).not.toBe(0);
    expect(`${ossl.stdout}${ossl.stderr}`).toContain("permitted subtree violation");
    const verified = await run("openssl", ["verify", "-CAfile", caFile], await leafPem(port, outside));
    expect(verified.code).not.toBe(0);
    expect(`${verified.stdout}${verified.stderr}`).toContain("permitted subtree violation");
    const viaCurl = await curl([
      "--cacert",
      caFile,
      "--connect-to",
      `${outside}:443:127.0.0.1:${port}`,
      `https://${outside}/`,
    ]);
    expect(viaCurl.code).toBe(60); // CURLE_PEER_FAILED_VERIFICATION
    expect(viaCurl.stderr).toContain("permitted subtree violation");
  });

  for (const client of ["ssl", "requests", "httpx"] as const) {
    it.skipIf(!py.has[client])(
      `Python ${client}: the permitted name verifies, another name is refused`,
      async () => {
        // case N5
        expect(await python(client, caFile, "api.test", proxy.listeners.tls)).toBe("ok");
        expect(await python(client, caFile, "api.test", anyNamePort)).toBe("ok");
        expect(await python(client, caFile, "outside.test", anyNamePort)).toContain(
          "permitted subtree violation",
        );
      },
    );
  }

  it("a leaf the same CA signs for an IP address is refused: every address is excluded", async () => {
    // case N5
    // The proxy's own way of serving a context (no SNI for an address to pick one by).
    const context = await proxy.ca.contextFor("127.0.0.1");
    const server = createNetServer((raw) => {
      const tls = new TLSSocket(raw, { isServer: true, secureContext: context });
      tls.on("error", () => tls.destroy());
      tls.on("secure", () => tls.end("HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"));
    });
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
    try {
      const port = (server.address() as AddressInfo).port;
      // No SNI for an address: the server's one certificate, whose SAN is that address.
      const node = await new Promise<string>((resolve) => {
        const socket = connect({ host: "127.0.0.1", port, ca: proxy.ca.certPem });
        socket.once("secureConnect", () => {
          socket.destroy();
          resolve("ok");
        });
        socket.once("error", (e: Error) => resolve(e.message));
      });
      expect(node).toBe("excluded subtree violation");
      const viaCurl = await curl(["--cacert", caFile, `https://127.0.0.1:${port}/`]);
      expect(viaCurl.code).toBe(60);
      expect(viaCurl.stderr).toContain("excluded subtree violation");
    } finally {
      server.close();
    }
  });

  it("a name the policy gains mid-run is refused at the handshake; the proxy serves on", async () => {
    // case N5
    cp.vault = {
      ...cp.vault,
      version: 8,
      hosts: [...cp.vault.hosts, { pattern: "late.test", action: "block" }],
    };
    await until("policy 8", () => {
      const s = proxy.policy.current();
      return s.kind === "ready" && s.policy.version === 8;
    });
    const state = proxy.policy.current();
    expect(state.kind === "ready" && state.policy.hostsFile).toContain("late.test");
    const refused = await curl([
      ...tlsArgs({ caFile, tlsPort: proxy.listeners.tls }, "late.test"),
      "https://late.test/",
    ]);
    expect(refused.status).toBe(0);
    expect(refused.code).toBe(35); // CURLE_SSL_CONNECT_ERROR: no certificate was presented
    await until("the tls_error line", () =>
      logs.some((l) => l.includes('"code":"outside_run_ca_names"') && l.includes('"host":"late.test"')),
    );
    const ok = await curl([
      ...tlsArgs({ caFile, tlsPort: proxy.listeners.tls }, "api.test"),
      "https://api.test/",
    ]);
    expect(ok.status).toBe(200);
  });
});

describe("which names the CA is constrained to (case N5)", () => {
  const ready = (v: Parameters<typeof compilePolicy>[0]) => {
    const policy = compilePolicy(v);
    return { kind: "ready" as const, policy, secrets: {}, index: buildPolicyIndex(policy) };
  };

  it("none under catch-all or without a policy: a readable 403 for any name needs a certificate for it", async () => {
    // case N5
    expect(terminableNames(ready(vault({ default: "block" })))).toBeNull();
    expect(terminableNames({ kind: "none" })).toBeNull();
    expect(terminableNames({ kind: "invalid", reason: "x" })).toBeNull();
    const ca: RunCa = await createRunCa({ runId: "run_catch_all", permittedNames: null });
    expect(ca.permits("anything.example")).toBe(true);
    const dir = mkdtempSync(join(tmpdir(), "bw-leaves-ca-"));
    try {
      writeFileSync(join(dir, "ca.pem"), ca.certPem);
      const text = await run("openssl", ["x509", "-noout", "-text", "-in", join(dir, "ca.pem")]);
      expect(text.stdout).not.toContain("Name Constraints");
      expect(text.stdout).toMatch(/pathlen:0/);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it("under default routing: the hosts file's names (not a merely allowed host) and the platform's", () => {
    // case N5
    const state = ready(
      vault({
        hosts: [
          { pattern: "blocked.test", action: "block" },
          { pattern: "free.test", action: "allow" },
        ],
        rules: [{ host: "api.test", secret: "K", inject: { scheme: "bearer", name: "authorization" } }],
      }),
    );
    expect(state.policy.routing.mode).toBe("default");
    expect(terminableNames(state)).toEqual([...state.policy.hostsFile, ...PLATFORM_HOSTS].sort());
    expect(terminableNames(state)).toEqual(["api.test", "blocked.test", ...PLATFORM_HOSTS].sort());
  });
});
