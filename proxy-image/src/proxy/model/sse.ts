// Server-sent events, as the WHATWG HTML standard defines the stream format: parse text into
// events incrementally (any chunking, \n, \r\n or \r line ends, comments, multi-line data) and
// write events back. Pure: the caller decodes bytes (TextDecoder with stream: true) and writes.
import type { SseEvent } from "./translate-types";

export class SseParser {
  private buf = "";
  private event: string | undefined;
  private data: string[] = [];
  private size = 0;
  // A \r at the end of a chunk may be the first half of \r\n.
  private pendingCr = false;

  /** maxEventChars bounds one event (its field lines together); past it feed() throws. */
  constructor(private readonly maxEventChars = 16 * 1024 * 1024) {}

  feed(text: string): SseEvent[] {
    let s = text;
    if (this.pendingCr) {
      if (s.startsWith("\n")) s = s.slice(1);
      this.pendingCr = false;
    }
    this.buf += s;
    const out: SseEvent[] = [];
    let start = 0;
    for (let i = 0; i < this.buf.length; i++) {
      const c = this.buf.charCodeAt(i);
      if (c !== 10 && c !== 13) continue;
      this.line(this.buf.slice(start, i), out);
      if (c === 13) {
        if (i + 1 === this.buf.length) this.pendingCr = true;
        else if (this.buf.charCodeAt(i + 1) === 10) i++;
      }
      start = i + 1;
    }
    this.buf = this.buf.slice(start);
    if (this.size + this.buf.length > this.maxEventChars) throw new Error("server-sent event too large");
    return out;
  }

  /** The stream ended: an event without its closing blank line is dropped, as the standard says. */
  end(): SseEvent[] {
    this.buf = "";
    this.data = [];
    this.event = undefined;
    this.size = 0;
    return [];
  }

  private line(line: string, out: SseEvent[]): void {
    if (line === "") {
      if (this.data.length > 0) {
        const e: SseEvent = { data: this.data.join("\n") };
        if (this.event !== undefined) e.event = this.event;
        out.push(e);
      }
      this.data = [];
      this.event = undefined;
      this.size = 0;
      return;
    }
    if (line.startsWith(":")) return;
    const colon = line.indexOf(":");
    const field = colon === -1 ? line : line.slice(0, colon);
    let value = colon === -1 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    this.size += line.length;
    if (this.size > this.maxEventChars) throw new Error("server-sent event too large");
    if (field === "data") this.data.push(value);
    else if (field === "event") this.event = value;
    // id and retry mean nothing to a model stream; other fields are ignored by the standard.
  }
}

/** One event as text, ending with the blank line that dispatches it. */
export function formatSse(e: SseEvent): string {
  const head = e.event === undefined ? "" : `event: ${e.event}\n`;
  return `${head}${e.data
    .split(/\r\n|\r|\n/)
    .map((l) => `data: ${l}\n`)
    .join("")}\n`;
}
