import { existsSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { ownerAlive, StateDir } from "../../local-agent/state-dir";

// The tests' host agents keep their state in tmpdir()/bw-*. A test process killed mid-file (a
// session that ended, a CI job cancelled) leaves that agent's namespaces, links, host table,
// cgroups and mounts behind, and every later "close() leaves nothing" assertion on this machine
// then sees them. Before the suites that make sandboxes, each such directory whose agent no
// longer runs is cleaned the way a restarted agent cleans its own (StateDir.prepare), then removed.
// A directory whose agent runs (another suite on this machine) is left alone.
export default async function setup() {
  if (process.getuid?.() !== 0 || process.platform !== "linux") return;
  const swept: string[] = [];
  for (const name of readdirSync(tmpdir())) {
    const root = join(tmpdir(), name);
    if (!name.startsWith("bw-") || !isStateDir(root) || ownerAlive(root)) continue;
    const removed = await new StateDir(root).prepare("nft");
    rmSync(root, { recursive: true, force: true });
    swept.push(`${name}${removed.length > 0 ? ` (${removed.join(", ")})` : ""}`);
  }
  if (swept.length > 0)
    console.error(`stale-agents: removed what crashed test agents left: ${swept.join("; ")}`);
}

// An agent records a namespace and a cgroup before it makes any sandbox (state-dir.ts), so these
// name an agent's directory; "sandboxes" alone does not (the E2B contract server has one too).
function isStateDir(root: string): boolean {
  return ["owner", "netns", "cgroups", "host.json"].some((e) => existsSync(join(root, e)));
}
