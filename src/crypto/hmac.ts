import { toHex } from "./api-keys";

// HMAC-SHA-256 for values the Worker derives rather than stores (a page's flash, a run's bridge
// token): the same key and message always give the same MAC. Only WebCrypto globals.

/** HMAC-SHA-256 of `message` under `key` (both UTF-8), as lowercase hex. */
export async function hmacSha256Hex(key: string, message: string): Promise<string> {
  const encoder = new TextEncoder();
  const cryptoKey = await crypto.subtle.importKey(
    "raw",
    encoder.encode(key),
    { name: "HMAC", hash: "SHA-256" },
    false,
    ["sign"],
  );
  return toHex(new Uint8Array(await crypto.subtle.sign("HMAC", cryptoKey, encoder.encode(message))));
}
