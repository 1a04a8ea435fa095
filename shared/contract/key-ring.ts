// The vault's key ring: the VAULT_KEK setting parsed (src/config.ts does, on the first request
// of an isolate) into key ids, with the key material kept here, out of the ring object, so that
// logging or serialising a ring cannot leak it (B5). The envelope encryption
// (src/crypto/vault-crypto.ts) gets each key only as non-extractable CryptoKeys (keyMaterial).
//
// Only WebCrypto globals are used so the same module runs in workerd and in Node.

export const KEY_ID_PATTERN = /^[A-Za-z0-9_-]{1,32}$/;
/** A key-encryption key: AES-256. */
export const KEY_BYTES = 32;

const FOREIGN_RING = "key ring must come from parseKeyRing";

/**
 * A parsed `VAULT_KEK`. Holds only key ids: key material lives in this module's private WeakMap so
 * that logging or serialising a ring cannot leak it (B5).
 */
export interface KeyRing {
  /** Key id that encrypts new values (the first entry of `VAULT_KEK`). */
  readonly currentKeyId: string;
  /** Every key id that can decrypt, in `VAULT_KEK` order. */
  readonly keyIds: readonly string[];
}

/** Thrown by `parseKeyRing`; the message names entries by position or key id, never key material. */
export class KeyRingError extends Error {
  override name = "KeyRingError";
}

// Node's types have no global CryptoKey name; this resolves to the right type in both runtimes.
export type WebCryptoKey = Awaited<ReturnType<typeof crypto.subtle.importKey>>;

export interface KeyMaterial {
  // Wraps/unwraps data keys.
  kek: WebCryptoKey;
  // The same secret as an HKDF base key, used only to derive the fingerprint key.
  hkdf: WebCryptoKey;
}

interface RingKeys {
  // Raw key bytes, dropped once imported as non-extractable CryptoKeys.
  raw: Map<string, Uint8Array<ArrayBuffer>>;
  imported: Map<string, Promise<KeyMaterial>>;
}

const rings = new WeakMap<KeyRing, RingKeys>();

/** Whether parseKeyRing made `ring` (a ring of another shape holds no key). */
export function isKeyRing(ring: KeyRing): boolean {
  return rings.has(ring);
}

/**
 * Parses `VAULT_KEK`: comma-separated `keyId:base64(32 bytes)`. The first key encrypts new values;
 * every listed key decrypts. Rotate by prepending a new key and keeping the old ones (B9).
 */
export function parseKeyRing(text: string): KeyRing {
  if (typeof text !== "string" || text.trim() === "") {
    throw new KeyRingError("VAULT_KEK is empty: expected comma-separated keyId:base64key entries");
  }
  const raw = new Map<string, Uint8Array<ArrayBuffer>>();
  const entries = text.split(",");
  entries.forEach((rawEntry, index) => {
    // Entries are named by position: an invalid entry may itself be key material.
    const where = `VAULT_KEK entry ${index + 1} of ${entries.length}`;
    const entry = rawEntry.trim();
    if (entry === "") throw new KeyRingError(`${where} is empty`);
    const colon = entry.indexOf(":");
    if (colon < 0) throw new KeyRingError(`${where} is malformed: expected keyId:base64key`);
    const keyId = entry.slice(0, colon).trim();
    if (!KEY_ID_PATTERN.test(keyId)) {
      throw new KeyRingError(`${where} has an invalid key id: must match ${KEY_ID_PATTERN.source}`);
    }
    if (raw.has(keyId)) throw new KeyRingError(`${where} repeats key id "${keyId}"`);
    const bytes = decodeBase64(entry.slice(colon + 1).trim(), "any");
    if (bytes === undefined) throw new KeyRingError(`${where} (key id "${keyId}") is not valid base64`);
    if (bytes.length !== KEY_BYTES) {
      throw new KeyRingError(
        `${where} (key id "${keyId}") decodes to ${bytes.length} bytes; expected ${KEY_BYTES}`,
      );
    }
    raw.set(keyId, bytes);
  });
  const keyIds = Object.freeze([...raw.keys()]);
  const ring: KeyRing = Object.freeze({ currentKeyId: keyIds[0] as string, keyIds });
  rings.set(ring, { raw, imported: new Map() });
  return ring;
}

/**
 * One key of the ring as non-extractable CryptoKeys: imported on first use, after which the raw
 * bytes are forgotten. Throws a TypeError for a ring parseKeyRing did not make.
 */
export function keyMaterial(ring: KeyRing, keyId: string): Promise<KeyMaterial> {
  const state = rings.get(ring);
  if (state === undefined) throw new TypeError(FOREIGN_RING);
  let material = state.imported.get(keyId);
  if (material === undefined) {
    const raw = state.raw.get(keyId);
    if (raw === undefined) throw new TypeError("key id is not in the key ring");
    material = Promise.all([
      crypto.subtle.importKey("raw", raw, { name: "AES-GCM" }, false, ["wrapKey", "unwrapKey"]),
      crypto.subtle.importKey("raw", raw, "HKDF", false, ["deriveKey"]),
    ]).then(([kek, hkdf]) => ({ kek, hkdf }));
    state.imported.set(keyId, material);
    state.raw.delete(keyId);
  }
  return material;
}

const BASE64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/**
 * Strict base64 decoding. "url": base64url without padding (blob parts). "any": standard or URL
 * alphabet, padding optional (keys in VAULT_KEK). Both reject stray characters and non-zero
 * trailing bits, so every accepted string has exactly one byte sequence and vice versa.
 */
export function decodeBase64(text: string, mode: "url" | "any"): Uint8Array<ArrayBuffer> | undefined {
  let body = text;
  if (mode === "any" && body.endsWith("=")) {
    if (body.length % 4 !== 0) return undefined;
    body = body.endsWith("==") ? body.slice(0, -2) : body.slice(0, -1);
  }
  if (body.length % 4 === 1) return undefined;
  const out = new Uint8Array(Math.floor((body.length * 3) / 4));
  let bits = 0;
  let bitCount = 0;
  let o = 0;
  for (const char of body) {
    let value = BASE64URL_ALPHABET.indexOf(char);
    if (mode === "any" && value < 0) value = char === "+" ? 62 : char === "/" ? 63 : -1;
    if (value < 0) return undefined;
    bits = ((bits << 6) | value) & 0xfff;
    bitCount += 6;
    if (bitCount >= 8) {
      bitCount -= 8;
      out[o++] = (bits >> bitCount) & 0xff;
    }
  }
  if ((bits & ((1 << bitCount) - 1)) !== 0) return undefined;
  return out;
}
