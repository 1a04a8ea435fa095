import { createSocket, type RemoteInfo, type Socket as UdpSocket } from "node:dgram";
import { type AddressInfo, createServer, isIPv4, isIPv6, type Server, type Socket } from "node:net";
import { type LogRecord, levelOf, logLine } from "@benchwright/shared/contract/log";

// The catch-all resolver. Under catch-all routing every TCP 80/443 from a work sandbox is DNAT'ed
// to the proxy whatever address it was meant for, so a name only has to resolve to *some* IPv4
// address for a client to try to connect: every A query is answered with one fixed address (TTL
// 5), every other type with NOERROR and no answers (no IPv6 path around the IPv4 redirect). It
// never recurses and never sends anything but the reply to the query's sender.
//
// Hand-written rather than a DNS library: answering needs the 12-byte header, one question and a
// fixed 16-byte answer record, and a parser that accepts exactly that shape (no compression
// pointers, one question, no answer or authority records) is a smaller thing to trust than a
// general decoder of every record type, and brings no dependency (nor typings) into the image.

/** Largest query accepted (UDP datagram or TCP message). A question is at most 12 + 255 + 4. */
const MAX_QUERY_BYTES = 4096;
const TTL_SECONDS = 5;
const TYPE_A = 1;
const CLASS_IN = 1;
const TCP_IDLE_MS = 10_000;
const TCP_MAX_CONNECTIONS = 256;

/**
 * The reply to one DNS query, or null when the message is not a well-formed standard query with
 * exactly one question (dropped: a response, another opcode, compression in the question name,
 * a truncated or oversized message).
 */
export function answerQuery(query: Uint8Array, answer: string): Buffer | null {
  if (!isIPv4(answer)) throw new TypeError("the answer must be an IPv4 address");
  const q = Buffer.from(query.buffer, query.byteOffset, query.byteLength);
  if (q.length < 12 + 1 + 4 || q.length > MAX_QUERY_BYTES) return null;
  const flags = q.readUInt16BE(2);
  const isResponse = (flags & 0x8000) !== 0;
  const opcode = (flags >> 11) & 0x0f;
  if (isResponse || opcode !== 0) return null;
  // One question, nothing in the answer and authority sections; an additional section (an EDNS
  // OPT record) is allowed and ignored, which RFC 6891 §7 permits a responder without EDNS to do.
  if (q.readUInt16BE(4) !== 1 || q.readUInt16BE(6) !== 0 || q.readUInt16BE(8) !== 0) return null;

  let off = 12;
  for (;;) {
    const len = q[off];
    if (len === undefined) return null;
    if (len === 0) {
      off += 1;
      break;
    }
    if ((len & 0xc0) !== 0) return null; // a pointer or a reserved label type
    off += 1 + len;
    if (off - 12 > 254) return null; // a name is at most 255 bytes, the root label included
  }
  if (off + 4 > q.length) return null;
  const qtype = q.readUInt16BE(off);
  const qclass = q.readUInt16BE(off + 2);
  const questionEnd = off + 4;
  const withAnswer = qtype === TYPE_A && qclass === CLASS_IN;

  const reply = Buffer.alloc(questionEnd + (withAnswer ? 16 : 0));
  q.copy(reply, 0, 0, 2); // id
  // QR, opcode QUERY, AA (this resolver is the authority for every name here), RD as asked,
  // RA clear (it never recurses), RCODE NOERROR.
  reply.writeUInt16BE(0x8000 | 0x0400 | (flags & 0x0100), 2);
  reply.writeUInt16BE(1, 4);
  reply.writeUInt16BE(withAnswer ? 1 : 0, 6);
  // The question exactly as sent (its letter case too: 0x20 randomisation checks it).
  q.copy(reply, 12, 12, questionEnd);
  if (withAnswer) {
    let a = questionEnd;
    a = reply.writeUInt16BE(0xc00c, a); // name: pointer to the question's
    a = reply.writeUInt16BE(TYPE_A, a);
    a = reply.writeUInt16BE(CLASS_IN, a);
    a = reply.writeUInt32BE(TTL_SECONDS, a);
    a = reply.writeUInt16BE(4, a);
    for (const octet of answer.split(".")) a = reply.writeUInt8(Number(octet), a);
  }
  return reply;
}

