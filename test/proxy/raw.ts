import { connect as netConnect, type Socket } from "node:net";
import { type TLSSocket, connect as tlsConnect } from "node:tls";

// Raw-socket clients for the proxy tests: byte-exact requests (malformed framing, pipelining,
// requests split at chunk boundaries) that curl and undici would refuse to send or would fix up.

export interface TlsOptions {
  servername: string;
  /** PEM the client trusts (the run CA). */
  ca: string;
  /** Skip the client's host-name check (for odd SNI spellings such as `API.TEST.`). */
  skipIdentityCheck?: boolean;
}

export interface RawTarget {
  port: number;
  host?: string;
  tls?: TlsOptions;
}

export interface RawResponse {
  status: number;
  headers: Array<[string, string]>;
  body: Buffer;
}

export interface RawResult {
  /** Everything the proxy sent back. */
  bytes: Buffer;
  responses: RawResponse[];
  /** True when the proxy closed the connection (rather than the client timing out). */
  closedByPeer: boolean;
  /** TLS or socket error seen by the client, if any. */
  error: string | null;
}

export interface ExchangeOptions {
  /** Stop once this many complete responses arrived (default: wait for the peer to close). */
  expect?: number;
  /** Give up after this long (default 3000 ms). */
  timeoutMs?: number;
  /** Pause between chunks, so each is its own read on the far side (default: none). */
  gapMs?: number;
  /** Half-close the sending side after the last chunk. */
  end?: boolean;
  /** Leave the connection open afterwards (for a keep-alive follow-up on the same socket). */
  keepOpen?: boolean;
  /** Stop once the connection has been quiet this long after the last chunk was sent. */
  idleMs?: number;
}

const wait = (ms: number) => new Promise((r) => setTimeout(r, ms));

export function openSocket(target: RawTarget): Promise<Socket | TLSSocket> {
  const host = target.host ?? "127.0.0.1";
  return new Promise((resolve, reject) => {
    if (target.tls) {
      const t = target.tls;
      const s = tlsConnect({
        host,
        port: target.port,
        servername: t.servername,
        ca: t.ca,
        ...(t.skipIdentityCheck ? { checkServerIdentity: () => undefined } : {}),
      });
      s.once("secureConnect", () => resolve(s));
      s.once("error", reject);
    } else {
      const s = netConnect({ host, port: target.port });
      s.once("connect", () => resolve(s));
      s.once("error", reject);
    }
  });
}

/**
 * Opens a CONNECT tunnel through the explicit proxy port and returns the raw tunnel socket (the
 * proxy's answer consumed), or the refusal's status.
 */
export async function connectTunnel(
  explicitPort: number,
  authority: string,
): Promise<{ status: number; socket: Socket; head: string }> {
  const socket = await openSocket({ port: explicitPort });
  socket.write(`CONNECT ${authority} HTTP/1.1\r\nHost: ${authority}\r\n\r\n`);
  let buf = Buffer.alloc(0);
  return new Promise((resolve, reject) => {
    const onData = (c: Buffer) => {
      buf = Buffer.concat([buf, c]);
      const end = buf.indexOf("\r\n\r\n");
      if (end === -1) return;
      socket.off("data", onData);
      const head = buf.subarray(0, end).toString("latin1");
      const rest = buf.subarray(end + 4);
      if (rest.length > 0) socket.unshift(rest);
      resolve({ status: Number(/^HTTP\/1\.1 (\d{3})/.exec(head)?.[1] ?? 0), socket, head });
    };
    socket.on("data", onData);
    socket.once("error", reject);
    socket.once("close", () => resolve({ status: 0, socket, head: buf.toString("latin1") }));
  });
}

/** TLS over an open tunnel, with the given SNI, trusting `ca`. */
export function tlsOver(socket: Socket, options: TlsOptions): Promise<TLSSocket> {
  return new Promise((resolve, reject) => {
    const s = tlsConnect({
      socket,
      servername: options.servername,
      ca: options.ca,
      ...(options.skipIdentityCheck ? { checkServerIdentity: () => undefined } : {}),
    });
    s.once("secureConnect", () => resolve(s));
    s.once("error", reject);
  });
}

