import { z } from "zod";
import { EgressVia, HostAction, HostPattern, RunEgress } from "./policy";

// The egress tunnel's wire contract: the run's proxy and the user's local egress agent both dial
// the control plane (nothing dials the user's machine, and a proxy on a cloud backend is not
// reachable from outside), and a per-run relay (a Durable Object) joins the two WebSockets:
//
//   proxy ──wss── GET tunnelPath(runId)     (Authorization: Bearer <proxy token>)  ┐
//                                                                                   ├─ relay
//   agent ──wss── GET EGRESS_AGENT_PATH     (Authorization: Bearer <bwe_ token>)   ┘
//
// Both live outside /v1 (like /compute and /hooks): their credential is the run's own token, not
// the user's API key, and the user's API key is never needed on the machine running the agent.
//
// Once both ends are there the relay sends each the text message PAIRED, then carries binary
// messages from one end to the other unchanged. The bytes are one HTTP/2 connection (node:http2,
// its flow control is the back-pressure): the proxy is the client, the agent the server. Each
// upstream connection is one CONNECT stream (`:authority` host:port); the agent answers 200 and
// pipes, or refuses with a status and REFUSAL_HEADER naming why. Inside a stream the proxy runs
// TLS end to end with the upstream: the agent never sees a request, let alone a credential.
//
// When either end leaves, the relay closes the other (CLOSE_PEER_GONE): the HTTP/2 connection
// dies with it, and the proxy refuses tunnelled egress until a new pair (never goes direct).

export const tunnelPath = (runId: string): string => `/internal/runs/${encodeURIComponent(runId)}/tunnel`;
/** The agent's WebSocket (GET with Upgrade: websocket). */
export const EGRESS_AGENT_PATH = "/egress-agent/tunnel";
/** The agent's copy of the run's host policy (GET, Bearer <bwe_ token>): AgentPolicy. */
export const EGRESS_AGENT_POLICY_PATH = "/egress-agent/policy";

/** The token the user's agent authenticates with: `bwe_` + 32 random bytes, base64url. */
export const EGRESS_TOKEN_PREFIX = "bwe_";
export const EgressToken = z.string().regex(/^bwe_[A-Za-z0-9_-]{43}$/, "not an egress agent token");

/** Text message from the relay: both ends are connected; start (or restart) HTTP/2 now. */
export const PAIRED = "paired";
/** Close codes the relay uses (4000-4999 are the application's). */
export const CLOSE_REPLACED = 4000; // a newer connection of the same end took over
export const CLOSE_PEER_GONE = 4001; // the other end left
export const CLOSE_RUN_ENDED = 4002; // the run is over: do not reconnect
export const CLOSE_TOKEN_REVOKED = 4003; // the agent's token was replaced or revoked

// What the two ends (the proxy's tunnel-client.ts, the agent's egress-agent.ts) agree on besides
// the relay: the size of a message, the HTTP/2 windows, and the WebSocket URL of the control plane.

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

/** Response header on a refused CONNECT stream: why the agent refused. */
export const REFUSAL_HEADER = "x-benchwright-refusal";
export const TunnelRefusal = z.enum([
  /** The run's block list (or the user's own --block) names the host. */
  "blocked",
  /** The host resolved to an address the agent does not dial (loopback, link-local, ...). */
  "address",
  /** The host does not resolve on the user's network. */
  "dns",
  /** It resolved but the connection failed. */
  "unreachable",
  /** Not a host:port the agent carries (ports 80 and 443 only). */
  "bad_target",
]);
export type TunnelRefusal = z.infer<typeof TunnelRefusal>;
/** The status the agent answers each refusal with (the proxy reads the header, not the status). */
export const REFUSAL_STATUS: Record<TunnelRefusal, number> = {
  blocked: 403,
  address: 403,
  dns: 502,
  unreachable: 502,
  bad_target: 400,
};
/** Ports the tunnel carries: the proxy forwards only https and http upstream. */
export const TUNNEL_PORTS: readonly number[] = [443, 80];

/** The run's host policy as the agent enforces it: no rules, no secret names, no model. */
export const AgentPolicy = z.strictObject({
  runId: z.string(),
  version: z.number().int().min(0),
  default: HostAction,
  egress: RunEgress,
  hosts: z.array(z.strictObject({ pattern: HostPattern, action: HostAction, via: EgressVia.optional() })),
});
export type AgentPolicy = z.infer<typeof AgentPolicy>;
