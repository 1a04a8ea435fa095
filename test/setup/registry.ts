import "reflect-metadata"; // @peculiar/x509 resolves its ASN.1 providers through tsyringe, which needs it
import { type ChildProcess, spawn } from "node:child_process";
import { randomBytes, webcrypto } from "node:crypto";
import { existsSync, mkdtempSync, openSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type Server } from "node:http";
import { createServer as createNetServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import * as x509 from "@peculiar/x509";
import type { TestProject } from "vitest/node";
import { pem } from "../../scripts/lib/test-ca.ts";
import { importSigningKey, mintRegistryToken, type RegistryAccess } from "../../src/images/token.ts";
import type { RealmCall, RealRegistryInfo } from "./registry-info.ts";

// A real OCI registry for the tests: Debian's docker-registry (the CNCF distribution registry,
// 2.8) on loopback, with token auth trusting one throwaway ES256 key, exactly as a deployment's
// registry trusts REGISTRY_SIGNING_KEY. Its `rootcertbundle` is a self-signed certificate over
// that key's public half: distribution takes the keys out of the bundle's certificates and names
// each by its libtrust fingerprint, which is the `kid` the broker's tokens carry
// (src/images/token.ts keyFingerprint). The challenges' realm is a recorder: the broker mints its
// own tokens and never calls a realm, and the tests can prove it. The recorder answers one
// identity of the tests' own (a random password in a 0600 auth file, `authFile`), so that skopeo
// gets its tokens the way any registry client does, with no token on its command line; those
// calls are not recorded.
//
// The worker project starts one per test run (this file's default export, a globalSetup); Node
// tests start their own with startRealRegistry(). Where docker-registry (or skopeo, for the tests
// that push and inspect with it) is not installed, the tests skip with a message naming the apt
// packages; under CI, where .ci/run installs them, they do not skip.

const SERVICE = "bw-test-registry";
const ISSUER = "benchwright-broker";
const READY_MS = 20_000;
export const APT_PACKAGES = "apt-get install docker-registry skopeo";

const onPath = (name: string) =>
  (process.env.PATH ?? "/usr/bin").split(":").some((dir) => existsSync(join(dir, name)));

/** Why the registry tests cannot run here, or null. `tools`: the programs they need. */
export function registryMissing(tools: readonly string[] = ["docker-registry"]): string | null {
  if (process.platform !== "linux") return "the real registry tests need Linux";
  const absent = tools.filter((t) => !onPath(t));
  if (absent.length === 0) return null;
  return `${absent.join(" and ")} not installed (${APT_PACKAGES})`;
}

export interface RealRegistry {
  info: RealRegistryInfo;
  /** The calls the realm recorder saw (none, if the broker behaves), the tests' own left out. */
  realmCalls(): RealmCall[];
  /**
   * Writes a containers-auth.json (mode 0600) in `dir` holding the tests' own realm identity for
   * this registry, for skopeo's `--authfile`; its path.
   */
  authFile(dir: string): string;
  stop(): Promise<void>;
}

export async function startRealRegistry(): Promise<RealRegistry> {
  const dir = mkdtempSync(join(tmpdir(), "bw-registry-"));
  const storage = join(dir, "storage");
  const key = await signingKey();
  writeFileSync(join(dir, "token-signer.crt"), key.certPem);

  const calls: RealmCall[] = [];
  const testIdentity = `bw-test:${randomBytes(24).toString("base64url")}`;
  const port = await freePort();
  const realm = await startRealm(calls, { identity: testIdentity, signingKey: key.jwk });
  const info: RealRegistryInfo = {
    url: `http://127.0.0.1:${port}`,
    host: `127.0.0.1:${port}`,
    signingKey: key.jwk,
    service: SERVICE,
    issuer: ISSUER,
    realm: `${realm.origin}/token`,
    realmCalls: `${realm.origin}/calls`,
    storage,
  };
  const config = join(dir, "config.yml");
  writeFileSync(config, registryConfig(info, join(dir, "token-signer.crt")));

  const log = join(dir, "registry.log");
  const child = spawn("docker-registry", ["serve", config], {
    stdio: ["ignore", openSync(log, "a"), openSync(log, "a")],
    // Nothing of the test process's environment: distribution reads REGISTRY_* variables as
    // config overrides, and the Worker's own are named the same.
    env: { PATH: process.env.PATH ?? "/usr/bin:/bin" },
  });
  const killOnExit = () => child.kill("SIGKILL");
  process.once("exit", killOnExit);
  const stop = async () => {
    process.off("exit", killOnExit);
    await stopChild(child);
    await new Promise<void>((resolve) => realm.server.close(() => resolve()));
    rmSync(dir, { recursive: true, force: true });
  };
  try {
    await ready(info, child, log);
  } catch (e) {
    await stop();
    throw e;
  }
  const authFile = (into: string) => {
    const path = join(into, `registry-auth-${port}.json`);
    const auths = { [info.host]: { auth: Buffer.from(testIdentity).toString("base64") } };
    writeFileSync(path, JSON.stringify({ auths }), { mode: 0o600 });
    return path;
  };
  return { info, realmCalls: () => [...calls], authFile, stop };
}

/** distribution's config, as the docs (docs/testing.md) show it. */
export function registryConfig(info: RealRegistryInfo, certBundle: string): string {
  return [
    "version: 0.1",
    "log:",
    "  level: info",
    "  accesslog:",
    "    disabled: true",
    "storage:",
    "  filesystem:",
    `    rootdirectory: ${info.storage}`,
    "  delete:",
    "    enabled: true",
    "http:",
    `  addr: ${info.host}`,
    // One instance: the secret only signs its own upload state.
    `  secret: ${Buffer.from(webcrypto.getRandomValues(new Uint8Array(24))).toString("hex")}`,
    "auth:",
    "  token:",
    `    realm: ${info.realm}`,
    `    service: ${info.service}`,
    `    issuer: ${info.issuer}`,
    `    rootcertbundle: ${certBundle}`,
    "",
  ].join("\n");
}

/** A fresh ES256 key: its private JWK (no `kid`) and a self-signed certificate over it. */
async function signingKey(): Promise<{ jwk: string; certPem: string }> {
  const keys = (await webcrypto.subtle.generateKey({ name: "ECDSA", namedCurve: "P-256" }, true, [
    "sign",
    "verify",
  ])) as webcrypto.CryptoKeyPair;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: "01",
    name: "CN=Benchwright test registry token signer",
    notBefore: new Date(now - 3_600_000),
    notAfter: new Date(now + 7 * 86_400_000),
    keys,
    signingAlgorithm: { name: "ECDSA", hash: "SHA-256" },
  });
  const { kty, crv, x, y, d } = await webcrypto.subtle.exportKey("jwk", keys.privateKey);
  return { jwk: JSON.stringify({ kty, crv, x, y, d }), certPem: pem("CERTIFICATE", cert.rawData) };
}

