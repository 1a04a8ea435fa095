import { usesTunnel } from "@benchwright/shared/contract/policy-routing";
import type { Machine } from "../ports";
import type { MachineState } from "../state";
import { must, stop } from "./common";

/** How often a run waiting for its egress agent looks again. */
export const TUNNEL_POLL_MS = 1_000;
/** How long a run waits for its egress agent by default (egressAgentWaitSeconds). */
export const DEFAULT_EGRESS_AGENT_WAIT_SECONDS = 600;

/**
 * A run that egresses through the user's machine starts its commands only once the user's
 * egress agent is there (paired with the proxy in the relay): otherwise its first requests
 * would be refused for no reason the user could see. Null when the commands may go on; else
 * when to look again, or the stop's next step once the wait is over.
 */
export async function awaitTunnel(m: Machine, s: MachineState): Promise<number | null> {
  const policy = must(s.policy);
  const needs = policy.enforce && !s.proxy?.unfiltered && usesTunnel(policy.routing);
  if (!needs || s.tunnel?.ready) return null;
  const now = m.ports.now();
  if (!s.tunnel) {
    s.tunnel = { waitingSince: now, ready: false };
    await m.ports.note(s.runId, {
      level: "note",
      code: "egress_agent_awaited",
      text: "This run egresses through your machine: its commands start once your egress agent is connected (the launch answer, or POST /v1/runs/{id}/egress-agent-token, gives the command to run).",
    });
  }
  if (await m.ports.tunnelPaired(s.runId)) {
    s.tunnel.ready = true;
    await m.ports.event(s.runId, "tunnel:ready", "note", {
      text: "The egress agent connected; the commands start.",
      waitedMs: now - s.tunnel.waitingSince,
    });
    return null;
  }
  const waitMs = (s.spec?.egressAgentWaitSeconds ?? DEFAULT_EGRESS_AGENT_WAIT_SECONDS) * 1000;
  if (now - s.tunnel.waitingSince >= waitMs) {
    await m.ports.note(s.runId, {
      level: "warning",
      code: "egress_agent_absent",
      text: `The egress agent did not connect within ${waitMs / 1000} s, so the run stopped before any benchmark code ran (its traffic is never sent direct instead).`,
    });
    return stop(m, s, "egress_agent_absent", "the egress agent never connected; no benchmark code ran");
  }
  return now + TUNNEL_POLL_MS;
}
