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

/** maskAll into `buf` itself, for a buffer nothing else reads (a chunk the proxy owns). */
export function maskInPlace(buf: Buffer, needles: readonly Buffer[]): Buffer {
  for (const needle of needles) {
    if (needle.length === 0) continue;
    for (let at = buf.indexOf(needle); at !== -1; at = buf.indexOf(needle, at + needle.length))
      buf.fill(0x2a, at, at + needle.length);
  }
  return buf;
}

export function maskString(value: string, needles: readonly Buffer[]): string {
  const buf = Buffer.from(value, "latin1");
  const masked = maskAll(buf, needles);
  return masked === buf ? value : masked.toString("latin1");
}

/**
 * The masking of one body, chunk by chunk, with the hold-back rule: only an end that could be the
 * start of a needle the next chunk completes waits for it. A fixed (longest needle - 1) would hold
 * every streamed message's last bytes until the next one, stalling an interactive stream (a
 * bidirectional gRPC call, server-sent events). `inPlace`: the chunks are the caller's to change
 * (the proxy's relay); otherwise a chunk with a match is copied first.
 */
export class Redactor {
  private tail: Buffer | null = null;

  constructor(
    private readonly needles: readonly Buffer[],
    private readonly inPlace = false,
  ) {}

  /** What may go out now of everything seen so far (possibly empty), masked. */
  push(chunk: Buffer): Buffer {
    const joined = this.tail === null ? chunk : Buffer.concat([this.tail, chunk]);
    // A joined buffer is a copy already.
    const masked =
      this.inPlace || joined !== chunk ? maskInPlace(joined, this.needles) : maskAll(joined, this.needles);
    const cut = masked.length - partialAtEnd(masked, this.needles);
    this.tail = cut < masked.length ? masked.subarray(cut) : null;
    return cut === masked.length ? masked : masked.subarray(0, cut);
  }

  /** What was held back, at the end of the body (null: nothing). */
  end(): Buffer | null {
    const tail = this.tail;
    this.tail = null;
    return tail === null ? null : maskAll(tail, this.needles);
  }
}

export class RedactStream extends Transform {
  private readonly redactor: Redactor;

  constructor(needles: readonly Buffer[]) {
    super();
    this.redactor = new Redactor(needles);
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    const out = this.redactor.push(chunk);
    if (out.length > 0) this.push(out);
    done();
  }

  override _flush(done: TransformCallback): void {
    const tail = this.redactor.end();
    if (tail !== null) this.push(tail);
    done();
  }
}

/** The length of the longest end of `buf` that is a proper prefix of a needle (0: none). */
function partialAtEnd(buf: Buffer, needles: readonly Buffer[]): number {
  let longest = 0;
  const n = buf.length;
  for (const needle of needles) {
    if (needle.length === 0) continue;
    const first = needle[0];
    // Longest candidate first: the end of length k starts at n - k.
    for (let at = n - Math.min(needle.length - 1, n); at < n - longest; at++) {
      if (buf[at] === first && buf.compare(needle, 0, n - at, at, n) === 0) {
        longest = n - at;
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
  // Asked per request with the same few (secret, injected) pairs: built once per pair. Frozen, as
  // every caller shares the list; bounded, as a rule's injected text may differ per request.
  const key = `${secret}\u0000${injected}`;
  const known = needleCache.get(key);
  if (known) return known;
  if (needleCache.size >= NEEDLE_CACHE_MAX) needleCache.clear();
  const built = Object.freeze(buildNeedles(secret, injected)) as Buffer[];
  needleCache.set(key, built);
  return built;
}

const NEEDLE_CACHE_MAX = 256;
const needleCache = new Map<string, Buffer[]>();

function buildNeedles(secret: string, injected: string): Buffer[] {
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
