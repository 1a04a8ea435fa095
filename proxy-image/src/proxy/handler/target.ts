import type { IncomingMessage } from "node:http";
import { isIP } from "node:net";
import { TLSSocket } from "node:tls";
import { canonicalHost, splitHostPort } from "@benchwright/shared/contract/host-name";
import type { Listener } from "./record";
import { bad, misdirected, Refusal } from "./refusal";

// What the client asked for: one canonical host, a port, a scheme and a path, from the signals
// its connection and request carry (TLS SNI, the CONNECT target, the Host header, an
// absolute-form URL). Any two signals that disagree are refused here, before policy sees a host
// (A7–A10). Nothing here consults the policy.

export interface Target {
  host: string;
  port: number;
  scheme: "https" | "http";
  path: string;
}

/** What the connection itself said before any request: its way in and its CONNECT target. */
export interface TargetConn {
  listener: Listener;
  /** CONNECT target (explicit proxy), canonical. */
  connectHost?: string;
  connectPort?: number;
}

/** The CONNECT request's target (`host:port`), or null when it is not one. */
export function connectTarget(url: string | undefined): ReturnType<typeof splitHostPort> {
  return splitHostPort(url ?? "");
}

/**
 * The host a TLS connection is for, from its ClientHello's SNI, before any handshake: what the
 * splice decision is about. Null when no usable name was sent (none, an IP literal, not a valid
 * host) or it differs from the CONNECT target; such a connection is terminated, where the same
 * checks refuse it readably (421) or the handshake fails.
 */
export function helloTarget(sni: string | null, conn: TargetConn): string | null {
  if (sni === null) return null;
  const host = canonicalHost(sni);
  // An IP in any spelling (`2130706433` is 127.0.0.1): RFC 6066 allows names only.
  if (!host || isIP(host.replace(/^\[|\]$/g, ""))) return null;
  if (conn.connectHost !== undefined && host !== conn.connectHost) return null;
  if ((conn.connectPort ?? 443) !== 443) return null;
  return host;
}

/** Works out which host this request is for, refusing any disagreement between the signals. */
export function targetOf(req: IncomingMessage, conn: TargetConn): Target {
  const hostValues = hostHeaderValues(req.rawHeaders);
  if (hostValues.length !== 1) throw bad(400, `expected one Host header, got ${hostValues.length}`);
  const hostHeader = splitHostPort(hostValues[0] as string);
  if (!hostHeader) throw bad(400, "Host header is not a valid host");
  const url = req.url ?? "";

  if (conn.listener === "explicit" && !(req.socket instanceof TLSSocket)) {
    // Absolute-form through the explicit proxy port: plain http only (https goes via CONNECT).
    let abs: URL;
    try {
      abs = new URL(url);
    } catch {
      throw bad(400, "a proxy request needs an absolute http:// URL");
    }
    if (abs.protocol !== "http:") throw bad(400, "only http:// absolute-form; use CONNECT for https");
    const host = canonicalHost(abs.host);
    if (!host) throw bad(400, "request URL host is not valid");
    if (host !== hostHeader.host) throw bad(400, "request URL host and Host header disagree"); // case A9
    const port = abs.port ? Number(abs.port) : 80;
    // A Host without a port means port 80: `http://h:8080/` with `Host: h` disagrees too.
    if ((hostHeader.port ?? 80) !== port) throw bad(400, "Host port disagrees with URL");
    return { host, port, scheme: "http", path: `${abs.pathname}${abs.search}` };
  }

  let authority: string;
  let port: number;
  let scheme: Target["scheme"];
  if (req.socket instanceof TLSSocket) {
    ({ host: authority, port } = tlsAuthority(req.socket, conn));
    scheme = "https";
  } else {
    authority = hostHeader.host;
    port = 80;
    scheme = "http";
  }
  // Domain fronting (A8), CONNECT-then-other-Host (A7), redirected-to-one-Host-for-another (A10).
  if (hostHeader.host !== authority) throw misdirected("Host header differs from the connection's host");
  if (hostHeader.port !== null && hostHeader.port !== port) throw misdirected("Host port differs");
  let path = url;
  if (!url.startsWith("/")) {
    // Absolute-form on a transparent connection: allowed only when it names the same host.
    let abs: URL;
    try {
      abs = new URL(url);
    } catch {
      throw bad(400, "request target is neither origin-form nor absolute-form");
    }
    if (canonicalHost(abs.host) !== authority)
      throw bad(400, "request URL host differs from the connection's host");
    path = `${abs.pathname}${abs.search}`;
  }
  return { host: authority, port, scheme, path };
}

