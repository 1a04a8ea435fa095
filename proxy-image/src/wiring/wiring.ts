import { X509Certificate } from "node:crypto";
import { lookup } from "node:dns/promises";
import {
  appendFileSync,
  chmodSync,
  existsSync,
  mkdirSync,
  readFileSync,
  renameSync,
  writeFileSync,
} from "node:fs";
import { request } from "node:https";
import { connect } from "node:net";
import { join } from "node:path";
import type { TLSSocket } from "node:tls";
import { describeIssues, PROBE_HEADER, WIRING_PROBE_HOST } from "@benchwright/shared/contract/proxy-wire";
import {
  type ReinstallResult,
  WIRING_EXIT,
  type WiringEnv,
  WiringInput,
  type WiringInputParsed,
  type WiringProbe,
  WiringProof,
  WiringReinstall,
} from "@benchwright/shared/contract/wiring";
import {
  bundleHas,
  hostsEntries as entriesFor,
  filesFirst,
  lookupInHostsText,
  rewriteHosts,
  wiredHosts,
} from "@benchwright/shared/policy/hosts-file";

// The sandbox wiring step. Runs in a work/task sandbox's setup stage (root of the sandbox's own
// user namespace; it cannot change the network, which the host owns): trust the run CA, write
// the hosts-file redirect, then prove both from inside, the way the agent's own clients will
// meet them. With `installed` (after a setup stage, whose root could have changed the files: the
// local agent re-installs them from outside) it runs in the execute stage, writes nothing and
// checks them instead. A run whose proof fails does not start (fail closed), so every probe asks
// for an observable result, never for the absence of an error.

const CA_FILE = "run-ca.pem";
const HTTPS_PROBE_TIMEOUT_MS = 5_000;
const DIRECT_PROBE_TIMEOUT_MS = 2_000;

export interface WiringResult {
  code: (typeof WIRING_EXIT)[keyof typeof WIRING_EXIT];
  /** Null only for bad input. */
  proof: WiringProof | null;
  /** Bad input: what is wrong, naming the field. */
  error: string | null;
}

/** The whole program, from the text on stdin to a result (main prints it and exits with `code`). */
export async function wireFromText(text: string): Promise<WiringResult> {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    return badInput("(stdin): not a JSON object");
  }
  return wire(json);
}

export async function wire(raw: unknown): Promise<WiringResult> {
  const parsed = WiringInput.safeParse(raw);
  if (!parsed.success) return badInput(describeIssues(parsed.error.issues, 5));
  const input = parsed.data;
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(input.caCertPem);
  } catch {
    return badInput("caCertPem: not a certificate");
  }
  if (!cert.ca) return badInput("caCertPem: not a CA certificate");
  const caFingerprint256 = cert.fingerprint256.replaceAll(":", "").toLowerCase();

  const caFile = join(input.caDir, CA_FILE);
  const env: WiringEnv = {
    NODE_EXTRA_CA_CERTS: caFile,
    REQUESTS_CA_BUNDLE: input.caBundlePath,
    SSL_CERT_FILE: input.caBundlePath,
    CURL_CA_BUNDLE: input.caBundlePath,
  };
  const hosts = wiredHosts(input.mode, input.hostsFile);
  const hostsEntries = entriesFor(input.proxyAddress, hosts);

  const done = (probes: WiringProbe[]): WiringResult => {
    const ok = probes.every((p) => p.ok);
    const proof = WiringProof.parse({ ok, mode: input.mode, caFingerprint256, hostsEntries, probes, env });
    return { code: ok ? WIRING_EXIT.ok : WIRING_EXIT.probeFailed, proof, error: null };
  };

  const installed = input.installed
    ? check(input, caFile, hosts)
    : install(input, caFile, hostsEntries, hosts);
  if (installed) return done([installed]);

  const probes = [await tlsProbe(input, caFingerprint256)];
  if (input.mode === "catch-all" && input.probe.directTarget !== null) {
    probes.push(await directProbe(input.probe.directTarget));
  }
  return done(probes);
}

