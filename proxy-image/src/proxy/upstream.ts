import { lookup as dnsLookup } from "node:dns/promises";
import { isIP, connect as netConnect, type Socket } from "node:net";
import type { Duplex } from "node:stream";
import { createSecureContext, rootCertificates, connect as tlsConnect } from "node:tls";
import type { createAddressPolicy } from "@benchwright/shared/node/address-policy";
import { type TunnelClient, TunnelError, tunnelConnect } from "./tunnel-client";
import { buildConnector, Pool } from "./undici";

// Upstream connections: resolve once, check every answer (A12, A13), dial exactly the checked
// address with the original name for SNI and certificate verification (B3). Pools belong to this
// proxy (one run), so an upstream connection is never shared across runs (B6).

export type ResolveResult =
  | { ok: true; address: string; port: number }
  | { ok: false; reason: string; kind: "dns" | "address" | "blocked" };

/** The block entry naming a resolved address, or null (PolicyIndex.blockedAddress, case I5). */
export type AddressBlocker = (address: string) => string | null;

export interface UpstreamOptions {
  addressPolicy: ReturnType<typeof createAddressPolicy>;
  /** Extra trust roots for upstream TLS, on top of the system's (tests: the suite's own CA). */
  extraCaPem?: string | undefined;
  /** Test-only: host → "ip:port", replacing DNS and the port for the suite's own test hosts. */
  testRoutes?: ReadonlyMap<string, { address: string; port: number }> | undefined;
  dialTimeoutMs?: number;
  dnsTimeoutMs?: number;
  /** Injectable for tests of DNS failure (E5) and rebinding (A13). */
  lookup?: (host: string) => Promise<string[]>;
  /** The egress tunnel to the user's machine, for hosts routed through it. */
  tunnel?: TunnelClient | undefined;
}

/** Per upstream origin, direct or through the tunnel alike. */
const POOL_LIMITS = {
  connections: 64,
  pipelining: 1,
  keepAliveTimeout: 30_000,
  headersTimeout: 60_000,
  bodyTimeout: 300_000,
} as const;

const systemLookup = async (host: string): Promise<string[]> =>
  (await dnsLookup(host, { all: true, verbatim: true })).map((a) => a.address);

