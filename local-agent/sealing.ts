import { X509Certificate } from "node:crypto";
import type { Seal, SealResult } from "@benchwright/shared/contract/local-agent";
import { AgentError, message } from "./errors";
import type { Sandbox, WorkSandbox } from "./sandbox-record";
import {
  checkBound,
  type ImageFiles,
  installHosts,
  installNsswitch,
  installSealed,
  type WiredFiles,
} from "./wiring-files";

// The end of a sandbox's setup stage, and the hosts-file rewrites after it: the agent's part,
// from the host side (wiring-files.ts writes the files).

function wiredFiles(sandbox: Sandbox): WiredFiles {
  return { dir: sandbox.process.dir, setupUid: sandbox.process.setupUid, sealed: sandbox.sealed };
}

/**
 * Ends a work or task sandbox's setup stage, from the host side (no program of the sandbox runs
 * for it): setup-stage execs are refused from now on; every process the stage started is killed
 * (its cgroup frozen first, however it left its exec's process tree), and the cgroup must then be
 * empty; the sandbox's user namespace limits are written again and read back (setup was root of
 * it: every namespace count 0); then the wiring's files are installed again from the caller's copy
 * (`image`: the image's own CA bundle and nsswitch.conf). If any of that cannot be done the
 * sandbox is left frozen, runs nothing more and the answer is `setup_not_sealed`. Idempotent: a
 * repeated seal installs the files again and kills nothing new; `killed` counts every seal's.
 */
export async function sealSandbox(sandbox: WorkSandbox, body: Seal, image: ImageFiles): Promise<SealResult> {
  if (body.routing !== sandbox.routing) {
    throw new AgentError(
      "invalid_request",
      `routing: the sandbox was made with ${sandbox.routing} routing, not ${body.routing}`,
    );
  }
  if (body.caCertPem !== null) {
    try {
      if (!new X509Certificate(body.caCertPem).ca) throw new Error("not a CA");
    } catch {
      throw new AgentError("invalid_request", "caCertPem: not a CA certificate");
    }
  }
  sandbox.sealed = true;
  sandbox.caCertPem = body.caCertPem;
  const proc = sandbox.process;
  const before = new Set(proc.processes("setup"));
  // Each setup exec first (one just started may not have joined its cgroup yet), then what is
  // left in the setup cgroup: the daemons.
  await Promise.all(
    [...sandbox.execs.values()]
      .filter((e) => e.stage === "setup" && e.state === "running")
      .map((e) => e.kill()),
  );
  const killed = await proc.cgroup.kill("setup", (pid) => proc.inSandbox(pid));
  sandbox.sealKilled += Math.max(killed, before.size);
  const left = proc.cgroup.allPids("setup");
  if (left.length > 0) {
    // Never on to the execute stage beside them: held frozen until the sandbox is destroyed.
    await proc.cgroup.freeze("setup");
    return notSealed(
      sandbox,
      `${left.length} process(es) of the setup stage are still running after the kill rounds (held frozen)`,
    );
  }
  proc.cgroup.removeLeaf("setup");
  try {
    await proc.holdUserLimits();
  } catch (error) {
    return notSealed(sandbox, `its namespace limits could not be held: ${message(error)}`);
  }
  try {
    checkBound(proc.rootPath, proc.dir, proc.setupUid);
    installNsswitch(proc.rootPath, proc.setupUid, image);
    installSealed(wiredFiles(sandbox), {
      routing: body.routing,
      proxyAddress: sandbox.work.proxyAddress,
      hostsFile: body.hostsFile,
      caCertPem: body.caCertPem,
      resolvConf: sandbox.resolvConf,
      imageBundle: image.bundle,
    });
  } catch (error) {
    return notSealed(sandbox, `the wiring's files could not be installed: ${message(error)}`);
  }
  return { killed: sandbox.sealKilled };
}

function notSealed(sandbox: Sandbox, why: string): never {
  sandbox.notSealed = why;
  throw new AgentError("setup_not_sealed", `sandbox ${sandbox.id}: ${why}; it runs nothing more`);
}

/** Default routing: the hosts file's redirect rewritten from outside (a vault edit). */
export function rewriteHostsOf(sandbox: WorkSandbox, hostsFile: readonly string[]): void {
  if (sandbox.routing !== "default") {
    throw new AgentError("invalid_request", "a catch-all sandbox has no per-host redirect to rewrite");
  }
  try {
    installHosts(wiredFiles(sandbox), sandbox.work.proxyAddress, hostsFile);
  } catch (error) {
    throw new AgentError("sandbox_failed", `could not rewrite the hosts file: ${message(error)}`);
  }
}
