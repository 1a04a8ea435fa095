import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import {
  createServer as createHttpServer,
  type Server as HttpServer,
  request as httpRequest,
  type IncomingMessage,
} from "node:http";
import { request as httpsRequest } from "node:https";
import {
  type AddressInfo,
  connect,
  createServer,
  type LookupFunction,
  type Server,
  type Socket,
} from "node:net";
import type { Duplex } from "node:stream";
import type { LogRecord } from "@benchwright/shared/contract/log";

// `bw-bridge`: how a work sandbox on E2B reaches its run's proxy sandbox. E2B lets nothing into a
// sandbox but HTTP(S) and WebSocket through its edge (`https://<port>-<sandboxId>.<domain>`), so
// each TCP connection a work sandbox makes to the proxy (to 127.0.0.1:443 or :80, where the hosts
// file or the catch-all redirect sends it) is carried as one WebSocket to the proxy sandbox:
//
//   work sandbox                                       proxy sandbox
//   client → 127.0.0.1:443 → bw-bridge connect ══wss══> bw-bridge serve /tls → 127.0.0.1:8443 (proxy)
//   client → 127.0.0.1:80  → bw-bridge connect ══wss══> bw-bridge serve /http → 127.0.0.1:8080
//
// The bytes inside are the client's own (its TLS, with its SNI), so the proxy sees what it would
// see on a direct connection. The edge admits the WebSocket only with the proxy sandbox's traffic
// token (it is created with public traffic off), and `serve` admits it only with the run's bridge
// token on top. Neither token is anything but a key to this one door: neither controls compute
// nor unlocks a credential (those stay in the proxy process's memory).
//
// The WebSocket framing (RFC 6455) is written here rather than taken from a library: binary
// frames, masking, ping/pong and close are all a byte pipe needs, in fewer lines than a
// dependency's audit. Tests talk to it with the `ws` package as the independent implementation.

export const BRIDGE_TOKEN_HEADER = "x-benchwright-bridge";
/** The E2B edge's header for a sandbox created with public traffic off. */
export const EDGE_TOKEN_HEADER = "e2b-traffic-access-token";
export const BRIDGE_PATHS = { tls: "/tls", http: "/http" } as const;
const WS_GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11";
/** Largest frame accepted; a byte pipe's frames are at most a socket read (64 KiB) in practice. */
const MAX_FRAME = 4 * 1024 * 1024;
const HANDSHAKE_TIMEOUT_MS = 10_000;

const OP = { continuation: 0x0, text: 0x1, binary: 0x2, close: 0x8, ping: 0x9, pong: 0xa } as const;

export function acceptKey(key: string): string {
  return createHash("sha1").update(`${key}${WS_GUID}`).digest("base64");
}

/** One frame, FIN set; masked (with a fresh key) when `mask`, as a client must send. */
export function encodeFrame(opcode: number, payload: Buffer, mask: boolean): Buffer {
  const len = payload.length;
  const lenBytes = len < 126 ? 0 : len < 65_536 ? 2 : 8;
  const head = Buffer.alloc(2 + lenBytes + (mask ? 4 : 0));
  head[0] = 0x80 | opcode;
  head[1] = (mask ? 0x80 : 0) | (lenBytes === 0 ? len : lenBytes === 2 ? 126 : 127);
  if (lenBytes === 2) head.writeUInt16BE(len, 2);
  if (lenBytes === 8) head.writeBigUInt64BE(BigInt(len), 2);
  if (!mask) return Buffer.concat([head, payload]);
  const key = randomBytes(4);
  key.copy(head, 2 + lenBytes);
  const body = Buffer.from(payload);
  for (let i = 0; i < body.length; i++) body[i] = (body[i] as number) ^ (key[i & 3] as number);
  return Buffer.concat([head, body]);
}

export interface Frame {
  fin: boolean;
  opcode: number;
  payload: Buffer;
}

/**
 * Splits a byte stream into frames. `masked` is what the peer must do (a server requires masked
 * frames from its client, a client unmasked ones from its server); anything else is an error.
 */
export class FrameReader {
  private buf: Buffer = Buffer.alloc(0);
  constructor(private readonly masked: boolean) {}

