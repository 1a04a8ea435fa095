import { Transform, type TransformCallback } from "node:stream";
import { maskAll } from "../redact";
import type { SseEvent } from "./translate";

/** Bound on one SSE event (and on a JSON body the lane reads whole). */
export const MAX_EVENT_BYTES = 16 * 1024 * 1024;

/**
 * What becomes of one upstream event: passed on as it came ("keep"), dropped, or replaced by
 * these events (a translation; none is a drop too).
 */
export type Verdict = "keep" | "drop" | SseEvent[];

const LF = 0x0a;
const CR = 0x0d;
const LF_BYTE = Buffer.from([LF]);

/** One event in the wire form: `event:` when named, a `data:` line per line of data. */
export function serializeEvent(e: SseEvent): Buffer {
  const lines = e.data.split(/\r\n|\r|\n/).map((l) => `data: ${l}\n`);
  return Buffer.from(`${e.event === undefined ? "" : `event: ${e.event}\n`}${lines.join("")}\n`, "utf8");
}

/**
 * Server-sent events, handled one whole event at a time as they arrive (never the whole
 * stream): each event goes to `onEvent`, which keeps, drops or replaces it, and whatever is
 * passed on is masked as a unit. A secret is printable ASCII, so no form of it spans an event
 * boundary and nothing has to be held back past the end of an event. Lines end in LF, CRLF or
 * CR, split anywhere. `onEnd` adds closing events when the upstream ends (a translation's).
 */
export class SseFilter extends Transform {
  private line: Buffer[] = [];
  private lineBytes = 0;
  private event: Buffer[] = [];
  private eventBytes = 0;
  private data: Buffer[] = [];
  private name: string | undefined;
  // The last chunk ended in CR: an LF first in the next one belongs to the same line end.
  private afterCr = false;
  private lastKept = true;

  constructor(
    private readonly needles: readonly Buffer[],
    private readonly onEvent: (e: SseEvent) => Verdict,
    private readonly onEnd: () => SseEvent[] = () => [],
    private readonly maxEventBytes = MAX_EVENT_BYTES,
  ) {
    super();
  }

  override _transform(chunk: Buffer, _enc: BufferEncoding, done: TransformCallback): void {
    let start = 0;
    if (this.afterCr) {
      this.afterCr = false;
      if (chunk[0] === LF) {
        start = 1;
        if (this.event.length > 0) {
          this.event.push(LF_BYTE);
          this.eventBytes++;
        } else if (this.lastKept) this.push(LF_BYTE);
      }
    }
    for (let i = start; i < chunk.length; i++) {
      const b = chunk[i];
      if (b !== LF && b !== CR) continue;
      let end = i + 1;
      if (b === CR) {
        if (i + 1 === chunk.length) this.afterCr = true;
        else if (chunk[i + 1] === LF) end = i + 2;
      }
      this.endLine(chunk.subarray(start, i), chunk.subarray(i, end));
      start = end;
      i = end - 1;
    }
    if (start < chunk.length) {
      this.line.push(chunk.subarray(start));
      this.lineBytes += chunk.length - start;
    }
    const tooLarge = this.lineBytes + this.eventBytes > this.maxEventBytes;
    done(tooLarge ? new Error(`an event of more than ${this.maxEventBytes} bytes`) : null);
  }

  override _flush(done: TransformCallback): void {
    // An event the stream did not finish is not dispatched (as a client would not). Passed on
    // as it came when events are kept as they come; a translation has no use for half of one.
    const rest = [...this.event, ...this.line];
    if (rest.length > 0 && this.lastKept) this.push(maskAll(Buffer.concat(rest), this.needles));
    let closing: SseEvent[] = [];
    try {
      closing = this.onEnd();
    } catch {}
    for (const e of closing) this.push(maskAll(serializeEvent(e), this.needles));
    done();
  }

  private endLine(tail: Buffer, ending: Buffer): void {
    const content = this.line.length > 0 ? Buffer.concat([...this.line, tail]) : tail;
    this.line = [];
    this.lineBytes = 0;
    if (content.length > 0) {
      this.event.push(content, ending);
      this.eventBytes += content.length + ending.length;
      const colon = content.indexOf(0x3a);
      const field = (colon === -1 ? content : content.subarray(0, colon)).toString("latin1");
      let value = colon === -1 ? Buffer.alloc(0) : content.subarray(colon + 1);
      if (value[0] === 0x20) value = value.subarray(1);
      if (field === "data") this.data.push(value);
      else if (field === "event") this.name = value.toString("utf8");
      return;
    }
    // A blank line ends the event; one without data (a comment, a keep-alive) is passed on.
    let verdict: Verdict = "keep";
    if (this.data.length > 0) {
      const parts: Buffer[] = [];
      for (const [i, d] of this.data.entries()) parts.push(...(i > 0 ? [LF_BYTE, d] : [d]));
      const data = Buffer.concat(parts).toString("utf8");
      try {
        verdict = this.onEvent(this.name === undefined ? { data } : { event: this.name, data });
      } catch {
        verdict = "keep";
      }
    }
    const raw = Buffer.concat([...this.event, ending]);
    this.event = [];
    this.eventBytes = 0;
    this.data = [];
    this.name = undefined;
    this.lastKept = verdict === "keep";
    if (verdict === "keep") this.push(maskAll(raw, this.needles));
    else if (verdict !== "drop") for (const e of verdict) this.push(maskAll(serializeEvent(e), this.needles));
  }
}
