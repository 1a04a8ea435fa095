import { type ChildProcess, spawn } from "node:child_process";
import { readdirSync, readFileSync } from "node:fs";
import {
  EXEC_OUTPUT_LIMIT,
  type ExecInfo,
  outputPage,
  type ResourceLimit,
} from "@benchwright/shared/contract/local-agent";

// One command in a sandbox: its process, its output (the last 1 MiB of each stream, with
// absolute byte offsets so a caller can page through it), its timeout.

export const OUTPUT_LIMIT = EXEC_OUTPUT_LIMIT;
export const MAX_WAIT_MS = 30_000;
/** How often a running exec's cgroup is read for the pids limit (a fork bomb never ends by itself). */
const LIMIT_POLL_MS = 250;

/** An exec's cgroup leaf (cgroups.ts), as the exec sees it. */
export interface ExecCgroup {
  /** Which limits the kernel enforced on the exec's processes (a memory kill, a refused fork). */
  hit(): Record<ResourceLimit, boolean>;
  /** SIGKILL to every process in the leaf, however far it left the exec's process tree. */
  killAll(): Promise<void>;
  /** The exec has ended: its leaf goes once nothing is left in it. */
  release(): void;
}

export class OutputBuffer {
  private chunks: Buffer[] = [];
  private kept = 0;
  /** Bytes written since the start (offset just past the last byte). */
  end = 0;

  append(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.kept += chunk.length;
    this.end += chunk.length;
    while (this.kept > OUTPUT_LIMIT) {
      const first = this.chunks[0] as Buffer;
      const drop = this.kept - OUTPUT_LIMIT;
      if (first.length <= drop) {
        this.chunks.shift();
        this.kept -= first.length;
      } else {
        this.chunks[0] = first.subarray(drop);
        this.kept -= drop;
      }
    }
  }

  /**
   * Text from byte offset `from` (or from the oldest byte kept), and the offset to ask from next.
   * Cut on UTF-8 character boundaries, so pages concatenate to the original text; a character
   * still being written (partial at the end) waits for the next page unless `final`.
   */
  read(from: number, final: boolean): { text: string; end: number } {
    const start = this.end - this.kept;
    const begin = Math.min(Math.max(from, start), this.end);
    return outputPage(Buffer.concat(this.chunks).subarray(begin - start), begin, from, final);
  }
}

export class Exec {
  readonly stdout = new OutputBuffer();
  readonly stderr = new OutputBuffer();
  exitCode: number | null = null;
  signal: string | null = null;
  state: "running" | "exited" = "running";
  /** The limit the exec's cgroup hit (it was killed for it, by the kernel or by the agent). */
  limit: ResourceLimit | null = null;
  readonly done: Promise<void>;
  private readonly child: ChildProcess;
  private timer: NodeJS.Timeout | undefined;
  private watch: NodeJS.Timeout | undefined;
  private readonly cgroup: ExecCgroup | null;