async function startRealm(
  calls: RealmCall[],
  own: { identity: string; signingKey: string },
): Promise<{ server: Server; origin: string }> {
  const signingKey = await importSigningKey(own.signingKey);
  const server = createServer((req, res) => {
    const url = new URL(req.url ?? "/", "http://realm");
    if (url.pathname === "/calls") {
      res.writeHead(200, { "content-type": "application/json" });
      return res.end(JSON.stringify(calls));
    }
    const basic = /^Basic (.+)$/.exec(req.headers.authorization ?? "")?.[1];
    if (url.pathname === "/token" && basic && Buffer.from(basic, "base64").toString() === own.identity) {
      // The tests' own identity (authFile): a token for what it asks, as a token service would.
      const access = url.searchParams.getAll("scope").flatMap((scope): RegistryAccess[] => {
        const [type, name, actions] = scope.split(":");
        return type === "repository" && name && actions
          ? [{ type: "repository", name, actions: actions.split(",") as RegistryAccess["actions"] }]
          : [];
      });
      void mintRegistryToken(signingKey, {
        issuer: ISSUER,
        service: url.searchParams.get("service") ?? SERVICE,
        subject: "registry-tests",
        access,
        ttlSeconds: 120,
      }).then(
        ({ token }) => {
          res.writeHead(200, { "content-type": "application/json" });
          res.end(JSON.stringify({ token, access_token: token, expires_in: 120 }));
        },
        (error: unknown) => {
          res.writeHead(500, { "content-type": "application/json" });
          res.end(JSON.stringify({ error: String(error) }));
        },
      );
      return;
    }
    calls.push({ method: req.method ?? "GET", path: url.pathname, scope: url.searchParams.get("scope") });
    res.writeHead(404, { "content-type": "application/json" });
    res.end('{"error":"no token service here: the broker mints its own"}');
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(0, "127.0.0.1", resolve);
  });
  server.unref();
  const { port } = server.address() as { port: number };
  return { server, origin: `http://127.0.0.1:${port}` };
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createNetServer();
    probe.once("error", reject);
    probe.listen(0, "127.0.0.1", () => {
      const { port } = probe.address() as { port: number };
      probe.close(() => resolve(port));
    });
  });
}

/** Ready when GET /v2/ is 401 with a Bearer challenge naming our service. */
async function ready(info: RealRegistryInfo, child: ChildProcess, log: string): Promise<void> {
  const deadline = Date.now() + READY_MS;
  const tail = () => readFileSync(log, "utf8").trim().split("\n").slice(-15).join("\n");
  while (Date.now() < deadline) {
    if (child.exitCode !== null || child.signalCode !== null) {
      throw new Error(`docker-registry exited (${child.exitCode ?? child.signalCode}):\n${tail()}`);
    }
    try {
      const res = await fetch(`${info.url}/v2/`, { signal: AbortSignal.timeout(2_000) });
      await res.body?.cancel();
      const challenge = res.headers.get("www-authenticate") ?? "";
      if (res.status === 401 && challenge.startsWith("Bearer ") && challenge.includes(`service="${SERVICE}"`))
        return;
      throw new Error(
        `GET /v2/ answered ${res.status} (${challenge}), not a Bearer challenge for ${SERVICE}`,
      );
    } catch (e) {
      if (e instanceof Error && e.message.startsWith("GET /v2/")) throw e;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
  throw new Error(`docker-registry did not answer on ${info.url} within ${READY_MS / 1000} s:\n${tail()}`);
}

function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const force = setTimeout(() => child.kill("SIGKILL"), 5_000);
    child.once("exit", () => {
      clearTimeout(force);
      resolve();
    });
    child.kill("SIGTERM");
  });
}

/** Global setup of the worker project: one registry for the run, provided as `realRegistry`. */
export default async function setup(project: TestProject) {
  const missing = process.env.CI ? null : registryMissing();
  project.provide("realRegistryMissing", missing);
  if (missing) {
    project.provide("realRegistry", null);
    return;
  }
  const registry = await startRealRegistry();
  project.provide("realRegistry", registry.info);
  return () => registry.stop();
}