function badInput(message: string): WiringResult {
  return { code: WIRING_EXIT.badInput, proof: null, error: `bad wiring input: ${message}` };
}

/** Writes the CA file, the bundle and the hosts file; a failed probe entry if any step failed. */
function install(
  input: WiringInputParsed,
  caFile: string,
  hostsEntries: string[],
  hosts: string[],
): WiringProbe | null {
  const pem = input.caCertPem.endsWith("\n") ? input.caCertPem : `${input.caCertPem}\n`;
  let step = "the CA file";
  try {
    mkdirSync(input.caDir, { recursive: true, mode: 0o755 });
    // Written aside and renamed: the execute stage never sees a half-written file.
    const tmp = `${caFile}.tmp-${process.pid}`;
    writeFileSync(tmp, pem, { mode: 0o644 });
    chmodSync(tmp, 0o644); // whatever the umask: the execute stage's uid must read it
    renameSync(tmp, caFile);

    // The bundle and the hosts file are bind-mounted over /etc in the sandbox: a rename onto a
    // mount point fails (EBUSY), so both are written in place. Nothing reads them meanwhile.
    step = "the CA bundle";
    const bundle = existsSync(input.caBundlePath) ? readFileSync(input.caBundlePath, "utf8") : "";
    if (!bundleHas(bundle, pem)) {
      appendFileSync(input.caBundlePath, `${bundle === "" || bundle.endsWith("\n") ? "" : "\n"}${pem}`, {
        mode: 0o644,
      });
    }

    step = "the hosts file";
    if (input.hostsInstalled) {
      const missing = hosts.filter((h) => lookupInHostsFile(input.hostsPath, h) !== input.proxyAddress);
      if (missing.length === 0) return null;
      return {
        name: "install",
        expected: "the hosts entries the backend installed",
        observed: `${input.hostsPath} does not send ${missing.join(", ")} to ${input.proxyAddress}`,
        ok: false,
      };
    }
    const before = existsSync(input.hostsPath) ? readFileSync(input.hostsPath, "utf8") : "";
    const after = rewriteHosts(before, hostsEntries, hosts);
    if (after !== before) writeFileSync(input.hostsPath, after, { mode: 0o644 });
    return null;
  } catch (e) {
    const code = (e as { code?: string }).code ?? (e as Error).name;
    return {
      name: "install",
      expected: "the run CA and the hosts entries written",
      observed: `could not write ${step}: ${code}`,
      ok: false,
    };
  }
}

/**
 * `bw-wiring reinstall`: the hosts block, the resolver order and (unless caCertPem is null) the
 * run CA's file and its place in the bundle, written again as install() writes them; no probe
 * (the coordinator proves the wiring afterwards from the execute stage).
 */