  constructor(
    readonly execId: string,
    readonly sandboxId: string,
    readonly stage: "setup" | "execute",
    options: {
      argv: readonly string[];
      env: Record<string, string>;
      /** Delivered on fd 3 (the sandbox's exec wrapper evaluates it), then closed. */
      fd3: string;
      stdin: string | undefined;
      timeoutMs: number | null;
      cgroup?: ExecCgroup;
    },
  ) {
    this.cgroup = options.cgroup ?? null;
    const [file, ...args] = options.argv as [string, ...string[]];
    this.child = spawn(file, args, {
      env: options.env,
      stdio: ["pipe", "pipe", "pipe", "pipe"],
      detached: true,
    });
    const child = this.child;
    child.stdout?.on("data", (d: Buffer) => this.stdout.append(d));
    child.stderr?.on("data", (d: Buffer) => this.stderr.append(d));
    const fd3 = child.stdio[3] as NodeJS.WritableStream & { on(e: "error", f: () => void): void };
    fd3.on("error", () => {});
    fd3.end(options.fd3);
    child.stdin?.on("error", () => {});
    child.stdin?.end(options.stdin ?? "");
    if (options.timeoutMs !== null) {
      this.timer = setTimeout(() => void this.kill(), options.timeoutMs);
    }
    const cgroup = this.cgroup;
    if (cgroup) {
      this.watch = setInterval(() => {
        if (this.limit === null && cgroup.hit().pids) {
          this.limit = "pids";
          void this.kill();
        }
      }, LIMIT_POLL_MS);
    }
    this.done = new Promise<void>((resolve) => {
      let exited = false;
      const finish = () => {
        if (this.state === "exited") return;
        clearTimeout(this.timer);
        clearInterval(this.watch);
        if (cgroup) {
          // A memory kill of a process the exec survived (it exited 0) is not the exec's end.
          const hit = cgroup.hit();
          if (this.limit === null && this.exitCode !== 0) {
            this.limit = hit.memory ? "memory" : hit.pids ? "pids" : null;
          }
          cgroup.release();
        }
        this.state = "exited";
        resolve();
      };
      child.on("error", (e) => {
        this.stderr.append(Buffer.from(`could not start: ${e.message}\n`));
        finish();
      });
      child.on("exit", (code, signal) => {
        exited = true;
        this.exitCode = code;
        this.signal = signal;
        // Wait for the pipes to drain; a background process that keeps them open does not hold
        // the exec "running" for more than a moment.
        setTimeout(finish, 500);
      });
      child.on("close", () => {
        if (exited) finish();
      });
    });
  }

  info(stdoutFrom: number, stderrFrom: number): ExecInfo {
    const final = this.state === "exited";
    const out = this.stdout.read(stdoutFrom, final);
    const err = this.stderr.read(stderrFrom, final);
    return {
      execId: this.execId,
      sandboxId: this.sandboxId,
      state: this.state,
      exitCode: this.exitCode,
      signal: this.signal,
      stdout: out.text,
      stderr: err.text,
      stdoutEnd: out.end,
      stderrEnd: err.end,
      ...(this.limit === null ? {} : { limit: this.limit }),
    };
  }

  /** Resolves when the exec has exited or after `ms`. */
  wait(ms: number): Promise<void> {
    if (this.state === "exited" || ms <= 0) return Promise.resolve();
    let timer: NodeJS.Timeout | undefined;
    return Promise.race([this.done, new Promise<void>((r) => (timer = setTimeout(r, ms)))]).finally(() =>
      clearTimeout(timer),
    );
  }

  /**
   * SIGCONT to the host-side nsenter of a running exec. nsenter mirrors its child's job control:
   * when the child is stopped it stops itself, and it only continues the child once it is
   * continued. So thawing a sandbox continues these too.
   */
  continueHostSide(): void {
    const pid = this.child.pid;
    if (pid === undefined || this.state !== "running") return;
    try {
      process.kill(pid, "SIGCONT");
    } catch {}
  }

  /**
   * SIGKILL to everything the exec started: its cgroup leaf (also what left its process tree,
   * by a double fork), then the process tree under nsenter; nsenter then reaps them and exits.
   */
  async kill(): Promise<void> {
    const pid = this.child.pid;
    if (pid !== undefined && this.state === "running") {
      await this.cgroup?.killAll();
      for (let round = 0; round < 3; round++) {
        const tree = descendants(pid);
        if (tree.length === 0) break;
        for (const p of tree) {
          try {
            process.kill(p, "SIGKILL");
          } catch {}
        }
      }
      const timer = setTimeout(() => this.child.kill("SIGKILL"), 2_000);
      await this.wait(5_000);
      clearTimeout(timer);
    }
  }
}

/** All descendants of `pid`, children before grandchildren. */
function descendants(pid: number): number[] {
  const out: number[] = [];
  const queue = [pid];
  while (queue.length > 0) {
    const p = queue.shift() as number;
    let tasks: string[] = [];
    try {
      tasks = readdirSync(`/proc/${p}/task`);
    } catch {
      continue;
    }
    for (const t of tasks) {
      try {
        for (const c of readFileSync(`/proc/${p}/task/${t}/children`, "utf8").split(/\s+/)) {
          if (c) {
            out.push(Number(c));
            queue.push(Number(c));
          }
        }
      } catch {}
    }
  }
  return out;
}