  push(chunk: Buffer): Frame[] {
    this.buf = this.buf.length === 0 ? chunk : Buffer.concat([this.buf, chunk]);
    const frames: Frame[] = [];
    for (;;) {
      if (this.buf.length < 2) break;
      const b0 = this.buf[0] as number;
      const b1 = this.buf[1] as number;
      if ((b0 & 0x70) !== 0) throw new Error("reserved bits set (no extension was negotiated)");
      if (Boolean(b1 & 0x80) !== this.masked)
        throw new Error(this.masked ? "unmasked frame" : "masked frame");
      let len = b1 & 0x7f;
      let at = 2;
      if (len === 126) {
        if (this.buf.length < 4) break;
        len = this.buf.readUInt16BE(2);
        at = 4;
      } else if (len === 127) {
        if (this.buf.length < 10) break;
        const big = this.buf.readBigUInt64BE(2);
        if (big > BigInt(MAX_FRAME)) throw new Error("frame too large");
        len = Number(big);
        at = 10;
      }
      if (len > MAX_FRAME) throw new Error("frame too large");
      const keyAt = at;
      if (this.masked) at += 4;
      if (this.buf.length < at + len) break;
      const payload = Buffer.from(this.buf.subarray(at, at + len));
      if (this.masked) {
        for (let i = 0; i < len; i++) {
          payload[i] = (payload[i] as number) ^ (this.buf[keyAt + (i & 3)] as number);
        }
      }
      frames.push({ fin: Boolean(b0 & 0x80), opcode: b0 & 0x0f, payload });
      this.buf = this.buf.subarray(at + len);
    }
    return frames;
  }
}

/**
 * Joins a WebSocket (already upgraded, `head` its first bytes) and a TCP socket: data frames to
 * bytes, bytes to binary frames, close to end, ping to pong. `client`: this side masks.
 */
export function splice(ws: Duplex, head: Buffer, tcp: Socket, client: boolean): void {
  const reader = new FrameReader(!client);
  let closeSent = false;
  const sendClose = (payload: Buffer) => {
    if (closeSent || ws.destroyed) return;
    closeSent = true;
    ws.end(encodeFrame(OP.close, payload, client));
  };
  const abort = () => {
    tcp.destroy();
    ws.destroy();
  };
  // Whichever side ends first, the other is ended gracefully (what was written still arrives),
  // and destroyed a little later if it does not finish by itself.
  const later = (s: Duplex) => setTimeout(() => s.destroy(), 5_000).unref();
  const onBytes = (chunk: Buffer) => {
    let frames: Frame[];
    try {
      frames = reader.push(chunk);
    } catch {
      abort();
      return;
    }
    for (const f of frames) {
      if (f.opcode === OP.binary || f.opcode === OP.continuation || f.opcode === OP.text) {
        tcp.write(f.payload);
      } else if (f.opcode === OP.ping) {
        if (!closeSent) ws.write(encodeFrame(OP.pong, f.payload, client));
      } else if (f.opcode === OP.close) {
        sendClose(f.payload.subarray(0, 2));
        tcp.end();
      }
    }
  };
  ws.on("data", onBytes);
  if (head.length > 0) onBytes(head);
  tcp.on("data", (chunk: Buffer) => {
    if (!closeSent && !ws.destroyed) ws.write(encodeFrame(OP.binary, chunk, client));
  });
  tcp.on("end", () => sendClose(Buffer.from([0x03, 0xe8]))); // 1000: normal closure
  tcp.on("close", () => {
    sendClose(Buffer.from([0x03, 0xe8]));
    later(ws);
  });
  ws.on("close", () => {
    tcp.end();
    later(tcp);
  });
  ws.on("error", abort);
  tcp.on("error", abort);
}

function tokenMatches(given: string | string[] | undefined, expected: string): boolean {
  if (typeof given !== "string") return false;
  const a = Buffer.from(given);
  const b = Buffer.from(expected);
  return a.length === b.length && timingSafeEqual(a, b);
}

function refuse(socket: Duplex, status: string): void {
  socket.end(`HTTP/1.1 ${status}\r\nConnection: close\r\nContent-Length: 0\r\n\r\n`);
}

export interface ServeOptions {
  host: string;
  port: number;
  token: string;
  /** Where each path goes, on this sandbox's loopback: the proxy's TLS and HTTP listeners. */
  targets: { tls: number; http: number };
  targetHost?: string;
  log?: (record: LogRecord) => void;
}