/** Sends `chunks` in order on a fresh connection (or on `socket`) and collects what comes back. */
export async function exchange(
  target: RawTarget | Socket | TLSSocket,
  chunks: ReadonlyArray<string | Buffer>,
  options: ExchangeOptions = {},
): Promise<RawResult> {
  let socket: Socket | TLSSocket;
  let error: string | null = null;
  if (!("write" in target)) {
    try {
      socket = await openSocket(target);
    } catch (e) {
      return { bytes: Buffer.alloc(0), responses: [], closedByPeer: true, error: (e as Error).message };
    }
  } else {
    socket = target;
  }
  const received: Buffer[] = [];
  let closedByPeer = socket.destroyed;
  let idle: NodeJS.Timeout | undefined;
  let sent = false;
  const quietFor = () => {
    if (options.idleMs === undefined || !sent) return;
    clearTimeout(idle);
    idle = setTimeout(() => finish(), options.idleMs);
  };
  const onData = (c: Buffer) => {
    received.push(c);
    quietFor();
    if (options.expect !== undefined && parseResponses(Buffer.concat(received)).length >= options.expect)
      finish();
  };
  const onError = (e: Error & { code?: string }) => {
    error ??= e.code ?? e.message;
  };
  const onClose = () => {
    closedByPeer = true;
    finish();
  };
  let finish = () => {};
  const done = new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, options.timeoutMs ?? 3_000);
    finish = () => {
      clearTimeout(timer);
      resolve();
    };
  });
  socket.on("data", onData);
  socket.on("error", onError);
  socket.on("close", onClose);
  if (closedByPeer) finish();
  for (const chunk of chunks) {
    if (socket.destroyed) break;
    socket.write(typeof chunk === "string" ? Buffer.from(chunk, "latin1") : chunk);
    if (options.gapMs) await wait(options.gapMs);
  }
  if (options.end && !socket.destroyed) socket.end();
  sent = true;
  quietFor();
  await done;
  clearTimeout(idle);
  socket.off("data", onData);
  socket.off("close", onClose);
  if (options.keepOpen) socket.off("error", onError);
  else socket.destroy();
  const bytes = Buffer.concat(received);
  return { bytes, responses: parseResponses(bytes), closedByPeer, error };
}

/** Parses the complete HTTP/1.1 responses at the start of `buf` (Content-Length or chunked). */
export function parseResponses(buf: Buffer): RawResponse[] {
  const out: RawResponse[] = [];
  let at = 0;
  while (at < buf.length) {
    const headEnd = buf.indexOf("\r\n\r\n", at);
    if (headEnd === -1) break;
    const lines = buf.subarray(at, headEnd).toString("latin1").split("\r\n");
    const status = Number(/^HTTP\/1\.[01] (\d{3})/.exec(lines[0] ?? "")?.[1] ?? Number.NaN);
    if (Number.isNaN(status)) break;
    const headers: Array<[string, string]> = lines.slice(1).map((l) => {
      const c = l.indexOf(":");
      return [l.slice(0, c).trim().toLowerCase(), l.slice(c + 1).trim()];
    });
    const get = (n: string) => headers.find(([k]) => k === n)?.[1];
    let bodyStart = headEnd + 4;
    let body: Buffer;
    if (get("transfer-encoding")?.toLowerCase() === "chunked") {
      const parts: Buffer[] = [];
      let p = bodyStart;
      let complete = false;
      for (;;) {
        const lineEnd = buf.indexOf("\r\n", p);
        if (lineEnd === -1) break;
        const size = Number.parseInt(buf.subarray(p, lineEnd).toString("latin1"), 16);
        if (Number.isNaN(size)) break;
        if (size === 0) {
          const trailerEnd = buf.indexOf("\r\n\r\n", lineEnd);
          if (trailerEnd === -1) break;
          p = trailerEnd + 4;
          complete = true;
          break;
        }
        if (lineEnd + 2 + size + 2 > buf.length) break;
        parts.push(buf.subarray(lineEnd + 2, lineEnd + 2 + size));
        p = lineEnd + 2 + size + 2;
      }
      if (!complete) break;
      body = Buffer.concat(parts);
      bodyStart = p;
    } else if (get("content-length") !== undefined) {
      const n = Number(get("content-length"));
      if (bodyStart + n > buf.length) break;
      body = buf.subarray(bodyStart, bodyStart + n);
      bodyStart += n;
    } else if (status === 204 || status === 304 || status < 200) {
      body = Buffer.alloc(0);
    } else {
      body = buf.subarray(bodyStart);
      bodyStart = buf.length;
    }
    out.push({ status, headers, body });
    at = bodyStart;
  }
  return out;
}

/** A request in wire form: the request line, header lines, then the body, with CRLFs. */
export function wire(requestLine: string, headerLines: readonly string[], body = ""): string {
  return `${requestLine}\r\n${headerLines.map((h) => `${h}\r\n`).join("")}\r\n${body}`;
}