export function reinstall(raw: unknown): {
  code: number;
  result: ReinstallResult | null;
  error: string | null;
} {
  const parsed = WiringReinstall.safeParse(raw);
  if (!parsed.success) {
    return {
      code: WIRING_EXIT.badInput,
      result: null,
      error: `bad reinstall input: ${describeIssues(parsed.error.issues, 5)}`,
    };
  }
  const input = parsed.data;
  const hosts = wiredHosts(input.mode, input.hostsFile);
  const hostsEntries = entriesFor(input.proxyAddress, hosts);
  let step = "the hosts file";
  try {
    const before = existsSync(input.hostsPath) ? readFileSync(input.hostsPath, "utf8") : "";
    const after = rewriteHosts(before, hostsEntries, hosts);
    if (after !== before) writeFileSync(input.hostsPath, after, { mode: 0o644 });
    chmodSync(input.hostsPath, 0o644);
    if (input.nsswitchPath !== null) {
      step = "the resolver order";
      const nss = existsSync(input.nsswitchPath) ? readFileSync(input.nsswitchPath, "utf8") : "";
      const fixed = filesFirst(nss);
      if (fixed !== nss) writeFileSync(input.nsswitchPath, fixed, { mode: 0o644 });
    }
    if (input.caCertPem !== null) {
      step = "the CA file";
      const pem = input.caCertPem.endsWith("\n") ? input.caCertPem : `${input.caCertPem}\n`;
      const caFile = join(input.caDir, CA_FILE);
      mkdirSync(input.caDir, { recursive: true, mode: 0o755 });
      const tmp = `${caFile}.tmp-${process.pid}`;
      writeFileSync(tmp, pem, { mode: 0o644 });
      chmodSync(tmp, 0o644);
      renameSync(tmp, caFile);
      step = "the CA bundle";
      const bundle = existsSync(input.caBundlePath) ? readFileSync(input.caBundlePath, "utf8") : "";
      if (!bundleHas(bundle, pem)) {
        appendFileSync(input.caBundlePath, `${bundle === "" || bundle.endsWith("\n") ? "" : "\n"}${pem}`, {
          mode: 0o644,
        });
      }
      chmodSync(input.caBundlePath, 0o644);
    }
    return { code: WIRING_EXIT.ok, result: { ok: true, hostsEntries }, error: null };
  } catch (e) {
    const code = (e as { code?: string }).code ?? (e as Error).name;
    const error = `could not write ${step}: ${code}`;
    return { code: WIRING_EXIT.probeFailed, result: { ok: false, hostsEntries, error }, error };
  }
}

/**
 * `installed`: the files were written from outside (the local agent's seal re-installs them after
 * the setup stage): write nothing, check that the CA file is the run CA, that the bundle holds it
 * and that the hosts file sends every wired name to the proxy. A failed probe entry if not.
 */
function check(input: WiringInputParsed, caFile: string, hosts: string[]): WiringProbe | null {
  const fail = (observed: string): WiringProbe => ({
    name: "install",
    expected: "the run CA and the hosts entries installed from outside the sandbox",
    observed,
    ok: false,
  });
  const read = (path: string) => {
    try {
      return readFileSync(path, "utf8");
    } catch (e) {
      return { error: (e as { code?: string }).code ?? (e as Error).name };
    }
  };
  const ca = read(caFile);
  if (typeof ca !== "string") return fail(`cannot read ${caFile}: ${ca.error}`);
  if (!bundleHas(ca, input.caCertPem)) return fail(`${caFile} is not the run CA`);
  const bundle = read(input.caBundlePath);
  if (typeof bundle !== "string") return fail(`cannot read ${input.caBundlePath}: ${bundle.error}`);
  if (!bundleHas(bundle, input.caCertPem)) return fail(`${input.caBundlePath} does not hold the run CA`);
  const text = read(input.hostsPath);
  if (typeof text !== "string") return fail(`cannot read ${input.hostsPath}: ${text.error}`);
  const missing = hosts.filter((h) => lookupInHostsText(text, h) !== input.proxyAddress);
  if (missing.length > 0)
    return fail(`${input.hostsPath} does not send ${missing.join(", ")} to ${input.proxyAddress}`);
  return null;
}

/** The first address the hosts file gives `host`, as the files resolver would. */
function lookupInHostsFile(path: string, host: string): string | null {
  return lookupInHostsText(readFileSync(path, "utf8"), host);
}

async function resolveProbeHost(input: WiringInputParsed): Promise<string> {
  if (input.probeResolver === "hosts-file") {
    const address = lookupInHostsFile(input.hostsPath, WIRING_PROBE_HOST);
    if (address === null) throw Object.assign(new Error("not in the hosts file"), { code: "ENOTFOUND" });
    return address;
  }
  return (await lookup(WIRING_PROBE_HOST, { family: 4 })).address;
}

/**
 * HTTPS to the probe host through the redirect, trusting only the bundle just written: a verified
 * handshake whose chain ends at the run CA, answered 403 with the probe header. Only the run's
 * proxy can give that answer (the name is under `.invalid`, and the header is one the proxy strips
 * from anything upstream), so it proves the redirect and the trust at once.
 */
