import {
  decodeBase64,
  isKeyRing,
  KEY_BYTES,
  KEY_ID_PATTERN,
  type KeyRing,
  keyMaterial,
  type WebCryptoKey,
} from "@benchwright/shared/contract/key-ring";
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

// Keys derived from a ring's keys, made once per ring (the ring itself: contract/key-ring.ts).
interface RingState {
  fingerprintKey?: Promise<WebCryptoKey>;
  /** HMAC keys for keyedDigest, by key id and purpose. */
  digestKeys?: Map<string, Promise<WebCryptoKey>>;
}

const ringStates = new WeakMap<KeyRing, RingState>();
const encoder = new TextEncoder();

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
  if (!isKeyRing(ring)) throw new TypeError("key ring must come from parseKeyRing");
  let state = ringStates.get(ring);
  if (state === undefined) {
    state = {};
    ringStates.set(ring, state);
  }
  return state;
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
