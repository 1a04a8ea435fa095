import { existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { deleteNetns, killNetnsProcesses, proxyNamespaces, removeHost } from "./network";

// What the agent made, written down before it is made, so that an agent that crashed leaves
// nothing the next one (same state dir) does not remove:
//   <state>/netns/<name>      one empty file per namespace (bw<k>p, bw<k>w<i>)
//   <state>/host.json         the host table is installed; ip_forward's value before
//   <state>/sandboxes/<id>/   a sandbox's bind-mounted files

export class StateDir {
  constructor(readonly root: string) {}

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
    rmSync(join(this.root, "sandboxes"), { recursive: true, force: true });
    return removed;
  }
}
