import { Transform, type TransformCallback } from "node:stream";

// Case B7: an upstream that echoes the request back must not hand the injected credential to the
// sandbox. Every occurrence of a needle (each form of the secret and of the exact bytes injected,
// needlesFor) is masked with the same number of `*`, so lengths, and with them Content-Length,
// stay right. Matches that straddle chunk boundaries are caught by holding back a chunk's end
// while it could be the start of a needle. The proxy's main path and its model lane both mask
// with these.

export function maskAll(input: Buffer, needles: readonly Buffer[]): Buffer {
  let out: Buffer | null = null;
  for (const needle of needles) {
    if (needle.length === 0) continue;
    let at = (out ?? input).indexOf(needle);
    while (at !== -1) {
      out ??= Buffer.from(input);
      out.fill(0x2a, at, at + needle.length);
      at = out.indexOf(needle, at + needle.length);
    }
  }
  return out ?? input;
}

export function maskString(value: string, needles: readonly Buffer[]): string {
  const buf = Buffer.from(value, "latin1");
  const masked = maskAll(buf, needles);
  return masked === buf ? value : masked.toString("latin1");
}

export class RedactStream extends Transform {
  private tail: Buffer = Buffer.alloc(0);

  constructor(private readonly needles: readonly Buffer[]) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    const joined = maskAll(Buffer.concat([this.tail, chunk]), this.needles);
    // Held back: only an end that could be the start of a needle the next chunk completes. A
    // fixed (longest needle - 1) would hold every streamed message's last bytes until the next
    // one, stalling an interactive stream (a bidirectional gRPC call, server-sent events).
    const cut = joined.length - partialAtEnd(joined, this.needles);
    this.tail = joined.subarray(cut);
    if (cut > 0) this.push(joined.subarray(0, cut));
    done();
  }

  override _flush(done: TransformCallback): void {
    if (this.tail.length > 0) this.push(maskAll(this.tail, this.needles));
    done();
  }
}

/** The length of the longest end of `buf` that is a proper prefix of a needle (0: none). */
function partialAtEnd(buf: Buffer, needles: readonly Buffer[]): number {
  let longest = 0;
  for (const needle of needles) {
    for (let k = Math.min(needle.length - 1, buf.length); k > longest; k--) {
      if (buf.subarray(buf.length - k).equals(needle.subarray(0, k))) {
        longest = k;
        break;
      }
    }
  }
  return longest;
}

/**
 * Every byte form in which a credential could come back (case I9), the one list for the main path
 * and the model lane alike: the secret and the exact text injected, each as it is, URL-encoded
 * (percent and form encoding), JSON-escaped, and JSON-escaped with `\/` for `/` (an echo inside a
 * JSON body, as some serialisers write it). Forms shorter than 4 bytes are left alone.
 */
export function needlesFor(secret: string, injected: string): Buffer[] {
  const forms = new Set<string>();
  for (const value of [secret, injected]) {
    const json = JSON.stringify(value).slice(1, -1);
    forms.add(value);
    forms.add(encodeURIComponent(value));
    forms.add(new URLSearchParams([["x", value]]).toString().slice(2));
    forms.add(json);
    forms.add(json.replaceAll("/", "\\/"));
  }
  // The secret's forms first: masked inside the injected text, they leave `Bearer ***` readable.
  return [...forms].filter((f) => f.length >= 4).map((f) => Buffer.from(f, "latin1"));
}
