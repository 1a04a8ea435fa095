import type { RegistryOptions } from "./registry-options";
import type { Run, Runs } from "./runs";
import type { Sandbox } from "./sandbox-record";

// Destroying one sandbox (the registry, sandboxes.ts, serializes the calls and destroys them all
// on close): its processes, however they were left (running, a proxy flushing its audit, frozen),
// its cgroup, its network (runs.ts) and its directory, in the order each needs the one before.

/** How long a proxy gets, after SIGTERM, to flush its audit batch before its sandbox is killed. */
const PROXY_GRACE_MS = 5_000;

export async function destroySandbox(
  o: RegistryOptions,
  sandboxes: Map<string, Sandbox>,
  runs: Runs,
  id: string,
): Promise<void> {
  const sandbox = sandboxes.get(id);
  if (!sandbox) return;
  sandbox.state = "destroyed";
  if (sandbox.kind === "proxy" && [...sandbox.execs.values()].some((e) => e.state === "running")) {
    // Let the proxy flush its last audit batch (it exits on SIGTERM), for a few seconds at most.
    // A paused proxy is continued first: stopped, it cannot act on the SIGTERM, and would sit out
    // the grace without flushing.
    if (sandbox.frozen) {
      await sandbox.process.freeze(false);
      for (const exec of sandbox.execs.values()) exec.continueHostSide();
      sandbox.frozen = false;
    }
    await sandbox.process.terminate();
    const running = [...sandbox.execs.values()].filter((e) => e.state === "running").map((e) => e.done);
    await Promise.race([Promise.all(running), new Promise((r) => setTimeout(r, PROXY_GRACE_MS))]);
  }
  if (sandbox.frozen) {
    // A halted sandbox is never continued: its processes die stopped. The execs' host-side
    // nsenters stopped with them, and the namespace's PID 1 cannot finish dying until they have
    // reaped their children: continue them once nothing in the sandbox can run again.
    await sandbox.process.killAll();
    for (const exec of sandbox.execs.values()) exec.continueHostSide();
  }
  await sandbox.process.kill();
  await Promise.all([...sandbox.execs.values()].map((e) => e.kill()));
  await sandbox.process.cgroup.kill("");
  sandbox.process.cgroup.remove();
  o.state.forgetCgroup(id);
  const run = runs.get(sandbox.runId) as Run;
  if (sandbox.kind === "proxy") {
    await runs.dismantleRunNetwork(run);
    run.proxyId = null;
  } else if (sandbox.work) {
    run.slots.delete(sandbox.work.i);
    await runs.dismantleWorkNetwork(run, sandbox.work);
  }
  o.state.removeSandboxDir(id);
  sandboxes.delete(id);
  run.members.delete(id);
  runs.releaseIfEmpty(run);
  o.log({ event: "sandbox_destroyed", id, runId: sandbox.runId, kind: sandbox.kind });
}
