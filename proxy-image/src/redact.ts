import { Transform, type TransformCallback } from "node:stream";

// Case B7: an upstream that echoes the request back must not hand the injected credential to the
// sandbox. Every occurrence of a needle (the secret and the exact bytes injected) is masked with
// the same number of `*`, so lengths, and with them Content-Length, stay right. Matches that
// straddle chunk boundaries are caught by holding back the last (longest needle - 1) bytes.

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
  private readonly keep: number;

  constructor(private readonly needles: readonly Buffer[]) {
    super();
    this.keep = Math.max(0, ...needles.map((n) => n.length - 1));
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    const joined = maskAll(Buffer.concat([this.tail, chunk]), this.needles);
    const cut = Math.max(0, joined.length - this.keep);
    this.tail = joined.subarray(cut);
    if (cut > 0) this.push(joined.subarray(0, cut));
    done();
  }

  override _flush(done: TransformCallback): void {
    if (this.tail.length > 0) this.push(maskAll(this.tail, this.needles));
    done();
  }
}

/** Every byte form in which a secret could come back: the value and what was injected. */
export function needlesFor(secret: string, injected: string): Buffer[] {
  const forms = new Set([secret, injected, encodeURIComponent(secret)]);
  return [...forms].filter((f) => f.length >= 4).map((f) => Buffer.from(f, "latin1"));
}
