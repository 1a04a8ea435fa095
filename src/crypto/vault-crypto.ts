import { encodeBase64Url } from "./api-keys";

// Envelope encryption of vault secret values (cases B5, B8, B9).
//
// Only WebCrypto globals are used so the same module runs in workerd and in Node.
//
// Blob format (ASCII, self-describing):
//   v1.<kid>.<wrapIv>.<wrappedKey>.<iv>.<ciphertext>      (binary parts base64url, no padding)
// A fresh AES-256-GCM data key per value encrypts the plaintext; the ring's current KEK wraps the
// data key with AES-GCM. Both layers authenticate the owner and secret id as additional data, so a
// blob copied into another tenant's (or another secret's) row cannot be decrypted there (B8).

const BLOB_VERSION = "v1";
const AAD_LABEL = "benchwright/vault-secret/v1";
const FINGERPRINT_INFO = "benchwright/fingerprint/v1";
const KEY_ID_PATTERN = /^[A-Za-z0-9_-]{1,32}$/;
const KEY_BYTES = 32;
const IV_BYTES = 12;
const TAG_BYTES = 16;
// A wrapped 256-bit data key is the key plus the GCM tag.
const WRAPPED_KEY_BYTES = KEY_BYTES + TAG_BYTES;

/** Owner and identity of a secret; authenticated by both encryption layers. */
export interface SecretAad {
  userId: string;
  environmentId: string;
  secretId: string;
}

/**
 * A parsed `VAULT_KEK`. Holds only key ids: key material lives in a module-private WeakMap so that
 * logging or serialising a ring cannot leak it (B5).
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

export type VaultDecryptFailure = "malformed" | "unknown_key" | "authentication_failed";

/** Thrown by `decryptSecret`; the message never contains plaintext or key material. */
export class VaultDecryptError extends Error {
  override name = "VaultDecryptError";
  readonly reason: VaultDecryptFailure;
  /** The blob's key id when it could be read (useful for "missing key" reports, E1/B9). */
  readonly keyId: string | undefined;

  constructor(reason: VaultDecryptFailure, message: string, keyId?: string) {
    super(message);
    this.reason = reason;
    this.keyId = keyId;
  }
}

// Node's types have no global CryptoKey name; this resolves to the right type in both runtimes.
type WebCryptoKey = Awaited<ReturnType<typeof crypto.subtle.importKey>>;

interface KeyMaterial {
  // Wraps/unwraps data keys.
  kek: WebCryptoKey;
  // The same secret as an HKDF base key, used only to derive the fingerprint key.
  hkdf: WebCryptoKey;
}

interface RingState {
  // Raw key bytes, dropped once imported as non-extractable CryptoKeys.
  raw: Map<string, Uint8Array<ArrayBuffer>>;
  imported: Map<string, Promise<KeyMaterial>>;
  fingerprintKey?: Promise<WebCryptoKey>;
  /** HMAC keys for keyedDigest, by key id and purpose. */
  digestKeys?: Map<string, Promise<WebCryptoKey>>;
}

const ringStates = new WeakMap<KeyRing, RingState>();
const encoder = new TextEncoder();

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
  ringStates.set(ring, { raw, imported: new Map() });
  return ring;
}

/** Encrypts a secret value for one owner and secret id; returns the ASCII blob to store. */
export async function encryptSecret(ring: KeyRing, aad: SecretAad, plaintext: string): Promise<string> {
  if (typeof plaintext !== "string" || !isWellFormed(plaintext)) {
    // TextEncoder would silently replace lone surrogates, so the round trip would not be exact.
    throw new TypeError("secret value must be a well-formed Unicode string");
  }
  const keyId = ring.currentKeyId;
  const { kek } = await keyMaterial(ring, keyId);
  // Extractable only so that wrapKey can export it, encrypted; the raw bytes never reach JS.
  const dataKeyAlgorithm = { name: "AES-GCM", length: 256 };
  const dataKey = (await crypto.subtle.generateKey(dataKeyAlgorithm, true, ["encrypt"])) as WebCryptoKey;
  const iv = randomBytes(IV_BYTES);
  const ciphertext = await crypto.subtle.encrypt(
    { name: "AES-GCM", iv, additionalData: aadBytes("data", keyId, aad) },
    dataKey,
    encoder.encode(plaintext),
  );
  // Random 96-bit IVs under the KEK are safe well beyond any realistic number of secret writes
  // (NIST SP 800-38D limit: 2^32 per key); the data key itself is used exactly once.
  const wrapIv = randomBytes(IV_BYTES);
  const wrappedKey = await crypto.subtle.wrapKey("raw", dataKey, kek, {
    name: "AES-GCM",
    iv: wrapIv,
    additionalData: aadBytes("wrap", keyId, aad),
  });
  return [
    BLOB_VERSION,
    keyId,
    encodeBase64Url(wrapIv),
    encodeBase64Url(new Uint8Array(wrappedKey)),
    encodeBase64Url(iv),
    encodeBase64Url(new Uint8Array(ciphertext)),
  ].join(".");
}

