import { X509Certificate } from "node:crypto";
import type { Seal, SealResult } from "../shared/contract/local-agent";
import { AgentError, message } from "./errors";
import type { Sandbox, WorkSandbox } from "./sandbox-record";
import { installHosts, installSealed, type WiredFiles } from "./wiring-files";

// The end of a sandbox's setup stage, and the hosts-file rewrites after it: the agent's part,
// from the host side (wiring-files.ts writes the files).

function wiredFiles(sandbox: Sandbox): WiredFiles {
  return { dir: sandbox.process.dir, setupUid: sandbox.process.setupUid, sealed: sandbox.sealed };
}

/**
 * Ends a work or task sandbox's setup stage: setup-stage execs are refused from now on, every
 * process the stage started is killed (its cgroup, however it left its exec's process tree),
 * then the wiring's files are installed again from the caller's copy, from the host side
 * (`imageBundle`: the image's own CA bundle). Idempotent: a repeated
 * seal installs the files again and kills nothing new; `killed` counts every seal's.
 */
export async function sealSandbox(
  sandbox: WorkSandbox,
  body: Seal,
  imageBundle: string,
): Promise<SealResult> {
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
  const before = new Set(sandbox.process.processes("setup"));
  // Each setup exec first (one just started may not have joined its cgroup yet), then what is
  // left in the setup cgroup: the daemons.
  await Promise.all(
    [...sandbox.execs.values()]
      .filter((e) => e.stage === "setup" && e.state === "running")
      .map((e) => e.kill()),
  );
  const killed = await sandbox.process.cgroup.kill("setup", (pid) => sandbox.process.inSandbox(pid));
  sandbox.sealKilled += Math.max(killed, before.size);
  sandbox.process.cgroup.removeLeaf("setup");
  try {
    installSealed(wiredFiles(sandbox), {
      routing: body.routing,
      proxyAddress: sandbox.work.proxyAddress,
      hostsFile: body.hostsFile,
      caCertPem: body.caCertPem,
      resolvConf: sandbox.resolvConf,
      imageBundle,
    });
  } catch (error) {
    throw new AgentError("sandbox_failed", `could not install the wiring's files: ${message(error)}`);
  }
  return { killed: sandbox.sealKilled };
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
