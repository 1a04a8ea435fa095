import { encodeBase64Url } from "../crypto/api-keys";
import { PATH_COMPONENT } from "./settings";

// The pull credential of one environment's setup images (the kubelet pulls a sandbox0 pod's image
// with it, from a pull Secret the sandbox0 backend makes): a basic credential whose username is
// the environment's id and whose password is an HMAC-SHA256 of that id under a key derived from
// REGISTRY_SIGNING_KEY. Stateless: the realm (routes/registry-token.ts) recomputes it, nothing is
// stored, and rotating the signing key revokes every one. It is only ever exchanged for a pull
// token on that environment's own repository (never push, never another's: cases P2, P3).
// WebCrypto only.

const LABEL = "benchwright registry pull credential v1\n";

async function hmacKey(signingKeyText: string): Promise<CryptoKey> {
  // Derived, not the signing key itself: a different key for a different job.
  const material = await crypto.subtle.digest("SHA-256", utf8(`${LABEL}${signingKeyText}`));
  return crypto.subtle.importKey("raw", material, { name: "HMAC", hash: "SHA-256" }, false, [
    "sign",
    "verify",
  ]);
}

/** The environment's pull password (the username is the environment's id). */
export async function pullPassword(signingKeyText: string, environmentId: string): Promise<string> {
  if (!PATH_COMPONENT.test(environmentId)) throw new Error("environment id is not a repository component");
  const mac = await crypto.subtle.sign("HMAC", await hmacKey(signingKeyText), utf8(environmentId));
  return encodeBase64Url(new Uint8Array(mac));
}

/**
 * The environment a request's `Authorization: Basic …` credential is the pull credential of, or
 * null (absent, malformed, or not ours). Compared in constant time (HMAC verify).
 */
export async function pullCredentialEnvironment(
  signingKeyText: string,
  authorization: string | undefined,
): Promise<string | null> {
  const match = /^Basic ([A-Za-z0-9+/=]{1,1024})$/.exec(authorization?.trim() ?? "");
  if (!match) return null;
  let text: string;
  try {
    text = atob(match[1] as string);
  } catch {
    return null;
  }
  const colon = text.indexOf(":");
  if (colon <= 0) return null;
  const environmentId = text.slice(0, colon);
  const password = text.slice(colon + 1);
  if (!PATH_COMPONENT.test(environmentId) || !/^[A-Za-z0-9_-]{43}$/.test(password)) return null;
  const mac = Uint8Array.from(atob(`${password.replaceAll("-", "+").replaceAll("_", "/")}=`), (ch) =>
    ch.charCodeAt(0),
  );
  const ok = await crypto.subtle.verify("HMAC", await hmacKey(signingKeyText), mac, utf8(environmentId));
  return ok ? environmentId : null;
}

const utf8 = (text: string) => new TextEncoder().encode(text);