function withTimeout<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what} timed out after ${ms} ms`)), ms);
  });
  return Promise.race([p, timeout]).finally(() => clearTimeout(timer));
}

export function createUpstream(options: UpstreamOptions) {
  const ca = options.extraCaPem ? [...rootCertificates, options.extraCaPem] : [...rootCertificates];
  // Parsed once: handing `ca` to every dial made Node re-parse ~150 roots per new upstream
  // connection (~25 ms of blocked event loop each, measured by the bench).
  const secureContext = createSecureContext({ ca });
  const lookup = options.lookup ?? systemLookup;
  const pools = new Map<string, Pool>();
  // The address policy is fixed for the proxy's life, and its BlockList checks allocate per call:
  // each address's verdict is kept (bounded: cleared when full).
  const verdicts = new Map<string, ReturnType<UpstreamOptions["addressPolicy"]["check"]>>();
  const addressVerdict = (address: string) => {
    let verdict = verdicts.get(address);
    if (verdict === undefined) {
      if (verdicts.size >= 1024) verdicts.clear();
      verdict = options.addressPolicy.check(address);
      verdicts.set(address, verdict);
    }
    return verdict;
  };

  async function resolve(host: string, port: number, blocked?: AddressBlocker): Promise<ResolveResult> {
    const bare = host.replace(/^\[|\]$/g, "");
    const route = options.testRoutes?.get(host);
    let answers: string[];
    let dialPort = port;
    if (route) {
      answers = [route.address];
      dialPort = route.port;
    } else if (isIP(bare)) {
      answers = [bare];
    } else {
      try {
        answers = await withTimeout(lookup(host), options.dnsTimeoutMs ?? 5_000, "DNS lookup");
      } catch (e) {
        return { ok: false, kind: "dns", reason: `DNS lookup failed: ${(e as Error).message.slice(0, 120)}` };
      }
      if (answers.length === 0) return { ok: false, kind: "dns", reason: "DNS returned no addresses" };
    }
    // Every answer must pass: an answer set that mixes public and private addresses is a
    // rebinding attempt, not a choice to make for the sandbox.
    for (const address of answers) {
      const entry = blocked?.(address) ?? null;
      if (entry !== null) return { ok: false, kind: "blocked", reason: `${address} is blocked by ${entry}` };
      const verdict = addressVerdict(address);
      if (!verdict.allowed) return { ok: false, kind: "address", reason: `${address} is ${verdict.reason}` };
    }
    return { ok: true, address: answers[0] as string, port: dialPort };
  }

  /** A pool that dials exactly `address` and verifies TLS against `host`. */
  function poolFor(protocol: "https:" | "http:", host: string, address: string, port: number): Pool {
    const key = `${protocol}//${host}:${port}@${address}`;
    let pool = pools.get(key);
    if (!pool) {
      const family = isIP(address);
      const fixedLookup = (
        _h: string,
        opts: { all?: boolean },
        cb: (err: Error | null, a: string | Array<{ address: string; family: number }>, f?: number) => void,
      ) => (opts.all ? cb(null, [{ address, family }]) : cb(null, address, family));
      const connect = buildConnector({
        secureContext,
        timeout: options.dialTimeoutMs ?? 10_000,
        lookup: fixedLookup as never,
        rejectUnauthorized: true,
        // HTTP/2 when the origin offers it in ALPN, else HTTP/1.1 (I1: gRPC needs h2 end to end).
        allowH2: true,
        ...(isIP(host.replace(/^\[|\]$/g, "")) ? {} : { servername: host }),
      });
      const origin = `${protocol}//${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}:${port}`;
      pool = new Pool(origin, { ...POOL_LIMITS, allowH2: true, connect });
      pools.set(key, pool);
    }
    return pool;
  }

  /**
   * A pool whose connections go through the egress tunnel: the user's agent resolves and checks
   * the address on its side (it refuses with a TunnelError), this proxy verifies `host`'s TLS
   * end to end inside the tunnel (B3). Null when this proxy has no tunnel.
   */
  function tunnelPoolFor(protocol: "https:" | "http:", host: string, port: number): Pool | null {
    const tunnel = options.tunnel;
    if (!tunnel) return null;
    const key = `tunnel ${protocol}//${host}:${port}`;
    let pool = pools.get(key);
    if (!pool) {
      const origin = `${protocol}//${host.includes(":") && !host.startsWith("[") ? `[${host}]` : host}:${port}`;
      const connect = tunnelConnect(tunnel, { secureContext, timeoutMs: options.dialTimeoutMs ?? 15_000 });
      pool = new Pool(origin, { ...POOL_LIMITS, connect: connect as never });
      pools.set(key, pool);
    }
    return pool;
  }

  /**
   * A raw TCP connection to exactly `address` (already checked by resolve), for a spliced TLS
   * connection: the client's own handshake goes through it untouched. Resolves once connected.
   */
  function dialRaw(address: string, port: number): Promise<Socket> {
    return new Promise((resolve, reject) => {
      const socket = netConnect({ host: address, port, family: isIP(address) });
      settleDial(socket, "connect", options.dialTimeoutMs ?? 10_000, resolve, reject);
    });
  }

  /**
   * A raw stream to `host`:`port` through the egress tunnel, for a spliced TLS connection of a
   * tunnelled host: the user's agent resolves and checks the address on its side (a refusal is a
   * TunnelError), and the client's own handshake goes through the stream untouched.
   */
  function dialTunnelRaw(host: string, port: number): Promise<Duplex> {
    return dialOnce("http:", host, null, port);
  }

  /**
   * One fresh connection for one `Upgrade` request (I2): https verified against `host` like a
   * pool's (ALPN http/1.1 only), http in clear; to exactly `address` (already checked by
   * resolve), or through the egress tunnel when `address` is null. Never pooled: after the
   * upgrade it belongs to one client connection. Resolves once connected (and TLS is verified).
   */
  function dialOnce(
    protocol: "https:" | "http:",
    host: string,
    address: string | null,
    port: number,
  ): Promise<Duplex> {
    const servername = isIP(host.replace(/^\[|\]$/g, "")) ? {} : { servername: host };
    if (address === null) {
      const tunnel = options.tunnel;
      if (!tunnel) return Promise.reject(new TunnelError("down", "no egress tunnel"));
      const connect = tunnelConnect(tunnel, { secureContext, timeoutMs: options.dialTimeoutMs ?? 15_000 });
      return new Promise((resolve, reject) =>
        connect({ protocol, hostname: host, port, ...servername }, (e, s) =>
          e || !s ? reject(e ?? new Error("no connection")) : resolve(s),
        ),
      );
    }
    if (protocol === "http:") return dialRaw(address, port);
    return new Promise((resolve, reject) => {
      const socket = tlsConnect({
        host: address,
        port,
        ...servername,
        secureContext,
        rejectUnauthorized: true,
        ALPNProtocols: ["http/1.1"],
      });
      settleDial(socket, "secureConnect", options.dialTimeoutMs ?? 10_000, resolve, reject);
    });
  }

  async function closeAll(): Promise<void> {
    const all = [...pools.values()];
    pools.clear();
    await Promise.allSettled(all.map((p) => p.destroy()));
  }

  return {
    resolve,
    poolFor,
    tunnelPoolFor,
    dialRaw,
    dialTunnelRaw,
    dialOnce,
    /** Whether the tunnel is paired with the user's agent now. */
    tunnelUp: () => options.tunnel?.up === true,
    closeAll,
  };
}

export type Upstream = ReturnType<typeof createUpstream>;

/** A dial settled once: `event` resolves it, an error or the deadline (the socket destroyed) rejects it. */
function settleDial<S extends Socket>(
  socket: S,
  event: "connect" | "secureConnect",
  timeoutMs: number,
  resolve: (socket: S) => void,
  reject: (e: Error) => void,
): void {
  const timer = setTimeout(() => {
    socket.destroy();
    reject(Object.assign(new Error("dial timed out"), { code: "ETIMEDOUT" }));
  }, timeoutMs);
  const onError = (e: Error) => {
    clearTimeout(timer);
    reject(e);
  };
  socket.once("error", onError);
  socket.once(event, () => {
    clearTimeout(timer);
    socket.off("error", onError);
    resolve(socket);
  });
}
