import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import type { ResourceLimit, Resources } from "@benchwright/shared/contract/local-agent";

// One cgroup per sandbox (docs/local-backend.md, "Resource limits"): its memory, pids and CPU
// limits, with leaves below it for its processes, so that what a process did (or what was done
// to it) can be read per exec:
//   <parent>/<sandbox>/init              the sandbox's PID 1 and its host-side parent
//   <parent>/<sandbox>/setup/<exec>      a setup-stage exec and everything it started (seal kills
//                                        the whole of setup/)
//   <parent>/<sandbox>/run/<exec>        an execute-stage exec, likewise
// The parent is `benchwright` below the agent's own cgroup in each hierarchy (where the machine
// put the agent, so the sandboxes stay within what it was given). cgroup v1 (a hierarchy per
// controller: memory, pids, cpu, freezer) or v2 (one hierarchy; controllers enabled down the tree).

const CONTROLLERS = ["memory", "pids", "cpu", "freezer"] as const;
type Controller = (typeof CONTROLLERS)[number];
const REQUIRED: readonly Controller[] = ["memory", "pids", "cpu"];
const CPU_PERIOD_US = 100_000;

export interface CgroupHost {
  version: 1 | 2;
  /** v1: one parent directory per controller's hierarchy; v2: `unified` only. */
  parents: Partial<Record<Controller | "unified", string>>;
}

export type CgroupDetect = { ok: true; host: CgroupHost } | { ok: false; problem: string };

interface MountInfo {
  root: string;
  point: string;
  type: string;
  superOptions: string[];
}

function mounts(): MountInfo[] {
  return readFileSync("/proc/self/mountinfo", "utf8")
    .split("\n")
    .filter(Boolean)
    .map((line) => {
      const [left = "", right = ""] = line.split(" - ");
      const f = left.split(" ");
      const r = right.split(" ");
      return { root: f[3] ?? "", point: f[4] ?? "", type: r[0] ?? "", superOptions: (r[2] ?? "").split(",") };
    });
}

/** The agent's own cgroup path per v1 controller, and in v2 (`""` key). */
function ownPaths(): Map<string, string> {
  const paths = new Map<string, string>();
  for (const line of readFileSync("/proc/self/cgroup", "utf8").split("\n").filter(Boolean)) {
    const [, controllers = "", path = "/"] = line.split(":");
    if (controllers === "") paths.set("", path);
    for (const c of controllers.split(",")) paths.set(c, path);
  }
  return paths;
}

/** Where this machine's cgroups are and whether the agent can make sandboxes' cgroups in them. */
export function detectCgroups(): CgroupDetect {
  let all: MountInfo[];
  try {
    all = mounts();
  } catch {
    return { ok: false, problem: "cannot read /proc/self/mountinfo" };
  }
  const own = ownPaths();
  const v1 = all.filter((m) => m.type === "cgroup");
  const parents: CgroupHost["parents"] = {};
  for (const c of CONTROLLERS) {
    const m = v1.find((x) => x.superOptions.includes(c));
    if (!m) continue;
    // The mount shows the hierarchy from m.root; the agent's path is from the hierarchy's root.
    const path = own.get(c) ?? "/";
    const rel = path.startsWith(m.root) ? path.slice(m.root.length) : path;
    parents[c] = join(m.point, rel, "benchwright");
  }
  if (REQUIRED.every((c) => parents[c])) return { ok: true, host: { version: 1, parents } };
  const v2 = all.find((m) => m.type === "cgroup2" && m.point === "/sys/fs/cgroup");
  if (v2) {
    const available = readOr(join(v2.point, "cgroup.controllers", ""), "").split(/\s+/);
    const missing = REQUIRED.filter((c) => !available.includes(c));
    if (missing.length > 0) {
      return { ok: false, problem: `cgroup v2 has no ${missing.join(", ")} controller (cgroup.controllers)` };
    }
    // v2 allows no processes in a cgroup whose children have controllers: the agent's own cgroup
    // has the agent in it, so the parent is at the top of the hierarchy.
    return { ok: true, host: { version: 2, parents: { unified: join(v2.point, "benchwright") } } };
  }
  const missing = REQUIRED.filter((c) => !parents[c]);
  return {
    ok: false,
    problem: `no cgroup ${missing.join(", ")} controller is mounted (cgroup v1 at /sys/fs/cgroup/<controller>, or cgroup v2 at /sys/fs/cgroup)`,
  };
}

