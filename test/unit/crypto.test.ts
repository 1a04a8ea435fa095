import { KeyRingError, parseKeyRing } from "@benchwright/shared/contract/key-ring";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import {
  API_KEY_DISPLAY_PREFIX_LENGTH,
  generateApiKey,
  hashApiKey,
  looksLikeApiKey,
  looksLikeRandomId,
  randomId,
  timingSafeEqualHex,
} from "../../src/crypto/api-keys";
import {
  decryptSecret,
  encryptSecret,
  fingerprintSecret,
  keyIdOf,
  type SecretAad,
  VaultDecryptError,
  type VaultDecryptFailure,
} from "../../src/crypto/vault-crypto";

function randomKeyBase64(): string {
  return Buffer.from(crypto.getRandomValues(new Uint8Array(32))).toString("base64");
}

const K1 = randomKeyBase64();
const K2 = randomKeyBase64();
const ringK1 = parseKeyRing(`k1:${K1}`);
const ringK2K1 = parseKeyRing(`k2:${K2},k1:${K1}`);

const aadA: SecretAad = { userId: "usr_a", environmentId: "env_a", secretId: "sec_a" };
const aadB: SecretAad = { userId: "usr_b", environmentId: "env_b", secretId: "sec_b" };

// Resolves to the failure reason; fails the test if decryption returns anything.
async function decryptFailure(
  ring: ReturnType<typeof parseKeyRing>,
  aad: SecretAad,
  blob: string,
): Promise<VaultDecryptFailure> {
  try {
    const plaintext = await decryptSecret(ring, aad, blob);
    throw new Error(`decryption unexpectedly succeeded (${plaintext.length} chars)`);
  } catch (error) {
    if (!(error instanceof VaultDecryptError)) throw error;
    return error.reason;
  }
}

