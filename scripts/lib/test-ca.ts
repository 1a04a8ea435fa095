import "reflect-metadata"; // @peculiar/x509 resolves its ASN.1 providers through tsyringe, which needs it
import { webcrypto } from "node:crypto";
import * as x509 from "@peculiar/x509";

// A throwaway CA for the suite's and the demo's own upstream servers (never the run CA, which
// the proxy makes for itself). Shared by the proxy tests, the end-to-end tests and `npm start`.

x509.cryptoProvider.set(webcrypto as unknown as Parameters<typeof x509.cryptoProvider.set>[0]);

const EC = { name: "ECDSA", namedCurve: "P-256" } as const;
const SIGN = { name: "ECDSA", hash: "SHA-256" } as const;

export interface TestCa {
  certPem: string;
  issue(hosts: string[]): Promise<{ certPem: string; keyPem: string }>;
}

export function pem(label: string, der: ArrayBuffer): string {
  const b64 = Buffer.from(der).toString("base64").replace(/.{64}/g, "$&\n");
  return `-----BEGIN ${label}-----\n${b64}${b64.endsWith("\n") ? "" : "\n"}-----END ${label}-----\n`;
}

export async function createTestCa(name = "Benchwright test upstream CA"): Promise<TestCa> {
  const keys = (await webcrypto.subtle.generateKey(EC, true, ["sign", "verify"])) as webcrypto.CryptoKeyPair;
  const now = Date.now();
  const ca = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: "01",
    name: `CN=${name}`,
    notBefore: new Date(now - 3_600_000),
    notAfter: new Date(now + 86_400_000),
    keys,
    signingAlgorithm: SIGN,
    extensions: [
      new x509.BasicConstraintsExtension(true, 0, true),
      new x509.KeyUsagesExtension(x509.KeyUsageFlags.keyCertSign, true),
    ],
  });
  return {
    certPem: ca.toString("pem"),
    async issue(hosts) {
      const leafKeys = (await webcrypto.subtle.generateKey(EC, true, [
        "sign",
        "verify",
      ])) as webcrypto.CryptoKeyPair;
      const leaf = await x509.X509CertificateGenerator.create({
        serialNumber: Buffer.from(webcrypto.getRandomValues(new Uint8Array(8)))
          .toString("hex")
          .replace(/^./, "1"),
        subject: `CN=${hosts[0]}`,
        issuer: ca.subject,
        notBefore: new Date(now - 3_600_000),
        notAfter: new Date(now + 86_400_000),
        publicKey: leafKeys.publicKey,
        signingKey: keys.privateKey,
        signingAlgorithm: SIGN,
        extensions: [
          new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
          new x509.SubjectAlternativeNameExtension(
            hosts.map((h) => (/^[\d.]+$/.test(h) ? { type: "ip", value: h } : { type: "dns", value: h })),
          ),
        ],
      });
      return {
        certPem: `${leaf.toString("pem")}\n`,
        keyPem: pem("PRIVATE KEY", await webcrypto.subtle.exportKey("pkcs8", leafKeys.privateKey)),
      };
    },
  };
}

/** A self-signed certificate for `hosts` (its own issuer): an upstream no trust store accepts (B3). */
export async function selfSignedCert(hosts: string[]): Promise<{ certPem: string; keyPem: string }> {
  const keys = (await webcrypto.subtle.generateKey(EC, true, ["sign", "verify"])) as webcrypto.CryptoKeyPair;
  const now = Date.now();
  const cert = await x509.X509CertificateGenerator.createSelfSigned({
    serialNumber: "02",
    name: `CN=${hosts[0]}`,
    notBefore: new Date(now - 3_600_000),
    notAfter: new Date(now + 86_400_000),
    keys,
    signingAlgorithm: SIGN,
    extensions: [
      new x509.ExtendedKeyUsageExtension([x509.ExtendedKeyUsage.serverAuth]),
      new x509.SubjectAlternativeNameExtension(hosts.map((h) => ({ type: "dns", value: h }))),
    ],
  });
  return {
    certPem: cert.toString("pem"),
    keyPem: pem("PRIVATE KEY", await webcrypto.subtle.exportKey("pkcs8", keys.privateKey)),
  };
}
