import "reflect-metadata"; // @peculiar/x509 resolves its ASN.1 providers through tsyringe, which needs it
import { webcrypto } from "node:crypto";
import { createSecureContext, type SecureContext } from "node:tls";
import { isIpLiteral } from "@benchwright/shared/contract/host-name";
import * as x509 from "@peculiar/x509";
import { nameConstraintsExtension } from "./name-constraints";

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

// The per-run CA. Made when the proxy starts, after its first policy read; its private key exists
// only in this process's memory and dies with it. The work sandbox trusts its certificate, so the
// proxy can terminate TLS for the hosts the sandbox dials and apply policy to the plain request
// inside. Under default routing it is name-constrained to the names the proxy may terminate
// (name-constraints.ts); its leaves live hours and are minted again before they expire (case N5).

const EC = { name: "ECDSA", namedCurve: "P-256" } as const;
const SIGN = { name: "ECDSA", hash: "SHA-256" } as const;
const HOUR = 3_600_000;
// A run lasts at most a day and a lingering proxy another day; a little margin on both ends.
const CA_LIFETIME_MS = 3 * 24 * HOUR;
const CLOCK_SKEW_MS = HOUR;
// A leaf (or its key) that leaks is good for hours, not for the CA's days. A leaf is minted again
// on the first handshake after half its life, so one in use is never near its end.
const LEAF_LIFETIME_MS = 6 * HOUR;
const LEAF_CLOCK_SKEW_MS = 5 * 60_000;

export interface RunCaOptions {
  runId: string;
  maxLeaves?: number;
  /** How long a leaf certificate is valid (default 6 h); tests use seconds. */
  leafLifetimeMs?: number;
  /** The only names the CA may vouch for (a critical NameConstraints), or null: any name. */
  permittedNames?: readonly string[] | null;
}

export interface RunCa {
  /** PEM of the CA certificate: what the work sandbox is told to trust. */
  readonly certPem: string;
  /** SHA-256 of the CA certificate's DER, hex, colon-free lowercase. */
  readonly fingerprint256: string;
  /** The names the CA's NameConstraints permits, or null when it carries none. */
  readonly permittedNames: readonly string[] | null;
  /** Whether the proxy may present a leaf for `host` (canonical): any name, or a permitted one. */
  permits(host: string): boolean;
  /**
   * A TLS context with a leaf certificate for `host` (canonical), minted on first use and again
   * once the cached one is past half its life. It signs for any name: callers check `permits`
   * first (a client would refuse a leaf outside the constraints anyway).
   */
  contextFor(host: string): Promise<SecureContext>;
  /** Number of leaf contexts currently cached (bounded by `maxLeaves`). */
  readonly cachedLeaves: number;
}

function pem(label: string, der: ArrayBuffer): string {
  const b64 = Buffer.from(der).toString("base64");
  return `-----BEGIN ${label}-----\n${b64.replace(/.{64}/g, "$&\n").replace(/\n?$/, "\n")}-----END ${label}-----\n`;
}

interface LeafKey {
  publicKey: webcrypto.CryptoKey;
  /** PKCS#8 PEM of the private key, as `createSecureContext` takes it. */
  pem: string;
}

async function makeLeafKey(): Promise<LeafKey> {
  const keys = (await webcrypto.subtle.generateKey(EC, true, ["sign", "verify"])) as webcrypto.CryptoKeyPair;
  return {
    publicKey: keys.publicKey,
    pem: pem("PRIVATE KEY", await webcrypto.subtle.exportKey("pkcs8", keys.privateKey)),
  };
}

function serial(): string {
  const bytes = webcrypto.getRandomValues(new Uint8Array(16));
  bytes[0] = (bytes[0] ?? 0) & 0x7f; // positive
  return Buffer.from(bytes).toString("hex");
}