function messageOf(fn: () => unknown): string {
  try {
    fn();
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
  throw new Error("expected a throw");
}

// Every base64url character plus separators and near misses, for exhaustive tampering.
const REPLACEMENT_CHARS = [..."ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_", ..."=.+/ "];

const b64url = (bytes: Uint8Array) => Buffer.from(bytes).toString("base64url");
const fromB64url = (text: string) => new Uint8Array(Buffer.from(text, "base64url"));

describe("vault envelope encryption", () => {
  it("round-trips values, including empty and non-ASCII ones", async () => {
    for (const value of ["sk-live-123", "", "päss wörd 🔑", "x".repeat(10_000), "a.b.c\0d"]) {
      const blob = await encryptSecret(ringK1, aadA, value);
      expect(blob).toMatch(
        /^v1\.k1\.[A-Za-z0-9_-]{16}\.[A-Za-z0-9_-]{64}\.[A-Za-z0-9_-]{16}\.[A-Za-z0-9_-]+$/,
      );
      expect(await decryptSecret(ringK1, aadA, blob)).toBe(value);
    }
  });

  it("case B8: a blob for (userB, envB, secretB) fails as (userA, envA, secretA)", async () => {
    const blob = await encryptSecret(ringK1, aadB, "tenant-b-secret");
    expect(await decryptFailure(ringK1, aadA, blob)).toBe("authentication_failed");
    expect(await decryptSecret(ringK1, aadB, blob)).toBe("tenant-b-secret");
  });

  it.each([
    ["secretId", { ...aadB, secretId: "sec_other" }],
    ["environmentId", { ...aadB, environmentId: "env_other" }],
    ["userId", { ...aadB, userId: "usr_other" }],
  ])("case B8: a blob fails when only %s differs", async (_field, aad) => {
    const blob = await encryptSecret(ringK1, aadB, "tenant-b-secret");
    expect(await decryptFailure(ringK1, aad, blob)).toBe("authentication_failed");
  });

  it("case B8: the AAD encoding is injective (no separator games between fields)", async () => {
    const blob = await encryptSecret(ringK1, { userId: "u", environmentId: "e\0x", secretId: "s" }, "v");
    const shifted = { userId: "u", environmentId: "e", secretId: "x\0s" };
    expect(await decryptFailure(ringK1, shifted, blob)).toBe("authentication_failed");
    const glued = await encryptSecret(ringK1, { userId: "u", environmentId: "env_ab", secretId: "c" }, "v");
    const regrouped = { userId: "u", environmentId: "env_a", secretId: "bc" };
    expect(await decryptFailure(ringK1, regrouped, glued)).toBe("authentication_failed");
    // Distinct lone surrogates would collapse to U+FFFD in UTF-8, so they are refused outright.
    await expect(encryptSecret(ringK1, { ...aadA, secretId: "sec_\uD800" }, "v")).rejects.toThrow(TypeError);
  });

  it("case B8: swapping the wrapped key of another blob fails", async () => {
    const one = (await encryptSecret(ringK1, aadA, "one")).split(".");
    const two = (await encryptSecret(ringK1, aadA, "two")).split(".");
    const mixed = [...one.slice(0, 2), ...two.slice(2, 4), ...one.slice(4)].join(".");
    expect(await decryptFailure(ringK1, aadA, mixed)).toBe("authentication_failed");
  });

  it("case B8: a flipped bit in any byte of each binary part fails authentication", async () => {
    const blob = await encryptSecret(ringK1, aadA, "flip-me");
    const parts = blob.split(".");
    for (let part = 2; part < parts.length; part++) {
      const bytes = fromB64url(parts[part] as string);
      for (let i = 0; i < bytes.length; i++) {
        for (const bit of [0x01, 0x80]) {
          const flipped = bytes.slice();
          flipped[i] = (flipped[i] as number) ^ bit;
          const tampered = parts.with(part, b64url(flipped)).join(".");
          expect(await decryptFailure(ringK1, aadA, tampered), `part ${part} byte ${i}`).toBe(
            "authentication_failed",
          );
        }
      }
    }
  });

  // ~10,000 decryptions; run concurrently and with a generous timeout for slow CI machines.
  it("case B8: any changed character anywhere in the blob is refused, never a wrong plaintext", {
    timeout: 30_000,
  }, async () => {
    const blob = await encryptSecret(ringK1, aadA, "flip-me");
    const tampered: string[] = [];
    for (let i = 0; i < blob.length; i++) {
      for (const replacement of REPLACEMENT_CHARS) {
        if (blob[i] !== replacement) tampered.push(blob.slice(0, i) + replacement + blob.slice(i + 1));
      }
    }
    const reasons = await Promise.all(tampered.map((text) => decryptFailure(ringK1, aadA, text)));
    expect(reasons.length).toBeGreaterThan(blob.length * 60);
    expect(new Set(reasons)).toEqual(new Set(["malformed", "unknown_key", "authentication_failed"]));
  });

  it("case B8: a blob relabelled with another key id of the ring fails authentication", async () => {
    const blob = await encryptSecret(ringK1, aadA, "value");
    const relabelled = blob.replace(/^v1\.k1\./, "v1.k2.");
    expect(await decryptFailure(ringK2K1, aadA, relabelled)).toBe("authentication_failed");
  });

  it("case B8: the key id is authenticated (same key material under two ids)", async () => {
    const twins = parseKeyRing(`k1:${K1},k2:${K1}`);
    const blob = await encryptSecret(twins, aadA, "value");
    const relabelled = blob.replace(/^v1\.k1\./, "v1.k2.");
    expect(await decryptFailure(twins, aadA, relabelled)).toBe("authentication_failed");
  });

  it.each([
    ["empty", ""],
    ["one part", "hello"],
    ["too few parts", "v1.k1.AAAA.AAAA"],
    ["too many parts", "v1.k1.a.b.c.d.e"],
  ])("rejects a malformed blob (%s)", async (_label, blob) => {
    expect(await decryptFailure(ringK1, aadA, blob)).toBe("malformed");
    expect(() => keyIdOf(blob)).toThrow(VaultDecryptError);
  });

  it("rejects blobs with a bad version, encoding or part length as malformed", async () => {
    const parts = (await encryptSecret(ringK1, aadA, "value")).split(".");
    const shortCiphertext = b64url(new Uint8Array(15));
    const variants = [
      parts.with(0, "v2"),
      parts.with(1, "k.1"),
      parts.with(1, ""),
      parts.with(5, `${parts[5]}=`),
      parts.with(5, ` ${parts[5]}`),
      parts.with(4, (parts[4] as string).replace(/^./, "+")),
      parts.with(2, b64url(new Uint8Array(11))),
      parts.with(3, b64url(new Uint8Array(47))),
      parts.with(4, b64url(new Uint8Array(16))),
      parts.with(5, shortCiphertext),
      parts.with(5, ""),
    ];
    for (const variant of variants) {
      expect(await decryptFailure(ringK1, aadA, variant.join(".")), variant.join(".")).toBe("malformed");
    }
  });

  it("case B8: nonces and IVs are unique across 1,000 encryptions of the same value", async () => {
    const blobs = await Promise.all(
      Array.from({ length: 1000 }, () => encryptSecret(ringK1, aadA, "same value")),
    );
    const wrapIvs = new Set(blobs.map((blob) => blob.split(".")[2]));
    const ivs = new Set(blobs.map((blob) => blob.split(".")[4]));
    const wrappedKeys = new Set(blobs.map((blob) => blob.split(".")[3]));
    const ciphertexts = new Set(blobs.map((blob) => blob.split(".")[5]));
    expect(wrapIvs.size).toBe(1000);
    expect(ivs.size).toBe(1000);
    expect(wrappedKeys.size).toBe(1000);
    expect(ciphertexts.size).toBe(1000);
    // IVs are not reused across the two layers either.
    expect(new Set([...wrapIvs, ...ivs]).size).toBe(2000);
  });

  it("case B9: a rotated ring decrypts old blobs and encrypts new ones with the new key", async () => {
    const old = await encryptSecret(ringK1, aadA, "before rotation");
    expect(keyIdOf(old)).toBe("k1");
    expect(await decryptSecret(ringK2K1, aadA, old)).toBe("before rotation");

    const fresh = await encryptSecret(ringK2K1, aadA, "after rotation");
    expect(ringK2K1.currentKeyId).toBe("k2");
    expect(keyIdOf(fresh)).toBe("k2");
    expect(await decryptSecret(ringK2K1, aadA, fresh)).toBe("after rotation");
    // A ring that has not been rotated yet cannot read the new blob.
    expect(await decryptFailure(ringK1, aadA, fresh)).toBe("unknown_key");
  });

  it("case B9: a ring without k1 fails on old blobs with unknown_key", async () => {
    const old = await encryptSecret(ringK1, aadA, "before rotation");
    const ringK2 = parseKeyRing(`k2:${K2}`);
    await expect(decryptSecret(ringK2, aadA, old)).rejects.toMatchObject({
      name: "VaultDecryptError",
      reason: "unknown_key",
      keyId: "k1",
    });
  });

  it("case B9: the same key id with a different key fails authentication", async () => {
    const old = await encryptSecret(ringK1, aadA, "value");
    const impostor = parseKeyRing(`k1:${randomKeyBase64()}`);
    expect(await decryptFailure(impostor, aadA, old)).toBe("authentication_failed");
  });

  it("refuses rings that did not come from parseKeyRing", async () => {
    const fake = { currentKeyId: "k1", keyIds: ["k1"] };
    await expect(encryptSecret(fake, aadA, "v")).rejects.toThrow(TypeError);
  });
});

describe("parseKeyRing", () => {
  it("parses entries in order, with whitespace, padded or unpadded base64", () => {
    const unpadded = K2.replace(/=+$/, "");
    const ring = parseKeyRing(` k2:${unpadded} , k1:${K1}\n`);
    expect(ring.currentKeyId).toBe("k2");
    expect(ring.keyIds).toEqual(["k2", "k1"]);
  });

  it("accepts the URL-safe base64 alphabet", () => {
    const url = Buffer.from(K1, "base64").toString("base64url");
    expect(parseKeyRing(`k1:${url}`).keyIds).toEqual(["k1"]);
  });

  const short = Buffer.alloc(16, 7).toString("base64");
  const long = Buffer.alloc(33, 7).toString("base64");
  it.each([
    ["empty", "", /empty/],
    ["blank", "  \n", /empty/],
    ["empty entry", `k1:${K1},`, /entry 2 of 2 is empty/],
    ["no colon", K1, /entry 1 of 1 is malformed/],
    ["bad base64 character", `k1:${K1.slice(0, -2)}!=`, /not valid base64/],
    ["non-canonical base64", `k1:${K1.slice(0, -2)}B=`, /not valid base64/],
    ["bad padding", `k1:${K1}=`, /not valid base64/],
    ["too short", `k1:${short}`, /16 bytes; expected 32/],
    ["too long", `k1:${long}`, /33 bytes; expected 32/],
    ["duplicate id", `k1:${K1},k1:${K2}`, /repeats key id "k1"/],
    ["empty id", `:${K1}`, /invalid key id/],
    ["id with a dot", `k.1:${K1}`, /invalid key id/],
    ["id too long", `${"k".repeat(33)}:${K1}`, /invalid key id/],
    ["reversed entry", `${K1}:k1`, /invalid key id/],
  ])("rejects %s with a clear message that never contains key material", (_label, text, pattern) => {
    const message = messageOf(() => parseKeyRing(text));
    expect(message).toMatch(pattern);
    for (const key of [K1, K2, short, long]) {
      expect(message).not.toContain(key);
      expect(message).not.toContain(key.slice(0, 12));
    }
    expect(() => parseKeyRing(text)).toThrow(KeyRingError);
  });

  it("case B5: a ring holds no key material that logging or serialising could reveal", async () => {
    const ring = parseKeyRing(`k2:${K2},k1:${K1}`);
    await encryptSecret(ring, aadA, "warm the cache");
    const shown = JSON.stringify(ring) + JSON.stringify(Object.getOwnPropertyNames(ring));
    const hex1 = Buffer.from(K1, "base64").toString("hex");
    for (const secret of [K1, K2, hex1]) expect(shown).not.toContain(secret);
  });
});

describe("case B5: a canary secret never leaks", () => {
  const canary = "CANARY-7f3a9c-do-not-leak";

  it("case B5: the canary is absent from the blob, in any encoding", async () => {
    const blob = await encryptSecret(ringK1, aadA, canary);
    const variants = [
      canary,
      Buffer.from(canary).toString("base64url"),
      Buffer.from(canary).toString("base64"),
      Buffer.from(canary).toString("hex"),
      "CANARY",
    ];
    for (const variant of variants) expect(blob).not.toContain(variant);
    for (let i = 0; i < 3; i++) {
      const tail = Buffer.from(canary.slice(i)).toString("base64url").slice(2, 20);
      expect(blob).not.toContain(tail);
    }
  });

  it("case B5: the fingerprint is fp_<kid>_<16 hex>, stable, keyed, and canary-free", async () => {
    const fingerprint = await fingerprintSecret(ringK1, canary);
    expect(fingerprint).toMatch(/^fp_k1_[0-9a-f]{16}$/);
    expect(fingerprint).not.toContain("CANARY");
    expect(await fingerprintSecret(parseKeyRing(`k1:${K1}`), canary)).toBe(fingerprint);
    expect(await fingerprintSecret(ringK1, `${canary}x`)).not.toBe(fingerprint);
    // Keyed by the current KEK: a plain hash of the value does not reveal it.
    const plainHash = Buffer.from(await crypto.subtle.digest("SHA-256", Buffer.from(canary)));
    expect(fingerprint).not.toContain(plainHash.toString("hex").slice(0, 16));
    const rotated = await fingerprintSecret(ringK2K1, canary);
    expect(rotated).toMatch(/^fp_k2_[0-9a-f]{16}$/);
    expect(rotated.slice(-16)).not.toBe(fingerprint.slice(-16));
  });

  it("case B5: no thrown error message contains the canary", async () => {
    const blob = await encryptSecret(ringK1, aadA, canary);
    const messages: string[] = [];
    const collect = async (attempt: Promise<unknown>) => {
      try {
        await attempt;
        throw new Error("expected a failure");
      } catch (error) {
        messages.push(String(error), (error as Error).stack ?? "");
      }
    };
    const parts = blob.split(".");
    const ct = fromB64url(parts[5] as string);
    ct[0] = (ct[0] as number) ^ 1;
    await collect(decryptSecret(ringK1, aadB, blob));
    await collect(decryptSecret(ringK1, { ...aadA, secretId: "sec_x" }, blob));
    await collect(decryptSecret(parseKeyRing(`k9:${K2}`), aadA, blob));
    await collect(decryptSecret(parseKeyRing(`k1:${K2}`), aadA, blob));
    await collect(decryptSecret(ringK1, aadA, parts.with(5, b64url(ct)).join(".")));
    await collect(decryptSecret(ringK1, aadA, blob.slice(0, -1)));
    await collect(encryptSecret(ringK1, aadA, `${canary}\uD800`));
    await collect(encryptSecret(ringK1, { ...aadA, userId: "" }, canary));
    expect(messages.length).toBe(16);
    for (const message of messages) {
      expect(message).not.toContain("CANARY");
      expect(message).not.toContain(K1);
      expect(message).not.toContain(K2);
    }
  });
});

describe("API keys", () => {
  it("generates bw_ + 43 base64url characters with a 10-character display prefix", () => {
    const { key, prefix } = generateApiKey();
    expect(key).toMatch(/^bw_[A-Za-z0-9_-]{43}$/);
    expect(Buffer.from(key.slice(3), "base64url").length).toBe(32);
    expect(prefix).toBe(key.slice(0, 10));
    expect(prefix.length).toBe(API_KEY_DISPLAY_PREFIX_LENGTH);
    expect(looksLikeApiKey(key)).toBe(true);
  });

  it("generates distinct keys", () => {
    const keys = new Set(Array.from({ length: 1000 }, () => generateApiKey().key));
    expect(keys.size).toBe(1000);
  });

  it("hashes to SHA-256 hex, deterministic and key-dependent", async () => {
    expect(await hashApiKey("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    const { key } = generateApiKey();
    const hash = await hashApiKey(key);
    expect(hash).toMatch(/^[0-9a-f]{64}$/);
    expect(await hashApiKey(key)).toBe(hash);
    expect(await hashApiKey(`${key.slice(0, -1)}${key.endsWith("A") ? "E" : "A"}`)).not.toBe(hash);
  });

  it.each([
    ["empty", ""],
    ["no prefix", "x".repeat(46)],
    ["wrong prefix", `sk_${"A".repeat(43)}`],
    ["too short", `bw_${"A".repeat(42)}`],
    ["too long", `bw_${"A".repeat(44)}`],
    ["padding", `bw_${"A".repeat(42)}=`],
    ["standard base64 alphabet", `bw_${"A".repeat(41)}+A`],
    ["non-canonical last character", `bw_${"A".repeat(42)}B`],
    ["trailing newline", `bw_${"A".repeat(43)}\n`],
  ])("looksLikeApiKey rejects %s", (_label, text) => {
    expect(looksLikeApiKey(text)).toBe(false);
  });

  it("looksLikeApiKey rejects non-strings", () => {
    expect(looksLikeApiKey(undefined)).toBe(false);
    expect(looksLikeApiKey(42)).toBe(false);
  });

  it("timingSafeEqualHex compares equal and unequal values", async () => {
    const a = await hashApiKey("one");
    const b = await hashApiKey("two");
    expect(timingSafeEqualHex(a, a.slice())).toBe(true);
    expect(timingSafeEqualHex(a, b)).toBe(false);
    expect(timingSafeEqualHex(a, a.slice(0, -1))).toBe(false);
    expect(timingSafeEqualHex(a.slice(0, -1), a)).toBe(false);
    expect(timingSafeEqualHex("", "")).toBe(true);
    expect(timingSafeEqualHex("", "00")).toBe(false);
    expect(timingSafeEqualHex("ab", "AB")).toBe(false);
    // A shorter input whose missing tail would read as NaN must not compare equal.
    expect(timingSafeEqualHex("ab", "ab\0")).toBe(false);
  });

  it("timingSafeEqualHex agrees with === (property)", () => {
    fc.assert(
      fc.property(fc.string(), fc.string(), (a, b) => {
        expect(timingSafeEqualHex(a, b)).toBe(a === b);
        expect(timingSafeEqualHex(a, a)).toBe(true);
      }),
    );
  });
});

describe("randomId", () => {
  it.each(["usr_", "env_", "key_", "sec_", "rul_", "hst_"])("makes %s ids", (prefix) => {
    const id = randomId(prefix);
    expect(id).toMatch(new RegExp(`^${prefix}[a-z2-7]{26}$`));
    expect(looksLikeRandomId(prefix, id)).toBe(true);
  });

  it("accepts the prefix without its underscore", () => {
    expect(randomId("sec")).toMatch(/^sec_[a-z2-7]{26}$/);
    expect(looksLikeRandomId("sec", randomId("sec_"))).toBe(true);
  });

  it("makes distinct ids", () => {
    const ids = new Set(Array.from({ length: 1000 }, () => randomId("usr_")));
    expect(ids.size).toBe(1000);
  });

  it.each(["", "_", "Sec_", "sec__", "se-c_", "1sec_", "a".repeat(17)])("rejects prefix %j", (prefix) => {
    expect(() => randomId(prefix)).toThrow(TypeError);
  });

  it.each([
    ["another prefix", "env_aaaaaaaaaaaaaaaaaaaaaaaaaa"],
    ["upper case", "usr_AAAAAAAAAAAAAAAAAAAAAAAAAA"],
    ["too short", "usr_aaaaaaaaaaaaaaaaaaaaaaaaa"],
    ["non-canonical last character", "usr_aaaaaaaaaaaaaaaaaaaaaaaaab"],
    ["path traversal", "usr_../../aaaaaaaaaaaaaaaaaaaaa"],
  ])("looksLikeRandomId rejects %s", (_label, text) => {
    expect(looksLikeRandomId("usr_", text)).toBe(false);
  });
});
