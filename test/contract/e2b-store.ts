import type { ChildProcess } from "node:child_process";
import { existsSync, rmdirSync, rmSync, writeFileSync } from "node:fs";
import type { IncomingMessage, ServerResponse } from "node:http";
import { join } from "node:path";
import { recordedExecs } from "../../proxy-image/src/exec-runner/exec-runner";
import type { templateBuilds } from "./e2b-builds";
import type { ContractSandbox, E2bFaults, RecordedE2bRequest } from "./e2b-contract";

// What the E2B contract server's parts (e2b-server.ts) share: the sandboxes it holds and the
// processes each runs, the faults asked for per run, and the end of a sandbox, which the platform
// API (kill) and the server's own close both take. Apart so that each part reads one state.

export interface Proc {
  pid: number;
  config: { cmd: string; args: string[]; envs: Record<string, string>; cwd?: string };
  tag?: string;
  child: ChildProcess | null;
  /** Subscribers (the Start stream, Connect streams) receiving enveloped events. */
  listeners: Set<(event: unknown) => void>;
  ended: boolean;
}

export interface Box extends ContractSandbox {
  /** The template's size, as E2B reports it for the sandbox. */
  size: { cpuCount: number; memoryMB: number };
  /** The sandbox's setup cgroup on this machine (bw-exec's BW_EXEC_SETUP_CGROUP), if any. */
  cgroup: string | null;
  envdAccessToken: string;
  trafficAccessToken: string | null;
  startedAt: Date;
  endAt: Date;
  dir: string;
  procs: Map<number, Proc>;
}

export interface E2bStore {
  /** The server's directory on this machine: the programs it built, every sandbox's home. */
  work: string;
  /** Where each sandbox's setup cgroup goes (this machine's cgroup v2), null where there is none. */
  cgroupRoot: string | null;
  boxes: Map<string, Box>;
  /** The faults asked for, by run (metadata `bw-run`). */
  faults: Map<string, E2bFaults>;
  templates: ReturnType<typeof templateBuilds>;
}

/** An envd request as the server hands it on (e2b-envd.ts, e2b-processes.ts): recorded already. */
export interface EnvdCall {
  req: IncomingMessage;
  res: ServerResponse;
  url: URL;
  raw: Buffer;
  /** The body as recorded: parsed JSON (a streaming call's one enveloped message). */
  body: unknown;
  /** The user the request runs as (its Basic authorization's name), null when none was given. */
  user: string | null;
  /** A Connect streaming call (application/connect+json). */
  streaming: boolean;
  record: RecordedE2bRequest;
  /** Answers with a JSON body (null: an empty one) and records the status. */
  json: (status: number, value: unknown, extra?: Record<string, string>) => void;
}

export const faultsOf = (store: E2bStore, box: Box) =>
  store.faults.get(box.metadata["bw-run"] ?? "") ?? { runId: "" };

/** Every pid a sandbox's processes have: envd's own children, the runner's supervisors and commands. */
function sandboxPids(box: Box): number[] {
  const pids = new Set<number>();
  for (const p of box.procs.values()) if (p.child?.pid && !p.ended) pids.add(p.child.pid);
  for (const exec of recordedExecs(join(box.dir, "exec"))) {
    for (const pid of [exec.supervisor, exec.pid]) if (pid !== null) pids.add(pid);
  }
  return [...pids];
}

export function signalSandbox(box: Box, signal: NodeJS.Signals): void {
  for (const pid of sandboxPids(box)) {
    for (const target of [-pid, pid]) {
      try {
        process.kill(target, signal);
      } catch {}
    }
  }
}

export function emit(proc: Proc, event: unknown): void {
  for (const l of proc.listeners) l(event);
}

export function end(proc: Proc, exitCode: number, status: string): void {
  if (proc.ended) return;
  proc.ended = true;
  emit(proc, { end: { exitCode, exited: true, status } });
  proc.listeners.clear();
}

export function killBox(store: E2bStore, box: Box): void {
  signalSandbox(box, "SIGCONT");
  signalSandbox(box, "SIGKILL");
  for (const p of box.procs.values()) end(p, -1, "signal: killed");
  store.boxes.delete(box.sandboxID);
  if (box.cgroup && existsSync(box.cgroup)) {
    try {
      writeFileSync(join(box.cgroup, "cgroup.kill"), "1");
      rmdirSync(box.cgroup);
    } catch {}
  }
  rmSync(box.dir, { recursive: true, force: true });
}