async function tlsProbe(input: WiringInputParsed, caFingerprint256: string): Promise<WiringProbe> {
  const name = "tls_probe";
  const expected =
    `403 with ${PROBE_HEADER}: refused from https://${WIRING_PROBE_HOST}/, TLS verified against ` +
    `${input.caBundlePath} with the run CA at the chain's root` +
    (input.mode === "default" ? `, the name resolving to ${input.proxyAddress}` : "");
  const fail = (observed: string): WiringProbe => ({ name, expected, observed, ok: false });

  let address: string;
  try {
    address = await resolveProbeHost(input);
  } catch (e) {
    return fail(`${WIRING_PROBE_HOST} does not resolve: ${(e as { code?: string }).code ?? "error"}`);
  }
  // Default routing rests on the hosts file alone; catch-all also redirects other addresses.
  if (input.mode === "default" && address !== input.proxyAddress) {
    return fail(`${WIRING_PROBE_HOST} resolves to ${address}, not the proxy`);
  }
  let bundle: string;
  try {
    bundle = readFileSync(input.caBundlePath, "utf8");
  } catch (e) {
    return fail(`cannot read the CA bundle: ${(e as { code?: string }).code ?? "error"}`);
  }

  return new Promise<WiringProbe>((resolve) => {
    const req = request(
      {
        host: address,
        port: input.probePort,
        // The name the certificate is checked against, and the SNI the proxy routes by.
        servername: WIRING_PROBE_HOST,
        headers: { host: WIRING_PROBE_HOST },
        method: "GET",
        path: "/",
        ca: bundle,
        agent: false,
        timeout: HTTPS_PROBE_TIMEOUT_MS,
      },
      (res) => {
        res.resume();
        const root = chainRoot(res.socket as TLSSocket);
        const header = res.headers[PROBE_HEADER];
        const observed =
          `${res.statusCode} with ${PROBE_HEADER}: ${header ?? "(absent)"}, chain root ` +
          `${root === caFingerprint256 ? "the run CA" : "another CA"}, via ${address}:${input.probePort}`;
        const ok = res.statusCode === 403 && header === "refused" && root === caFingerprint256;
        req.destroy();
        resolve({ name, expected, observed, ok });
      },
    );
    req.on("timeout", () => req.destroy(Object.assign(new Error("timeout"), { code: "ETIMEDOUT" })));
    req.on("error", (e: Error & { code?: string }) => {
      resolve(fail(`no answer via ${address}:${input.probePort}: ${e.code ?? e.name}: ${e.message}`));
    });
    req.end();
  });
}

/** The SHA-256 fingerprint (lowercase hex) of the top of the peer's verified chain. */
function chainRoot(socket: TLSSocket): string | null {
  let cert = socket.getPeerCertificate(true);
  if (!cert || Object.keys(cert).length === 0) return null;
  for (let i = 0; i < 10 && cert.issuerCertificate && cert.issuerCertificate !== cert; i++) {
    cert = cert.issuerCertificate;
  }
  return cert.fingerprint256.replaceAll(":", "").toLowerCase();
}

/** catch-all: a direct connection out must not be made (refused, unreachable or unanswered). */
function directProbe(target: string): Promise<WiringProbe> {
  const name = "direct_egress";
  const expected = `a direct TCP connection to ${target} fails within ${DIRECT_PROBE_TIMEOUT_MS} ms`;
  const cut = target.lastIndexOf(":");
  return new Promise((resolve) => {
    const socket = connect({ host: target.slice(0, cut), port: Number(target.slice(cut + 1)) });
    const finish = (observed: string, ok: boolean) => {
      clearTimeout(timer);
      socket.destroy();
      resolve({ name, expected, observed, ok });
    };
    const timer = setTimeout(
      () => finish(`no connection within ${DIRECT_PROBE_TIMEOUT_MS} ms`, true),
      DIRECT_PROBE_TIMEOUT_MS,
    );
    socket.once("connect", () => finish("connected: direct egress is open", false));
    socket.once("error", (e: Error & { code?: string }) => finish(`failed: ${e.code ?? e.name}`, true));
  });
}
