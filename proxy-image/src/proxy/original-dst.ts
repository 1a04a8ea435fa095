import type { Socket } from "node:net";

// Where a DNAT'd connection was dialled (I4): the address and port the sandbox connected to
// before an nft `dnat` rule sent it to one of the proxy's listeners. Linux keeps it in the
// connection's conntrack entry and returns it to anyone holding the socket through
// getsockopt(SOL_IP, SO_ORIGINAL_DST); no privilege is needed. Node has no API for it, so the
// call goes through koffi (an FFI package with prebuilt binaries; it stays outside the bundle,
// in node_modules beside proxy.cjs). Loaded lazily: without koffi, or off Linux, there is no
// original destination and the direct listeners refuse every connection (fail closed).

export interface Dialed {
  /** IPv4, dotted. */
  address: string;
  port: number;
}

/** The pre-DNAT destination of an accepted socket; null when it was not DNAT'd or is not IPv4. */
export type OriginalDst = (socket: Socket) => Dialed | null;

const SOL_IP = 0;
const SO_ORIGINAL_DST = 80; // linux/netfilter_ipv4.h
const SOCKADDR_IN_BYTES = 16;

type GetSockOpt = (fd: number, level: number, name: number, val: Buffer, len: number[]) => number;

/**
 * Loads the native call; null when it is not available here (not Linux, koffi missing). IPv6:
 * not read (IP6T_SO_ORIGINAL_DST is another call with another address layout); an IPv6 socket
 * gives null, so its connection is refused. The local backend disables IPv6 in work sandboxes.
 */
export async function loadOriginalDst(): Promise<OriginalDst | null> {
  if (process.platform !== "linux") return null;
  let getsockopt: GetSockOpt;
  try {
    const koffi = (await import("koffi")).default;
    const libc = koffi.load("libc.so.6");
    getsockopt = libc.func(
      "int getsockopt(int fd, int level, int name, _Out_ uint8_t *val, _Inout_ uint32_t *len)",
    ) as GetSockOpt;
  } catch {
    return null;
  }
  return (socket) => {
    // A TCP socket's libuv handle holds its file descriptor (Node documents no other way to it).
    const fd = (socket as Socket & { _handle?: { fd?: unknown } })._handle?.fd;
    if (typeof fd !== "number" || fd < 0 || socket.remoteFamily !== "IPv4") return null;
    const buf = Buffer.alloc(SOCKADDR_IN_BYTES);
    const len = [SOCKADDR_IN_BYTES];
    // ENOENT when conntrack has no NAT for it (not DNAT'd): no original destination.
    if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, buf, len) !== 0) return null;
    if (buf.readUInt16LE(0) !== 2 /* AF_INET */) return null;
    const dialed = { address: `${buf[4]}.${buf[5]}.${buf[6]}.${buf[7]}`, port: buf.readUInt16BE(2) };
    // A tracked connection that was not NAT'd reports where it arrived: nothing was redirected.
    if (dialed.address === socket.localAddress && dialed.port === socket.localPort) return null;
    return dialed;
  };
}
