import type { MachineState, Worker } from "../machine";
import { lastLine, type Machine, move, must, POLL_MS, stop } from "./common";

// wiring: the wiring program (bw-wiring) installs the redirect to the proxy and the run's CA in
// every sandbox made so far and proves it with probes; no benchmark command runs before that.

export async function wire(m: Machine, s: MachineState): Promise<number> {
  const policy = must(s.policy);
  if (!policy.enforce || s.proxy?.unfiltered) {
    // Nothing to wire: no proxy runs. The run proof says so.
    for (const w of s.workers) if (w.proxyAddress !== null) w.env = {};
    await m.ports.setRunFields(s.runId, {
      proof: { enforced: false, reason: policy.enforce ? "proxy_failed_unfiltered" : "nothing_to_enforce" },
    });
    await move(m, s, "running", "no_wiring_needed");
    return m.ports.now();
  }
  let pending = false;
  for (const w of s.workers) {
    if (w.proxyAddress === null) continue; // a task whose turn has not come
    const wired = await wireSandbox(m, s, w);
    if (typeof wired === "number") return wired;
    if (wired === "pending") pending = true;
  }
  if (pending) return m.ports.now() + POLL_MS;
  await m.ports.setRunFields(s.runId, {
    proof: {
      enforced: true,
      routing: policy.routing.mode,
      sandboxes: s.workers.filter((w) => w.env !== null).map((w) => w.sandboxId),
    },
  });
  await move(m, s, "running", "boundary_proved");
  return m.ports.now();
}

/**
 * Runs the wiring program in a worker's sandbox and checks its proof. "done" once proved (the
 * worker's env is set), "pending" while it runs; a number is the stop's next step.
 */
export async function wireSandbox(
  m: Machine,
  s: MachineState,
  w: Worker,
): Promise<"done" | "pending" | number> {
  if (w.env !== null) return "done";
  const policy = must(s.policy);
  const ca = s.proxy?.caCertPem ?? null;
  if (ca === null) {
    // A proxy that should enforce but gave no CA: never run as if unenforced (fail closed).
    return stop(m, s, "internal_error", "the run's proxy CA is missing, so no benchmark code ran");
  }
  const mode = w.routing ?? policy.routing.mode;
  if (w.wiringExecId === null) {
    const info = await m.ports.broker.exec(s.runId, w.sandboxId, {
      id: "wiring",
      argv: ["bw-wiring"],
      env: {},
      stage: "setup",
      stdin: JSON.stringify({
        mode,
        caCertPem: ca,
        proxyAddress: w.proxyAddress,
        hostsFile: w.hostsFile ?? policy.hostsFile,
        probe: { directTarget: mode === "catch-all" ? w.probeTarget : null },
        ...w.wiring,
      }),
      timeoutMs: 60_000,
    });
    w.wiringExecId = info.execId;
    return "pending";
  }
  const exec = await m.ports.broker.poll(s.runId, w.sandboxId, w.wiringExecId, {
    stdoutFrom: 0,
    stderrFrom: 0,
  });
  if (exec.state === "running") return "pending";
  const proof = m.ports.parseProof(exec.stdout);
  await m.ports.event(s.runId, `wiring:${w.sandboxId}`, "proxy", {
    sandbox: w.sandboxId,
    name: w.name,
    routing: mode,
    proof: proof ?? { ok: false, error: lastLine(exec.stderr) || `exit code ${exec.exitCode}` },
  });
  if (!proof?.ok || exec.exitCode !== 0) {
    const why = proof
      ? `probe failed: ${proof.probes
          .filter((p) => !p.ok)
          .map((p) => `${p.name} (${p.observed})`)
          .join(", ")}`
      : `the wiring program failed: ${lastLine(exec.stderr) || `exit code ${exec.exitCode}`}`;
    await m.ports.note(s.runId, {
      level: "warning",
      code: "redirect_not_installed",
      text: `The redirect to the proxy could not be installed or proved in ${w.name} (${why}), so the run stopped before its benchmark code ran there.`,
    });
    await m.ports.setRunFields(s.runId, { proof: { enforced: false, sandbox: w.sandboxId, proof } });
    return stop(m, s, "redirect_not_installed", why);
  }
  w.env = proof.env;
  return "done";
}
