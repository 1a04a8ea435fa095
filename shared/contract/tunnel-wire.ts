// What both ends of the egress tunnel's WebSocket agree on besides tunnel.ts: the proxy's client
// (proxy-image/src/proxy/tunnel-client.ts) and the user's egress agent (egress-agent/src/egress-agent.ts).

/**
 * Largest WebSocket message accepted. Node's HTTP/2 writes frames of at most 16 KiB of payload
 * plus headers, so a message is small; the limit only bounds what a broken peer can make us hold.
 */
export const MAX_TUNNEL_MESSAGE = 4 * 1024 * 1024;
/**
 * Receive windows. Larger than HTTP/2's 64 KiB default, which over a relay would cap a stream at
 * 64 KiB per round trip; still bounded: at most SESSION_WINDOW bytes are in flight toward us.
 */
export const STREAM_WINDOW = 1024 * 1024;
export const SESSION_WINDOW = 8 * 1024 * 1024;

export function toWebSocketUrl(base: string, path: string): string {
  const url = new URL(base);
  if (url.protocol === "http:") url.protocol = "ws:";
  else if (url.protocol === "https:") url.protocol = "wss:";
  else if (url.protocol !== "ws:" && url.protocol !== "wss:") {
    throw new Error(`the control plane URL must be http(s) or ws(s), not ${url.protocol}`);
  }
  return `${url.origin}${url.pathname.replace(/\/+$/, "")}${path}`;
}
