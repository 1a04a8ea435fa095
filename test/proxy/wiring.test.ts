import { execFile } from "node:child_process";
import { createHash, X509Certificate } from "node:crypto";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { type AddressInfo, createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { MODEL_LANE_HOST, PROBE_HEADER, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import { type WiringInput, WiringProof } from "@benchwright/shared/contract/wiring";
import { renderHostsFile, withCertificate } from "@benchwright/shared/policy/hosts-file";
import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { createRunCa } from "../../proxy-image/src/proxy/ca";
import { wire } from "../../proxy-image/src/wiring/wiring";
import {
  createTestCa,
  type RunningProxy,
  startProxy,
  startTlsUpstream,
  type TestCa,
  type Upstream,
  vault,
} from "./harness";

// The wiring program against temp files standing in for the sandbox's /etc/hosts, CA bundle and
// /run/benchwright, and the real proxy on loopback standing in for the redirect's far end.

const PROBE = WIRING_PROBE_HOST;
const PROGRAM = "proxy-image/src/wiring/main.ts";
const HOSTS_BEFORE = [
  "127.0.0.1\tlocalhost",
  "::1\tlocalhost ip6-localhost ip6-loopback",
  "# a comment the wiring keeps",
  "10.9.9.9 api.test other.test # a stale mapping that would win over the redirect",
  "",
].join("\n");

let proxy: RunningProxy;
let otherCa: TestCa;
/** The bundle's content before wiring: one unrelated root. */
let roots: string;
let dir: string;
let paths: { caDir: string; caBundlePath: string; hostsPath: string };

beforeAll(async () => {
  otherCa = await createTestCa("Some system root");
  roots = `${otherCa.certPem}\n`;
  proxy = await startProxy({
    vault: vault({
      default: "allow",
      hosts: [{ pattern: "evil.test", action: "block" }],
      rules: [{ host: "api.test", secret: "API_KEY", inject: { scheme: "bearer", name: "authorization" } }],
    }),
    secrets: { API_KEY: "sk-canary-wiring-3c4d" },
  });
});
afterAll(async () => {
  await proxy.close();
});

beforeEach(() => {
  dir = mkdtempSync(join(tmpdir(), "bw-wiring-test-"));
  paths = {
    caDir: join(dir, "run", "benchwright"),
    caBundlePath: join(dir, "ca-certificates.crt"),
    hostsPath: join(dir, "hosts"),
  };
  writeFileSync(paths.hostsPath, HOSTS_BEFORE);
  writeFileSync(paths.caBundlePath, roots);
});
afterEach(() => {
  rmSync(dir, { recursive: true, force: true });
  // The probe is the platform's own: never an audit row, never an upstream dial.
  expect(proxy.audit.blocked).toEqual([]);
  expect(proxy.audit.routes).toEqual([]);
  expect(proxy.dials).toEqual([]);
});

function input(over: Partial<WiringInput> = {}): WiringInput {
  return {
    mode: "default",
    caCertPem: proxy.caPem,
    proxyAddress: "127.0.0.1",
    hostsFile: ["api.test", "evil.test"],
    probe: { directTarget: null },
    ...paths,
    probePort: proxy.tlsPort,
    probeResolver: "hosts-file",
    ...over,
  };
}

const fingerprint = (pem: string) => createHash("sha256").update(new X509Certificate(pem).raw).digest("hex");
/** A PEM as a file holds it: ending in a newline. */
const asFile = (pem: string) => (pem.endsWith("\n") ? pem : `${pem}\n`);
const count = (haystack: string, needle: string) => haystack.split(needle).length - 1;

/** A loopback port nothing listens on (bound, then closed). */
async function closedPort(): Promise<number> {
  const s = createServer();
  await new Promise<void>((r) => s.listen(0, "127.0.0.1", () => r()));
  const { port } = s.address() as AddressInfo;
  await new Promise<void>((r) => s.close(() => r()));
  return port;
}

describe("default routing", () => {
  it("trusts the run CA, points the vault's hosts and the probe host at the proxy, and proves it", async () => {
    const result = await wire(input());
    expect(result.error).toBeNull();
    expect(result.code).toBe(0);
    const proof = WiringProof.parse(result.proof);
    expect(proof).toMatchObject({ ok: true, mode: "default", caFingerprint256: fingerprint(proxy.caPem) });
    expect(proof.hostsEntries).toEqual([
      "127.0.0.1 api.test",
      "127.0.0.1 evil.test",
      `127.0.0.1 ${PROBE}`,
      `127.0.0.1 ${MODEL_LANE_HOST}`,
    ]);
    expect(proof.probes).toHaveLength(1);
    expect(proof.probes[0]).toMatchObject({ name: "tls_probe", ok: true });
    expect(proof.probes[0]?.observed).toContain(`403 with ${PROBE_HEADER}: refused, chain root the run CA`);
    expect(proof.env).toEqual({
      NODE_EXTRA_CA_CERTS: join(paths.caDir, "run-ca.pem"),
      REQUESTS_CA_BUNDLE: paths.caBundlePath,
      SSL_CERT_FILE: paths.caBundlePath,
      CURL_CA_BUNDLE: paths.caBundlePath,
    });

    expect(readFileSync(join(paths.caDir, "run-ca.pem"), "utf8")).toBe(asFile(proxy.caPem));
    // The bundle keeps its roots and gains the run CA.
    expect(readFileSync(paths.caBundlePath, "utf8")).toBe(`${roots}${asFile(proxy.caPem)}`);

    const hosts = readFileSync(paths.hostsPath, "utf8").split("\n");
    expect(hosts.slice(0, 4)).toEqual([
      "127.0.0.1\tlocalhost",
      "::1\tlocalhost ip6-localhost ip6-loopback",
      "# a comment the wiring keeps",
      // The stale line loses the name the redirect owns (the first line naming a host wins).
      "10.9.9.9\tother.test",
    ]);
    expect(hosts.filter((l) => /^[^#]/.test(l) && /\bapi\.test\b/.test(l))).toEqual(["127.0.0.1 api.test"]);
    expect(hosts).toContain(`127.0.0.1 ${PROBE}`);

    const decision = proxy.logs.at(-1) as { reason: string; host: string; status: number };
    expect(decision).toMatchObject({ reason: "wiring probe", host: PROBE, status: 403 });
  });

  it("is idempotent: a second run leaves one CA copy and one line per host", async () => {
    expect((await wire(input())).code).toBe(0);
    const files = () => [paths.caBundlePath, paths.hostsPath].map((p) => readFileSync(p, "utf8"));
    const first = files();
    expect((await wire(input())).code).toBe(0);
    expect(files()).toEqual(first);
    const [bundle, hosts] = first as [string, string];
    expect(count(bundle, proxy.caPem.trim())).toBe(1);
    for (const host of ["api.test", "evil.test", PROBE]) expect(count(hosts, ` ${host}\n`)).toBe(1);
  });

  it("recognises the CA already in the bundle however it is wrapped", async () => {
    const body = proxy.caPem.replace(/-----[A-Z ]+-----/g, "").replace(/\s+/g, "");
    const rewrapped = `-----BEGIN CERTIFICATE-----\r\n${body.replace(/.{76}/g, "$&\r\n")}\r\n-----END CERTIFICATE-----\r\n`;
    writeFileSync(paths.caBundlePath, `${roots}${rewrapped}`);
    expect((await wire(input())).code).toBe(0);
    expect(readFileSync(paths.caBundlePath, "utf8")).toBe(`${roots}${rewrapped}`);
  });

  it("appends the CA on a line of its own when the bundle does not end with a newline", async () => {
    writeFileSync(paths.caBundlePath, otherCa.certPem.trimEnd());
    expect((await wire(input())).code).toBe(0);
    expect(readFileSync(paths.caBundlePath, "utf8")).toBe(`${roots}${asFile(proxy.caPem)}`);
  });

  it("switching to catch-all rewrites the block down to the probe line", async () => {
    expect((await wire(input())).code).toBe(0);
    const result = await wire(input({ mode: "catch-all", hostsFile: [] }));
    expect(result.code).toBe(0);
    const hosts = readFileSync(paths.hostsPath, "utf8");
    expect(hosts).not.toContain("127.0.0.1 api.test");
    expect(count(hosts, `127.0.0.1 ${PROBE}\n`)).toBe(1);
  });
});

describe("installed from outside (installed: true, after a setup stage)", () => {
  /** What the local agent's seal writes, with the same module the wiring writes with. */
  function installFromOutside(hostsFile = ["api.test", "evil.test"]) {
    mkdirSync(paths.caDir, { recursive: true });
    writeFileSync(join(paths.caDir, "run-ca.pem"), asFile(proxy.caPem));
    writeFileSync(paths.caBundlePath, withCertificate(roots, proxy.caPem));
    writeFileSync(paths.hostsPath, renderHostsFile(HOSTS_BEFORE, "default", "127.0.0.1", hostsFile));
  }
  const files = () =>
    [join(paths.caDir, "run-ca.pem"), paths.caBundlePath, paths.hostsPath].map((p) => {
      try {
        return [readFileSync(p, "utf8"), statSync(p).mtimeMs];
      } catch {
        return null;
      }
    });

  it("the agent's rendering is byte for byte what the wiring writes", async () => {
    expect((await wire(input())).code).toBe(0);
    const written = [paths.caBundlePath, paths.hostsPath].map((p) => readFileSync(p, "utf8"));
    installFromOutside();
    expect([paths.caBundlePath, paths.hostsPath].map((p) => readFileSync(p, "utf8"))).toEqual(written);
  });

  it("writes nothing, checks the files and proves them", async () => {
    installFromOutside();
    const before = files();
    const result = await wire(input({ installed: true }));
    expect(result.code).toBe(0);
    expect(result.proof?.probes.map((p) => [p.name, p.ok])).toEqual([["tls_probe", true]]);
    expect(files()).toEqual(before);
  });

  it("fails on each file that is not what it must be, naming it, and probes nothing", async () => {
    const cases: Array<[string, () => void, RegExp]> = [
      ["no run CA file", () => rmSync(join(paths.caDir, "run-ca.pem")), /cannot read .*run-ca\.pem: ENOENT/],
      [
        "another CA in the run CA's file",
        () => writeFileSync(join(paths.caDir, "run-ca.pem"), otherCa.certPem),
        /run-ca\.pem is not the run CA/,
      ],
      [
        "a bundle without the run CA",
        () => writeFileSync(paths.caBundlePath, roots),
        /does not hold the run CA/,
      ],
      [
        "a hosts file missing a vault host",
        () =>
          writeFileSync(paths.hostsPath, renderHostsFile(HOSTS_BEFORE, "default", "127.0.0.1", ["api.test"])),
        /does not send evil\.test to 127\.0\.0\.1/,
      ],
    ];
    for (const [name, breakIt, observed] of cases) {
      installFromOutside();
      breakIt();
      const before = files();
      const result = await wire(input({ installed: true }));
      expect(result.code, name).toBe(1);
      expect(result.proof?.probes, name).toEqual([
        expect.objectContaining({ name: "install", ok: false, observed: expect.stringMatching(observed) }),
      ]);
      expect(files(), name).toEqual(before);
    }
  });
});

describe("catch-all routing", () => {
  it("writes only the probe host's line, and proves the redirect and the trust", async () => {
    const result = await wire(input({ mode: "catch-all", hostsFile: [] }));
    expect(result.code).toBe(0);
    // The platform's own names only: the probe and the model lane.
    expect(result.proof?.hostsEntries).toEqual([`127.0.0.1 ${PROBE}`, `127.0.0.1 ${MODEL_LANE_HOST}`]);
    expect(result.proof?.probes.map((p) => p.name)).toEqual(["tls_probe"]);
    expect(readFileSync(paths.hostsPath, "utf8")).not.toMatch(/^127\.0\.0\.1 api\.test$/m);
  });

  it("a direct target that refuses the connection is proof that direct egress is closed", async () => {
    const port = await closedPort();
    const result = await wire(
      input({ mode: "catch-all", hostsFile: [], probe: { directTarget: `127.0.0.1:${port}` } }),
    );
    expect(result.code).toBe(0);
    expect(result.proof?.ok).toBe(true);
    expect(result.proof?.probes[1]).toMatchObject({ name: "direct_egress", ok: true });
    expect(result.proof?.probes[1]?.observed).toContain("ECONNREFUSED");
  });

  it("a direct target that accepts the connection fails the wiring (exit 1)", async () => {
    const open: Server = createServer((s) => s.destroy());
    await new Promise<void>((r) => open.listen(0, "127.0.0.1", () => r()));
    try {
      const target = `127.0.0.1:${(open.address() as AddressInfo).port}`;
      const result = await wire(input({ mode: "catch-all", hostsFile: [], probe: { directTarget: target } }));
      expect(result.code).toBe(1);
      expect(result.proof?.ok).toBe(false);
      expect(result.proof?.probes).toMatchObject([
        { name: "tls_probe", ok: true },
        { name: "direct_egress", ok: false, observed: "connected: direct egress is open" },
      ]);
    } finally {
      await new Promise<void>((r) => open.close(() => r()));
    }
  });
});

describe("the probe fails closed", () => {
  it("when the proxy presents another run's CA", async () => {
    const stranger = await createRunCa({ runId: "run_other" });
    const result = await wire(input({ caCertPem: stranger.certPem }));
    expect(result.code).toBe(1);
    expect(result.proof?.probes[0]?.ok).toBe(false);
    expect(result.proof?.probes[0]?.observed).toMatch(/certificate|verify/i);
  });

  it("when something other than the proxy answers like it, under a root the bundle trusts", async () => {
    // A server with a valid certificate for the probe host from a trusted root, forging the
    // proxy's answer: the chain does not end at the run CA, so it proves nothing.
    const impostor: Upstream = await startTlsUpstream({
      ca: otherCa,
      hosts: [PROBE],
      handler: (_req, res) => {
        res.writeHead(403, { [PROBE_HEADER]: "refused" });
        res.end();
      },
    });
    try {
      const result = await wire(input({ proxyAddress: impostor.address, probePort: impostor.port }));
      expect(result.code).toBe(1);
      expect(result.proof?.probes[0]?.observed).toContain(
        `403 with ${PROBE_HEADER}: refused, chain root another CA`,
      );
    } finally {
      await impostor.close();
    }
  });

  it("when nothing answers at the redirect's address", async () => {
    const result = await wire(input({ proxyAddress: "127.0.0.1", probePort: await closedPort() }));
    expect(result.code).toBe(1);
    expect(result.proof?.probes[0]?.observed).toContain("ECONNREFUSED");
  });

  it("when the probe host resolves elsewhere than the proxy under default routing", async () => {
    const result = await wire(input({ probeResolver: "system" }));
    // The system resolver does not read the test's hosts file: the .invalid name never resolves.
    expect(result.code).toBe(1);
    expect(result.proof?.probes[0]?.observed).toMatch(`${PROBE} does not resolve`);
  });

  it("when the files cannot be written (reported as the install step)", async () => {
    const result = await wire(input({ caDir: join(paths.hostsPath, "sub") }));
    expect(result.code).toBe(1);
    expect(result.proof?.probes).toEqual([
      {
        name: "install",
        expected: "the run CA and the hosts entries written",
        observed: "could not write the CA file: ENOTDIR",
        ok: false,
      },
    ]);
  });
});

describe("bad input", () => {
  const cases: Array<[string, Record<string, unknown>, string]> = [
    [
      "a proxy address that is not IPv4",
      { proxyAddress: "proxy.local" },
      "proxyAddress: must be an IPv4 address",
    ],
    [
      "a host that would add a line to the hosts file",
      { hostsFile: ["api.test\n6.6.6.6 bank.test"] },
      "hostsFile.0:",
    ],
    ["a wildcard in the hosts file", { hostsFile: ["*.example.com"] }, "hostsFile.0:"],
    ["hosts under catch-all", { mode: "catch-all" }, "hostsFile: must be empty under catch-all"],
    [
      "a direct target under default routing",
      { probe: { directTarget: "127.0.0.1:9" } },
      "probe.directTarget:",
    ],
    [
      "a direct target on 443",
      { mode: "catch-all", hostsFile: [], probe: { directTarget: "1.2.3.4:443" } },
      "probe.directTarget: ports 80 and 443 go to the proxy",
    ],
    ["an unknown mode", { mode: "none" }, "mode:"],
    ["an unknown field", { extra: 1 }, "(root): Unrecognized key"],
    ["a relative path", { hostsPath: "etc/hosts" }, "hostsPath: must be an absolute path"],
    ["a path climbing out", { caDir: "/run/../etc" }, "caDir: must not contain .. segments"],
    ["a caCertPem that is no PEM", { caCertPem: "hello" }, "caCertPem: one PEM certificate"],
    [
      "a caCertPem whose PEM is no certificate",
      { caCertPem: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n" },
      "caCertPem: not a certificate",
    ],
  ];

  it.each(cases)("%s: exit 2 naming the field, nothing written", async (_name, over, message) => {
    const result = await wire({ ...input(), ...over });
    expect(result.code).toBe(2);
    expect(result.proof).toBeNull();
    expect(result.error).toContain(message);
    expect(readFileSync(paths.hostsPath, "utf8")).toBe(HOSTS_BEFORE);
    expect(readFileSync(paths.caBundlePath, "utf8")).toBe(roots);
  });

  it("a leaf certificate is not a CA to trust", async () => {
    const leaf = await otherCa.issue(["leaf.test"]);
    const result = await wire(input({ caCertPem: leaf.certPem.trim() }));
    expect(result.code).toBe(2);
    expect(result.error).toBe("bad wiring input: caCertPem: not a CA certificate");
  });
});

describe("the program (stdin → stdout, exit code)", () => {
  function run(
    stdin: string,
    argv = ["npx", "tsx", PROGRAM],
  ): Promise<{ code: number; stdout: string; stderr: string }> {
    return new Promise((resolve) => {
      const child = execFile(
        argv[0] as string,
        argv.slice(1),
        { env: { PATH: process.env.PATH ?? "" } },
        (err, stdout, stderr) =>
          resolve({ code: err ? ((err as { code?: number }).code ?? 1) : 0, stdout, stderr }),
      );
      child.stdin?.end(stdin);
    });
  }

  it("prints exactly one WiringProof line and exits 0 when wired", async () => {
    const out = await run(JSON.stringify(input()));
    expect(out.stderr).toBe("");
    expect(out.code).toBe(0);
    const lines = out.stdout.split("\n").filter(Boolean);
    expect(lines).toHaveLength(1);
    expect(WiringProof.parse(JSON.parse(lines[0] as string)).ok).toBe(true);
  });

  it("exits 2 on bad input with a message naming the field and nothing on stdout", async () => {
    const out = await run(JSON.stringify({ ...input(), proxyAddress: "999.1.1.1" }));
    expect(out.code).toBe(2);
    expect(out.stdout).toBe("");
    expect(out.stderr).toBe("bad wiring input: proxyAddress: must be an IPv4 address\n");
  });

  // As in a sandbox: /etc/hosts and the system bundle are files bind-mounted over /etc (here in a
  // mount namespace of the test's own), written in place, and the probe host is resolved by the
  // system resolver (getaddrinfo), the way every client in the sandbox will resolve names.
  it.skipIf(process.getuid?.() !== 0)(
    "wires the real /etc/hosts and CA bundle paths, bind-mounted, resolved by the system resolver",
    async () => {
      const realHosts = readFileSync("/etc/hosts", "utf8");
      const systemBundle = "/etc/ssl/certs/ca-certificates.crt";
      const realBundle = readFileSync(systemBundle, "utf8");
      writeFileSync(paths.caBundlePath, realBundle);
      const { hostsPath: _h, caBundlePath: _b, ...rest } = input({ probeResolver: "system" });
      const out = await run(JSON.stringify(rest), [
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-ec",
        `mount --bind "$1" /etc/hosts; mount --bind "$2" ${systemBundle}; exec npx tsx ${PROGRAM}`,
        "sh",
        paths.hostsPath,
        paths.caBundlePath,
      ]);
      // Whatever happened inside, the machine's own files are untouched.
      expect(readFileSync("/etc/hosts", "utf8")).toBe(realHosts);
      expect(readFileSync(systemBundle, "utf8")).toBe(realBundle);
      expect(out.stderr).toBe("");
      expect(out.code).toBe(0);
      const proof = WiringProof.parse(JSON.parse(out.stdout));
      expect(proof.env.SSL_CERT_FILE).toBe(systemBundle);
      expect(proof.probes[0]?.observed).toContain(`via 127.0.0.1:${proxy.tlsPort}`);
      // The writes went through the bind mounts into the files behind them.
      expect(readFileSync(paths.hostsPath, "utf8")).toContain(`127.0.0.1 ${PROBE}\n`);
      expect(readFileSync(paths.caBundlePath, "utf8")).toBe(`${realBundle}${asFile(proxy.caPem)}`);
    },
  );

  it("exits 2 when stdin is not JSON", async () => {
    const out = await run("{not json");
    expect(out.code).toBe(2);
    expect(out.stderr).toBe("bad wiring input: (stdin): not a JSON object\n");
  });
});