/** The proxy sandbox's end: WebSocket upgrades with the bridge token become TCP to the proxy. */
export function serve(o: ServeOptions): Promise<HttpServer> {
  const server = createHttpServer((_req, res) => {
    res.writeHead(404, { "content-length": "0" }).end();
  });
  server.on("upgrade", (req: IncomingMessage, socket: Duplex, head: Buffer) => {
    socket.on("error", () => socket.destroy());
    const path = (req.url ?? "").split("?")[0];
    const target =
      path === BRIDGE_PATHS.tls ? o.targets.tls : path === BRIDGE_PATHS.http ? o.targets.http : null;
    const key = req.headers["sec-websocket-key"];
    if (target === null) return refuse(socket, "404 Not Found");
    if (!tokenMatches(req.headers[BRIDGE_TOKEN_HEADER], o.token)) {
      o.log?.({ event: "bridge_refused", reason: "token" });
      return refuse(socket, "403 Forbidden");
    }
    if (
      req.method !== "GET" ||
      (req.headers.upgrade ?? "").toLowerCase() !== "websocket" ||
      req.headers["sec-websocket-version"] !== "13" ||
      typeof key !== "string" ||
      Buffer.from(key, "base64").length !== 16
    ) {
      return refuse(socket, "400 Bad Request");
    }
    const tcp = connect({ host: o.targetHost ?? "127.0.0.1", port: target });
    tcp.once("connect", () => {
      socket.write(
        "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n" +
          `Sec-WebSocket-Accept: ${acceptKey(key)}\r\n\r\n`,
      );
      splice(socket, head, tcp, false);
    });
    tcp.once("error", () => refuse(socket, "502 Bad Gateway"));
  });
  return new Promise((resolve, reject) => {
    server.once("error", reject);
    server.listen(o.port, o.host, () => resolve(server));
  });
}

export interface ConnectOptions {
  /** The proxy sandbox's bridge, e.g. https://8090-<sandboxId>.e2b.app */
  url: string;
  token: string;
  /** The proxy sandbox's E2B traffic token, when its public traffic is off. */
  edgeToken?: string;
  host: string;
  ports: { tls: number; http: number };
  /** Tests: certificates for the edge stand-in, and its name resolved to loopback. */
  ca?: string;
  lookup?: LookupFunction;
}

/** The work sandbox's end: each local connection becomes one WebSocket to the proxy sandbox. */
export async function forward(o: ConnectOptions): Promise<{ tls: Server; http: Server }> {
  const base = new URL(o.url);
  if (base.protocol !== "https:" && base.protocol !== "http:")
    throw new Error("the bridge URL is not http(s)");
  const open = (path: string, local: Socket) => {
    local.pause();
    const key = randomBytes(16).toString("base64");
    const headers: Record<string, string> = {
      connection: "Upgrade",
      upgrade: "websocket",
      "sec-websocket-version": "13",
      "sec-websocket-key": key,
      [BRIDGE_TOKEN_HEADER]: o.token,
    };
    if (o.edgeToken) headers[EDGE_TOKEN_HEADER] = o.edgeToken;
    const req = (base.protocol === "https:" ? httpsRequest : httpRequest)(new URL(path, base), {
      method: "GET",
      headers,
      timeout: HANDSHAKE_TIMEOUT_MS,
      ...(o.ca ? { ca: o.ca } : {}),
      ...(o.lookup ? { lookup: o.lookup } : {}),
    });
    req.on("upgrade", (res, socket, head) => {
      req.setTimeout(0);
      if (res.headers["sec-websocket-accept"] !== acceptKey(key)) {
        socket.destroy();
        local.destroy();
        return;
      }
      splice(socket, head, local, true);
      local.resume();
    });
    req.on("response", (res) => {
      res.resume();
      local.destroy();
    });
    req.on("timeout", () => req.destroy());
    req.on("error", () => local.destroy());
    local.on("error", () => req.destroy());
    req.end();
  };
  const listen = (port: number, path: string) =>
    new Promise<Server>((resolve, reject) => {
      const server = createServer((local) => open(path, local));
      server.once("error", reject);
      server.listen(port, o.host, () => resolve(server));
    });
  const tls = await listen(o.ports.tls, BRIDGE_PATHS.tls);
  const http = await listen(o.ports.http, BRIDGE_PATHS.http);
  return { tls, http };
}

export const portOf = (server: Server) => (server.address() as AddressInfo).port;
