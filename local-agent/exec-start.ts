import { randomUUID } from "node:crypto";
import type { ExecInfo, ExecRequest } from "@benchwright/shared/contract/local-agent";
import type { z } from "zod";
import { cleanRootCommand } from "./clean-root";
import { AgentError, message } from "./errors";
import { Exec } from "./exec";
import type { RegistryOptions } from "./registry-options";
import type { Run, Runs } from "./runs";
import { EXEC_BASE_ENV, envScript, IMAGE_MOUNT, NODE_MOUNT, SANDBOX_HOME } from "./sandbox";
import { execCgroup, refuseReading, refuseUnsealed, type Sandbox } from "./sandbox-record";

// Starting an exec in a sandbox (exec.ts runs it): what a request may ask of a sandbox in its
// state, the image's programs by name, and how many exited execs a sandbox keeps. Apart from the
// registry (sandboxes.ts), which only finds the sandbox; execs are not serialized with creation.

type ParsedExec = z.output<typeof ExecRequest>;

/** Exited execs kept per sandbox (each keeps up to 2 MiB of output). */
const MAX_EXITED_EXECS = 256;

export function startExec(
  o: RegistryOptions,
  runs: Runs,
  sandbox: Sandbox,
  request: ParsedExec,
): { info: ExecInfo; created: boolean } {
  const sandboxId = sandbox.id;
  const known = request.id === undefined ? undefined : sandbox.execs.get(request.id);
  if (known) return { info: known.info(0, 0), created: false };
  if (sandbox.state !== "ready" || !sandbox.process.isolated()) {
    throw new AgentError("sandbox_failed", `sandbox ${sandboxId} is destroyed`);
  }
  const texts = [...request.argv, ...Object.values(request.env), request.cwd ?? ""];
  if (texts.some((t) => t.includes("\0")))
    throw new AgentError("invalid_request", "NUL bytes are not allowed in argv, env or cwd");
  refuseUnsealed(sandbox);
  refuseReading(sandbox);
  if (request.stage === "setup" && sandbox.layer !== null) {
    throw new AgentError("sealed", `sandbox ${sandboxId} started from a setup layer: it has no setup stage`);
  }
  if (request.stage === "setup" && sandbox.sealed) {
    throw new AgentError("sealed", `sandbox ${sandboxId} is sealed: its setup stage has ended`);
  }
  const execId = request.id ?? randomUUID();
  const { argv, env, cleanRoot } = program(o, runs, sandbox, request.argv, request.env, request.stage);
  if (cleanRoot && (Object.keys(env).length > 0 || request.cwd !== undefined)) {
    throw new AgentError(
      "invalid_request",
      "bw-wiring in the execute stage (the re-proof) runs in a clean root: it takes no env and no cwd",
    );
  }
  let exec: Exec;
  try {
    const { rel, cgroup } = execCgroup(sandbox, request.stage, `e-${execId}`);
    const command = cleanRoot
      ? cleanRootCommand(sandbox.process, rel, o.imageDir, argv)
      : {
          argv: sandbox.process.execArgv(request.stage, rel, request.cwd ?? SANDBOX_HOME, argv),
          fd3: envScript(env),
        };
    exec = new Exec(execId, sandboxId, request.stage, {
      argv: command.argv,
      env: EXEC_BASE_ENV,
      fd3: command.fd3,
      stdin: request.stdin,
      timeoutMs: request.timeoutMs,
      cgroup,
    });
  } catch (error) {
    // spawn refuses synchronously only what the request itself makes impossible (E2BIG).
    throw new AgentError("invalid_request", `could not start the command: ${message(error)}`);
  }
  // Only the re-proof (clean root) runs nothing of the sandbox's own: any other execute-stage
  // exec ends what a capture may keep.
  if (request.stage === "execute" && !cleanRoot) sandbox.commandsRan = true;
  sandbox.execs.set(execId, exec);
  prune(sandbox);
  return { info: exec.info(0, 0), created: true };
}

/**
 * The image's programs by name, as a container image would have them on its PATH:
 * `bw-proxy` (proxy sandboxes only; the agent adds where the control plane is reachable from
 * the sandbox, and the test-only settings), `bw-proxy-view` (proxy sandboxes only: prints the
 * running proxy's view, reading nothing of the caller's environment but BW_VIEW_PORT) and
 * `bw-wiring` (work and task sandboxes only). `bw-wiring` in the execute stage is the re-proof
 * after the seal (it only checks): it runs in the clean root (clean-root.ts), not on the
 * sandbox's own loader and libraries.
 */
function program(
  o: RegistryOptions,
  runs: Runs,
  sandbox: Sandbox,
  argv: readonly string[],
  env: Record<string, string>,
  stage: ParsedExec["stage"],
): { argv: string[]; env: Record<string, string>; cleanRoot?: true } {
  const [name, ...rest] = argv;
  const node = NODE_MOUNT;
  if (name === "bw-proxy") {
    if (sandbox.kind !== "proxy")
      throw new AgentError("invalid_request", "bw-proxy runs in a proxy sandbox only");
    const run = runs.get(sandbox.runId) as Run;
    return {
      argv: [node, `${IMAGE_MOUNT}/proxy.cjs`, ...rest],
      env: {
        ...o.proxyTestEnv,
        ...env,
        BW_CONTROL_PLANE_URL: sandbox.controlPlaneUrl as string,
        BW_OWN_ADDRESSES: run.net.upAddress,
      },
    };
  }
  if (name === "bw-proxy-view") {
    if (sandbox.kind !== "proxy")
      throw new AgentError("invalid_request", "bw-proxy-view runs in a proxy sandbox only");
    return {
      argv: [node, `${IMAGE_MOUNT}/proxy.cjs`, "view", ...rest],
      env: env.BW_VIEW_PORT === undefined ? {} : { BW_VIEW_PORT: env.BW_VIEW_PORT },
    };
  }
  if (name === "bw-wiring") {
    if (sandbox.kind === "proxy")
      throw new AgentError("invalid_request", "bw-wiring runs in a work or task sandbox");
    const wiring = [node, `${IMAGE_MOUNT}/wiring.cjs`, ...rest];
    return stage === "execute" ? { argv: wiring, env, cleanRoot: true } : { argv: wiring, env };
  }
  return { argv: [...argv], env };
}

function prune(sandbox: Sandbox): void {
  const exited = [...sandbox.execs.values()].filter((e) => e.state === "exited");
  for (const e of exited.slice(0, Math.max(0, exited.length - MAX_EXITED_EXECS)))
    sandbox.execs.delete(e.execId);
}
