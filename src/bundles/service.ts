import { checkBundle } from "@benchwright/shared/archive/bundle";
import type { UnpackResult, UploadLimits } from "@benchwright/shared/contract/bundle";
import { bundles } from "../db/schema";
import type { Q } from "../db/types";
import { ApiError, bundleErrorCode } from "../errors";
import { type BundleRow, bundleKey, findBundle } from "./rows";

export { type BundleRow, bundleKey, findBundle } from "./rows";

// Bundles: benchmark code a user uploads (POST /v1/bundles), a .tar.gz named by its sha256 and
// kept per environment: the row in Postgres, the bytes in R2 at bundleKey().
//
// An upload is held in memory while it is hashed and checked (R2 wants the object's key, the
// hash, before its first byte, and a refused bundle must not be stored at all): at most
// BUNDLE_MAX_BYTES, which is why that setting stays well under the isolate's memory. It is held
// as the chunks it arrived in, never copied into one buffer.

/**
 * Reads an upload's body to its end, or to one byte past `maxBytes` (bundle_upload_too_large).
 * `declared`, the Content-Length, is refused before a byte is read when it is already too much.
 */
export async function readUpload(
  body: ReadableStream<Uint8Array> | null,
  declared: number | null,
  maxBytes: number,
): Promise<Uint8Array[]> {
  const tooLarge = () =>
    new ApiError("bundle_upload_too_large", `A bundle may be at most ${maxBytes} bytes (BUNDLE_MAX_BYTES).`);
  if (declared !== null && declared > maxBytes) {
    await body?.cancel().catch(() => {});
    throw tooLarge();
  }
  if (!body) throw new ApiError("bundle_invalid", "The body is empty: send the bundle's .tar.gz.");
  const chunks: Uint8Array[] = [];
  let size = 0;
  const reader = body.getReader();
  while (true) {
    const next = await reader.read();
    if (next.done) break;
    size += next.value.byteLength;
    if (size > maxBytes) {
      await reader.cancel().catch(() => {});
      throw tooLarge();
    }
    chunks.push(next.value);
  }
  if (size === 0) throw new ApiError("bundle_invalid", "The body is empty: send the bundle's .tar.gz.");
  return chunks;
}

const sizeOf = (chunks: readonly Uint8Array[]) => chunks.reduce((n, c) => n + c.byteLength, 0);

/** A stream of the chunks, one at a time (nothing copied). */
function streamOf(chunks: readonly Uint8Array[]): ReadableStream<Uint8Array> {
  let i = 0;
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      const next = chunks[i++];
      if (next) controller.enqueue(next);
      else controller.close();
    },
  });
}

async function sha256Of(chunks: readonly Uint8Array[]): Promise<string> {
  const digest = new crypto.DigestStream("SHA-256");
  await streamOf(chunks).pipeTo(digest);
  return [...new Uint8Array(await digest.digest)].map((b) => b.toString(16).padStart(2, "0")).join("");
}

/**
 * Stores an uploaded bundle for the environment: its hash, every entry checked (a refused one is
 * an ApiError with the BundleCode, nothing stored), the bytes in R2, then the row. `created`
 * false: the environment had it already (the same bytes, so the same answer).
 */
export async function storeBundle(
  bucket: R2Bucket,
  db: Q,
  environmentId: string,
  chunks: readonly Uint8Array[],
  limits: UploadLimits,
): Promise<{ bundle: BundleRow; created: boolean }> {
  const sha256 = await sha256Of(chunks);
  const known = await findBundle(db, environmentId, sha256);
  if (known) return { bundle: known, created: false };
  const checked: UnpackResult = await checkBundle(streamOf(chunks), {
    maxUnpackedBytes: limits.maxUnpackedBytes,
    maxFiles: limits.maxFiles,
  });
  if (!checked.ok) throw new ApiError(bundleErrorCode(checked.code), `Bundle refused: ${checked.message}.`);
  const size = sizeOf(chunks);
  const upload = new FixedLengthStream(size);
  // R2 first, then the row: a row never names bytes that are not there. A crash between the two
  // leaves an object the next upload of the same bytes writes again.
  const [stored] = await Promise.all([
    bucket.put(bundleKey(environmentId, sha256), upload.readable, {
      httpMetadata: { contentType: "application/gzip" },
      sha256,
    }),
    streamOf(chunks).pipeTo(upload.writable),
  ]);
  if (!stored) throw new Error("R2 refused the bundle");
  const [row] = await db
    .insert(bundles)
    .values({ environmentId, sha256, size, files: checked.files, unpackedBytes: checked.bytes })
    .onConflictDoNothing()
    .returning();
  if (row) return { bundle: row, created: true };
  // Another upload of the same bytes committed first.
  const raced = await findBundle(db, environmentId, sha256);
  if (!raced) throw new Error("bundle row vanished");
  return { bundle: raced, created: false };
}