export interface CatchAllResolverOptions {
  host: string;
  /** 0: any free port (the same one for UDP and TCP). */
  port: number;
  /** The IPv4 address every A query is answered with. */
  answer: string;
  log?: (record: LogRecord) => void;
}

export interface CatchAllResolver {
  /** The port both the UDP and the TCP listener are bound to. */
  readonly port: number;
  close(): Promise<void>;
}

function bindUdp(socket: UdpSocket, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    socket.once("error", reject);
    socket.bind(port, host, () => {
      socket.off("error", reject);
      resolve(socket.address().port);
    });
  });
}

function listenTcp(server: Server, port: number, host: string): Promise<number> {
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve((server.address() as AddressInfo).port);
    });
  });
}

function closeUdp(socket: UdpSocket): Promise<void> {
  return new Promise((resolve) => {
    try {
      socket.close(() => resolve());
    } catch {
      resolve(); // not bound, or already closed
    }
  });
}

/** Starts the resolver on UDP and TCP (RFC 7766: a resolver answers over both). */
export async function startCatchAllResolver(options: CatchAllResolverOptions): Promise<CatchAllResolver> {
  if (!isIPv4(options.answer)) throw new TypeError("the answer must be an IPv4 address");
  const log = options.log ?? ((r) => process.stdout.write(`${logLine(levelOf(r), r)}\n`));
  const type = isIPv6(options.host) ? "udp6" : "udp4";
  // With port 0 the OS picks the UDP port, and TCP may find it taken: try again a few times.
  for (let attempt = 0; ; attempt++) {
    const udp = createSocket({ type });
    const tcp = createServer();
    const port = await bindUdp(udp, options.port, options.host);
    try {
      await listenTcp(tcp, port, options.host);
    } catch (e) {
      await closeUdp(udp);
      if (options.port === 0 && (e as { code?: string }).code === "EADDRINUSE" && attempt < 5) continue;
      throw e;
    }
    serveUdp(udp, options.answer, log);
    const sockets = serveTcp(tcp, options.answer);
    return {
      port,
      async close() {
        for (const s of sockets) s.destroy();
        await Promise.all([
          closeUdp(udp),
          new Promise<void>((resolve) => (tcp.listening ? tcp.close(() => resolve()) : resolve())),
        ]);
      },
    };
  }
}

function serveUdp(udp: UdpSocket, answer: string, log: (r: LogRecord) => void): void {
  udp.on("message", (msg: Buffer, from: RemoteInfo) => {
    if (from.port === 0) return;
    const reply = answerQuery(msg, answer);
    // Only ever to the sender of the query, and only a reply no larger than the query plus one
    // 16-byte record, so it cannot be used to amplify traffic towards someone else.
    if (reply) udp.send(reply, from.port, from.address);
  });
  udp.on("error", (e: Error & { code?: string }) => log({ event: "dns_error", code: e.code ?? e.name }));
}

function serveTcp(tcp: Server, answer: string): Set<Socket> {
  const sockets = new Set<Socket>();
  tcp.maxConnections = TCP_MAX_CONNECTIONS;
  tcp.on("connection", (socket: Socket) => {
    sockets.add(socket);
    socket.once("close", () => sockets.delete(socket));
    socket.on("error", () => socket.destroy());
    socket.setTimeout(TCP_IDLE_MS, () => socket.destroy());
    let buffered = Buffer.alloc(0);
    socket.on("data", (chunk: Buffer) => {
      buffered = Buffer.concat([buffered, chunk]);
      // Each message is framed by a 2-byte length (RFC 1035 §4.2.2); several may be pipelined.
      while (buffered.length >= 2) {
        const len = buffered.readUInt16BE(0);
        if (len > MAX_QUERY_BYTES) return void socket.destroy();
        if (buffered.length < 2 + len) break;
        const reply = answerQuery(buffered.subarray(2, 2 + len), answer);
        buffered = buffered.subarray(2 + len);
        // A malformed message on a stream leaves nothing sound to answer after it: close.
        if (!reply) return void socket.destroy();
        const framed = Buffer.alloc(2 + reply.length);
        framed.writeUInt16BE(reply.length, 0);
        reply.copy(framed, 2);
        socket.write(framed);
      }
      // A client that pipelines queries but does not read its answers: stop reading from it
      // until they drain, so its replies cannot pile up in the proxy's memory.
      if (socket.writableNeedDrain) {
        socket.pause();
        socket.once("drain", () => socket.resume());
      }
    });
  });
  return sockets;
}