/** The host and port a terminated TLS connection is for: its SNI, which must be the CONNECT target. */
function tlsAuthority(socket: TLSSocket, conn: TargetConn): { host: string; port: number } {
  const sni = canonicalHost(String((socket as TLSSocket & { servername?: string }).servername ?? ""));
  if (!sni) throw misdirected("no usable SNI");
  if (conn.connectHost && sni !== conn.connectHost) throw misdirected("SNI differs from the CONNECT target");
  return { host: conn.connectHost ?? sni, port: conn.connectPort ?? 443 };
}

/** An HTTP/2 request's header block: pseudo-headers and fields as nghttp2 handed them over. */
export interface StreamHead {
  method: string | undefined;
  scheme: string | undefined;
  authority: string | undefined;
  path: string | undefined;
  /** Every field, `[name, value, ...]`, pseudo-headers included. */
  rawHeaders: readonly string[];
}

/**
 * Which host one HTTP/2 stream is for (I1): its `:authority` (or `Host`, which must agree with it
 * when both are sent) must name the connection's SNI host, else 421, so every stream on a
 * connection is decided, injected and audited for the host the connection was opened to.
 */
export function targetOfStream(head: StreamHead, socket: TLSSocket, conn: TargetConn): Target {
  if (head.method === "CONNECT") throw bad(400, "CONNECT inside HTTP/2 is not served");
  if (head.scheme !== "https") throw bad(400, ":scheme is not https");
  const hosts = hostHeaderValues(head.rawHeaders);
  if (hosts.length > 1) throw bad(400, `expected at most one Host header, got ${hosts.length}`);
  const named = head.authority ?? hosts[0];
  if (named === undefined) throw bad(400, "neither :authority nor Host");
  const asked = splitHostPort(named);
  if (!asked) throw bad(400, ":authority is not a valid host");
  if (head.authority !== undefined && hosts[0] !== undefined) {
    const host = splitHostPort(hosts[0]);
    if (!host || host.host !== asked.host || host.port !== asked.port)
      throw bad(400, "Host header and :authority disagree");
  }
  const path = head.path ?? "";
  if (!path.startsWith("/")) throw bad(400, ":path is not origin-form");
  const { host, port } = tlsAuthority(socket, conn);
  if (asked.host !== host) throw misdirected(":authority differs from the connection's host");
  if (asked.port !== null && asked.port !== port) throw misdirected(":authority port differs");
  return { host, port, scheme: "https", path };
}

function hostHeaderValues(rawHeaders: readonly string[]): string[] {
  const out: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    if (rawHeaders[i]?.toLowerCase() === "host") out.push(rawHeaders[i + 1] ?? "");
  }
  return out;
}

/**
 * Case I6: plain http through the explicit proxy port goes to port 80 only, as the redirects do
 * (CONNECT goes to 443 only). Any other port is a readable 403, recorded as a refused route.
 */
export function explicitPortRefusal(conn: TargetConn, target: Target): Refusal | null {
  if (conn.listener !== "explicit" || target.scheme !== "http" || target.port === 80) return null;
  return new Refusal(
    403,
    "refuse",
    `plain http to port ${target.port}`,
    [
      `Refused by Benchwright: http://${target.host}:${target.port}/ is not reachable from this run; plain http through the proxy goes to port 80 only.`,
      "Use port 80, or https (CONNECT to port 443).",
      "",
    ].join("\n"),
    {},
    { route: "refused" },
  );
}
