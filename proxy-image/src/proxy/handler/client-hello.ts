import type { Socket } from "node:net";

// The first flight of a TLS connection, read before any handshake so the splice decision can be
// made on its SNI (RFC 8446 §4.1.2, RFC 6066 §3). Hand-written rather than a dependency: the
// proxy needs one field of one message, npm's ClientHello parsers are unmaintained fingerprinting
// toys, and a parser that accepts only a well-formed ClientHello (every length consistent, no
// duplicate extension, at most one host name) is a smaller thing to trust than a general TLS
// decoder. Anything it does not accept is not spliced: the connection is terminated as before,
// and OpenSSL then parses (or refuses) the very same bytes.

/** A ClientHello needs no more than this (post-quantum key shares included, with room to spare). */
export const MAX_HELLO_BYTES = 32 * 1024;

const RECORD_HANDSHAKE = 0x16;
const HANDSHAKE_CLIENT_HELLO = 0x01;
const EXT_SERVER_NAME = 0x0000;
/** Encrypted ClientHello (draft-ietf-tls-esni) and its predecessor ESNI: the real name is hidden. */
const EXT_ECH = 0xfe0d;
const EXT_ESNI = 0xffce;

export type HelloParse =
  | { status: "more" }
  | { status: "invalid"; why: string }
  | {
      status: "done";
      /** The host_name the client sent, as sent (not yet canonical); null when none. */
      sni: string | null;
      /** The client encrypts its real ClientHello: the visible SNI is not the host it wants. */
      ech: boolean;
    };

/** Parses the bytes read so far: "more" until the whole ClientHello is in. */
export function parseClientHello(buf: Buffer): HelloParse {
  // Reassemble the handshake message from as many handshake records as it spans.
  const parts: Buffer[] = [];
  let have = 0;
  let need: number | null = null;
  let at = 0;
  while (need === null || have < need) {
    if (buf.length < at + 5) return { status: "more" };
    if (buf[at] !== RECORD_HANDSHAKE) return { status: "invalid", why: "not a TLS handshake record" };
    if (buf[at + 1] !== 0x03) return { status: "invalid", why: "not a TLS record version" };
    const length = buf.readUInt16BE(at + 3);
    if (length === 0 || length > 16_384) return { status: "invalid", why: "bad record length" };
    if (buf.length < at + 5 + length) return { status: "more" };
    parts.push(buf.subarray(at + 5, at + 5 + length));
    have += length;
    at += 5 + length;
    if (need === null && have >= 4) {
      const head = Buffer.concat(parts);
      if (head[0] !== HANDSHAKE_CLIENT_HELLO) return { status: "invalid", why: "not a ClientHello" };
      need = 4 + head.readUIntBE(1, 3);
      if (need > MAX_HELLO_BYTES) return { status: "invalid", why: "ClientHello too large" };
    }
  }
  // The ClientHello must end with its record: nothing else may share it.
  if (have !== need) return { status: "invalid", why: "data after the ClientHello in its record" };
  return parseBody(Buffer.concat(parts).subarray(4));
}

function parseBody(b: Buffer): HelloParse {
  const r = new Reader(b);
  const bad = (why: string): HelloParse => ({ status: "invalid", why });
  if (!r.skip(2 + 32)) return bad("truncated version/random");
  const session = r.vector(1);
  if (!session || session.length > 32) return bad("bad session id");
  const suites = r.vector(2);
  if (!suites || suites.length === 0 || suites.length % 2 !== 0) return bad("bad cipher suites");
  const compression = r.vector(1);
  if (!compression || compression.length === 0) return bad("bad compression methods");
  if (r.done()) return { status: "done", sni: null, ech: false }; // no extensions at all (TLS 1.2)
  const extensions = r.vector(2);
  if (!extensions || !r.done()) return bad("bad extensions block");

  const ext = new Reader(extensions);
  const seen = new Set<number>();
  let sni: string | null = null;
  let ech = false;
  while (!ext.done()) {
    const type = ext.u16();
    const data = ext.vector(2);
    if (type === null || !data) return bad("truncated extension");
    if (seen.has(type)) return bad("duplicate extension"); // RFC 8446 §4.2
    seen.add(type);
    if (type === EXT_ECH || type === EXT_ESNI) ech = true;
    if (type !== EXT_SERVER_NAME) continue;
    const list = new Reader(data);
    const names = list.vector(2);
    if (!names || !list.done()) return bad("bad server_name extension");
    const entries = new Reader(names);
    const nameType = entries.u8();
    const name = entries.vector(2);
    // One host_name entry (type 0), nothing after it (RFC 6066: one name per type; no other type
    // is defined, so anything else is not a ClientHello to relay on trust of its name).
    if (nameType !== 0 || !name || !entries.done()) return bad("server_name is not exactly one host name");
    if (name.length === 0 || name.length > 253 || !/^[A-Za-z0-9._-]+$/.test(name.toString("latin1")))
      return bad("server_name is not an ASCII host name");
    sni = name.toString("latin1");
  }
  return { status: "done", sni, ech };
}

class Reader {
  private at = 0;
  constructor(private readonly b: Buffer) {}
  done(): boolean {
    return this.at === this.b.length;
  }
  skip(n: number): boolean {
    if (this.at + n > this.b.length) return false;
    this.at += n;
    return true;
  }
  u8(): number | null {
    return this.at + 1 <= this.b.length ? (this.b[this.at++] as number) : null;
  }
  u16(): number | null {
    if (this.at + 2 > this.b.length) return null;
    const v = this.b.readUInt16BE(this.at);
    this.at += 2;
    return v;
  }
  /** A length-prefixed vector (1- or 2-byte length); null when it runs past the end. */
  vector(lengthBytes: 1 | 2): Buffer | null {
    const n = lengthBytes === 1 ? this.u8() : this.u16();
    if (n === null || this.at + n > this.b.length) return null;
    const out = this.b.subarray(this.at, this.at + n);
    this.at += n;
    return out;
  }
}

export interface ReadHello {
  /** Every byte read from the socket, in order: the ClientHello and anything behind it. */
  bytes: Buffer;
  parse: Exclude<HelloParse, { status: "more" }>;
}

/**
 * Reads from `socket` until the ClientHello is complete (or cannot be one), then pauses it: only
 * the first flight is buffered. Rejects when the socket ends or errs first, or on the deadline.
 */
export function readClientHello(socket: Socket, timeoutMs: number): Promise<ReadHello> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let length = 0;
    const stop = () => {
      clearTimeout(timer);
      socket.off("data", onData);
      socket.off("end", onEnd);
      socket.off("close", onEnd);
      socket.off("error", onError);
      socket.pause();
    };
    const onData = (chunk: Buffer) => {
      chunks.push(chunk);
      length += chunk.length;
      const bytes = Buffer.concat(chunks, length);
      // Past twice the bound (a ClientHello cut into tiny records, say) it is not read further.
      const parse = length > 2 * MAX_HELLO_BYTES ? null : parseClientHello(bytes);
      if (parse?.status === "more") return;
      stop();
      resolve({ bytes, parse: parse ?? { status: "invalid", why: "ClientHello too large" } });
    };
    const onEnd = () => {
      stop();
      reject(new Error("the client closed before its ClientHello"));
    };
    const onError = (e: Error) => {
      stop();
      reject(e);
    };
    const timer = setTimeout(() => {
      stop();
      reject(new Error("no ClientHello in time"));
    }, timeoutMs);
    socket.on("data", onData);
    socket.once("end", onEnd);
    socket.once("close", onEnd);
    socket.once("error", onError);
  });
}