/** Decrypts a blob from `encryptSecret`; throws `VaultDecryptError` on any failure. */
export async function decryptSecret(ring: KeyRing, aad: SecretAad, blob: string): Promise<string> {
  const parsed = parseBlob(blob);
  if (parsed === undefined) throw new VaultDecryptError("malformed", "vault secret blob is malformed");
  const { keyId } = parsed;
  if (!ring.keyIds.includes(keyId)) {
    throw new VaultDecryptError(
      "unknown_key",
      `vault secret was encrypted under key "${keyId}", which is not in VAULT_KEK`,
      keyId,
    );
  }
  const header = aadBytes("wrap", keyId, aad);
  const body = aadBytes("data", keyId, aad);
  const { kek } = await keyMaterial(ring, keyId);
  let plainBytes: ArrayBuffer;
  try {
    const dataKey = await crypto.subtle.unwrapKey(
      "raw",
      parsed.wrappedKey,
      kek,
      { name: "AES-GCM", iv: parsed.wrapIv, additionalData: header },
      { name: "AES-GCM" },
      false,
      ["decrypt"],
    );
    plainBytes = await crypto.subtle.decrypt(
      { name: "AES-GCM", iv: parsed.iv, additionalData: body },
      dataKey,
      parsed.ciphertext,
    );
  } catch {
    // Wrong key, wrong owner/secret id (B8) or tampering: GCM cannot tell these apart.
    throw new VaultDecryptError(
      "authentication_failed",
      `vault secret failed authentication under key "${keyId}" (tampered, or bound to another secret)`,
      keyId,
    );
  }
  try {
    return new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(plainBytes);
  } catch {
    throw new VaultDecryptError("malformed", "vault secret plaintext is not valid UTF-8", keyId);
  }
}

/** The id of the KEK that wrapped a blob (for rotation reports); throws `VaultDecryptError`. */
export function keyIdOf(blob: string): string {
  const parsed = parseBlob(blob);
  if (parsed === undefined) throw new VaultDecryptError("malformed", "vault secret blob is malformed");
  return parsed.keyId;
}

/**
 * A keyed fingerprint of a secret value, safe to show and log (B5): `fp_<kid>_<16 hex>`.
 * Keyed with HMAC so low-entropy values cannot be brute-forced from it without the KEK. The key
 * derives from the current KEK, so fingerprints change after rotation: store them at write time.
 */
export async function fingerprintSecret(ring: KeyRing, value: string): Promise<string> {
  if (typeof value !== "string" || !isWellFormed(value)) {
    throw new TypeError("secret value must be a well-formed Unicode string");
  }
  const state = stateOf(ring);
  const keyId = ring.currentKeyId;
  if (state.fingerprintKey === undefined) {
    const derive = async () => {
      const { hkdf } = await keyMaterial(ring, keyId);
      return crypto.subtle.deriveKey(
        { name: "HKDF", hash: "SHA-256", salt: new Uint8Array(0), info: encoder.encode(FINGERPRINT_INFO) },
        hkdf,
        { name: "HMAC", hash: "SHA-256", length: 256 },
        false,
        ["sign"],
      );
    };
    state.fingerprintKey = derive();
  }
  const mac = await crypto.subtle.sign("HMAC", await state.fingerprintKey, encoder.encode(value));
  return `fp_${keyId}_${toHex(new Uint8Array(mac, 0, 8))}`;
}

/**
 * A keyed digest of bytes for one purpose (`info`), as `<kid>.<64 hex>`: comparable later, never
 * reversible without the KEK, so a digest of a low-entropy secret cannot be brute-forced from a
 * database dump. `keyId` recomputes under the key a stored digest names (after a rotation).
 */
