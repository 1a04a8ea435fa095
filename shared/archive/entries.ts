import { createTarDecoder, type TarHeader } from "modern-tar";

// A .tar.gz as a sequence of entries, for every reader of one: the bundle check (bundle.ts), the
// Worker's upload check, bw-unpack, and the Worker reading bw-collect's archive. Web Streams only
// (workerd and Node alike); modern-tar does the tar format (ustar, PAX, GNU long names), so every
// reader sees the same names, as modern-tar produces them.
//
// What reading may cost is bounded by `maxTarBytes` of decompressed tar, counted as it leaves the
// gunzip: metadata entries (PAX, GNU long names), padding and whatever follows the end-of-archive
// marker are in no entry's size, so a bound on entry sizes alone would let a decompression bomb
// of those through. The compressed input is also fed to the gunzip in small pieces, so one read
// of the source never expands to more than a piece's worth at once (deflate peaks near 1032:1).

/** Why an archive could not be read. Not a problem of whoever consumes the entries. */
export class ArchiveError extends Error {
  constructor(
    /** `invalid`: not gzip, not a tar, truncated. `too_large`: more than `maxTarBytes` of tar. */
    readonly code: "invalid" | "too_large",
    message: string,
  ) {
    super(message);
    this.name = "ArchiveError";
  }
}

export interface TarGzEntry {
  /** As modern-tar parsed it: PAX and GNU long names applied, the ustar prefix joined. */
  header: TarHeader;
  /**
   * The entry's bytes (empty for all but regular files). Read it to its end or cancel it before
   * asking for the next entry. A failure of the archive while reading it is an ArchiveError.
   */
  body: ReadableStream<Uint8Array>;
}

/** A deflate piece expands to at most ~16 MiB. */
const PIECE_BYTES = 16 * 1024;

/**
 * The entries of a gzip-compressed tar, in order. Strict: a bad header checksum, a truncated
 * archive, or non-zero bytes after the end-of-archive marker are ArchiveErrors, not a shorter
 * list. Stopping early (break, return, an error) cancels the source.
 */
export async function* tarGzEntries(
  source: ReadableStream<Uint8Array>,
  options: { maxTarBytes: number },
): AsyncGenerator<TarGzEntry, void, undefined> {
  // The source is read here, not piped: stopping cancels it at once (a pipe would first wait for
  // a write its own backpressure holds up), and nothing reads ahead of what the gunzip takes.
  const upstream = source.getReader();
  const pieces = new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        const next = await upstream.read();
        if (next.done) return controller.close();
        for (let at = 0; at < next.value.length; at += PIECE_BYTES) {
          controller.enqueue(next.value.subarray(at, at + PIECE_BYTES));
        }
      },
      cancel: (reason) => upstream.cancel(reason),
    },
    { highWaterMark: 0 },
  );
  const entries = pieces
    .pipeThrough(new DecompressionStream("gzip"))
    .pipeThrough(boundedTo(options.maxTarBytes))
    .pipeThrough(createTarDecoder({ strict: true }));
  const reader = entries.getReader();
  try {
    while (true) {
      const next = await reader.read().catch((e: unknown) => {
        throw asArchiveError(e);
      });
      if (next.done) return;
      const inner = next.value.body.getReader();
      yield { header: next.value.header, body: guarded(inner) };
      // Whatever the consumer left unread is skipped (and still counted), so the next header can
      // come; on a body read to its end this does nothing.
      await inner.cancel().catch(() => {});
    }
  } finally {
    await upstream.cancel().catch(() => {});
    await reader.cancel().catch(() => {});
  }
}

/** An error of reading an archive, as an ArchiveError (one that already is stays as it is). */
export function asArchiveError(e: unknown): ArchiveError {
  if (e instanceof ArchiveError) return e;
  // The gunzip's errors are TypeErrors with a zlib code and often no message.
  const detail = e instanceof Error ? e.message || (e as { code?: string }).code || e.name : String(e);
  return new ArchiveError("invalid", `not a valid .tar.gz (${detail})`);
}

function boundedTo(maxBytes: number): TransformStream<Uint8Array, Uint8Array> {
  let total = 0;
  return new TransformStream({
    transform(chunk, controller) {
      total += chunk.length;
      if (total > maxBytes) {
        throw new ArchiveError("too_large", `the archive unpacks to more than ${maxBytes} bytes of tar`);
      }
      controller.enqueue(chunk);
    },
  });
}

/** The body, its read failures turned into ArchiveErrors so a consumer can tell them from its own. */
function guarded(inner: ReadableStreamDefaultReader<Uint8Array>): ReadableStream<Uint8Array> {
  return new ReadableStream<Uint8Array>(
    {
      async pull(controller) {
        let next: Awaited<ReturnType<typeof inner.read>>;
        try {
          next = await inner.read();
        } catch (e) {
          controller.error(asArchiveError(e));
          return;
        }
        if (next.done) controller.close();
        else controller.enqueue(next.value);
      },
      cancel(reason) {
        return inner.cancel(reason);
      },
    },
    { highWaterMark: 0 },
  );
}
