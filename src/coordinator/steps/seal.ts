import type { Seal } from "@benchwright/shared/contract/local-agent";
import { BrokerFailure, type Machine } from "../ports";
import type { MachineState, Worker } from "../state";
import { must, stop } from "./common";

// The seal that ends a sandbox's setup stage (steps/stages.ts), and the one a sandbox started
// from a setup image gets before its proof (steps/wiring.ts): the wiring's files installed from
// the coordinator's copy, from outside the sandbox; what setup left running killed.

/** Whether a proxy enforces the run (its sandboxes were wired, and are sealed with its CA). */
export const enforced = (s: MachineState) => Boolean(s.policy?.enforce && !s.proxy?.unfiltered);

/** Seals the worker's sandbox. Null when sealed; else the stop's next step (never its commands). */
export async function sealSandbox(m: Machine, s: MachineState, w: Worker): Promise<number | null> {
  let killed: number;
  try {
    ({ killed } = await m.ports.broker.seal(s.runId, w.sandboxId, sealOf(s, w)));
  } catch (error) {
    // Never on to the commands with what setup left running: stop instead.
    if (notSupported(error)) return notBuilt(m, s, w, error, "before its commands ran");
    if (error instanceof BrokerFailure && error.code === "setup_not_sealed") return notSealed(m, s, w, error);
    throw error;
  }
  const image = w.image?.role === "use" ? w.image : null;
  await m.ports.event(s.runId, `seal:${w.sandboxId}`, "note", {
    sandbox: w.sandboxId,
    name: w.name,
    stage: "seal",
    killed,
    text: image
      ? `${w.name} started from setup image ${image.digest} with no setup stage: the wiring's files were installed from the proxy's copy, from outside it.`
      : `The setup stage of ${w.name} ended: ${killed} process(es) it left were killed and the wiring's files were re-installed from the proxy's copy.`,
  });
  return null;
}

export const notSupported = (error: unknown): error is BrokerFailure =>
  error instanceof BrokerFailure && error.code === "not_supported";

/** The run's backend cannot do a stage this run needs (bundles, sealing a setup stage) yet. */
export async function notBuilt(m: Machine, s: MachineState, w: Worker, error: BrokerFailure, when: string) {
  await m.ports.note(s.runId, {
    level: "warning",
    code: "stage_not_supported",
    text: `${error.message}, so the run stopped ${when} in ${w.name}. Run it on a backend that has it (the local one has every stage).`,
  });
  return stop(m, s, "stage_not_supported", `${w.name}: ${error.message}`);
}

/** The backend could not end the setup stage (case L7): nothing runs beside what it left. */
async function notSealed(m: Machine, s: MachineState, w: Worker, error: BrokerFailure): Promise<number> {
  await m.ports.note(s.runId, {
    level: "warning",
    code: "setup_not_sealed",
    text: `The setup stage of ${w.name} could not be sealed (${error.message}), so the run stopped before its commands ran: no command runs beside what setup left.`,
  });
  return stop(m, s, "setup_not_sealed", `${w.name} (${w.sandboxId}): ${error.message}`);
}

/** What seal re-installs: the coordinator's copy of the wiring (the proxy's CA and hosts). */
function sealOf(s: MachineState, w: Worker): Seal {
  const policy = must(s.policy);
  const routing = w.routing ?? policy.routing.mode;
  if (!enforced(s)) return { routing, hostsFile: [], caCertPem: null };
  return {
    routing,
    hostsFile: routing === "default" ? (w.hostsFile ?? policy.hostsFile) : [],
    caCertPem: must(s.proxy?.caCertPem),
  };
}
