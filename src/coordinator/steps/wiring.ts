import type { Machine } from "../ports";
import type { MachineState, Worker } from "../state";
import { checkpoint, firstStage, lastLine, move, must, POLL_MS, stop } from "./common";
import { sealSandbox } from "./seal";
import { renewBuilds } from "./setup-image";

// wiring: the wiring program (bw-wiring) installs the redirect to the proxy and the run's CA in
// every sandbox made so far and proves it with probes; no benchmark command runs before that. A
// sandbox started from a setup image is sealed instead (the files written from outside) and
// proved from its execute stage (wireFromImage).

export async function wire(m: Machine, s: MachineState): Promise<number> {
  const policy = must(s.policy);
  if (!policy.enforce || s.proxy?.unfiltered) {
    // Nothing to wire: no proxy runs. The run proof says so.
    for (const w of s.workers) {
      if (w.proxyAddress === null) continue;
      w.env = {};
      w.stage = firstStage(w);
    }
    await m.ports.setRunFields(s.runId, {
      proof: { enforced: false, reason: policy.enforce ? "proxy_failed_unfiltered" : "nothing_to_enforce" },
    });
    await move(m, s, "running", "no_wiring_needed");
    return m.ports.now();
  }
  await renewBuilds(m, s);
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
 * worker's env is set, its next stage is the bundle), "pending" while it runs; a number is the
 * stop's next step.
 */
export async function wireSandbox(
  m: Machine,
  s: MachineState,
  w: Worker,
): Promise<"done" | "pending" | number> {
  if (w.env !== null) return "done";
  if (w.image?.role === "use") return wireFromImage(m, s, w);
  const proved = await prove(m, s, w, "wiring");
  if (proved === "done") w.stage = "bundle";
  return proved;
}

/**
 * A sandbox started from a setup image has no setup stage: the wiring program never runs as its
 * root (it would run on the layer's loader and libraries). Its seal installs the wiring's files
 * from outside, then the re-proof (execute stage, clean root, `installed: true`) is its one proof,
 * before any command (case P5).
 */
async function wireFromImage(m: Machine, s: MachineState, w: Worker): Promise<"done" | "pending" | number> {
  if (w.stage === null) {
    const stopped = await sealSandbox(m, s, w);
    if (stopped !== null) return stopped;
    w.stage = "rewire";
    await checkpoint(m, s); // sealed before the proof starts: never re-written under it
  }
  const proved = await prove(m, s, w, "rewire");
  if (proved === "done") w.stage = "execute";
  return proved;
}

/**
 * After the setup stage was sealed (its files re-installed from outside), the wiring is proved
 * again, in the execute stage and without writing anything (`installed: true`): root may have
 * changed what the first proof saw (case G2).
 */
export function rewireSandbox(m: Machine, s: MachineState, w: Worker): Promise<"done" | "pending" | number> {
  return prove(m, s, w, "rewire");
}

/** The first wiring (setup stage, writes the files) or the re-proof (execute stage, checks). */
type Pass = "wiring" | "rewire";

async function prove(
  m: Machine,
  s: MachineState,
  w: Worker,
  pass: Pass,
): Promise<"done" | "pending" | number> {
  const policy = must(s.policy);
  const ca = s.proxy?.caCertPem ?? null;
  if (ca === null) {
    // A proxy that should enforce but gave no CA: never run as if unenforced (fail closed).
    return stop(m, s, "internal_error", "the run's proxy CA is missing, so no benchmark code ran");
  }
  const mode = w.routing ?? policy.routing.mode;
  const execId = pass === "wiring" ? w.wiringExecId : w.rewireExecId;
  if (execId === null) {
    const info = await m.ports.broker.exec(s.runId, w.sandboxId, {
      id: pass,
      argv: ["bw-wiring"],
      env: {},
      stage: pass === "wiring" ? "setup" : "execute",
      stdin: JSON.stringify({
        mode,
        caCertPem: ca,
        proxyAddress: w.proxyAddress,
        hostsFile: w.hostsFile ?? policy.hostsFile,
        probe: { directTarget: mode === "catch-all" ? w.probeTarget : null },
        ...w.wiring,
        ...(pass === "rewire" ? { installed: true } : {}),
      }),
      timeoutMs: 60_000,
    });
    if (pass === "wiring") w.wiringExecId = info.execId;
    else w.rewireExecId = info.execId;
    return "pending";
  }
  const exec = await m.ports.broker.poll(s.runId, w.sandboxId, execId, { stdoutFrom: 0, stderrFrom: 0 });
  if (exec.state === "running") return "pending";
  const proof = m.ports.parseProof(exec.stdout);
  await m.ports.event(s.runId, `${pass}:${w.sandboxId}`, "proxy", {
    sandbox: w.sandboxId,
    name: w.name,
    routing: mode,
    ...(pass === "rewire" ? { stage: "execute", installed: true } : {}),
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
      text:
        pass === "wiring"
          ? `The redirect to the proxy could not be installed or proved in ${w.name} (${why}), so the run stopped before its benchmark code ran there.`
          : `The redirect to the proxy could not be proved again in ${w.name} after its setup stage (${why}), so the run stopped before its commands ran there.`,
    });
    await m.ports.setRunFields(s.runId, { proof: { enforced: false, sandbox: w.sandboxId, proof } });
    return stop(m, s, "redirect_not_installed", pass === "wiring" ? why : `after setup: ${why}`);
  }
  w.env = proof.env;
  return "done";
}
