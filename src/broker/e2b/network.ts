import type { RoutingMode } from "@benchwright/shared/contract/policy";
import { ALL_TRAFFIC, type SandboxNetworkInfo, type SandboxNetworkOpts } from "e2b";

// The network settings of each kind of sandbox, in one place, so that a create and an update can
// never disagree (E2B's network update replaces the whole egress configuration: a field left out
// of an update is cleared, and a cleared denyOut is a sandbox that goes anywhere).
//
// - proxy: egress open (it forwards upstream), public traffic off: its one public port, the
//   bridge, is reachable only with its traffic token.
// - work/task/orchestrator, default routing: egress open (only the hosts file's names go to the
//   proxy, as on every backend), public traffic off.
// - catch-all: E2B's firewall denies everything (ALL_TRAFFIC) but the run's proxy bridge host,
//   matched by SNI on 443: the sandbox, root included, can reach nothing else over TCP.

/** The proxy sandbox's bridge port (bw-bridge serve), reached through E2B's edge. */
export const BRIDGE_PORT = 8090;

export function workNetwork(routing: RoutingMode, proxyHost: string): SandboxNetworkOpts {
  if (routing === "default") return { allowPublicTraffic: false };
  return { allowOut: [proxyHost], denyOut: [ALL_TRAFFIC], allowPublicTraffic: false };
}

export const proxyNetwork = (): SandboxNetworkOpts => ({ allowPublicTraffic: false });

/** The whole egress part of a sandbox's settings, as an update must send it. */
export function egressOf(network: SandboxNetworkOpts) {
  return {
    ...(network.allowOut === undefined ? {} : { allowOut: network.allowOut }),
    ...(network.denyOut === undefined ? {} : { denyOut: network.denyOut }),
  };
}

const sameList = (a: readonly string[] | undefined, b: readonly string[] | undefined) =>
  JSON.stringify([...(a ?? [])].sort()) === JSON.stringify([...(b ?? [])].sort());

/**
 * What differs between the settings asked for and those E2B reports holding, in words; empty
 * when E2B holds exactly what was asked.
 */
export function networkDrift(wanted: SandboxNetworkOpts, held: SandboxNetworkInfo | undefined): string[] {
  const out: string[] = [];
  const allow = Array.isArray(wanted.allowOut) ? wanted.allowOut : undefined;
  const deny = Array.isArray(wanted.denyOut) ? wanted.denyOut : undefined;
  if (!sameList(allow, held?.allowOut)) out.push(`allowOut is ${JSON.stringify(held?.allowOut ?? [])}`);
  if (!sameList(deny, held?.denyOut)) out.push(`denyOut is ${JSON.stringify(held?.denyOut ?? [])}`);
  if (wanted.allowPublicTraffic === false && held?.allowPublicTraffic !== false) {
    out.push("public traffic is not restricted");
  }
  return out;
}