export async function createRunCa(options: RunCaOptions): Promise<RunCa> {
  const maxLeaves = options.maxLeaves ?? 1024;
  const leafLifetimeMs = options.leafLifetimeMs ?? LEAF_LIFETIME_MS;
  const permittedNames = options.permittedNames ? [...options.permittedNames] : null;
  const permitted = permittedNames === null ? null : new Set(permittedNames);
  const now = Date.now();
  const notBefore = new Date(now - CLOCK_SKEW_MS);
  const notAfter = new Date(now + CA_LIFETIME_MS);
  const caKeys = (await webcrypto.subtle.generateKey(EC, false, [
    "sign",
    "verify",
  ])) as webcrypto.CryptoKeyPair;
  const caCert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: serial(),
    name: `CN=Benchwright run ${options.runId.replace(/[^A-Za-z0-9_-]/g, "")} CA, O=Benchwright`,
    notBefore,
    notAfter,
    keys: caKeys,
    signingAlgorithm: SIGN,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign | x509.KeyUsageFlags.cRLSign, true),
      await x509.SubjectKeyIdentifierExtension.create(caKeys.publicKey),
      ...(permittedNames === null ? [] : [nameConstraintsExtension(permittedNames)]),
    ],
  });
  const certPem = caCert.toString("pem");
  const fingerprint256 = Buffer.from(await caCert.getThumbprint("SHA-256")).toString("hex");

  // One leaf key for every host, so minting stays cheap (one signature), memory-only like the
  // CA's, and replaced as often as leaves are renewed: a leaked one signs nothing new, and the
  // leaves it is in end within one and a half leaf lifetimes.
  let leafKey: { madeAt: number; made: Promise<LeafKey> } | null = null;
  const currentLeafKey = (now: number): Promise<LeafKey> => {
    if (leafKey === null || now - leafKey.madeAt >= leafLifetimeMs / 2) {
      const made = makeLeafKey();
      made.catch(() => {
        if (leafKey?.made === made) leafKey = null;
      });
      leafKey = { madeAt: now, made };
    }
    return leafKey.made;
  };
  const authorityKeyId = await x509.AuthorityKeyIdentifierExtension.create(caKeys.publicKey);

  // Bounded: the proxy mints a certificate for any SNI a client sends. Map order = recency.
  const cache = new Map<string, { context: Promise<SecureContext>; renewAt: number }>();

  async function mint(host: string, mintedAt: number): Promise<SecureContext> {
    const key = await currentLeafKey(mintedAt);
    const name = isIpLiteral(host)
      ? { type: "ip" as const, value: host.replace(/^\[|\]$/g, "") }
      : { type: "dns" as const, value: host };
    const leaf = await x509.X509CertificateGenerator.create({
      serialNumber: serial(),
      subject: `CN=${host.length <= 64 ? host : "benchwright-leaf"}`,
      issuer: caCert.subject,
      notBefore: new Date(mintedAt - LEAF_CLOCK_SKEW_MS),
      // Never past the CA's own end.
      notAfter: new Date(Math.min(mintedAt + leafLifetimeMs, notAfter.getTime())),
      publicKey: key.publicKey,
      signingKey: caKeys.privateKey,
      signingAlgorithm: SIGN,
      extensions: [
        new x509.BasicConstraintsExtension(false, undefined, true),
        new x509.KeyUsagesExtension(x509.KeyUsageFlags.digitalSignature, true),
        new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
        new x509.SubjectAlternativeNameExtension([name]),
        authorityKeyId,
      ],
    });
    return createSecureContext({ key: key.pem, cert: `${leaf.toString("pem")}\n${certPem}` });
  }

  return {
    certPem,
    fingerprint256,
    permittedNames,
    permits: (host) => permitted === null || permitted.has(host),
    get cachedLeaves() {
      return cache.size;
    },
    contextFor(host: string) {
      const hit = cache.get(host);
      const now = Date.now();
      cache.delete(host);
      // A renewed leaf is for new handshakes only: a connection keeps the one it was made with.
      if (hit && now < hit.renewAt) {
        cache.set(host, hit);
        return hit.context;
      }
      const entry = { context: mint(host, now), renewAt: now + leafLifetimeMs / 2 };
      entry.context.catch(() => {
        if (cache.get(host) === entry) cache.delete(host);
      });
      cache.set(host, entry);
      while (cache.size > maxLeaves) {
        const oldest = cache.keys().next().value;
        if (oldest === undefined) break;
        cache.delete(oldest);
      }
      return entry.context;
    },
  };
}