function readOr(path: string, fallback: string): string {
  try {
    return readFileSync(path, "utf8");
  } catch {
    return fallback;
  }
}

function write(path: string, value: string): void {
  writeFileSync(path, value);
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Every directory below `dir` (deepest first), then `dir`. */
function subtree(dir: string): string[] {
  const out: string[] = [];
  const visit = (d: string) => {
    let entries: string[] = [];
    try {
      entries = readdirSync(d, { withFileTypes: true })
        .filter((e) => e.isDirectory())
        .map((e) => e.name);
    } catch {
      return;
    }
    for (const e of entries) visit(join(d, e));
    out.push(d);
  };
  visit(dir);
  return out;
}

function procsOf(dir: string): number[] {
  return readOr(join(dir, "cgroup.procs"), "").split("\n").filter(Boolean).map(Number);
}

export interface Counters {
  /** Processes the kernel killed for the memory limit. */
  oomKills: number;
  /** Forks refused at the pids limit. */
  pidsMax: number;
}

/** A sandbox's cgroup in every hierarchy. `name` is unique on this machine. */
export class SandboxCgroup {
  private constructor(
    private readonly host: CgroupHost,
    /** The sandbox's directory per controller (two co-mounted controllers share one). */
    readonly dirs: Partial<Record<Controller | "unified", string>>,
  ) {}

  /** One directory per hierarchy. */
  private get all(): string[] {
    return [...new Set(Object.values(this.dirs))];
  }

  static create(host: CgroupHost, name: string, resources: Resources): SandboxCgroup {
    const dirs: SandboxCgroup["dirs"] = {};
    for (const [key, parent] of Object.entries(host.parents) as Array<[Controller | "unified", string]>) {
      dirs[key] = join(parent, name);
    }
    const cg = new SandboxCgroup(host, dirs);
    try {
      if (host.version === 2) cg.createV2(resources);
      else cg.createV1(resources);
    } catch (error) {
      cg.remove();
      throw error;
    }
    return cg;
  }

  private createV1(r: Resources): void {
    for (const dir of this.all) mkdirSync(dir, { recursive: true });
    const memory = this.dirs.memory as string;
    const bytes = String(r.memoryMb * 1024 * 1024);
    write(join(memory, "memory.limit_in_bytes"), bytes);
    // With swap, memory+swap too (the file is there only when the kernel accounts swap).
    const memsw = join(memory, "memory.memsw.limit_in_bytes");
    if (existsSync(memsw)) write(memsw, bytes);
    write(join(this.dirs.pids as string, "pids.max"), String(r.pids));
    const cpu = this.dirs.cpu as string;
    write(join(cpu, "cpu.cfs_period_us"), String(CPU_PERIOD_US));
    write(join(cpu, "cpu.cfs_quota_us"), String(Math.max(1000, Math.round(r.cpus * CPU_PERIOD_US))));
    for (const leaf of ["init", "setup", "run"]) {
      for (const dir of this.all) mkdirSync(join(dir, leaf));
    }
  }

  private createV2(r: Resources): void {
    const parent = this.host.parents.unified as string;
    const top = join(parent, "..");
    const enable = (dir: string) => write(join(dir, "cgroup.subtree_control"), "+memory +pids +cpu");
    mkdirSync(parent, { recursive: true });
    enable(top);
    enable(parent);
    const dir = this.dirs.unified as string;
    mkdirSync(dir);
    write(join(dir, "memory.max"), String(r.memoryMb * 1024 * 1024));
    if (existsSync(join(dir, "memory.swap.max"))) write(join(dir, "memory.swap.max"), "0");
    write(join(dir, "pids.max"), String(r.pids));
    write(join(dir, "cpu.max"), `${Math.max(1000, Math.round(r.cpus * CPU_PERIOD_US))} ${CPU_PERIOD_US}`);
    enable(dir);
    for (const leaf of ["init", "setup", "run"]) mkdirSync(join(dir, leaf));
    enable(join(dir, "setup"));
    enable(join(dir, "run"));
  }

  /** The relative path of a leaf: `init`, or `setup/<execId>` / `run/<execId>` (made here). */
  leaf(stage: "setup" | "execute", execId: string): string {
    const rel = join(stage === "setup" ? "setup" : "run", execId);
    for (const dir of this.all) mkdirSync(join(dir, rel), { recursive: true });
    return rel;
  }

  /** The cgroup.procs files a process writes its pid into to join `rel` (in every hierarchy). */
  procsFiles(rel: string): string[] {
    return this.all.map((d) => join(d, rel, "cgroup.procs"));
  }

  /** Every process in `rel` and below. */
  pids(rel = ""): number[] {
    const dir = join(this.pidsDir(), rel);
    return [...new Set(subtree(dir).flatMap(procsOf))];
  }

  private pidsDir(): string {
    return (this.dirs.pids ?? this.dirs.unified) as string;
  }

  counters(rel: string): Counters {
    const field = (text: string, name: string) =>
      Number(new RegExp(`^${name} (\\d+)$`, "m").exec(text)?.[1] ?? 0);
    if (this.host.version === 2) {
      const dir = join(this.dirs.unified as string, rel);
      // v2 counts the pids limit where it is set (the sandbox); .local (newer kernels) where the
      // fork was refused.
      const local = readOr(join(dir, "pids.events.local"), "");
      return {
        oomKills: field(readOr(join(dir, "memory.events"), ""), "oom_kill"),
        pidsMax: local
          ? field(local, "max")
          : field(readOr(join(this.dirs.unified as string, "pids.events"), ""), "max"),
      };
    }
    // v1: both are counted in the cgroup of the process concerned (the victim, the forker).
    let oomKills = 0;
    let pidsMax = 0;
    for (const d of subtree(join(this.dirs.memory as string, rel))) {
      oomKills += field(readOr(join(d, "memory.oom_control"), ""), "oom_kill");
    }
    for (const d of subtree(join(this.dirs.pids as string, rel))) {
      pidsMax += field(readOr(join(d, "pids.events"), ""), "max");
    }
    return { oomKills, pidsMax };
  }

  /** Which limits the kernel enforced on `rel`'s processes. */
  limitsHit(rel: string): Record<ResourceLimit, boolean> {
    const c = this.counters(rel);
    return { memory: c.oomKills > 0, pids: c.pidsMax > 0 };
  }

  /** Every process in `rel` and below, in any hierarchy (one mid-way through joining them too). */
  allPids(rel = ""): number[] {
    return [...new Set(this.all.flatMap((d) => subtree(join(d, rel)).flatMap(procsOf)))];
  }

  /**
   * SIGKILL to every process in `rel` and below, until none is left (at most 50 rounds). Each
   * round freezes `rel` first where a freezer is there and waits until it is frozen, so that
   * nothing forks meanwhile and the list is whole; then every process is killed and the subtree
   * thawed (a v1-frozen process dies only once thawed). The pids it killed for which `count`
   * holds are counted. Whoever needs `rel` empty checks allPids() after.
   */
  async kill(rel: string, count: (pid: number) => boolean = () => true): Promise<number> {
    const killed = new Set<number>();
    for (let round = 0; round < 50; round++) {
      const pids = this.allPids(rel);
      if (pids.length === 0) break;
      const frozen = await this.freeze(rel);
      if (this.host.version === 2) {
        const file = join(this.dirs.unified as string, rel, "cgroup.kill");
        if (existsSync(file)) write(file, "1");
      }
      for (const pid of this.allPids(rel)) {
        if (!killed.has(pid) && count(pid)) killed.add(pid);
        try {
          process.kill(pid, "SIGKILL");
        } catch {}
      }
      if (frozen) this.thaw(rel);
      await sleep(round < 5 ? 20 : 100);
    }
    return killed.size;
  }

  /**
   * Freezes `rel` and below (v1 freezer, v2 cgroup.freeze) and waits, a bounded while, until the
   * kernel says every process there is frozen. Whether this machine has a freezer for it; a
   * cgroup that does not freeze in time is left freezing (what is frozen stays so).
   */
  async freeze(rel: string): Promise<boolean> {
    const file = this.freezeFile(rel);
    if (file === null) return false;
    write(file, this.host.version === 2 ? "1" : "FROZEN");
    for (let i = 0; i < 200 && !this.isFrozen(rel); i++) await sleep(10);
    return true;
  }

  /** Whether every process in `rel` and below is frozen (false where there is no freezer). */
  isFrozen(rel: string): boolean {
    if (this.host.version === 2) {
      return /^frozen 1$/m.test(readOr(join(this.dirs.unified as string, rel, "cgroup.events"), ""));
    }
    const freezer = this.dirs.freezer;
    return freezer !== undefined && readOr(join(freezer, rel, "freezer.state"), "").trim() === "FROZEN";
  }

  /** Thaws `rel` and every cgroup below it (each may have been frozen on its own). */
  private thaw(rel: string): void {
    const top = this.host.version === 2 ? this.dirs.unified : this.dirs.freezer;
    if (top === undefined) return;
    for (const dir of subtree(join(top, rel))) {
      const file = join(dir, this.host.version === 2 ? "cgroup.freeze" : "freezer.state");
      try {
        write(file, this.host.version === 2 ? "0" : "THAWED");
      } catch {}
    }
  }

  private freezeFile(rel: string): string | null {
    const file =
      this.host.version === 2
        ? join(this.dirs.unified as string, rel, "cgroup.freeze")
        : this.dirs.freezer
          ? join(this.dirs.freezer, rel, "freezer.state")
          : null;
    return file !== null && existsSync(file) ? file : null;
  }

  /** Removes `rel` and below where empty (an exec's leaf once its processes are gone). */
  removeLeaf(rel: string): void {
    for (const dir of this.all) {
      for (const d of subtree(join(dir, rel))) {
        try {
          rmdirSync(d);
        } catch {}
      }
    }
  }

  /** Removes the whole cgroup (its processes must be gone: kill("") first). */
  remove(): void {
    for (const dir of this.all) removeTree(dir);
  }
}

function removeTree(dir: string): void {
  for (const d of subtree(dir)) {
    try {
      rmdirSync(d);
    } catch {}
  }
}

/**
 * What a crashed agent left: kills every process in each directory's tree and removes it. Used by
 * the state directory with the directories it had written down.
 */
export async function removeLeftoverCgroup(dirs: readonly string[]): Promise<void> {
  for (let round = 0; round < 50; round++) {
    const pids = [...new Set(dirs.flatMap((d) => subtree(d).flatMap(procsOf)))];
    if (pids.length === 0) break;
    for (const pid of pids) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {}
    }
    await sleep(50);
  }
  for (const d of dirs) removeTree(d);
}

/** Removes the agent's parent directories when no sandbox cgroup is left in them. */
export function removeParents(host: CgroupHost): void {
  for (const dir of new Set(Object.values(host.parents))) {
    try {
      rmdirSync(dir);
    } catch {}
  }
}
