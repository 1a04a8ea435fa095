import { z } from "zod";
import { encodeBase64Url } from "../crypto/api-keys";

// Registry bearer tokens (the distribution "token authentication" scheme and its JWT profile),
// minted by the broker itself: the registry trusts one public key, and only the Worker holds the
// private half (REGISTRY_SIGNING_KEY). ES256 over WebCrypto, hand-written rather than through a
// JWT library: signing is one `crypto.subtle.sign` call whose raw r||s output already is the
// JWS signature, and the Worker never parses or verifies a token, which is where JWT libraries
// earn their keep. Plain TypeScript with no Workers or Node imports.

/** One entry of the token's `access` claim. */
export interface RegistryAccess {
  type: "repository";
  name: string;
  /** `delete`: the broker's own removal of a dropped setup image's manifest. */
  actions: ("pull" | "push" | "delete")[];
}

/** WebCrypto's key type, spelled so that Node's types (the tests) and workerd's both accept it. */
type WebCryptoKey = Awaited<ReturnType<typeof crypto.subtle.importKey>>;

export interface SigningKey {
  readonly privateKey: WebCryptoKey;
  /** The JWS `kid`: the JWK's own `kid`, else the key's libtrust fingerprint (see keyFingerprint). */
  readonly kid: string;
}

export interface TokenClaims {
  issuer: string;
  /** The registry's service name: the token's `aud`. */
  service: string;
  subject: string;
  access: RegistryAccess[];
  ttlSeconds: number;
}

export interface MintedToken {
  token: string;
  /** Random id of this token (`jti`): safe to log, unlike the token. */
  jti: string;
  expiresAt: Date;
}

const b64url = /^[A-Za-z0-9_-]+$/;
const PrivateEcJwk = z.object({
  kty: z.literal("EC"),
  crv: z.literal("P-256"),
  x: z.string().regex(b64url),
  y: z.string().regex(b64url),
  d: z.string().regex(b64url),
  kid: z.string().min(1).max(200).optional(),
  alg: z.literal("ES256").optional(),
});

/** Thrown with a message that names what is wrong, never the key material. */
export class SigningKeyError extends Error {}

export async function importSigningKey(jwkText: string): Promise<SigningKey> {
  let json: unknown;
  try {
    json = JSON.parse(jwkText);
  } catch {
    throw new SigningKeyError("not JSON (expected a private EC P-256 JWK)");
  }
  const parsed = PrivateEcJwk.safeParse(json);
  if (!parsed.success) {
    throw new SigningKeyError(
      `not a private EC P-256 JWK (fields: ${parsed.error.issues.map((i) => i.path.join(".")).join(", ")})`,
    );
  }
  const { kty, crv, x, y, d } = parsed.data;
  try {
    const privateKey = await crypto.subtle.importKey(
      "jwk",
      { kty, crv, x, y, d },
      { name: "ECDSA", namedCurve: "P-256" },
      false,
      ["sign"],
    );
    const publicKey = await crypto.subtle.importKey(
      "jwk",
      { kty, crv, x, y },
      { name: "ECDSA", namedCurve: "P-256" },
      true,
      ["verify"],
    );
    const kid = parsed.data.kid ?? (await keyFingerprint(publicKey));
    return { privateKey, kid };
  } catch {
    throw new SigningKeyError("the JWK does not import as a P-256 key");
  }
}

/**
 * The key id distribution gives each key of its `rootcertbundle` (libtrust's fingerprint):
 * SHA-256 of the public key's DER SubjectPublicKeyInfo, its first 240 bits in unpadded base32,
 * in groups of four joined by `:`. A token whose `kid` is this verifies against a registry that
 * was given a certificate for the key; one configured with a JWKS matches the JWK's own `kid`.
 */
export async function keyFingerprint(publicKey: WebCryptoKey): Promise<string> {
  const spki = new Uint8Array((await crypto.subtle.exportKey("spki", publicKey)) as ArrayBuffer);
  const sum = new Uint8Array(await crypto.subtle.digest("SHA-256", spki)).slice(0, 30);
  return (base32(sum).match(/.{4}/g) ?? []).join(":");
}

export async function mintRegistryToken(
  key: SigningKey,
  claims: TokenClaims,
  now = new Date(),
): Promise<MintedToken> {
  const iat = Math.floor(now.getTime() / 1000);
  const exp = iat + claims.ttlSeconds;
  const jti = encodeBase64Url(crypto.getRandomValues(new Uint8Array(16)));
  const header = { typ: "JWT", alg: "ES256", kid: key.kid };
  const payload = {
    iss: claims.issuer,
    sub: claims.subject,
    aud: claims.service,
    exp,
    nbf: iat,
    iat,
    jti,
    access: claims.access,
  };
  const signingInput = `${encodeBase64Url(utf8(JSON.stringify(header)))}.${encodeBase64Url(utf8(JSON.stringify(payload)))}`;
  // WebCrypto's ECDSA signature is r||s (64 bytes for P-256): the JWS encoding, no DER to undo.
  const signature = await crypto.subtle.sign(
    { name: "ECDSA", hash: "SHA-256" },
    key.privateKey,
    utf8(signingInput),
  );
  return {
    token: `${signingInput}.${encodeBase64Url(new Uint8Array(signature))}`,
    jti,
    expiresAt: new Date(exp * 1000),
  };
}

const utf8 = (text: string) => new TextEncoder().encode(text);

const BASE32 = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567";

/** RFC 4648 base32, unpadded. */
function base32(bytes: Uint8Array): string {
  let out = "";
  let bits = 0;
  let value = 0;
  for (const b of bytes) {
    value = (value << 8) | b;
    bits += 8;
    while (bits >= 5) {
      out += BASE32[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += BASE32[(value << (5 - bits)) & 31];
  return out;
}
