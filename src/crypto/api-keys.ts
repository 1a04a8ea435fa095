// API keys and database ids. Only WebCrypto globals, so this runs in workerd and in Node.

const API_KEY_PREFIX = "bw_";
const API_KEY_RANDOM_BYTES = 32;
/** How many leading characters of a key are stored in clear and shown to recognise it. */
export const API_KEY_DISPLAY_PREFIX_LENGTH = 10;
// 32 bytes = 43 base64url characters; the last one carries 4 bits, so its low 2 bits are zero.
const API_KEY_PATTERN = /^bw_[A-Za-z0-9_-]{42}[AEIMQUYcgkosw048]$/;
const ID_PREFIX_PATTERN = /^[a-z][a-z0-9]{0,15}_?$/;
const ID_RANDOM_BYTES = 16;
// 16 bytes = 26 lowercase base32 characters; the last one carries 3 bits.
const ID_BODY_PATTERN = /^[a-z2-7]{25}[aeimquy4]$/;

const BASE64URL_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
// RFC 4648 base32, lowercased: ids stay unambiguous in case-insensitive places (URLs, logs, files).
const BASE32_ALPHABET = "abcdefghijklmnopqrstuvwxyz234567";

/** A new API key (`bw_` + 32 random bytes base64url) and its display prefix. Show the key once. */
export function generateApiKey(): { key: string; prefix: string } {
  const key = API_KEY_PREFIX + encodeBase64Url(randomBytes(API_KEY_RANDOM_BYTES));
  return { key, prefix: key.slice(0, API_KEY_DISPLAY_PREFIX_LENGTH) };
}

/**
 * SHA-256 hex of a key, the only form stored. A fast unsalted hash is enough here: keys carry 256
 * random bits, so neither brute force nor precomputed tables apply (unlike passwords).
 */
export async function hashApiKey(key: string): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(key));
  return toHex(new Uint8Array(digest));
}

/**
 * Constant-time comparison of two hex strings (e.g. stored and computed hashes). Case-sensitive.
 * Unequal lengths return false; only the length, never the content, affects timing.
 */
export function timingSafeEqualHex(a: string, b: string): boolean {
  let diff = a.length ^ b.length;
  const length = Math.max(a.length, b.length);
  for (let i = 0; i < length; i++) {
    // charCodeAt past the end is NaN, and NaN | 0 is 0: no branch on the content.
    diff |= (a.charCodeAt(i) | 0) ^ (b.charCodeAt(i) | 0);
  }
  return diff === 0;
}

/** Whether text has the exact shape of a key from `generateApiKey` (cheap check before hashing). */
export function looksLikeApiKey(text: unknown): text is string {
  return typeof text === "string" && API_KEY_PATTERN.test(text);
}

/**
 * A random database id: `<prefix>_` + 16 random bytes as 26 lowercase base32 characters, e.g.
 * `randomId("sec_")` → `sec_k5…`. The prefix may be given with or without its trailing underscore.
 */
export function randomId(prefix: string): string {
  return normalizeIdPrefix(prefix) + encodeBase32(randomBytes(ID_RANDOM_BYTES));
}

/**
 * An id of randomId's shape derived from `parts` (the first 16 bytes of their SHA-256): the same
 * parts always give the same id, so a write retried after a crash names the same thing.
 */
export async function derivedId(prefix: string, ...parts: string[]): Promise<string> {
  const digest = await crypto.subtle.digest("SHA-256", new TextEncoder().encode(parts.join("\0")));
  return normalizeIdPrefix(prefix) + encodeBase32(new Uint8Array(digest).subarray(0, ID_RANDOM_BYTES));
}

/** Whether text has the exact shape of an id made by `randomId(prefix)`. */
export function looksLikeRandomId(prefix: string, text: unknown): text is string {
  const tag = normalizeIdPrefix(prefix);
  return typeof text === "string" && text.startsWith(tag) && ID_BODY_PATTERN.test(text.slice(tag.length));
}

function normalizeIdPrefix(prefix: string): string {
  if (typeof prefix !== "string" || !ID_PREFIX_PATTERN.test(prefix)) {
    throw new TypeError("id prefix must be 1-16 lowercase letters or digits, starting with a letter");
  }
  return prefix.endsWith("_") ? prefix : `${prefix}_`;
}

function randomBytes(length: number): Uint8Array<ArrayBuffer> {
  return crypto.getRandomValues(new Uint8Array(length));
}

/** Lowercase hex of bytes. */
export function toHex(bytes: Uint8Array): string {
  let out = "";
  for (const byte of bytes) out += byte.toString(16).padStart(2, "0");
  return out;
}

/** Unpadded base64url (RFC 4648 §5), for tokens and key material. */
export function encodeBase64Url(bytes: Uint8Array): string {
  let out = "";
  for (let i = 0; i < bytes.length; i += 3) {
    const n = ((bytes[i] as number) << 16) | ((bytes[i + 1] ?? 0) << 8) | (bytes[i + 2] ?? 0);
    const chars = i + 2 < bytes.length ? 4 : i + 1 < bytes.length ? 3 : 2;
    for (let c = 0; c < chars; c++) out += BASE64URL_ALPHABET[(n >> (18 - 6 * c)) & 63];
  }
  return out;
}

function encodeBase32(bytes: Uint8Array): string {
  let out = "";
  let bits = 0;
  let bitCount = 0;
  for (const byte of bytes) {
    bits = ((bits << 8) | byte) & 0xfff;
    bitCount += 8;
    while (bitCount >= 5) {
      bitCount -= 5;
      out += BASE32_ALPHABET[(bits >> bitCount) & 31];
    }
  }
  if (bitCount > 0) out += BASE32_ALPHABET[(bits << (5 - bitCount)) & 31];
  return out;
}
