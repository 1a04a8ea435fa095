import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import type { Resources, SandboxKind } from "@benchwright/shared/contract/local-agent";
import type { RoutingMode } from "@benchwright/shared/contract/policy";
import type { CapturedImage } from "@benchwright/shared/contract/setup-image";
import { AgentError } from "./errors";
import type { Exec, ExecCgroup } from "./exec";
import type { WorkNet } from "./network";
import { EXEC_BASE_ENV, SANDBOX_HOME, type SandboxProcess } from "./sandbox";
import type { SandboxProgram } from "./transfer";

// What the agent holds of one sandbox (sandbox-create.ts makes them, sandboxes.ts lists them),
// and the two ways a process is started in it: an exec (its own cgroup leaf) and a program of
// the image whose stdio the agent streams (bundles, artifacts).

export interface Sandbox {
  id: string;
  runId: string;
  kind: SandboxKind;
  routing: RoutingMode | null;
  proxySandboxId: string | null;
  state: "ready" | "destroyed";
  /** Its processes are stopped (a halted run's work sandbox, a paused lingering proxy). */
  frozen: boolean;
  netns: string;
  work: WorkNet | null;
  address: string;
  controlPlaneUrl: string | null;
  process: SandboxProcess;
  execs: Map<string, Exec>;
  resources: Resources;
  /** The setup stage has ended (seal): no more setup-stage execs. */
  sealed: boolean;
  /** Processes seal killed (all seals of this sandbox). */
  sealKilled: number;
  /**
   * Why a seal could not end the setup stage: the sandbox runs nothing more (every exec, bundle,
   * collect and seal is refused `setup_not_sealed`) and is only destroyed.
   */
  notSealed: string | null;
  resolvConf: string;
  /** Made with `capture`: a setup image's builder (layer-capture.ts). */
  capture: boolean;
  /** The stored setup layer it started from (no setup stage at all), or null. */
  layer: string | null;
  /**
   * The execute stage ran something of the sandbox's own (any exec but the clean-root re-proof,
   * or a bundle or collect after the seal): its changes are no longer setup's alone to capture.
   */
  commandsRan: boolean;
  /** The run CA the last seal installed (a capture refuses a layer holding it), or null. */
  caCertPem: string | null;
  /** A capture under way or done (POST …/capture answers the same while it holds). */
  capturing: Promise<CapturedImage> | null;
  /** A capture is reading its files: nothing may start in it meanwhile. */
  reading: boolean;
}

/** Throws for a sandbox whose files a capture is reading: nothing starts in it meanwhile. */
export function refuseReading(sandbox: Sandbox): void {
  if (sandbox.reading) {
    throw new AgentError(
      "invalid_request",
      `sandbox ${sandbox.id} is being captured: nothing starts in it until that ends`,
    );
  }
}

/** A work, task or orchestrator sandbox: on a work link of its run. */
export type WorkSandbox = Sandbox & { work: WorkNet; routing: RoutingMode };

/** Throws `setup_not_sealed` for a sandbox whose seal failed: nothing runs beside what setup left. */
export function refuseUnsealed(sandbox: Sandbox): void {
  if (sandbox.notSealed !== null) {
    throw new AgentError(
      "setup_not_sealed",
      `sandbox ${sandbox.id} runs nothing more: its setup stage could not be sealed (${sandbox.notSealed})`,
    );
  }
}

/** A cgroup leaf of its own for one exec (cgroups.ts), as the exec uses it. */
export function execCgroup(
  sandbox: Sandbox,
  stage: "setup" | "execute",
  name: string,
): { rel: string; cgroup: ExecCgroup } {
  const cg = sandbox.process.cgroup;
  const rel = cg.leaf(stage, name);
  return {
    rel,
    cgroup: {
      hit: () => cg.limitsHit(rel),
      killAll: async () => {
        await cg.kill(rel);
      },
      release: () => cg.removeLeaf(rel),
    },
  };
}

/** Runs a program of the image in the execute stage with its stdio piped to the agent. */
export function programIn(sandbox: Sandbox, name: string): SandboxProgram {
  return {
    spawn: (argv) => {
      const { rel, cgroup } = execCgroup(sandbox, "execute", `${name}-${randomUUID()}`);
      const [file, ...args] = sandbox.process.execArgv("execute", rel, SANDBOX_HOME, argv) as [
        string,
        ...string[],
      ];
      const child = spawn(file, args, { env: EXEC_BASE_ENV, stdio: ["pipe", "pipe", "pipe", "pipe"] });
      const fd3 = child.stdio[3] as NodeJS.WritableStream & { on(e: "error", f: () => void): void };
      fd3.on("error", () => {});
      fd3.end("");
      return {
        child,
        done: () => {
          void cgroup.killAll().then(() => cgroup.release());
        },
      };
    },
  };
}
