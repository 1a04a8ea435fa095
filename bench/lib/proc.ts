import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

// Linux /proc readings for the processes the bench runs: memory (VmRSS now, VmHWM = peak RSS
// since start) and CPU time, so a phase can say how the two cores were shared.

const MiB = 1024 * 1024;

let ticksPerSecond = 100;
try {
  ticksPerSecond = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
} catch {
  // getconf missing: Linux's USER_HZ is 100 on every architecture the bench runs on.
}

/** VmRSS and VmHWM of a process in MiB, or null once it is gone. */
export function memoryOf(pid: number): { rssMiB: number; hwmMiB: number } | null {
  try {
    const status = readFileSync(`/proc/${pid}/status`, "utf8");
    const kb = (key: string) =>
      Number(new RegExp(`^${key}:\\s+(\\d+) kB`, "m").exec(status)?.[1] ?? Number.NaN);
    return { rssMiB: (kb("VmRSS") * 1024) / MiB, hwmMiB: (kb("VmHWM") * 1024) / MiB };
  } catch {
    return null;
  }
}

/** User + system CPU seconds a process has used so far (its own threads, not its children). */
export function cpuSecondsOf(pid: number): number {
  if (pid === process.pid) {
    const u = process.cpuUsage();
    return (u.user + u.system) / 1e6;
  }
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    const rest = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return (Number(rest[11]) + Number(rest[12])) / ticksPerSecond;
  } catch {
    return Number.NaN;
  }
}

/**
 * CPU seconds of the whole machine so far: `busy` (user, nice, system, steal) and `irq` (hard and
 * soft interrupts, where much of loopback TCP runs, charged to no process).
 */
function machineSeconds(): { busy: number; irq: number } {
  try {
    const line = readFileSync("/proc/stat", "utf8").split("\n")[0] ?? "";
    const [user, nice, system, , , irq, softirq, steal] = line.trim().split(/\s+/).slice(1).map(Number);
    return {
      busy: ((user ?? 0) + (nice ?? 0) + (system ?? 0) + (steal ?? 0)) / ticksPerSecond,
      irq: ((irq ?? 0) + (softirq ?? 0)) / ticksPerSecond,
    };
  } catch {
    return { busy: Number.NaN, irq: Number.NaN };
  }
}

/**
 * CPU use of the bench's processes over one or more windows of wall time, as a share of one core
 * (1 = a full core), plus `others`: what the rest of the machine used meanwhile (a neighbour on a
 * shared machine makes every number here noisier, so the results say how much there was).
 */
export class CpuMeter {
  private readonly cpuS = new Map<string, number>();
  private wallS = 0;
  private open: { t0: bigint; at: Map<string, number> } | null = null;

  constructor(private readonly pids: () => Record<string, number>) {}

  private read(): Map<string, number> {
    const at = new Map(Object.entries(this.pids()).map(([k, pid]) => [k, cpuSecondsOf(pid)]));
    const m = machineSeconds();
    at.set("machine", m.busy);
    at.set("irq", m.irq);
    return at;
  }

  begin(): void {
    this.open = { t0: process.hrtime.bigint(), at: this.read() };
  }

  end(): void {
    if (!this.open) return;
    const now = this.read();
    this.wallS += Number(process.hrtime.bigint() - this.open.t0) / 1e9;
    for (const [k, v] of now) {
      const before = this.open.at.get(k);
      if (before === undefined) continue;
      this.cpuS.set(k, (this.cpuS.get(k) ?? 0) + (v - before));
    }
    this.open = null;
  }

  /**
   * Cores used per process over all windows, `irq` (interrupts, mostly the loopback network), and
   * `others` (the machine's busy time minus the bench's own processes).
   */
  cores(): Record<string, number> {
    const out: Record<string, number> = {};
    let ours = 0;
    for (const [k, v] of this.cpuS) {
      if (k === "machine") continue;
      out[k] = v / this.wallS;
      if (k !== "irq") ours += v;
    }
    const machine = this.cpuS.get("machine");
    if (machine !== undefined) out.others = Math.max(0, (machine - ours) / this.wallS);
    return out;
  }
}
