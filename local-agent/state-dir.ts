import { createHash } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { removeLeftoverCgroup } from "./cgroups";
import { run } from "./command";
import { deleteNetns, killNetnsProcesses, proxyNamespaces, removeHost } from "./network";

// What the agent made, written down before it is made, so that an agent that crashed leaves
// nothing the next one (same state dir) does not remove:
//   <state>/netns/<name>      one empty file per namespace (bw<k>p, bw<k>w<i>)
//   <state>/host.json         the host table is installed; ip_forward's value before
//   <state>/sandboxes/<id>/   a sandbox's bind-mounted files and its user namespace's file
//   <state>/cgroups/<id>      a sandbox's cgroup directories (JSON), one per hierarchy
//   <state>/bin/              the uid-map helpers (sandbox.ts)
//   <state>/owner             the agent's process (pid and start time), so that a sweep can tell
//                             a crashed agent's directory from a live one's (ownerAlive)

export class StateDir {
  /** Names this state directory's sandboxes' cgroups apart from another agent's. */
  readonly tag: string;

  constructor(readonly root: string) {
    this.tag = createHash("sha256").update(root).digest("hex").slice(0, 10);
  }

  binDir(): string {
    return join(this.root, "bin");
  }

  recordCgroup(id: string, dirs: string[]): void {
    mkdirSync(join(this.root, "cgroups"), { recursive: true, mode: 0o700 });
    writeFileSync(join(this.root, "cgroups", id), JSON.stringify(dirs));
  }

  forgetCgroup(id: string): void {
    rmSync(join(this.root, "cgroups", id), { force: true });
  }

  sandboxDir(id: string): string {
    return join(this.root, "sandboxes", id);
  }

  recordNetns(name: string): void {
    mkdirSync(join(this.root, "netns"), { recursive: true, mode: 0o700 });
    writeFileSync(join(this.root, "netns", name), "");
  }

  forgetNetns(name: string): void {
    rmSync(join(this.root, "netns", name), { force: true });
  }

  recordHost(ipForwardBefore: string): void {
    writeFileSync(join(this.root, "host.json"), JSON.stringify({ ipForwardBefore }), { mode: 0o600 });
  }

  forgetHost(): void {
    rmSync(join(this.root, "host.json"), { force: true });
  }

  removeSandboxDir(id: string): void {
    rmSync(this.sandboxDir(id), { recursive: true, force: true });
  }

  /** Makes the directory (root only) and removes whatever a previous agent left in it. */
  async prepare(nft: string): Promise<string[]> {
    mkdirSync(this.root, { recursive: true, mode: 0o700 });
    writeFileSync(join(this.root, "owner"), JSON.stringify(processIdentity(process.pid)), { mode: 0o600 });
    const removed: string[] = [];
    const netnsDir = join(this.root, "netns");
    const names = existsSync(netnsDir) ? readdirSync(netnsDir) : [];
    // Work namespaces before proxy namespaces (their links live in the proxy's).
    for (const name of names.sort((a, b) => Number(a.endsWith("p")) - Number(b.endsWith("p")))) {
      await killNetnsProcesses(name);
      await deleteNetns(name);
      this.forgetNetns(name);
      removed.push(name);
    }
    const hostFile = join(this.root, "host.json");
    if (existsSync(hostFile) && proxyNamespaces().length === 0) {
      let before: string | null = null;
      try {
        before =
          (JSON.parse(readFileSync(hostFile, "utf8")) as { ipForwardBefore?: string }).ipForwardBefore ??
          null;
      } catch {}
      await removeHost(nft, before);
      this.forgetHost();
      removed.push("host table");
    }
    const cgroupDir = join(this.root, "cgroups");
    for (const id of existsSync(cgroupDir) ? readdirSync(cgroupDir) : []) {
      let dirs: string[] = [];
      try {
        dirs = JSON.parse(readFileSync(join(cgroupDir, id), "utf8")) as string[];
      } catch {}
      await removeLeftoverCgroup(dirs);
      this.forgetCgroup(id);
      removed.push(`cgroup ${id}`);
    }
    // A sandbox's user namespace is kept by a bind mount in its directory.
    const sandboxes = `${join(this.root, "sandboxes")}/`;
    for (const line of readFileSync("/proc/self/mountinfo", "utf8").split("\n")) {
      const point = line.split(" ")[4];
      if (point?.startsWith(sandboxes)) await run(["umount", "-l", point]);
    }
    rmSync(join(this.root, "sandboxes"), { recursive: true, force: true });
    return removed;
  }
}

/** A process's pid and its start time (clock ticks since boot): a pid alone may be reused. */
function processIdentity(pid: number): { pid: number; start: string } | null {
  try {
    // The second field, the command, may hold spaces and parentheses: count from its last ")".
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const start = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
    return start ? { pid, start } : null;
  } catch {
    return null;
  }
}

/**
 * Whether the agent that prepared `root` still runs. A directory without the record (an agent
 * killed before it wrote one) counts as not alive: only a sweep of crashed agents' directories
 * asks (test/setup/stale-agents.ts).
 */
export function ownerAlive(root: string): boolean {
  try {
    const owner = JSON.parse(readFileSync(join(root, "owner"), "utf8")) as { pid?: number; start?: string };
    const now = typeof owner.pid === "number" ? processIdentity(owner.pid) : null;
    return now !== null && now.start === owner.start;
  } catch {
    return false;
  }
}