export async function keyedDigest(
  ring: KeyRing,
  info: string,
  data: Uint8Array<ArrayBuffer>,
  keyId = ring.currentKeyId,
): Promise<string> {
  const state = stateOf(ring);
  state.digestKeys ??= new Map();
  const slot = `${keyId}\u0000${info}`;
  let key = state.digestKeys.get(slot);
  if (key === undefined) {
    key = keyMaterial(ring, keyId).then(({ hkdf }) =>
      crypto.subtle.deriveKey(
        {
          name: "HKDF",
          hash: "SHA-256",
          salt: new Uint8Array(0),
          info: encoder.encode(`benchwright/digest/${info}`),
        },
        hkdf,
        { name: "HMAC", hash: "SHA-256", length: 256 },
        false,
        ["sign"],
      ),
    );
    state.digestKeys.set(slot, key);
  }
  const mac = await crypto.subtle.sign("HMAC", await key, data);
  return `${keyId}.${toHex(new Uint8Array(mac))}`;
}

// ---- internals ----

interface ParsedBlob {
  keyId: string;
  wrapIv: Uint8Array<ArrayBuffer>;
  wrappedKey: Uint8Array<ArrayBuffer>;
  iv: Uint8Array<ArrayBuffer>;
  ciphertext: Uint8Array<ArrayBuffer>;
}

function parseBlob(blob: unknown): ParsedBlob | undefined {
  if (typeof blob !== "string") return undefined;
  const parts = blob.split(".");
  if (parts.length !== 6) return undefined;
  const [version, keyId, wrapIvText, wrappedKeyText, ivText, ciphertextText] = parts as [
    string,
    string,
    string,
    string,
    string,
    string,
  ];
  if (version !== BLOB_VERSION || !KEY_ID_PATTERN.test(keyId)) return undefined;
  // Strict, canonical base64url: a changed character can never decode to the same bytes.
  const wrapIv = decodeBase64(wrapIvText, "url");
  const wrappedKey = decodeBase64(wrappedKeyText, "url");
  const iv = decodeBase64(ivText, "url");
  const ciphertext = decodeBase64(ciphertextText, "url");
  if (wrapIv?.length !== IV_BYTES || wrappedKey?.length !== WRAPPED_KEY_BYTES) return undefined;
  if (iv?.length !== IV_BYTES || ciphertext === undefined || ciphertext.length < TAG_BYTES) return undefined;
  return { keyId, wrapIv, wrappedKey, iv, ciphertext };
}

function stateOf(ring: KeyRing): RingState {
  const state = ringStates.get(ring);
  if (state === undefined) throw new TypeError("key ring must come from parseKeyRing");
  return state;
}

// Imports a key once per ring as non-extractable CryptoKeys, then forgets the raw bytes.
function keyMaterial(ring: KeyRing, keyId: string): Promise<KeyMaterial> {
  const state = stateOf(ring);
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

// Length-prefixed fields keep the encoding injective whatever the ids contain; the layer name
// separates the wrap and data contexts, and the key id binds the blob header.
function aadBytes(layer: "wrap" | "data", keyId: string, aad: SecretAad): Uint8Array<ArrayBuffer> {
  const fields = [AAD_LABEL, layer, keyId, aadField(aad, "userId"), aadField(aad, "environmentId")];
  fields.push(aadField(aad, "secretId"));
  const encoded = fields.map((field) => encoder.encode(field));
  const out = new Uint8Array(encoded.reduce((sum, bytes) => sum + 4 + bytes.length, 0));
  const view = new DataView(out.buffer);
  let offset = 0;
  for (const bytes of encoded) {
    view.setUint32(offset, bytes.length);
    out.set(bytes, offset + 4);
    offset += 4 + bytes.length;
  }
  return out;
}

function aadField(aad: SecretAad, name: keyof SecretAad): string {
  const value = aad?.[name];
  // Lone surrogates would all encode to U+FFFD, making distinct ids collide.
  if (typeof value !== "string" || value === "" || !isWellFormed(value)) {
    throw new TypeError(`secret AAD field ${name} must be a non-empty, well-formed string`);
  }
  return value;
}

function isWellFormed(text: string): boolean {
  return !/[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/.test(text);
}

function randomBytes(length: number): Uint8Array<ArrayBuffer> {
  return crypto.getRandomValues(new Uint8Array(length));
}

function toHex(bytes: Uint8Array): string {
  let out = "";
  for (const byte of bytes) out += byte.toString(16).padStart(2, "0");
  return out;
}

const BASE64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/**
 * Strict base64 decoding. "url": base64url without padding (blob parts). "any": standard or URL
 * alphabet, padding optional (keys in VAULT_KEK). Both reject stray characters and non-zero
 * trailing bits, so every accepted string has exactly one byte sequence and vice versa.
 */
function decodeBase64(text: string, mode: "url" | "any"): Uint8Array<ArrayBuffer> | undefined {
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
